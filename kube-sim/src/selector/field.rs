//! Field selectors, parsed as `k8s.io/apimachinery/pkg/fields` parses them, with the
//! field labels each served kind supports.

use serde_json::Value;

use super::{Error, Result};
use crate::resources::ResourceInfo;

#[derive(Debug, Clone, PartialEq)]
struct Term {
    field: String,
    equal: bool,
    value: String,
}

/// A parsed `fieldSelector`; all terms must hold.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector {
    terms: Vec<Term>,
}

/// Field labels supported beyond `metadata.name` and `metadata.namespace`.
fn supported(res: &ResourceInfo) -> &'static [&'static str] {
    match res.plural {
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
        "replicasets" => &["status.replicas"],
        _ => &[],
    }
}

/// Splits on commas not escaped with a backslash.
fn split_terms(s: &str) -> Vec<String> {
    let mut terms = Vec::new();
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
            terms.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    if escaped {
        cur.push('\\');
    }
    terms.push(cur);
    terms
}

fn unescape(s: &str) -> Result<String> {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e @ ('\\' | ',' | '=')) => out.push(e),
                Some(e) => return Err(Error(format!("invalid escape sequence: \\{e}"))),
                None => return Err(Error(format!("unterminated escape sequence in {s:?}"))),
            },
            ',' | '=' => return Err(Error(format!("invalid field selector value: {s:?}"))),
            c => out.push(c),
        }
    }
    Ok(out)
}

impl FieldSelector {
    /// Parses a selector for `res`; unknown field labels are refused as the real server does.
    pub fn parse(res: &ResourceInfo, input: &str) -> Result<Self> {
        let mut terms = Vec::new();
        for part in split_terms(input) {
            if part.is_empty() {
                continue;
            }
            let split = part.char_indices().find_map(|(i, _)| {
                let rest = &part[i..];
                ["!=", "==", "="]
                    .into_iter()
                    .find(|op| rest.starts_with(op))
                    .map(|op| (&part[..i], op, &rest[op.len()..]))
            });
            let Some((field, op, value)) = split else {
                return Err(Error(format!(
                    "invalid selector: '{input}'; can't understand '{part}'"
                )));
            };
            let value = unescape(value)?;
            if !matches!(field, "metadata.name" | "metadata.namespace")
                && !supported(res).contains(&field)
            {
                return Err(Error(format!("field label not supported: {field}")));
            }
            terms.push(Term {
                field: field.to_string(),
                equal: op != "!=",
                value,
            });
        }
        Ok(FieldSelector { terms })
    }

    /// Whether this selector selects everything.
    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// The value `metadata.name=` requires, if any (kubectl's wait uses it).
    pub fn required_name(&self) -> Option<&str> {
        self.terms
            .iter()
            .find(|t| t.equal && t.field == "metadata.name")
            .map(|t| t.value.as_str())
    }

    /// Whether `obj` satisfies every term.
    pub fn matches(&self, obj: &Value) -> bool {
        self.terms
            .iter()
            .all(|t| (field_value(obj, &t.field) == t.value) == t.equal)
    }
}

fn field_value(obj: &Value, field: &str) -> String {
    let path = if field == "source" {
        "source.component"
    } else {
        field
    };
    let mut v = obj;
    for part in path.split('.') {
        v = &v[part];
    }
    match v {
        Value::String(s) => s.clone(),
        Value::Null => match field {
            "spec.hostNetwork" => "false".into(),
            _ => String::new(),
        },
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;
    use crate::resources::by_plural;

    fn parse(plural: &str, s: &str) -> Result<FieldSelector> {
        FieldSelector::parse(by_plural(plural).unwrap(), s)
    }

    #[test]
    fn metadata_fields() {
        let o = json!({"metadata": {"name": "web", "namespace": "demo"}});
        assert!(
            parse("configmaps", "metadata.name=web")
                .unwrap()
                .matches(&o)
        );
        assert!(
            parse("configmaps", "metadata.name==web")
                .unwrap()
                .matches(&o)
        );
        assert!(
            !parse("configmaps", "metadata.name!=web")
                .unwrap()
                .matches(&o)
        );
        assert!(
            parse("configmaps", "metadata.name=web,metadata.namespace=demo")
                .unwrap()
                .matches(&o)
        );
        assert!(
            !parse("configmaps", "metadata.namespace=other")
                .unwrap()
                .matches(&o)
        );
        assert_eq!(
            parse("configmaps", "metadata.name=web")
                .unwrap()
                .required_name(),
            Some("web")
        );
    }

    #[test]
    fn event_fields() {
        let ev = json!({"metadata": {"name": "e"}, "involvedObject": {"kind": "Pod", "name": "p"}, "type": "Normal", "reason": "Pulled"});
        assert!(
            parse(
                "events",
                "involvedObject.kind=Pod,involvedObject.name=p,type=Normal,reason=Pulled"
            )
            .unwrap()
            .matches(&ev)
        );
        assert!(!parse("events", "type=Warning").unwrap().matches(&ev));
    }

    #[test]
    fn unknown_fields_and_bad_syntax_are_refused() {
        assert_eq!(
            parse("configmaps", "spec.foo=bar").unwrap_err().0,
            "field label not supported: spec.foo"
        );
        assert_eq!(
            parse("configmaps", "type=x").unwrap_err().0,
            "field label not supported: type"
        );
        assert_eq!(
            parse("configmaps", "nonsense").unwrap_err().0,
            "invalid selector: 'nonsense'; can't understand 'nonsense'"
        );
    }

    proptest! {
        #[test]
        fn parser_never_panics(s in ".{0,64}") {
            let _ = parse("events", &s);
        }

        #[test]
        fn parser_never_panics_on_selector_alphabet(s in "[a-z.=!,\\\\]{0,40}") {
            if let Ok(sel) = parse("pods", &s) {
                let _ = sel.matches(&json!({"metadata": {"name": "x"}}));
            }
        }
    }
}
