//! Label and field selectors as the Kubernetes API server parses them
//! (`k8s.io/apimachinery/pkg/labels` and `.../fields`), with its error wording,
//! and matching of cached objects against them.

use std::collections::BTreeSet;

use serde_json::Value;

/// A selector the API server would refuse; the message is its wording.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Error(pub String);

/// Result with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A label requirement operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `k=v`, `k==v`, `k in (..)`.
    In,
    /// `k!=v`, `k notin (..)`.
    NotIn,
    /// `k`.
    Exists,
    /// `!k`.
    DoesNotExist,
    /// `k>n`.
    Gt,
    /// `k<n`.
    Lt,
}

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    /// The label key.
    pub key: String,
    /// The operator.
    pub op: Op,
    /// The values (one for `=`, `!=`, `gt`, `lt`).
    pub values: BTreeSet<String>,
}

/// A parsed label selector: every requirement must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(pub Vec<Requirement>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Ident(String),
    Comma,
    Open,
    Close,
    Eq,
    DoubleEq,
    NotEq,
    Bang,
    Gt,
    Lt,
    End,
}

impl Tok {
    fn literal(&self) -> &str {
        match self {
            Tok::Ident(s) => s,
            Tok::Comma => ",",
            Tok::Open => "(",
            Tok::Close => ")",
            Tok::Eq => "=",
            Tok::DoubleEq => "==",
            Tok::NotEq => "!=",
            Tok::Bang => "!",
            Tok::Gt => ">",
            Tok::Lt => "<",
            Tok::End => "",
        }
    }
}

fn is_special(c: char) -> bool {
    matches!(c, '=' | '!' | '(' | ')' | ',' | '>' | '<')
}

fn lex(s: &str) -> Vec<Tok> {
    let chars: Vec<char> = s.chars().collect();
    let mut i = 0;
    let mut out = Vec::new();
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if is_special(c) {
            // Longest known symbol wins, as in the Go lexer; every single
            // special character is itself a symbol.
            let two: String = chars[i..(i + 2).min(chars.len())].iter().collect();
            let (tok, len) = match two.as_str() {
                "==" => (Tok::DoubleEq, 2),
                "!=" => (Tok::NotEq, 2),
                _ => (
                    match c {
                        '=' => Tok::Eq,
                        '!' => Tok::Bang,
                        '(' => Tok::Open,
                        ')' => Tok::Close,
                        ',' => Tok::Comma,
                        '>' => Tok::Gt,
                        _ => Tok::Lt,
                    },
                    1,
                ),
            };
            out.push(tok);
            i += len;
        } else {
            let start = i;
            while i < chars.len() && !chars[i].is_whitespace() && !is_special(chars[i]) {
                i += 1;
            }
            out.push(Tok::Ident(chars[start..i].iter().collect()));
        }
    }
    out.push(Tok::End);
    out
}

struct Parser {
    toks: Vec<Tok>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> &Tok {
        self.toks.get(self.pos).unwrap_or(&Tok::End)
    }

    fn next(&mut self) -> Tok {
        let t = self.peek().clone();
        if self.pos < self.toks.len() {
            self.pos += 1;
        }
        t
    }

    fn requirement(&mut self) -> Result<Requirement> {
        let mut tok = self.next();
        let mut op = None;
        if tok == Tok::Bang {
            op = Some(Op::DoesNotExist);
            tok = self.next();
        }
        let Tok::Ident(key) = tok else {
            return Err(Error(format!(
                "found '{}', expected: identifier",
                tok.literal()
            )));
        };
        validate_key(&key)?;
        if matches!(self.peek(), Tok::End | Tok::Comma) {
            return Ok(Requirement {
                key,
                op: op.unwrap_or(Op::Exists),
                values: BTreeSet::new(),
            });
        }
        if op == Some(Op::DoesNotExist) {
            let t = self.next();
            return Err(Error(format!(
                "found '{}', expected: ',' or 'end of string'",
                t.literal()
            )));
        }
        let t = self.next();
        let (op, values) = match &t {
            Tok::Ident(s) if s == "in" => (Op::In, self.values()?),
            Tok::Ident(s) if s == "notin" => (Op::NotIn, self.values()?),
            Tok::Eq | Tok::DoubleEq => (Op::In, self.exact_value()?),
            Tok::NotEq => (Op::NotIn, self.exact_value()?),
            Tok::Gt => (Op::Gt, self.exact_value()?),
            Tok::Lt => (Op::Lt, self.exact_value()?),
            other => {
                return Err(Error(format!(
                    "found '{}', expected: in, notin, =, ==, !=, gt, lt",
                    other.literal()
                )));
            }
        };
        if matches!(op, Op::Gt | Op::Lt) {
            for v in &values {
                if v.parse::<i64>().is_err() {
                    return Err(Error(format!(
                        "for 'Gt', 'Lt' operators, the value must be an integer: {v}"
                    )));
                }
            }
        }
        for v in &values {
            validate_value(v)?;
        }
        Ok(Requirement { key, op, values })
    }

