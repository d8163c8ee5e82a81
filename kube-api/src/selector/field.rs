//! Field selectors, parsed as `k8s.io/apimachinery/pkg/fields` parses them, with the
//! field labels each resource supports (its registry's `SelectableFields`).

use serde_json::Value;

use super::{Error, Result};
use crate::Resource;

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

/// Field labels supported beyond `metadata.name` and `metadata.namespace`, per group
/// and resource: other groups' resources of the same name (e.g. `events.k8s.io`) have
/// their own lists.
fn supported(group: &str, plural: &str) -> &'static [&'static str] {
    match (group, plural) {
        ("", "events") => &[
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
        ("", "pods") => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        ("", "secrets") => &["type"],
        ("", "namespaces") => &["status.phase"],
        ("", "nodes") => &["spec.unschedulable"],
        ("", "replicationcontrollers") | ("apps", "replicasets") => &["status.replicas"],
        ("batch", "jobs") => &["status.successful"],
        _ => &[],
    }
}

/// The server's refusal of a field label `res` does not support. Kinds with
/// field labels of their own have a conversion function that answers
/// "field label not supported" (core `v1/conversion.go`, `apps`, `batch`),
/// and so do custom resources (apiextensions-apiserver); every other
/// built-in kind uses apimachinery's `DefaultMetaV1FieldSelectorConversion`,
/// which names the two labels it knows.
fn unsupported(res: Resource<'_>, field: &str) -> String {
    let built_in = !res.group.contains('.') || res.group.ends_with(".k8s.io");
    if !supported(res.group, res.plural).is_empty() || !built_in {
        format!("field label not supported: {field}")
    } else {
        format!(
            "{field:?} is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
        )
    }
}

/// Splits on commas not escaped with a backslash (`splitTerms`).
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

/// `UnescapeValue`, with its error wording (a rune is printed as its number, as Go's
/// `%v` prints it).
fn unescape(s: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e @ ('\\' | ',' | '=')) => out.push(e),
                Some(e) => {
                    return Err(format!(
                        "invalid field selector: invalid escape sequence: \\{e}"
                    ));
                }
                None => return Err("invalid field selector: invalid escape sequence: \\".into()),
            },
            ',' | '=' => {
                return Err(format!(
                    "invalid field selector: unescaped character in value: {}",
                    u32::from(c)
                ));
            }
            c => out.push(c),
        }
    }
    Ok(out)
}

impl FieldSelector {
    /// Parses a `fieldSelector` for objects of `res`; field labels the resource does
    /// not support are refused as the real server refuses them.
    pub fn parse(res: Resource<'_>, input: &str) -> Result<Self> {
        Self::parse_terms(res, input).map_err(Error::InvalidFieldSelector)
    }

