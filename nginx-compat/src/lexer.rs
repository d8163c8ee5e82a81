//! nginx's tokenizer and block reader, state for state: [`parse_file`] is
//! `ngx_conf_parse` over one file and [`Lexer::read_token`] is
//! `ngx_conf_read_token`.
//!
//! What nginx does, and so what this does:
//! - A word ends at space, tab, CR, LF, `;` or `{`. `}` ends nothing: `a}` is
//!   one word, and `}` is a block end only where a word could start.
//! - `#` starts a comment only where a word could start (`a#b` is one word).
//! - `"…"` and `'…'` quote only at the start of a word, and the closing quote
//!   must be followed by space, `;`, `{` or `)`.
//! - `\x` keeps `x` from ending a word or a quoted string; when the word is
//!   stored, `\"`, `\'` and `\\` lose the backslash, `\t` `\r` `\n` become the
//!   control characters, and any other `\x` stays as it is.
//! - `$` is not expanded; `${` … `}` keeps `{` from ending the word.
//! - A word (or a comment) that would not fit nginx's 4096-byte read buffer is
//!   "too long parameter", as it is for nginx.

use std::path::Path;
use std::sync::Arc;

use crate::ast::Directive;
use crate::error::{Error, Result, Span};
use crate::limits;

/// nginx's `NGX_CONF_BUFFER`: a token must fit in it.
const NGX_CONF_BUFFER: usize = 4096;

/// One word of a directive, unescaped, with the line it started on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Word {
    pub(crate) value: String,
    pub(crate) line: u32,
}

/// What `ngx_conf_read_token` returns.
#[derive(Debug)]
pub(crate) enum Event {
    /// Words ended by `;` (`block == false`) or `{` (`block == true`).
    Statement { words: Vec<Word>, block: bool },
    /// A `}` where a word could start.
    BlockDone,
    /// The end of the input, outside any word.
    FileDone,
}

/// The tokenizer over one file's bytes.
pub(crate) struct Lexer<'a> {
    src: &'a [u8],
    pos: usize,
    line: u32,
    file: Arc<Path>,
}

fn is_space(ch: u8) -> bool {
    matches!(ch, b' ' | b'\t' | b'\r' | b'\n')
}

impl<'a> Lexer<'a> {
    pub(crate) fn new(src: &'a [u8], file: Arc<Path>) -> Self {
        Self {
            src,
            pos: 0,
            line: 1,
            file,
        }
    }

    fn span(&self, line: u32) -> Span {
        Span::new(self.file.clone(), line)
    }

    fn syntax(&self, message: String, line: u32) -> Error {
        Error::Syntax {
            message,
            span: self.span(line),
        }
    }

    /// The next statement, block end or end of file.
    pub(crate) fn read_token(&mut self) -> Result<Event> {
        let mut words: Vec<Word> = Vec::new();
        let mut need_space = false;
        let mut last_space = true;
        let mut sharp_comment = false;
        let mut variable = false;
        let mut quoted = false;
        let mut s_quoted = false;
        let mut d_quoted = false;
        let mut start = self.pos;
        let mut start_line = self.line;

        loop {
            let Some(&ch) = self.src.get(self.pos) else {
                if !words.is_empty() || !last_space {
                    return Err(self.syntax(
                        "unexpected end of file, expecting \";\" or \"}\"".into(),
                        self.line,
                    ));
                }
                return Ok(Event::FileDone);
            };
            // nginx refills its buffer exactly when a pending token has filled
            // it; see the module docs.
            if self.pos - start >= NGX_CONF_BUFFER {
                let message = if d_quoted {
                    "too long parameter, probably missing terminating \"\"\" character".to_string()
                } else if s_quoted {
                    "too long parameter, probably missing terminating \"'\" character".to_string()
                } else {
                    let head = &self.src[start..start + 10];
                    format!(
                        "too long parameter \"{}...\" started",
                        String::from_utf8_lossy(head)
                    )
                };
                return Err(self.syntax(message, start_line));
            }
            self.pos += 1;

            if ch == b'\n' {
                self.line = self.line.saturating_add(1);
                sharp_comment = false;
            }
            if sharp_comment {
                continue;
            }
            if quoted {
                quoted = false;
                continue;
            }
            if need_space {
                if is_space(ch) {
                    last_space = true;
                    need_space = false;
                    continue;
                }
                match ch {
                    b';' => {
                        return Ok(Event::Statement {
                            words,
                            block: false,
                        });
                    }
                    b'{' => return Ok(Event::Statement { words, block: true }),
                    // `if ($a = "b")`: the `)` starts the next word.
                    b')' => {
                        last_space = true;
                        need_space = false;
                    }
                    _ => {
                        return Err(
                            self.syntax(format!("unexpected \"{}\"", char::from(ch)), self.line)
                        );
                    }
                }
            }

            if last_space {
                start = self.pos - 1;
                start_line = self.line;
                if is_space(ch) {
                    continue;
                }
                match ch {
                    b';' | b'{' => {
                        if words.is_empty() {
                            return Err(self
                                .syntax(format!("unexpected \"{}\"", char::from(ch)), self.line));
                        }
                        return Ok(Event::Statement {
                            words,
                            block: ch == b'{',
                        });
                    }
                    b'}' => {
                        if !words.is_empty() {
                            return Err(self.syntax("unexpected \"}\"".into(), self.line));
                        }
                        return Ok(Event::BlockDone);
                    }
                    b'#' => {
                        sharp_comment = true;
                        continue;
                    }
                    b'\\' => {
                        quoted = true;
                        last_space = false;
                        continue;
                    }
                    b'"' => {
                        start += 1;
                        d_quoted = true;
                        last_space = false;
                        continue;
                    }
                    b'\'' => {
                        start += 1;
                        s_quoted = true;
                        last_space = false;
                        continue;
                    }
                    b'$' => {
                        variable = true;
                        last_space = false;
                        continue;
                    }
                    _ => last_space = false,
                }
            } else {
                if ch == b'{' && variable {
                    continue;
                }
                variable = false;
                if ch == b'\\' {
                    quoted = true;
                    continue;
                }
                if ch == b'$' {
                    variable = true;
                    continue;
                }
                let mut found = false;
                if d_quoted {
                    if ch == b'"' {
                        d_quoted = false;
                        need_space = true;
                        found = true;
                    }
                } else if s_quoted {
                    if ch == b'\'' {
                        s_quoted = false;
                        need_space = true;
                        found = true;
                    }
                } else if is_space(ch) || ch == b';' || ch == b'{' {
                    last_space = true;
                    found = true;
                }
                if found {
                    if words.len() >= limits::MAX_WORDS {
                        return Err(Error::LimitExceeded {
                            message: format!(
                                "more than {} words in one directive",
                                limits::MAX_WORDS
                            ),
                            span: Some(self.span(start_line)),
                        });
                    }
                    words.push(Word {
                        value: unescape(&self.src[start..self.pos - 1]),
                        line: start_line,
                    });
                    match ch {
                        b';' => {
                            return Ok(Event::Statement {
                                words,
                                block: false,
                            });
                        }
                        b'{' => return Ok(Event::Statement { words, block: true }),
                        _ => {}
                    }
                }
            }
        }
    }
}