    fn exact_value(&mut self) -> Result<BTreeSet<String>> {
        if matches!(self.peek(), Tok::End | Tok::Comma) {
            return Ok(BTreeSet::from([String::new()]));
        }
        match self.next() {
            Tok::Ident(s) => Ok(BTreeSet::from([s])),
            t => Err(Error(format!(
                "found '{}', expected: identifier",
                t.literal()
            ))),
        }
    }

    fn values(&mut self) -> Result<BTreeSet<String>> {
        let t = self.next();
        if t != Tok::Open {
            return Err(Error(format!("found '{}' expected: '('", t.literal())));
        }
        match self.peek().clone() {
            Tok::Ident(_) | Tok::Comma => {
                let set = self.identifiers()?;
                let t = self.next();
                if t != Tok::Close {
                    return Err(Error(format!("found '{}', expected: ')'", t.literal())));
                }
                Ok(set)
            }
            Tok::Close => {
                self.next();
                Ok(BTreeSet::from([String::new()]))
            }
            t => Err(Error(format!(
                "found '{}', expected: ',', ')' or identifier",
                t.literal()
            ))),
        }
    }

    fn identifiers(&mut self) -> Result<BTreeSet<String>> {
        let mut set = BTreeSet::new();
        loop {
            match self.peek().clone() {
                Tok::Ident(s) => {
                    self.next();
                    set.insert(s);
                    match self.peek() {
                        Tok::Comma => {
                            self.next();
                        }
                        Tok::Close => return Ok(set),
                        t => {
                            return Err(Error(format!(
                                "found '{}', expected: ',' or ')'",
                                t.literal()
                            )));
                        }
                    }
                }
                Tok::Comma => {
                    self.next();
                    set.insert(String::new());
                }
                Tok::Close => {
                    set.insert(String::new());
                    return Ok(set);
                }
                t => {
                    return Err(Error(format!(
                        "found '{}', expected: ',', or identifier",
                        t.literal()
                    )));
                }
            }
        }
    }
}

fn validate_key(key: &str) -> Result<()> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '.'))
    });
    if name_ok && prefix_ok {
        Ok(())
    } else {
        Err(Error(format!(
            "unable to parse requirement: <nil>: Invalid value: \"{key}\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
        )))
    }
}

fn validate_value(v: &str) -> Result<()> {
    let ok = v.is_empty()
        || (v.len() <= 63
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && v.starts_with(|c: char| c.is_ascii_alphanumeric())
            && v.ends_with(|c: char| c.is_ascii_alphanumeric()));
    if ok {
        Ok(())
    } else {
        Err(Error(format!(
            "unable to parse requirement: values[0][{v}]: Invalid value: \"{v}\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
        )))
    }
}

impl LabelSelector {
    /// Parses `labelSelector`; the empty string selects everything.
    pub fn parse(s: &str) -> Result<Self> {
        let mut p = Parser {
            toks: lex(s),
            pos: 0,
        };
        let mut reqs = Vec::new();
        loop {
            match p.peek().clone() {
                Tok::End => return Ok(Self(reqs)),
                Tok::Ident(_) | Tok::Bang => {
                    let r = p.requirement().map_err(|e| {
                        if e.0.starts_with("unable to parse requirement") {
                            e
                        } else {
                            Error(format!("unable to parse requirement: {}", e.0))
                        }
                    })?;
                    reqs.push(r);
                    match p.next() {
                        Tok::End => return Ok(Self(reqs)),
                        Tok::Comma => {
                            if !matches!(p.peek(), Tok::Ident(_) | Tok::Bang) {
                                return Err(Error(format!(
                                    "found '{}', expected: identifier after ','",
                                    p.peek().literal()
                                )));
                            }
                        }
                        t => {
                            return Err(Error(format!(
                                "found '{}', expected: ',' or 'end of string'",
                                t.literal()
                            )));
                        }
                    }
                }
                t => {
                    return Err(Error(format!(
                        "found '{}', expected: !, identifier, or 'end of string'",
                        t.literal()
                    )));
                }
            }
        }
    }

