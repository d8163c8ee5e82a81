//! The Kubernetes API server's semantics over `serde_json::Value` objects, shared by
//! kube-sim and the sidecar's facade: label and field selectors ([`selector`]), `Table`
//! rendering for `kubectl get` ([`table`]), `metav1.Status` errors ([`status`]), JSON
//! bytes as the server writes them ([`json`]) and the protobuf encoding of built-in kinds
//! ([`protobuf`]).
//!
//! Everything here answers as a real kube-apiserver 1.36 does; the recorded responses
//! it is checked against are in `kube-sim/fixtures/` (`errors/`, `objects/`,
//! `protobuf/`), compared with [`compare::differences`]. Start at
//! [`Resource`], the one description of a resource type every module takes, then
//! [`selector::Selectors::parse`], [`table::table`] and [`Status`].

#![forbid(unsafe_code)]

pub mod compare;
pub mod discovery;
pub mod json;
pub mod media;
pub mod protobuf;
pub mod selector;
pub mod status;
pub mod table;

/// The `Cache-Control` of every kube-apiserver answer that sets none of its
/// own (its `WithCacheControl` filter, `k8s.io/apiserver/pkg/server/filters`):
/// a client's HTTP cache may keep the answer but must ask again before using
/// it. The recorded answers in `kube-sim/fixtures` carry it on `200`, `201`,
/// `304`, `4xx` and a `429` with `Retry-After` alike.
pub const NO_CACHE: &str = "no-cache, private";

pub use selector::{FieldSelector, LabelSelector, Selectors};
pub use status::{Status, StatusCause, StatusDetails};
pub use table::IncludeObject;

/// A resource type as the API names it: what selectors, tables and statuses need to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resource<'a> {
    /// API group (`""` for core).
    pub group: &'a str,
    /// API version within the group.
    pub version: &'a str,
    /// Plural resource name used in paths, e.g. `deployments`.
    pub plural: &'a str,
    /// Object kind, e.g. `Deployment`.
    pub kind: &'a str,
}

impl Resource<'_> {
    /// `plural` or `plural.group`, as error messages name the resource.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// `apiVersion` of objects (`v1`, `apps/v1`).
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

/// The verb RBAC names a request on a resource path by, as the API server
/// derives it: from the method, whether the path names an object, and
/// `watch=true` (which wins over a name). `None` for other methods.
pub fn request_verb(method: &http::Method, named: bool, watch: bool) -> Option<&'static str> {
    Some(match (method.as_str(), named) {
        ("GET" | "HEAD", _) if watch => "watch",
        ("GET" | "HEAD", true) => "get",
        ("GET" | "HEAD", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_verbs_are_rbacs() {
        use http::Method;
        let cases = [
            (Method::GET, true, false, Some("get")),
            (Method::GET, false, false, Some("list")),
            (Method::GET, false, true, Some("watch")),
            (Method::GET, true, true, Some("watch")),
            (Method::DELETE, true, false, Some("delete")),
            (Method::DELETE, false, false, Some("deletecollection")),
            (Method::OPTIONS, false, false, None),
        ];
        for (method, named, watch, want) in cases {
            assert_eq!(
                request_verb(&method, named, watch),
                want,
                "{method} {named} {watch}"
            );
        }
    }

    #[test]
    fn qualified_names_and_api_versions() {
        let pods = Resource {
            group: "",
            version: "v1",
            plural: "pods",
            kind: "Pod",
        };
        assert_eq!(pods.qualified(), "pods");
        assert_eq!(pods.api_version(), "v1");
        let deployments = Resource {
            group: "apps",
            version: "v1",
            plural: "deployments",
            kind: "Deployment",
        };
        assert_eq!(deployments.qualified(), "deployments.apps");
        assert_eq!(deployments.api_version(), "apps/v1");
    }
}
