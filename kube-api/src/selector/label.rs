//! Label selectors, parsed as `k8s.io/apimachinery/pkg/labels` parses them: the same
//! lexer (ASCII whitespace only, keywords that are identifiers where a value is
//! expected), the same error wording, the same validation of keys and values.

use std::collections::BTreeSet;

use serde_json::Value;

use super::Error;

/// Parser steps fail with the server's message; [`LabelSelector::parse`] wraps it.
type Result<T, E = String> = std::result::Result<T, E>;

#[derive(Debug, Clone, PartialEq)]
enum Op {
    Exists,
    DoesNotExist,
    Equals,
    NotEquals,
    In,
    NotIn,
    GreaterThan,
    LessThan,
}

#[derive(Debug, Clone, PartialEq)]
struct Requirement {
    key: String,
    op: Op,
    values: BTreeSet<String>,
}

/// A parsed `labelSelector`; all requirements must hold.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    In,
    NotIn,
    Not,
    Eq,
    DoubleEq,
    NotEq,
    Gt,
    Lt,
    Open,
    Close,
    Comma,
    End,
}

impl Tok {
    fn literal(&self) -> String {
        match self {
            Tok::Ident(s) => s.clone(),
            Tok::In => "in".into(),
            Tok::NotIn => "notin".into(),
            Tok::Not => "!".into(),
            Tok::Eq => "=".into(),
            Tok::DoubleEq => "==".into(),
            Tok::NotEq => "!=".into(),
            Tok::Gt => ">".into(),
            Tok::Lt => "<".into(),
            Tok::Open => "(".into(),
            Tok::Close => ")".into(),
            Tok::Comma => ",".into(),
            Tok::End => String::new(),
        }
    }
}

/// The Go lexer's whitespace: ASCII only, so a non-breaking or other Unicode space is
/// part of an identifier (and then an invalid key or value), not a separator.
fn is_whitespace(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\r' | '\n')
}

fn is_special(c: char) -> bool {
    matches!(c, '=' | '!' | '(' | ')' | ',' | '>' | '<')
}