    /// Whether an object's labels satisfy every requirement.
    pub fn matches(&self, object: &Value) -> bool {
        let labels = object.get("metadata").and_then(|m| m.get("labels"));
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r.op {
            Op::Exists => get(&r.key).is_some(),
            Op::DoesNotExist => get(&r.key).is_none(),
            Op::In => get(&r.key).is_some_and(|v| r.values.contains(v)),
            Op::NotIn => get(&r.key).is_none_or(|v| !r.values.contains(v)),
            Op::Gt | Op::Lt => {
                let Some(have) = get(&r.key).and_then(|v| v.parse::<i64>().ok()) else {
                    return false;
                };
                r.values
                    .iter()
                    .filter_map(|v| v.parse::<i64>().ok())
                    .all(|want| {
                        if r.op == Op::Gt {
                            have > want
                        } else {
                            have < want
                        }
                    })
            }
        })
    }
}

/// One term of a field selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldTerm {
    /// The field, e.g. `metadata.name`.
    pub field: String,
    /// `true` for `!=`.
    pub negated: bool,
    /// The value to compare with.
    pub value: String,
}

/// A parsed field selector: every term must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(pub Vec<FieldTerm>);

/// Fields every kind can be selected by.
const COMMON_FIELDS: &[&str] = &["metadata.name", "metadata.namespace"];

/// Extra fields the API server supports per resource (core group).
fn extra_fields(resource: &str) -> &'static [&'static str] {
    match resource {
        "events" => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        "pods" => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        "secrets" => &["type"],
        "namespaces" => &["status.phase"],
        "nodes" => &["spec.unschedulable"],
        "replicasets" | "replicationcontrollers" => &["status.replicas"],
        "jobs" => &["status.successful"],
        _ => &[],
    }
}

fn split_terms(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut escaped = false;
    for c in s.chars() {
        if escaped {
            cur.push('\\');
            cur.push(c);
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == ',' {
            out.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    if escaped {
        cur.push('\\');
    }
    out.push(cur);
    out
}

fn split_term(term: &str) -> Option<(String, bool, String)> {
    let mut escaped = false;
    for (i, c) in term.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        if c == '\\' {
            escaped = true;
            continue;
        }
        for (op, negated) in [("!=", true), ("==", false), ("=", false)] {
            if term[i..].starts_with(op) {
                return Some((
                    term[..i].to_owned(),
                    negated,
                    term[i + op.len()..].to_owned(),
                ));
            }
        }
    }
    None
}

fn unescape(v: &str, selector: &str) -> Result<String> {
    let mut out = String::new();
    let mut chars = v.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e @ ('\\' | ',' | '=')) => out.push(e),
                _ => {
                    return Err(Error(format!(
                        "invalid selector: '{selector}'; invalid escape sequence"
                    )));
                }
            },
            ',' | '=' => {
                return Err(Error(format!(
                    "invalid selector: '{selector}'; unescaped character"
                )));
            }
            c => out.push(c),
        }
    }
    Ok(out)
}

impl FieldSelector {
    /// Parses `fieldSelector` for objects of `resource` (plural, core group
    /// extras apply only when `group` is empty).
    pub fn parse(s: &str, group: &str, resource: &str) -> Result<Self> {
        let mut terms = Vec::new();
        let mut parts = split_terms(s);
        parts.sort();
        for part in parts {
            if part.is_empty() {
                continue;
            }
            let Some((field, negated, value)) = split_term(&part) else {
                return Err(Error(format!(
                    "invalid selector: '{s}'; can't understand '{part}'"
                )));
            };
            let value = unescape(&value, s)?;
            let extras = if group.is_empty() {
                extra_fields(resource)
            } else {
                &[]
            };
            if !COMMON_FIELDS.contains(&field.as_str()) && !extras.contains(&field.as_str()) {
                return Err(Error(format!("field label not supported: {field}")));
            }
            terms.push(FieldTerm {
                field,
                negated,
                value,
            });
        }
        Ok(Self(terms))
    }

