//! The JSONPath of a CRD's `additionalPrinterColumns`, as the API server
//! evaluates it (client-go's `util/jsonpath`, missing keys allowed): fields
//! (`.spec.size`, `['a.b']`), indexes (`[0]`, `[-1]`), slices (`[1:3]`), the
//! wildcard (`[*]`, `.*`), recursive descent (`..name`) and filters
//! (`[?(@.type=="Ready")]`, `[?(@.ready)]`, `==`, `!=`, `<`, `<=`, `>`, `>=`).
//! A column shows the first value found; none is a `null` cell.

use serde_json::Value;

/// One step of a parsed path.
#[derive(Debug, Clone, PartialEq)]
enum Step {
    Field(String),
    /// `.*` or `[*]`: every value of an object or array.
    All,
    /// `..`: this value and everything below it.
    Descend,
    Index(i64),
    Slice(Option<i64>, Option<i64>),
    Filter(Filter),
}

#[derive(Debug, Clone, PartialEq)]
struct Filter {
    /// Path below `@`.
    left: Vec<Step>,
    /// Operator and literal; `None` tests that `left` exists.
    cmp: Option<(String, Value)>,
}

/// A path that could not be parsed; the server refuses such a CRD, so a
/// column with one shows `null` cells.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unrecognized column definition {0:?}")]
pub struct ParseError(pub String);

/// A parsed JSONPath.
#[derive(Debug, Clone, PartialEq)]
pub struct JsonPath(Vec<Step>);

impl JsonPath {
    /// Parses `.spec.foo`-style paths, with or without the `{}` the server
    /// wraps them in.
    pub fn parse(path: &str) -> Result<Self, ParseError> {
        let err = || ParseError(path.to_owned());
        let mut s = path.trim();
        if let Some(inner) = s.strip_prefix('{').and_then(|r| r.strip_suffix('}')) {
            s = inner.trim();
        }
        let s = s.strip_prefix('$').unwrap_or(s);
        parse_steps(s).ok_or_else(err).map(JsonPath)
    }

    /// Every value the path finds in `root`, in document order.
    pub fn find<'a>(&self, root: &'a Value) -> Vec<&'a Value> {
        eval(&self.0, vec![root])
    }
}

fn parse_steps(mut s: &str) -> Option<Vec<Step>> {
    let mut steps = Vec::new();
    while !s.is_empty() {
        if let Some(rest) = s.strip_prefix("..") {
            steps.push(Step::Descend);
            s = rest;
            // `..name` / `..*` / `..[0]`.
            if !s.starts_with('[') {
                let (step, rest) = field(s)?;
                steps.push(step);
                s = rest;
            }
        } else if let Some(rest) = s.strip_prefix('.') {
            if rest.is_empty() {
                // A lone `.` (or `{.}`) is the value itself.
                s = rest;
                continue;
            }
            let (step, rest) = field(rest)?;
            steps.push(step);
            s = rest;
        } else if let Some(rest) = s.strip_prefix('[') {
            let end = bracket_end(rest)?;
            steps.push(bracket(rest[..end].trim())?);
            s = &rest[end + 1..];
        } else if steps.is_empty() {
            // A path without its leading dot (`spec.foo`).
            let (step, rest) = field(s)?;
            steps.push(step);
            s = rest;
        } else {
            return None;
        }
    }
    Some(steps)
}

fn field(s: &str) -> Option<(Step, &str)> {
    let end = s.find(['.', '[']).unwrap_or(s.len());
    let name = &s[..end];
    if name.is_empty() {
        return None;
    }
    let step = if name == "*" {
        Step::All
    } else {
        Step::Field(name.to_owned())
    };
    Some((step, &s[end..]))
}

/// Where the `]` closing a bracket opened just before `s` is, skipping
/// quoted text and nested brackets (filters).
fn bracket_end(s: &str) -> Option<usize> {
    let mut depth = 0;
    let mut quote = None;
    for (i, c) in s.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '[') => depth += 1,
            (None, ']') if depth == 0 => return Some(i),
            (None, ']') => depth -= 1,
            _ => {}
        }
    }
    None
}

fn unquote(s: &str) -> Option<&str> {
    let s = s.trim();
    s.strip_prefix('\'')
        .and_then(|r| r.strip_suffix('\''))
        .or_else(|| s.strip_prefix('"').and_then(|r| r.strip_suffix('"')))
}

fn bracket(inner: &str) -> Option<Step> {
    if inner == "*" {
        return Some(Step::All);
    }
    if let Some(name) = unquote(inner) {
        return Some(Step::Field(name.to_owned()));
    }
    if let Some(f) = inner.strip_prefix("?(").and_then(|r| r.strip_suffix(')')) {
        return filter(f.trim()).map(Step::Filter);
    }
    if let Some((a, b)) = inner.split_once(':') {
        // `[a:b]` (a step after a second colon is not supported).
        let num = |t: &str| -> Option<Option<i64>> {
            let t = t.trim();
            if t.is_empty() {
                Some(None)
            } else {
                t.parse().ok().map(Some)
            }
        };
        return Some(Step::Slice(num(a)?, num(b)?));
    }
    inner.parse().ok().map(Step::Index)
}