fn lex(input: &str) -> Vec<Tok> {
    let chars: Vec<char> = input.chars().collect();
    let mut i = 0;
    let mut out = Vec::new();
    loop {
        while i < chars.len() && is_whitespace(chars[i]) {
            i += 1;
        }
        if i >= chars.len() {
            out.push(Tok::End);
            return out;
        }
        let c = chars[i];
        if is_special(c) {
            // Longest valid symbol, as the Go lexer scans it.
            let two: String = chars[i..(i + 2).min(chars.len())].iter().collect();
            let (tok, len) = match two.as_str() {
                "==" => (Tok::DoubleEq, 2),
                "!=" => (Tok::NotEq, 2),
                _ => match c {
                    '=' => (Tok::Eq, 1),
                    '!' => (Tok::Not, 1),
                    '(' => (Tok::Open, 1),
                    ')' => (Tok::Close, 1),
                    ',' => (Tok::Comma, 1),
                    '>' => (Tok::Gt, 1),
                    _ => (Tok::Lt, 1),
                },
            };
            out.push(tok);
            i += len;
        } else {
            let start = i;
            while i < chars.len() && !is_whitespace(chars[i]) && !is_special(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            out.push(match word.as_str() {
                "in" => Tok::In,
                "notin" => Tok::NotIn,
                _ => Tok::Ident(word),
            });
        }
    }
}

struct Parser {
    toks: Vec<Tok>,
    pos: usize,
}

impl Parser {
    /// Next token; in the `Values` context the keywords are plain identifiers.
    fn lookahead(&self, values: bool) -> Tok {
        let tok = self.toks.get(self.pos).cloned().unwrap_or(Tok::End);
        match tok {
            Tok::In | Tok::NotIn if values => Tok::Ident(tok.literal()),
            t => t,
        }
    }

    fn consume(&mut self, values: bool) -> Tok {
        let tok = self.lookahead(values);
        if self.pos < self.toks.len() {
            self.pos += 1;
        }
        tok
    }

    fn parse(&mut self) -> Result<Vec<Requirement>> {
        let mut reqs = Vec::new();
        loop {
            match self.lookahead(true) {
                Tok::Ident(_) | Tok::Not => {
                    let r = self
                        .requirement()
                        .map_err(|e| format!("unable to parse requirement: {e}"))?;
                    reqs.push(r);
                    match self.consume(true) {
                        Tok::End => return Ok(reqs),
                        Tok::Comma => match self.lookahead(true) {
                            Tok::Ident(_) | Tok::Not => {}
                            t => {
                                return Err(format!(
                                    "found '{}', expected: identifier after ','",
                                    t.literal()
                                ));
                            }
                        },
                        t => {
                            return Err(format!(
                                "found '{}', expected: ',' or 'end of string'",
                                t.literal()
                            ));
                        }
                    }
                }
                Tok::End => return Ok(reqs),
                t => {
                    return Err(format!(
                        "found '{}', expected: !, identifier, or 'end of string'",
                        t.literal()
                    ));
                }
            }
        }
    }

    fn requirement(&mut self) -> Result<Requirement> {
        let mut op = None;
        let mut tok = self.consume(true);
        if tok == Tok::Not {
            op = Some(Op::DoesNotExist);
            tok = self.consume(true);
        }
        let Tok::Ident(key) = tok else {
            return Err(format!("found '{}', expected: identifier", tok.literal()));
        };
        validate_key(&key)?;
        if matches!(self.lookahead(true), Tok::End | Tok::Comma) && op.is_none() {
            op = Some(Op::Exists);
        }
        if let Some(op) = op {
            return Ok(Requirement {
                key,
                op,
                values: BTreeSet::new(),
            });
        }
        let op = match self.consume(false) {
            Tok::In => Op::In,
            Tok::NotIn => Op::NotIn,
            Tok::Eq | Tok::DoubleEq => Op::Equals,
            Tok::NotEq => Op::NotEquals,
            Tok::Gt => Op::GreaterThan,
            Tok::Lt => Op::LessThan,
            t => {
                return Err(format!(
                    "found '{}', expected: in, notin, =, ==, !=, gt, lt",
                    t.literal()
                ));
            }
        };
        let values = match op {
            Op::In | Op::NotIn => self.set_values()?,
            _ => self.exact_value()?,
        };
        validate_values(&key, &values, &op)?;
        Ok(Requirement { key, op, values })
    }

    fn exact_value(&mut self) -> Result<BTreeSet<String>> {
        if matches!(self.lookahead(true), Tok::End | Tok::Comma) {
            return Ok(BTreeSet::from([String::new()]));
        }
        match self.consume(true) {
            Tok::Ident(v) => Ok(BTreeSet::from([v])),
            t => Err(format!("found '{}', expected: identifier", t.literal())),
        }
    }

    fn set_values(&mut self) -> Result<BTreeSet<String>> {
        let t = self.consume(true);
        if t != Tok::Open {
            return Err(format!("found '{}' expected: '('", t.literal()));
        }
        match self.lookahead(true) {
            Tok::Ident(_) | Tok::Comma => {
                let set = self.identifiers()?;
                let t = self.consume(true);
                if t != Tok::Close {
                    return Err(format!("found '{}', expected: ')'", t.literal()));
                }
                Ok(set)
            }
            Tok::Close => {
                self.consume(true);
                Ok(BTreeSet::from([String::new()]))
            }
            t => Err(format!(
                "found '{}', expected: ',', ')' or identifier",
                t.literal()
            )),
        }
    }

    fn identifiers(&mut self) -> Result<BTreeSet<String>> {
        let mut set = BTreeSet::new();
        loop {
            match self.consume(true) {
                Tok::Ident(v) => {
                    set.insert(v);
                    match self.lookahead(true) {
                        Tok::Comma => continue,
                        Tok::Close => return Ok(set),
                        t => {
                            return Err(format!("found '{}', expected: ',' or ')'", t.literal()));
                        }
                    }
                }
                Tok::Comma => {
                    if set.is_empty() {
                        set.insert(String::new());
                    }
                    match self.lookahead(true) {
                        Tok::Close => {
                            set.insert(String::new());
                            return Ok(set);
                        }
                        Tok::Comma => {
                            self.consume(true);
                            set.insert(String::new());
                        }
                        _ => {}
                    }
                }
                t => {
                    return Err(format!(
                        "found '{}', expected: ',', or identifier",
                        t.literal()
                    ));
                }
            }
        }
    }
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
}

fn valid_name_part(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars().all(is_name_char)
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
}

fn validate_key(key: &str) -> Result<()> {
    let name = match key.split_once('/') {
        Some((prefix, name)) => {
            let ok = !prefix.is_empty()
                && prefix.len() <= 253
                && prefix.split('.').all(|l| {
                    !l.is_empty()
                        && l.chars()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                        && !l.starts_with('-')
                        && !l.ends_with('-')
                });
            if !ok {
                return Err(format!(
                    "key: Invalid value: {key:?}: prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
                ));
            }
            name
        }
        None => key,
    };
    if !valid_name_part(name) {
        return Err(format!(
            "key: Invalid value: {key:?}: name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
        ));
    }
    Ok(())
}

/// `NewRequirement`'s checks of the values: integers for `gt`/`lt`, then label-value
/// syntax for each, reported together as an aggregate when more than one fails.
fn validate_values(key: &str, values: &BTreeSet<String>, op: &Op) -> Result<()> {
    let mut errs = Vec::new();
    if matches!(op, Op::GreaterThan | Op::LessThan) {
        for (i, value) in values.iter().enumerate() {
            if value.parse::<i64>().is_err() {
                errs.push(format!(
                    "values[{i}]: Invalid value: {value:?}: for 'Gt', 'Lt' operators, the value must be an integer"
                ));
            }
        }
    }
    for (i, value) in values.iter().enumerate() {
        if !value.is_empty() && !valid_name_part(value) {
            errs.push(format!(
                "values[{i}][{key}]: Invalid value: {value:?}: a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
            ));
        }
    }
    // `utilerrors.Aggregate`: one error as itself, several as a bracketed list.
    match errs.len() {
        0 => Ok(()),
        1 => Err(errs.remove(0)),
        _ => Err(format!("[{}]", errs.join(", "))),
    }
}

impl LabelSelector {
    /// Parses a `labelSelector`; the empty string selects everything.
    pub fn parse(input: &str) -> Result<Self, Error> {
        let mut parser = Parser {
            toks: lex(input),
            pos: 0,
        };
        Ok(LabelSelector {
            requirements: parser.parse().map_err(Error::InvalidLabelSelector)?,
        })
    }

    /// Whether this selector selects everything.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Whether the labels of `obj` satisfy every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = &obj["metadata"]["labels"];
        self.matches_with(|key| labels.get(key).and_then(Value::as_str))
    }

    /// Whether the labels `label` looks up by key satisfy every requirement:
    /// for callers that keep labels apart from a parsed object (the sidecar's
    /// cache keeps objects as JSON text).
    pub fn matches_with<'a>(&self, label: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.requirements.iter().all(|r| {
            let value = label(&r.key);
            match r.op {
                Op::Exists => value.is_some(),
                Op::DoesNotExist => value.is_none(),
                Op::Equals | Op::In => value.is_some_and(|v| r.values.contains(v)),
                Op::NotEquals | Op::NotIn => value.is_none_or(|v| !r.values.contains(v)),
                Op::GreaterThan | Op::LessThan => {
                    let (Some(have), Some(want)) = (
                        value.and_then(|v| v.parse::<i64>().ok()),
                        r.values.iter().next().and_then(|v| v.parse::<i64>().ok()),
                    ) else {
                        return false;
                    };
                    if r.op == Op::GreaterThan {
                        have > want
                    } else {
                        have < want
                    }
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "x", "labels": labels}})
    }

    fn sel(s: &str) -> LabelSelector {
        LabelSelector::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn equality_requirements() {
        let o = obj(json!({"app": "web", "tier": "front"}));
        assert!(sel("app=web").matches(&o));
        assert!(sel("app==web").matches(&o));
        assert!(!sel("app!=web").matches(&o));
        assert!(sel("app!=api").matches(&o));
        assert!(sel("missing!=x").matches(&o));
        assert!(sel("app=web,tier=front").matches(&o));
        assert!(!sel("app=web,tier=back").matches(&o));
        assert!(sel("").matches(&o));
    }

    #[test]
    fn set_requirements() {
        let o = obj(json!({"app": "web", "env": "prod"}));
        assert!(sel("app in (web,api)").matches(&o));
        assert!(!sel("app in (api)").matches(&o));
        assert!(sel("app notin (api, db)").matches(&o));
        assert!(!sel("app notin (web)").matches(&o));
        assert!(sel("env").matches(&o));
        assert!(!sel("!env").matches(&o));
        assert!(sel("!missing").matches(&o));
        assert!(sel("app in (web), !missing, env").matches(&o));
        // Keywords are identifiers where a value is expected.
        assert!(!sel("app in (in, notin)").matches(&o));
    }

    #[test]
    fn errors_use_the_real_wording() {
        let err = |s: &str| LabelSelector::parse(s).unwrap_err().to_string();
        assert_eq!(
            err("app in ("),
            "unable to parse requirement: found '', expected: ',', ')' or identifier"
        );
        assert_eq!(
            err("app in (a b)"),
            "unable to parse requirement: found 'b', expected: ',' or ')'"
        );
        assert_eq!(
            err("=x"),
            "found '=', expected: !, identifier, or 'end of string'"
        );
        assert_eq!(err("a=b,"), "found '', expected: identifier after ','");
        assert_eq!(
            err("a x"),
            "unable to parse requirement: found 'x', expected: in, notin, =, ==, !=, gt, lt"
        );
        assert!(err("a=b c").starts_with("found 'c'"));
        assert!(err("a=@@").contains("Invalid value"));
    }

    // From the sidecar's facade.

    fn obj_in_demo(labels: Value) -> Value {
        json!({"metadata": {"name": "n1", "namespace": "demo", "labels": labels}})
    }

    #[test]
    fn label_operators_match() {
        let o = obj_in_demo(json!({"app": "web", "tier": "front", "n": "5"}));
        let yes = [
            "",
            "app=web",
            "app==web",
            "app!=db",
            "app in (web,db)",
            "app notin (db)",
            "app",
            "!missing",
            "app=web,tier=front",
            "missing!=x",
            "n>3",
            "n<6",
            " app = web , tier in ( front ) ",
        ];
        for s in yes {
            assert!(LabelSelector::parse(s).unwrap().matches(&o), "{s}");
        }
        let no = [
            "app=db",
            "app!=web",
            "app in (db)",
            "app notin (web)",
            "missing",
            "!app",
            "app=web,tier=back",
            "n>5",
            "missing in (x)",
        ];
        for s in no {
            assert!(!LabelSelector::parse(s).unwrap().matches(&o), "{s}");
        }
    }

    #[test]
    fn label_errors_are_worded_like_the_api_server() {
        // The fixture kube-sim/fixtures/errors/400-badselector.json.
        assert_eq!(
            LabelSelector::parse("app in (").unwrap_err().to_string(),
            "unable to parse requirement: found '', expected: ',', ')' or identifier"
        );
        assert!(LabelSelector::parse("app=web,").is_err());
        assert!(LabelSelector::parse("=x").is_err());
        assert!(LabelSelector::parse("app in web").is_err());
        assert!(LabelSelector::parse("app >x").is_err());
        assert!(LabelSelector::parse("app=web)").is_err());
        assert!(LabelSelector::parse("a=b=c").is_err());
        assert!(LabelSelector::parse("-bad=x").is_err());
    }

    // Where the two earlier versions differed, apimachinery's wording.
    #[test]
    fn value_errors_name_the_path_as_apimachinery_does() {
        let err = |s: &str| LabelSelector::parse(s).unwrap_err().to_string();
        assert_eq!(
            err("n>x"),
            "unable to parse requirement: values[0]: Invalid value: \"x\": for 'Gt', 'Lt' operators, the value must be an integer"
        );
        assert!(err("app=-x").starts_with(
            "unable to parse requirement: values[0][app]: Invalid value: \"-x\": a valid label"
        ));
        assert!(err("n>-x").starts_with(
            "unable to parse requirement: [values[0]: Invalid value: \"-x\": for 'Gt', 'Lt'"
        ));
        // `!k` takes no operator; the parser, not the requirement, refuses what follows.
        assert_eq!(err("!a=b"), "found '=', expected: ',' or 'end of string'");
        assert!(
            err("-bad=x").starts_with(
                "unable to parse requirement: key: Invalid value: \"-bad\": name part"
            )
        );
        assert!(err("Ex.com/a=x").starts_with(
            "unable to parse requirement: key: Invalid value: \"Ex.com/a\": prefix part"
        ));
    }

    #[test]
    fn only_ascii_whitespace_separates() {
        // The Go lexer reads bytes and skips only ' ', '\t', '\r' and '\n'.
        assert!(sel(" \tapp\r\n=\nweb ").matches(&obj(json!({"app": "web"}))));
        assert!(LabelSelector::parse("\u{202f}").is_err());
        assert!(LabelSelector::parse("app=web\u{a0}").is_err());
    }

    proptest! {
        #[test]
        fn parser_never_panics(s in ".{0,64}") {
            let _ = LabelSelector::parse(&s);
        }

        #[test]
        fn parser_never_panics_on_selector_alphabet(s in "[a-z!=(),<> in]{0,40}") {
            if let Ok(sel) = LabelSelector::parse(&s) {
                let _ = sel.matches(&obj(json!({"a": "b"})));
            }
        }

        #[test]
        fn label_parser_never_panics(s in "\\PC{0,40}") {
            let _ = LabelSelector::parse(&s);
        }

        #[test]
        fn label_parser_never_panics_on_selector_alphabet(s in "[a-z!=(), <>in]{0,30}") {
            if let Ok(sel) = LabelSelector::parse(&s) {
                let _ = sel.matches(&obj_in_demo(json!({"a": "b"})));
            }
        }

        #[test]
        fn equality_roundtrip(k in "[a-z][a-z0-9]{0,8}", v in "[a-z][a-z0-9]{0,8}") {
            let sel = LabelSelector::parse(&format!("{k}={v}")).unwrap();
            let labels = obj_in_demo(json!({ k.clone(): v.clone() }));
            prop_assert!(sel.matches(&labels));
            let sel = LabelSelector::parse(&format!("{k}!={v}")).unwrap();
            prop_assert!(!sel.matches(&labels));
        }
    }
}