    /// Whether an object satisfies every term.
    pub fn matches(&self, object: &Value) -> bool {
        self.0.iter().all(|t| {
            let have = field_value(object, &t.field);
            (have == t.value) != t.negated
        })
    }
}

/// The string value of a dotted field, as the API server's field sets render
/// it (missing → empty, booleans and numbers as text).
fn field_value(object: &Value, field: &str) -> String {
    let mut v = object;
    for part in field.split('.') {
        match v.get(part) {
            Some(next) => v = next,
            None => {
                return if field == "metadata.namespace" || field.ends_with("Name") {
                    String::new()
                } else if field == "spec.hostNetwork" || field == "spec.unschedulable" {
                    "false".to_owned()
                } else {
                    String::new()
                };
            }
        }
    }
    match v {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Null => String::new(),
        // `source` of events is an object: the API server selects on its component.
        Value::Object(o) => o
            .get("component")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        Value::Array(_) => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "n1", "namespace": "demo", "labels": labels}})
    }

    #[test]
    fn label_operators_match() {
        let o = obj(json!({"app": "web", "tier": "front", "n": "5"}));
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
            LabelSelector::parse("app in (").unwrap_err().0,
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

    #[test]
    fn field_selectors() {
        let o = json!({"metadata": {"name": "n1", "namespace": "demo"},
                       "involvedObject": {"kind": "Pod", "name": "web-1"}, "reason": "Started", "type": "Normal"});
        let ok = |s: &str, r: &str| FieldSelector::parse(s, "", r).unwrap().matches(&o);
        assert!(ok("metadata.name=n1", "pods"));
        assert!(ok("metadata.name==n1,metadata.namespace=demo", "pods"));
        assert!(!ok("metadata.name!=n1", "pods"));
        assert!(ok("metadata.namespace!=kube-system", "pods"));
        assert!(ok(
            "involvedObject.kind=Pod,involvedObject.name=web-1,reason=Started,type=Normal",
            "events"
        ));
        assert!(!ok("type=Warning", "events"));
        assert!(ok("", "pods"));
        assert_eq!(
            FieldSelector::parse("spec.foo=1", "", "pods")
                .unwrap_err()
                .0,
            "field label not supported: spec.foo"
        );
        assert_eq!(
            FieldSelector::parse("reason=x", "", "configmaps")
                .unwrap_err()
                .0,
            "field label not supported: reason"
        );
        assert_eq!(
            FieldSelector::parse("metadata.name", "", "pods")
                .unwrap_err()
                .0,
            "invalid selector: 'metadata.name'; can't understand 'metadata.name'"
        );
    }

    proptest! {
        #[test]
        fn label_parser_never_panics(s in "\\PC{0,40}") {
            let _ = LabelSelector::parse(&s);
        }

        #[test]
        fn label_parser_never_panics_on_selector_alphabet(s in "[a-z!=(), <>in]{0,30}") {
            if let Ok(sel) = LabelSelector::parse(&s) {
                let _ = sel.matches(&obj(json!({"a": "b"})));
            }
        }

        #[test]
        fn field_parser_never_panics(s in "\\PC{0,40}") {
            if let Ok(sel) = FieldSelector::parse(&s, "", "events") {
                let _ = sel.matches(&json!({"metadata": {}}));
            }
        }

        #[test]
        fn equality_roundtrip(k in "[a-z][a-z0-9]{0,8}", v in "[a-z][a-z0-9]{0,8}") {
            let sel = LabelSelector::parse(&format!("{k}={v}")).unwrap();
            let labels = obj(json!({ k.clone(): v.clone() }));
            prop_assert!(sel.matches(&labels));
            let sel = LabelSelector::parse(&format!("{k}!={v}")).unwrap();
            prop_assert!(!sel.matches(&labels));
        }
    }
}
