//! The syntax tree ([`Ast`], [`Directive`]) and `include` resolution.
//!
//! nginx reads an included file in the context of the `include` directive, so
//! resolution splices the included directives in place of the `include`.
//! Each file must still balance its own braces (nginx parses it on its own).
//! Relative patterns are joined to the *conf prefix* — the directory of the
//! main configuration file — as `ngx_conf_include` does with
//! `ngx_conf_full_name(cycle, name, 1)`. A pattern with `*`, `?` or `[` is a
//! glob: matches are read in byte order and no match is not an error; a
//! plain name that does not exist is. As in glob(3), a `[` that opens no
//! valid class is a literal `[`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, Result, Span};
use crate::lexer;
use crate::limits;

/// One directive: its name, its arguments (unescaped, variables literal) and
/// its block, if it ended with `{`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Directive {
    /// The first word.
    pub name: String,
    /// The other words.
    pub args: Vec<String>,
    /// Where the first word is.
    pub span: Span,
    /// The directives inside `{ … }`, or `None` for a directive ended by `;`.
    pub block: Option<Vec<Directive>>,
}

/// A parsed configuration file, before its meaning is resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ast {
    /// The main file.
    pub file: Arc<Path>,
    /// Its top-level directives.
    pub directives: Vec<Directive>,
}

impl Ast {
    /// Tokenizes and parses `src` as the contents of `file`. Includes are
    /// left as `include` directives.
    pub fn parse(src: &[u8], file: impl AsRef<Path>) -> Result<Self> {
        let file: Arc<Path> = Arc::from(file.as_ref());
        let directives = lexer::parse_file(src, file.clone())?;
        Ok(Self { file, directives })
    }

    /// Replaces every `include` with the directives of the files it names,
    /// read through `source`, relative names joined to `conf_prefix`.
    pub fn resolve_includes(&mut self, conf_prefix: &Path, source: &dyn Source) -> Result<()> {
        let mut state = IncludeState {
            conf_prefix,
            source,
            stack: vec![self.file.to_path_buf()],
            files: 1,
        };
        let directives = std::mem::take(&mut self.directives);
        self.directives = state.splice(directives, 0)?;
        Ok(())
    }
}

/// Where included files come from: the file system ([`FileSystem`]) or, for
/// tests and fuzzing, memory ([`MemorySource`]).
pub trait Source {
    /// The bytes of `path`.
    fn read(&self, path: &Path) -> std::io::Result<Vec<u8>>;
    /// The files matching a glob `pattern`, in any order. `Err` carries the
    /// pattern parser's complaint.
    fn glob(&self, pattern: &str) -> std::result::Result<Vec<PathBuf>, String>;
}

/// glob(3) with no flags, as nginx calls it: `*` does not match a leading
/// dot or a `/`.
fn match_options() -> glob::MatchOptions {
    glob::MatchOptions {
        case_sensitive: true,
        require_literal_separator: true,
        require_literal_leading_dot: true,
    }
}

/// Reads the real file system.
#[derive(Debug, Clone, Copy, Default)]
pub struct FileSystem;

impl Source for FileSystem {
    fn read(&self, path: &Path) -> std::io::Result<Vec<u8>> {
        use std::io::Read;
        let file = std::fs::File::open(path)?;
        let mut buf = Vec::new();
        // One byte over the limit is enough to know it is over.
        file.take(limits::MAX_FILE_BYTES as u64 + 1)
            .read_to_end(&mut buf)?;
        Ok(buf)
    }

    fn glob(&self, pattern: &str) -> std::result::Result<Vec<PathBuf>, String> {
        let paths = glob::glob_with(pattern, match_options()).map_err(|e| e.msg.to_string())?;
        // Unreadable directories are skipped, as glob(3) without GLOB_ERR does.
        Ok(paths.filter_map(|p| p.ok()).collect())
    }
}

/// Files held in memory, keyed by path.
#[derive(Debug, Clone, Default)]
pub struct MemorySource {
    files: BTreeMap<PathBuf, Vec<u8>>,
}

impl MemorySource {
    /// An empty set of files.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) a file.
    #[must_use]
    pub fn with_file(mut self, path: impl Into<PathBuf>, contents: impl Into<Vec<u8>>) -> Self {
        self.files.insert(path.into(), contents.into());
        self
    }
}

