//! Where things are ([`Span`]), what went wrong ([`Error`]) and what lenient
//! mode skipped ([`Warning`]). Messages follow nginx's own wording
//! (`unknown directive "rewrite" in /etc/nginx/conf.d/spin.conf:12`) so an
//! operator recognises them.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A place in a configuration file: the file and the 1-based line.
///
/// Every token carries one. For a directive it is the line of the
/// directive's name (nginx reports the line of the terminating `;` or `{`;
/// the two differ only for directives spread over several lines).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Span {
    /// The file, as it was named to [`crate::parse_str`] or found by
    /// [`crate::load`] (include patterns are joined to the conf prefix).
    pub file: Arc<Path>,
    /// 1-based line number.
    pub line: u32,
}

impl Span {
    /// A span in `file` at `line`.
    pub fn new(file: Arc<Path>, line: u32) -> Self {
        Self { file, line }
    }
}

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file.display(), self.line)
    }
}

impl serde::Serialize for Span {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Why a configuration could not be read or is not one the gateway can serve.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The text is not nginx configuration syntax (`unexpected "}"`,
    /// `unexpected end of file, expecting ";" or "}"`, ...).
    #[error("{message} in {span}")]
    Syntax {
        /// nginx's wording of the problem.
        message: String,
        /// Where.
        span: Span,
    },
    /// A directive this crate does not know: either nginx does not know it
    /// either, or it is outside the ingress subset. Lenient mode turns it
    /// into a [`Warning`].
    #[error("unknown directive \"{name}\" in {span}")]
    UnknownDirective {
        /// The directive.
        name: String,
        /// Where.
        span: Span,
    },
    /// A known directive in a block where nginx does not allow it.
    #[error("\"{name}\" directive is not allowed here in {span}")]
    NotAllowedHere {
        /// The directive.
        name: String,
        /// Where.
        span: Span,
    },
    /// A directive with too few or too many arguments, or a block directive
    /// without its block (and the reverse).
    #[error("{message} in {span}")]
    Arity {
        /// nginx's wording (`invalid number of arguments in "listen" directive`).
        message: String,
        /// Where.
        span: Span,
    },
    /// A directive given twice where nginx allows it once.
    #[error("\"{name}\" directive is duplicate in {span}")]
    Duplicate {
        /// The directive.
        name: String,
        /// Where the second one is.
        span: Span,
    },
    /// An argument nginx would reject, or a combination of directives it
    /// would refuse to start with.
    #[error("{message} in {span}")]
    InvalidValue {
        /// What is wrong, in nginx's words where nginx has them.
        message: String,
        /// Where.
        span: Span,
    },
    /// A form nginx accepts but the gateway does not serve (regex locations,
    /// `unix:` sockets, variables in `proxy_pass`, ...). Lenient mode turns
    /// the directive-level ones into a [`Warning`].
    #[error("{message} is outside the subset in {span}")]
    OutsideSubset {
        /// What was found.
        message: String,
        /// Where.
        span: Span,
    },
    /// nginx refuses to start without an `events` block; so do we, so that a
    /// file accepted here is one nginx accepts too.
    #[error("no \"events\" section in configuration")]
    MissingEvents {
        /// The main configuration file.
        file: PathBuf,
    },
    /// A file (the main one or an included one) could not be read.
    #[error("open() \"{}\" failed ({}){}", path.display(), os_error(source), at(span.as_ref()))]
    ReadFailed {
        /// The file.
        path: PathBuf,
        /// The include directive that named it, if any.
        span: Option<Span>,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// An include pattern that is not a valid glob.
    #[error("invalid include pattern \"{pattern}\": {reason} in {span}")]
    IncludePattern {
        /// The pattern after joining it to the conf prefix.
        pattern: String,
        /// What the glob parser said.
        reason: String,
        /// Where.
        span: Span,
    },
    /// A file includes itself, directly or through other files. (nginx
    /// itself recurses until it runs out of file descriptors.)
    #[error("include cycle: \"{}\" is already being read in {span}", path.display())]
    IncludeCycle {
        /// The file that was already open.
        path: PathBuf,
        /// The include directive that closed the cycle.
        span: Span,
    },
    /// Input bigger or deeper than the limits in [`crate::limits`]; the input
    /// is untrusted, so nothing is unbounded.
    #[error("{message}{}", at(span.as_ref()))]
    LimitExceeded {
        /// Which limit.
        message: String,
        /// Where, when there is a place to point at.
        span: Option<Span>,
    },
    /// [`crate::Ingress::from_ast`] met an `include` directive: it only
    /// resolves includes through [`crate::load`] or [`crate::Ast::resolve_includes`].
    #[error("\"include\" is not resolved (use load or Ast::resolve_includes) in {span}")]
    UnresolvedInclude {
        /// The include directive.
        span: Span,
    },
}

/// An I/O error as nginx prints it: `2: No such file or directory`.
fn os_error(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(code) => {
            let text = e.to_string();
            let suffix = format!(" (os error {code})");
            format!("{code}: {}", text.strip_suffix(&suffix).unwrap_or(&text))
        }
        None => e.to_string(),
    }
}

fn at(span: Option<&Span>) -> String {
    span.map(|s| format!(" in {s}")).unwrap_or_default()
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Something lenient mode skipped, or a configuration nginx accepts with a
/// warning of its own (a conflicting server name).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Warning {
    /// What was skipped and why.
    pub message: String,
    /// Where.
    pub span: Span,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} in {}", self.message, self.span)
    }
}
