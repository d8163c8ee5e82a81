//! A benchmark's result: a title, the command that reproduces it, and
//! Markdown lines, printed by `main`.

/// What one benchmark run found.
#[derive(Debug, Default)]
pub struct Report {
    /// Heading.
    pub title: String,
    /// The command line that produced it.
    pub command: String,
    /// Result lines (Markdown).
    pub lines: Vec<String>,
}

impl Report {
    /// A report for `title`, run as `command`.
    pub fn new(title: &str, command: &str) -> Self {
        Report {
            title: title.to_owned(),
            command: command.to_owned(),
            lines: Vec::new(),
        }
    }

    /// Adds a line.
    pub fn line(&mut self, line: impl Into<String>) {
        let line = line.into();
        eprintln!("  {line}");
        self.lines.push(line);
    }

    /// The Markdown block.
    pub fn markdown(&self, machine: &str) -> String {
        let mut out = format!(
            "### {}\n\n```\n{}\n```\n\n{machine}\n",
            self.title, self.command
        );
        for l in &self.lines {
            out.push_str(l);
            out.push('\n');
        }
        out
    }
}
