//! Label and field selectors: parsing, with the real server's error wording, and
//! matching of objects against them.
//!
//! Start at [`Selectors::parse`], which turns the `labelSelector` and `fieldSelector`
//! query parameters of a request into one predicate.

mod field;
mod label;

pub use field::FieldSelector;
pub use label::LabelSelector;

use serde_json::Value;

use crate::Resource;

/// A selector the API server would refuse; the text is the server's message, which
/// becomes a 400 BadRequest `metav1.Status`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The `labelSelector` does not parse or names an invalid key or value.
    #[error("{0}")]
    InvalidLabelSelector(String),
    /// The `fieldSelector` does not parse or names a field the resource cannot be selected by.
    #[error("{0}")]
    InvalidFieldSelector(String),
}

/// Result with the selector [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The label and field selectors of one request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Selectors {
    /// `labelSelector`.
    pub labels: LabelSelector,
    /// `fieldSelector`.
    pub fields: FieldSelector,
}

impl Selectors {
    /// Parses both selectors for objects of `res`; a missing parameter selects everything.
    pub fn parse(res: Resource<'_>, labels: Option<&str>, fields: Option<&str>) -> Result<Self> {
        Ok(Selectors {
            labels: LabelSelector::parse(labels.unwrap_or(""))?,
            fields: FieldSelector::parse(res, fields.unwrap_or(""))?,
        })
    }

    /// Whether neither selector restricts anything.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }

    /// Whether `obj` is selected.
    pub fn matches(&self, obj: &Value) -> bool {
        self.labels.matches(obj) && self.fields.matches(obj)
    }
}

/// Fuzz body: any `labelSelector` and `fieldSelector` (separated by NUL), for
/// pods, secrets and a custom resource. Parsing answers or refuses without
/// panicking, and a parsed selector matches an object without panicking.
pub fn fuzz_selectors(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let (labels, fields) = text.split_once('\0').unwrap_or((&text, ""));
    let object = serde_json::json!({
        "metadata": {"name": "web-1", "namespace": "team-a", "labels": {"app": "web", "tier": "1"}},
        "spec": {"nodeName": "node-1"},
        "status": {"phase": "Running"},
        "type": "Opaque"
    });
    for res in [
        Resource {
            group: "",
            version: "v1",
            plural: "pods",
            kind: "Pod",
        },
        Resource {
            group: "",
            version: "v1",
            plural: "secrets",
            kind: "Secret",
        },
        Resource {
            group: "example.com",
            version: "v1",
            plural: "widgets",
            kind: "Widget",
        },
    ] {
        if let Ok(selectors) = Selectors::parse(res, Some(labels), Some(fields)) {
            let _ = selectors.is_empty();
            let _ = selectors.matches(&object);
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const CONFIGMAPS: Resource<'static> = Resource {
        group: "",
        version: "v1",
        plural: "configmaps",
        kind: "ConfigMap",
    };

    #[test]
    fn both_selectors_must_hold() {
        let o = json!({"metadata": {"name": "web", "labels": {"app": "web"}}});
        let sel = Selectors::parse(CONFIGMAPS, Some("app=web"), Some("metadata.name=web")).unwrap();
        assert!(sel.matches(&o));
        assert!(!sel.is_empty());
        let sel = Selectors::parse(CONFIGMAPS, Some("app=web"), Some("metadata.name=x")).unwrap();
        assert!(!sel.matches(&o));
        assert!(Selectors::parse(CONFIGMAPS, None, None).unwrap().is_empty());
        assert!(matches!(
            Selectors::parse(CONFIGMAPS, Some("app in ("), None),
            Err(Error::InvalidLabelSelector(_))
        ));
        assert!(matches!(
            Selectors::parse(CONFIGMAPS, None, Some("spec.foo=1")),
            Err(Error::InvalidFieldSelector(_))
        ));
    }

    #[test]
    fn fuzz_selector_text() {
        spinlink_fuzzing::Fuzz::new("kube-api selectors")
            .seeds([
                b"app=web,tier!=2\0metadata.name=web-1".to_vec(),
                b"app in (web,api),!legacy,tier notin (3)\0status.phase!=Pending".to_vec(),
                b"example.com/key=v\0type=Opaque,metadata.namespace=team-a".to_vec(),
                b"a=b=c\0spec.nodeName==node-1".to_vec(),
            ])
            .run(super::fuzz_selectors);
    }
}