/// The copy loop of `ngx_conf_read_token`.
fn unescape(raw: &[u8]) -> String {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while let Some(&b) = raw.get(i) {
        if b == b'\\' {
            match raw.get(i + 1) {
                Some(b'"' | b'\'' | b'\\') => i += 1,
                Some(b't') => {
                    out.push(b'\t');
                    i += 2;
                    continue;
                }
                Some(b'r') => {
                    out.push(b'\r');
                    i += 2;
                    continue;
                }
                Some(b'n') => {
                    out.push(b'\n');
                    i += 2;
                    continue;
                }
                _ => {}
            }
        }
        if let Some(&c) = raw.get(i) {
            out.push(c);
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Reads a whole file into directives: `ngx_conf_parse` with its three
/// outcomes (`;`, block start, block end) checked the way nginx checks them.
pub(crate) fn parse_file(src: &[u8], file: Arc<Path>) -> Result<Vec<Directive>> {
    if src.len() > limits::MAX_FILE_BYTES {
        return Err(Error::LimitExceeded {
            message: format!(
                "{} is larger than {} bytes",
                file.display(),
                limits::MAX_FILE_BYTES
            ),
            span: None,
        });
    }
    let mut lexer = Lexer::new(src, file);
    let mut count = 0usize;
    parse_block(&mut lexer, 0, &mut count)
}

fn parse_block(lexer: &mut Lexer<'_>, depth: usize, count: &mut usize) -> Result<Vec<Directive>> {
    let mut out = Vec::new();
    loop {
        match lexer.read_token()? {
            Event::FileDone => {
                if depth > 0 {
                    return Err(
                        lexer.syntax("unexpected end of file, expecting \"}\"".into(), lexer.line)
                    );
                }
                return Ok(out);
            }
            Event::BlockDone => {
                if depth == 0 {
                    return Err(lexer.syntax("unexpected \"}\"".into(), lexer.line));
                }
                return Ok(out);
            }
            Event::Statement { words, block } => {
                *count += 1;
                let mut words = words.into_iter();
                // read_token returns a statement only with at least one word.
                let Some(name) = words.next() else {
                    return Err(lexer.syntax("unexpected \";\"".into(), lexer.line));
                };
                let span = lexer.span(name.line);
                if *count > limits::MAX_DIRECTIVES {
                    return Err(Error::LimitExceeded {
                        message: format!("more than {} directives", limits::MAX_DIRECTIVES),
                        span: Some(span),
                    });
                }
                let children = if block {
                    if depth + 1 > limits::MAX_DEPTH {
                        return Err(Error::LimitExceeded {
                            message: format!("blocks nested deeper than {}", limits::MAX_DEPTH),
                            span: Some(span),
                        });
                    }
                    Some(parse_block(lexer, depth + 1, count)?)
                } else {
                    None
                };
                out.push(Directive {
                    name: name.value,
                    args: words.map(|w| w.value).collect(),
                    span,
                    block: children,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests;