    fn parse_terms(res: Resource<'_>, input: &str) -> Result<Self, String> {
        let mut terms = Vec::new();
        let mut parts = split_terms(input);
        // The server sorts the terms first, so the first bad one in sorted order is reported.
        parts.sort();
        for part in parts {
            if part.is_empty() {
                continue;
            }
            // No escaping on the left: the first operator splits (`splitTerm`).
            let split = part.char_indices().find_map(|(i, _)| {
                let rest = &part[i..];
                ["!=", "==", "="]
                    .into_iter()
                    .find(|op| rest.starts_with(op))
                    .map(|op| (&part[..i], op, &rest[op.len()..]))
            });
            let Some((field, op, value)) = split else {
                return Err(format!(
                    "invalid selector: '{input}'; can't understand '{part}'"
                ));
            };
            let value = unescape(value)?;
            if !matches!(field, "metadata.name" | "metadata.namespace")
                && !supported(res.group, res.plural).contains(&field)
            {
                return Err(unsupported(res, field));
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

/// The value of a field label as the server's field set renders it from the typed
/// object: a missing string is empty, a missing bool `false`, a missing count `0`.
fn field_value(obj: &Value, field: &str) -> String {
    // An event's `source` label is its `source.component`.
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
            "spec.hostNetwork" | "spec.unschedulable" => "false".into(),
            "status.replicas" | "status.successful" => "0".into(),
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

    fn res(plural: &'static str) -> Resource<'static> {
        let group = match plural {
            "deployments" | "replicasets" => "apps",
            "jobs" => "batch",
            _ => "",
        };
        Resource {
            group,
            version: "v1",
            plural,
            kind: "",
        }
    }

    fn parse(plural: &'static str, s: &str) -> Result<FieldSelector> {
        FieldSelector::parse(res(plural), s)
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

    /// The messages a real kube-apiserver 1.36 answered for the same
    /// selectors (kube-sim/fixtures/errors/400-fieldselector-*.json).
    #[test]
    fn refusals_are_worded_as_the_api_server_words_them() {
        let recorded = |name: &str| -> String {
            let path = format!(
                "{}/../kube-sim/fixtures/errors/400-fieldselector-{name}.json",
                env!("CARGO_MANIFEST_DIR")
            );
            let status: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
            status["message"].as_str().unwrap().to_owned()
        };
        let gadgets = Resource {
            group: "fx.example.com",
            version: "v1",
            plural: "gadgets",
            kind: "Gadget",
        };
        for (res, selector, fixture) in [
            (res("configmaps"), "data.a=b", "configmaps"),
            (res("pods"), "spec.foo=bar", "pods"),
            (gadgets, "spec.color=red", "customresource"),
            (res("configmaps"), "metadata.name===x", "badsyntax"),
        ] {
            let got = FieldSelector::parse(res, selector).unwrap_err().to_string();
            assert_eq!(got, recorded(fixture), "{selector}");
        }
    }

    #[test]
    fn unknown_fields_and_bad_syntax_are_refused() {
        assert_eq!(
            parse("configmaps", "spec.foo=bar").unwrap_err().to_string(),
            r#""spec.foo" is not a known field selector: only "metadata.name", "metadata.namespace""#
        );
        assert_eq!(
            parse("secrets", "spec.foo=bar").unwrap_err().to_string(),
            "field label not supported: spec.foo"
        );
        assert_eq!(
            parse("configmaps", "nonsense").unwrap_err().to_string(),
            "invalid selector: 'nonsense'; can't understand 'nonsense'"
        );
    }

    // From the sidecar's facade.
    #[test]
    fn field_selectors() {
        let o = json!({"metadata": {"name": "n1", "namespace": "demo"},
                       "involvedObject": {"kind": "Pod", "name": "web-1"}, "reason": "Started", "type": "Normal"});
        let ok = |s: &str, r: &'static str| parse(r, s).unwrap().matches(&o);
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
            parse("pods", "spec.foo=1").unwrap_err().to_string(),
            "field label not supported: spec.foo"
        );
        assert_eq!(
            parse("configmaps", "reason=x").unwrap_err().to_string(),
            r#""reason" is not a known field selector: only "metadata.name", "metadata.namespace""#
        );
        assert_eq!(
            parse("pods", "metadata.name").unwrap_err().to_string(),
            "invalid selector: 'metadata.name'; can't understand 'metadata.name'"
        );
    }

    // Where the two earlier versions differed, apimachinery's behaviour.
    #[test]
    fn escapes_sorting_and_groups_as_apimachinery() {
        let err = |plural: &'static str, s: &str| parse(plural, s).unwrap_err().to_string();
        assert_eq!(
            err("pods", "metadata.name=a\\x"),
            "invalid field selector: invalid escape sequence: \\x"
        );
        assert_eq!(
            err("pods", "metadata.name=a\\"),
            "invalid field selector: invalid escape sequence: \\"
        );
        assert_eq!(
            err("pods", "metadata.name!==x"),
            "invalid field selector: unescaped character in value: 61"
        );
        // The left side has no escapes: `a\=b=c` splits at the first `=`.
        assert_eq!(
            err("pods", "metadata.name\\=b=c"),
            "invalid field selector: unescaped character in value: 61"
        );
        let escaped = json!({"metadata": {"name": "a,b=c\\d"}});
        assert!(
            parse("pods", "metadata.name=a\\,b\\=c\\\\d")
                .unwrap()
                .matches(&escaped)
        );
        // Terms are sorted before they are checked.
        assert_eq!(err("pods", "zzz=1,aaa=1"), "field label not supported: aaa");
        // Per group: replica sets are apps/v1, jobs batch/v1.
        let rs = json!({"metadata": {"name": "r"}, "status": {"replicas": 2}});
        assert!(
            parse("replicasets", "status.replicas=2")
                .unwrap()
                .matches(&rs)
        );
        assert!(parse("jobs", "status.successful=0").unwrap().matches(&rs));
        let no_status = json!({"metadata": {"name": "r"}});
        assert!(
            parse("replicasets", "status.replicas=0")
                .unwrap()
                .matches(&no_status)
        );
        let other_events = Resource {
            group: "events.k8s.io",
            ..res("events")
        };
        assert!(FieldSelector::parse(other_events, "reason=x").is_err());
        let pod = json!({"metadata": {"name": "p"}, "spec": {}});
        assert!(
            parse("pods", "spec.hostNetwork=false")
                .unwrap()
                .matches(&pod)
        );
        let ev = json!({"metadata": {"name": "e"}, "source": {"component": "kubelet"}});
        assert!(parse("events", "source=kubelet").unwrap().matches(&ev));
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

        #[test]
        fn field_parser_never_panics(s in "\\PC{0,40}") {
            if let Ok(sel) = parse("events", &s) {
                let _ = sel.matches(&json!({"metadata": {}}));
            }
        }
    }
}
