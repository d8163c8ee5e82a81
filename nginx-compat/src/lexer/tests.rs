use std::path::Path;
use std::sync::Arc;

use super::*;

fn parse(src: &str) -> Result<Vec<Directive>> {
    parse_file(
        src.as_bytes(),
        Arc::from(Path::new("/etc/nginx/nginx.conf")),
    )
}

/// Each directive as its words, blocks flattened after their directive.
fn words(src: &str) -> Vec<Vec<String>> {
    fn walk(ds: &[Directive], out: &mut Vec<Vec<String>>) {
        for d in ds {
            let mut w = vec![d.name.clone()];
            w.extend(d.args.iter().cloned());
            out.push(w);
            if let Some(b) = &d.block {
                walk(b, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(&parse(src).unwrap(), &mut out);
    out
}

fn err(src: &str) -> String {
    parse(src).unwrap_err().to_string()
}

fn w(ws: &[&str]) -> Vec<String> {
    ws.iter().map(|s| s.to_string()).collect()
}

#[test]
fn statements_and_blocks() {
    let ds = parse("a b c;\nd {\n  e;\n  f { }\n}\n").unwrap();
    assert_eq!(ds.len(), 2);
    assert_eq!(ds[0].name, "a");
    assert_eq!(ds[0].args, w(&["b", "c"]));
    assert!(ds[0].block.is_none());
    let inner = ds[1].block.as_ref().unwrap();
    assert_eq!(inner.len(), 2);
    assert_eq!(inner[1].block.as_deref(), Some(&[][..]));
}

#[test]
fn words_end_at_semicolon_and_brace_without_space() {
    assert_eq!(
        words("a b;c{d;}"),
        vec![w(&["a", "b"]), w(&["c"]), w(&["d"])]
    );
}

#[test]
fn closing_brace_inside_a_word_is_part_of_it() {
    // nginx ends words only at space, `;` and `{`.
    assert_eq!(words("a b};"), vec![w(&["a", "b}"])]);
}

#[test]
fn comments_only_where_a_word_starts() {
    let src = "# leading\na 1; # trailing\nb c#d \"#e\";\nf # in the middle\n  g;";
    assert_eq!(
        words(src),
        vec![w(&["a", "1"]), w(&["b", "c#d", "#e"]), w(&["f", "g"])]
    );
}

#[test]
fn quotes_group_words_and_may_be_empty() {
    assert_eq!(
        words("a \"x y\" 'z ; w' \"\";"),
        vec![w(&["a", "x y", "z ; w", ""])]
    );
    // A quote inside a word is an ordinary character.
    assert_eq!(words("a b\"c;"), vec![w(&["a", "b\"c"])]);
    // A quoted word may end the statement or open a block directly.
    assert_eq!(
        words("a \"b\";c 'd'{}"),
        vec![w(&["a", "b"]), w(&["c", "d"])]
    );
}

#[test]
fn quoted_word_followed_by_paren_starts_a_new_word() {
    assert_eq!(words("x \"a\") ;"), vec![w(&["x", "a", ")"])]);
}

#[test]
fn text_right_after_a_closing_quote_is_an_error() {
    assert_eq!(
        err("a \"b\"c;"),
        "unexpected \"c\" in /etc/nginx/nginx.conf:1"
    );
}

#[test]
fn escapes_as_nginx_copies_them() {
    // Only \" \' \\ \t \r \n are rewritten; `\ ` and `\;` keep their
    // backslash but do not end the word.
    let got = words(r#"a "q\"t" 'q\'t' b\ c "\t|\n|\r" "\x" "\\" \;;"#);
    assert_eq!(
        got,
        vec![w(&[
            "a", "q\"t", "q't", "b\\ c", "\t|\n|\r", "\\x", "\\", "\\;"
        ])]
    );
}

#[test]
fn variables_are_literal_and_braces_after_dollar_do_not_open_blocks() {
    assert_eq!(
        words("a ${host}x $var \"$v{\";"),
        vec![w(&["a", "${host}x", "$var", "$v{"])]
    );
}

#[test]
fn line_numbers_count_lf_and_name_the_first_word() {
    let ds = parse("\n\n# c\nfirst\n  arg;\r\nsecond 'multi\nline';\nthird;").unwrap();
    let lines: Vec<u32> = ds.iter().map(|d| d.span.line).collect();
    assert_eq!(lines, vec![4, 6, 8]);
    assert_eq!(ds[1].args, w(&["multi\nline"]));
}

#[test]
fn syntax_errors_with_nginx_wording_and_line() {
    assert_eq!(err("\n;"), "unexpected \";\" in /etc/nginx/nginx.conf:2");
    assert_eq!(err("{ }"), "unexpected \"{\" in /etc/nginx/nginx.conf:1");
    assert_eq!(err("a;\n}"), "unexpected \"}\" in /etc/nginx/nginx.conf:2");
    assert_eq!(err("a b }"), "unexpected \"}\" in /etc/nginx/nginx.conf:1");
    assert_eq!(
        err("http {\n a;\n"),
        "unexpected end of file, expecting \"}\" in /etc/nginx/nginx.conf:3"
    );
    assert_eq!(
        err("a b"),
        "unexpected end of file, expecting \";\" or \"}\" in /etc/nginx/nginx.conf:1"
    );
}

#[test]
fn unterminated_quotes_run_to_end_of_file() {
    assert_eq!(
        err("a \"b;\nc;\n"),
        "unexpected end of file, expecting \";\" or \"}\" in /etc/nginx/nginx.conf:3"
    );
    assert_eq!(
        err("a 'b;"),
        "unexpected end of file, expecting \";\" or \"}\" in /etc/nginx/nginx.conf:1"
    );
    // A backslash at the very end escapes nothing but still leaves a word open.
    assert!(err("a \\").starts_with("unexpected end of file"));
}

#[test]
fn comment_at_end_of_file_is_fine() {
    assert_eq!(words("a;\n# last"), vec![w(&["a"])]);
}

#[test]
fn words_longer_than_nginx_buffer_are_rejected() {
    let ok = format!("a {};", "x".repeat(4000));
    assert!(parse(&ok).is_ok());
    let long = format!("a {};", "x".repeat(5000));
    assert_eq!(
        err(&long),
        "too long parameter \"xxxxxxxxxx...\" started in /etc/nginx/nginx.conf:1"
    );
    let quoted = format!("a \"{};\n", "y".repeat(5000));
    assert_eq!(
        err(&quoted),
        "too long parameter, probably missing terminating \"\"\" character in /etc/nginx/nginx.conf:1"
    );
    // The same holds for comments: nginx keeps a comment in its buffer too.
    let comment = format!("#{}\na;", "c".repeat(5000));
    assert!(err(&comment).starts_with("too long parameter \"#cccccccc"));
    // At the very end of the file the buffer is not refilled: nginx reports EOF.
    let at_eof = format!("a {}", "x".repeat(4096));
    assert!(err(&at_eof).starts_with("unexpected end of file"));
}

#[test]
fn crlf_and_tabs_are_space() {
    assert_eq!(words("a\tb\r\nc;\r\n"), vec![w(&["a", "b", "c"])]);
}

#[test]
fn nesting_is_bounded() {
    let deep = format!(
        "{}{}",
        "a {".repeat(limits::MAX_DEPTH + 1),
        "}".repeat(limits::MAX_DEPTH + 1)
    );
    assert!(matches!(parse(&deep), Err(Error::LimitExceeded { .. })));
    let fine = format!(
        "{}{}",
        "a {".repeat(limits::MAX_DEPTH),
        "}".repeat(limits::MAX_DEPTH)
    );
    assert!(parse(&fine).is_ok());
}

#[test]
fn non_utf8_bytes_do_not_break_parsing() {
    let ds = parse_file(b"a \xff\xfe;\n# \xc3\n", Arc::from(Path::new("x"))).unwrap();
    assert_eq!(ds.len(), 1);
    assert_eq!(ds[0].args.len(), 1);
}
