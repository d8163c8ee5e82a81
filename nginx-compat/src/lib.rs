//! nginx configuration, as operators already write it for Spinnaker's
//! ingress (Deck, Gate, the agents' gRPC port), read into a typed
//! [`Ingress`] the gateway can serve.
//!
//! Start at [`load`] (a file and its includes) or [`parse_str`] (text, no
//! includes). The flow, one module per step:
//!
//! 1. `lexer` (private) — nginx's tokenizer and block reader, state
//!    for state (`ngx_conf_read_token`, `ngx_conf_parse`): comments, quotes,
//!    escapes, `{ } ;`, variables left literal, line numbers.
//! 2. [`ast`] — the tree, and `include` resolution relative to the conf
//!    prefix (glob patterns included).
//! 3. [`directives`] — which directive is allowed where with how many
//!    arguments; the subset handled, the list accepted and ignored.
//! 4. [`resolve`] — meaning and inheritance, into [`model`].
//!
//! Input is untrusted: nothing here panics on it, and size, nesting and
//! include depth are bounded ([`limits`]).

#![forbid(unsafe_code)]

pub mod ast;
pub mod directives;
pub mod error;
mod lexer;
pub mod model;
pub mod resolve;
mod values;

use std::path::{Path, PathBuf};

pub use ast::{Ast, Directive, FileSystem, MemorySource, Source};
pub use error::{Error, Result, Span, Warning};
pub use model::*;

/// Bounds on untrusted input.
pub mod limits {
    /// Largest configuration file read, main or included.
    pub const MAX_FILE_BYTES: usize = 16 * 1024 * 1024;
    /// Deepest nesting of blocks, counted across included files.
    pub const MAX_DEPTH: usize = 32;
    /// Deepest nesting of `include`.
    pub const MAX_INCLUDE_DEPTH: usize = 16;
    /// Most files read for one configuration.
    pub const MAX_FILES: usize = 1024;
    /// Most directives in one file.
    pub const MAX_DIRECTIVES: usize = 100_000;
    /// Most words in one directive.
    pub const MAX_WORDS: usize = 1024;
}

/// How to read a configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    /// Skip directives outside the subset (unknown ones included) with a
    /// [`Warning`] instead of failing.
    pub lenient: bool,
    /// The directory relative `include` and certificate paths are joined to.
    /// Default: the directory of the main file, as nginx's conf prefix when
    /// started with `-c FILE`.
    pub conf_prefix: Option<PathBuf>,
}

impl Options {
    /// Strict reading, conf prefix from the main file.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets [`Options::lenient`].
    #[must_use]
    pub fn lenient(mut self, lenient: bool) -> Self {
        self.lenient = lenient;
        self
    }

    /// Sets [`Options::conf_prefix`].
    #[must_use]
    pub fn conf_prefix(mut self, dir: impl Into<PathBuf>) -> Self {
        self.conf_prefix = Some(dir.into());
        self
    }
}

/// A resolved configuration and what was skipped or is worth a look.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    /// The model.
    pub ingress: Ingress,
    /// Directives lenient mode skipped, options accepted but ignored,
    /// conflicting server names.
    pub warnings: Vec<Warning>,
}

/// nginx's conf prefix for a main file: its directory.
pub(crate) fn conf_prefix_of(file: &Path) -> PathBuf {
    file.parent().map(Path::to_path_buf).unwrap_or_default()
}

/// Parses and resolves `src` as the contents of `file` (used in messages and
/// as the conf prefix for certificate paths). Reads no files: an `include`
/// is [`Error::UnresolvedInclude`]. The entry point for fuzzing.
pub fn parse_str(src: &str, file: impl AsRef<Path>, options: &Options) -> Result<Parsed> {
    let ast = Ast::parse(src.as_bytes(), file)?;
    Ingress::from_ast(&ast, options)
}

/// Reads `file` and everything it includes from the file system.
pub fn load(file: impl AsRef<Path>, options: &Options) -> Result<Parsed> {
    load_from(file, options, &FileSystem)
}

/// Reads `file` and everything it includes from `source`.
pub fn load_from(file: impl AsRef<Path>, options: &Options, source: &dyn Source) -> Result<Parsed> {
    let file = file.as_ref();
    let bytes = source.read(file).map_err(|e| Error::ReadFailed {
        path: file.to_path_buf(),
        span: None,
        source: e,
    })?;
    let mut ast = Ast::parse(&bytes, file)?;
    let prefix = options
        .conf_prefix
        .clone()
        .unwrap_or_else(|| conf_prefix_of(file));
    ast.resolve_includes(&prefix, source)?;
    Ingress::from_ast(&ast, options)
}