fn filter(f: &str) -> Option<Filter> {
    for op in ["==", "!=", "<=", ">=", "<", ">"] {
        if let Some((l, r)) = f.split_once(op) {
            let left = at_path(l.trim())?;
            let r = r.trim();
            let lit = match unquote(r) {
                Some(text) => Value::from(text),
                None => serde_json::from_str(r).ok()?,
            };
            return Some(Filter {
                left,
                cmp: Some((op.to_owned(), lit)),
            });
        }
    }
    Some(Filter {
        left: at_path(f)?,
        cmp: None,
    })
}

fn at_path(s: &str) -> Option<Vec<Step>> {
    parse_steps(s.strip_prefix('@')?)
}

fn eval<'a>(steps: &[Step], mut cur: Vec<&'a Value>) -> Vec<&'a Value> {
    for step in steps {
        let mut next = Vec::new();
        for v in cur {
            match step {
                Step::Field(name) => next.extend(v.get(name.as_str())),
                Step::All => match v {
                    Value::Object(m) => next.extend(m.values()),
                    Value::Array(a) => next.extend(a.iter()),
                    _ => {}
                },
                Step::Descend => descend(v, &mut next),
                Step::Index(i) => {
                    if let Value::Array(a) = v {
                        let len = a.len() as i64;
                        let i = if *i < 0 { len + i } else { *i };
                        if (0..len).contains(&i) {
                            next.push(&a[i as usize]);
                        }
                    }
                }
                Step::Slice(from, to) => {
                    if let Value::Array(a) = v {
                        let len = a.len() as i64;
                        let clamp = |i: i64| (if i < 0 { len + i } else { i }).clamp(0, len);
                        let from = clamp(from.unwrap_or(0));
                        let to = clamp(to.unwrap_or(len));
                        if from < to {
                            next.extend(&a[from as usize..to as usize]);
                        }
                    }
                }
                Step::Filter(f) => {
                    let items: Vec<&Value> = match v {
                        Value::Array(a) => a.iter().collect(),
                        Value::Object(m) => m.values().collect(),
                        _ => Vec::new(),
                    };
                    next.extend(items.into_iter().filter(|item| matches(f, item)));
                }
            }
        }
        cur = next;
    }
    cur
}

fn descend<'a>(v: &'a Value, out: &mut Vec<&'a Value>) {
    out.push(v);
    match v {
        Value::Object(m) => m.values().for_each(|c| descend(c, out)),
        Value::Array(a) => a.iter().for_each(|c| descend(c, out)),
        _ => {}
    }
}

fn matches(f: &Filter, item: &Value) -> bool {
    let found = eval(&f.left, vec![item]);
    let Some((op, lit)) = &f.cmp else {
        return !found.is_empty();
    };
    found.iter().any(|v| compare(v, op, lit))
}

fn compare(v: &Value, op: &str, lit: &Value) -> bool {
    match (v, lit) {
        (Value::Number(a), Value::Number(b)) => {
            let (a, b) = (a.as_f64().unwrap_or(0.0), b.as_f64().unwrap_or(0.0));
            match op {
                "==" => a == b,
                "!=" => a != b,
                "<" => a < b,
                "<=" => a <= b,
                ">" => a > b,
                ">=" => a >= b,
                _ => false,
            }
        }
        _ => match op {
            "==" => v == lit,
            "!=" => v != lit,
            _ => false,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn first(path: &str, v: &Value) -> Option<Value> {
        JsonPath::parse(path)
            .unwrap()
            .find(v)
            .first()
            .map(|v| (*v).clone())
    }

    #[test]
    fn paths_find_what_kubectl_finds() {
        let o = json!({"spec": {"size": 3, "list": [{"a": 1}, {"a": 2}], "x.y": "dotted"},
            "status": {"conditions": [{"type": "Synced", "status": "False"},
                {"type": "Ready", "status": "True", "n": 4}]}});
        assert_eq!(first(".spec.size", &o), Some(json!(3)));
        assert_eq!(first("{.spec.size}", &o), Some(json!(3)));
        assert_eq!(first(".spec.list[1].a", &o), Some(json!(2)));
        assert_eq!(first(".spec.list[-1].a", &o), Some(json!(2)));
        assert_eq!(first(".spec.list[*].a", &o), Some(json!(1)));
        assert_eq!(first(".spec['x.y']", &o), Some(json!("dotted")));
        assert_eq!(
            first(r#".status.conditions[?(@.type=="Ready")].status"#, &o),
            Some(json!("True"))
        );
        assert_eq!(
            first(".status.conditions[?(@.type!='Synced')].type", &o),
            Some(json!("Ready"))
        );
        assert_eq!(
            first(".status.conditions[?(@.n>3)].type", &o),
            Some(json!("Ready"))
        );
        assert_eq!(
            first(".status.conditions[?(@.n)].type", &o),
            Some(json!("Ready"))
        );
        assert_eq!(first("..status", &o), Some(o["status"].clone()));
        assert_eq!(first(".spec.list[0:1].a", &o), Some(json!(1)));
        assert_eq!(first(".spec.missing", &o), None);
        assert_eq!(first(".spec.list[5]", &o), None);
        assert!(JsonPath::parse(".spec[").is_err());
    }
}