impl Source for MemorySource {
    fn read(&self, path: &Path) -> std::io::Result<Vec<u8>> {
        self.files
            .get(path)
            .cloned()
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))
    }

    fn glob(&self, pattern: &str) -> std::result::Result<Vec<PathBuf>, String> {
        let pattern = glob::Pattern::new(pattern).map_err(|e| e.msg.to_string())?;
        Ok(self
            .files
            .keys()
            .filter(|p| pattern.matches_path_with(p, match_options()))
            .cloned()
            .collect())
    }
}

struct IncludeState<'a> {
    conf_prefix: &'a Path,
    source: &'a dyn Source,
    /// The files being read, outermost first, to find cycles.
    stack: Vec<PathBuf>,
    /// Files read so far.
    files: usize,
}

impl IncludeState<'_> {
    fn splice(&mut self, directives: Vec<Directive>, depth: usize) -> Result<Vec<Directive>> {
        let mut out = Vec::with_capacity(directives.len());
        for mut d in directives {
            if d.name == "include" {
                // `include` is NGX_ANY_CONF|NGX_CONF_TAKE1.
                if d.block.is_some() {
                    return Err(Error::Arity {
                        message: "directive \"include\" is not terminated by \";\"".into(),
                        span: d.span,
                    });
                }
                let [pattern] = d.args.as_slice() else {
                    return Err(Error::Arity {
                        message: "invalid number of arguments in \"include\" directive".into(),
                        span: d.span,
                    });
                };
                let included = self.include(pattern, &d.span, depth)?;
                out.extend(included);
                continue;
            }
            if let Some(block) = d.block.take() {
                if depth + 1 > limits::MAX_DEPTH {
                    return Err(Error::LimitExceeded {
                        message: format!("blocks nested deeper than {}", limits::MAX_DEPTH),
                        span: Some(d.span),
                    });
                }
                d.block = Some(self.splice(block, depth + 1)?);
            }
            out.push(d);
        }
        Ok(out)
    }

    fn include(&mut self, pattern: &str, span: &Span, depth: usize) -> Result<Vec<Directive>> {
        let full = self.conf_prefix.join(pattern);
        let full_str = full.to_string_lossy().into_owned();
        let files = if full_str.contains(['*', '?', '[']) {
            // glob(3) takes a `[` that opens no valid class as a literal
            // `[`; the glob crate refuses the pattern, so retry with every
            // `[` escaped (`[[]`).
            let mut files = match self.source.glob(&full_str) {
                Ok(files) => files,
                Err(_) => self
                    .source
                    .glob(&full_str.replace('[', "[[]"))
                    .map_err(|reason| Error::IncludePattern {
                        pattern: full_str.clone(),
                        reason,
                        span: span.clone(),
                    })?,
            };
            // glob(3) sorts; nginx does not call setlocale, so byte order.
            files.sort_by(|a, b| a.as_os_str().cmp(b.as_os_str()));
            files
        } else {
            vec![full]
        };
        let mut out = Vec::new();
        for file in files {
            if self.stack.iter().any(|open| open == &file) {
                return Err(Error::IncludeCycle {
                    path: file,
                    span: span.clone(),
                });
            }
            if self.stack.len() > limits::MAX_INCLUDE_DEPTH {
                return Err(Error::LimitExceeded {
                    message: format!("includes nested deeper than {}", limits::MAX_INCLUDE_DEPTH),
                    span: Some(span.clone()),
                });
            }
            self.files += 1;
            if self.files > limits::MAX_FILES {
                return Err(Error::LimitExceeded {
                    message: format!("more than {} configuration files", limits::MAX_FILES),
                    span: Some(span.clone()),
                });
            }
            let bytes = self
                .source
                .read(&file)
                .map_err(|source| Error::ReadFailed {
                    path: file.clone(),
                    span: Some(span.clone()),
                    source,
                })?;
            let directives = lexer::parse_file(&bytes, Arc::from(file.as_path()))?;
            self.stack.push(file);
            let spliced = self.splice(directives, depth);
            self.stack.pop();
            out.extend(spliced?);
        }
        Ok(out)
    }
}
