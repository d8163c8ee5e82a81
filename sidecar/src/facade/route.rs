//! Where a facade request goes: the account it names, the Kubernetes resource
//! path inside it ([`ResourcePath`]), and whether the cache may answer it
//! ([`from_cache`]) or it must be relayed live to the agent.

use http::{HeaderMap, Method};
use percent_encoding::percent_decode_str;

/// The prefix of per-account Kubernetes API paths.
pub const ACCOUNTS_PREFIX: &str = "/accounts/";

/// Splits `/accounts/<name>/<k8s path>` into the account name and the
/// Kubernetes path (`/` when empty).
pub fn split_account(path: &str) -> Option<(String, String)> {
    let rest = path.strip_prefix(ACCOUNTS_PREFIX)?;
    let (name, k8s) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if name.is_empty() {
        return None;
    }
    let name = percent_decode_str(name).decode_utf8().ok()?.into_owned();
    Some((name, k8s.to_owned()))
}

/// A Kubernetes resource path, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourcePath {
    /// API group, empty for the core group.
    pub group: String,
    /// API version.
    pub version: String,
    /// Namespace, for namespaced paths.
    pub namespace: Option<String>,
    /// Plural resource name.
    pub resource: String,
    /// Object name, for single-object paths.
    pub name: Option<String>,
    /// Subresource segments after the name (`log`, `status`, `scale`).
    pub subresource: Vec<String>,
}

impl ResourcePath {
    /// Parses `/api/v1/...` and `/apis/<g>/<v>/...`; `None` for anything else
    /// (discovery documents, `/openapi`, `/version`, ...).
    pub fn parse(path: &str) -> Option<Self> {
        let segs: Vec<String> = path
            .split('/')
            .filter(|s| !s.is_empty())
            .map(|s| percent_decode_str(s).decode_utf8().map(|c| c.into_owned()))
            .collect::<Result<_, _>>()
            .ok()?;
        let (group, version, rest) = match segs.first().map(String::as_str) {
            Some("api") if segs.len() >= 3 => (String::new(), segs[1].clone(), &segs[2..]),
            Some("apis") if segs.len() >= 4 => (segs[1].clone(), segs[2].clone(), &segs[3..]),
            _ => return None,
        };
        let (namespace, rest) = if rest[0] == "namespaces" && rest.len() >= 3 {
            (Some(rest[1].clone()), &rest[2..])
        } else {
            (None, rest)
        };
        Some(Self {
            group,
            version,
            namespace,
            resource: rest[0].clone(),
            name: rest.get(1).cloned(),
            subresource: rest.get(2..).map(<[String]>::to_vec).unwrap_or_default(),
        })
    }
}

/// A request's query string, decoded.
#[derive(Debug, Clone, Default)]
pub struct Query(Vec<(String, String)>);

impl Query {
    /// Parses a raw query string.
    pub fn parse(raw: Option<&str>) -> Self {
        Self(
            raw.map(|q| {
                url::form_urlencoded::parse(q.as_bytes())
                    .into_owned()
                    .collect()
            })
            .unwrap_or_default(),
        )
    }

    /// The first value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Whether `key` is `true` or `1`.
    pub fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1"))
    }
}

/// Whether a GET/LIST of a resource path may be answered from the cache (if
/// the kind is cached): everything that needs the live server goes through.
///
/// `limit` alone does not force a live request: the API server may ignore it
/// and return every item ("servers may choose not to support the limit
/// argument"), and `kubectl get` always sends `limit=500`. A `continue` token
/// comes from the live server, so it goes there.
pub fn from_cache(
    method: &Method,
    path: &ResourcePath,
    query: &Query,
    headers: &HeaderMap,
) -> bool {
    if method != Method::GET || !path.subresource.is_empty() {
        return false;
    }
    if query.flag("watch") || query.get("continue").is_some_and(|c| !c.is_empty()) {
        return false;
    }
    if query.get("resourceVersionMatch") == Some("Exact") {
        return false;
    }
    let apply = headers
        .get("kubectl-command")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with("kubectl apply"));
    !apply
}

/// Whether a WATCH may be answered from the cache (if the kind is cached
/// and [`super::watch::serve`] takes its options): a watch of a collection,
/// not of one object's path (deprecated, and what it means is the server's).
pub fn watch_from_cache(method: &Method, path: &ResourcePath, query: &Query) -> bool {
    method == Method::GET
        && path.subresource.is_empty()
        && path.name.is_none()
        && query.flag("watch")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rp(path: &str) -> ResourcePath {
        ResourcePath::parse(path).unwrap()
    }

    #[test]
    fn account_split() {
        assert_eq!(
            split_account("/accounts/dev/api/v1/pods"),
            Some(("dev".into(), "/api/v1/pods".into()))
        );
        assert_eq!(
            split_account("/accounts/dev"),
            Some(("dev".into(), "/".into()))
        );
        assert_eq!(split_account("/accounts/"), None);
        assert_eq!(split_account("/v1/accounts"), None);
    }

    #[test]
    fn resource_paths() {
        let p = rp("/api/v1/namespaces/demo/pods/web-1");
        assert_eq!(
            (
                p.group.as_str(),
                p.version.as_str(),
                p.namespace.as_deref(),
                p.resource.as_str(),
                p.name.as_deref()
            ),
            ("", "v1", Some("demo"), "pods", Some("web-1"))
        );
        let p = rp("/api/v1/namespaces/demo/pods/web-1/log");
        assert_eq!(p.subresource, ["log"]);
        let p = rp("/api/v1/namespaces");
        assert_eq!(
            (p.resource.as_str(), p.namespace.is_none(), p.name.is_none()),
            ("namespaces", true, true)
        );
        let p = rp("/api/v1/namespaces/demo");
        assert_eq!(
            (p.resource.as_str(), p.name.as_deref()),
            ("namespaces", Some("demo"))
        );
        let p = rp("/apis/apps/v1/namespaces/demo/deployments/web/scale");
        assert_eq!(
            (p.group.as_str(), p.resource.as_str(), p.subresource.len()),
            ("apps", "deployments", 1)
        );
        let p = rp("/apis/apps/v1/deployments");
        assert_eq!((p.namespace.is_none(), p.name.is_none()), (true, true));
        assert!(ResourcePath::parse("/api/v1").is_none());
        assert!(ResourcePath::parse("/apis/apps/v1").is_none());
        assert!(ResourcePath::parse("/openapi/v2").is_none());
        assert!(ResourcePath::parse("/version").is_none());
    }

    #[test]
    fn what_the_cache_answers() {
        let h = HeaderMap::new();
        let list = rp("/api/v1/pods");
        let q = |s: &str| Query::parse(Some(s));
        assert!(from_cache(&Method::GET, &list, &q(""), &h));
        assert!(from_cache(&Method::GET, &list, &q("limit=500"), &h));
        assert!(!from_cache(&Method::POST, &list, &q(""), &h));
        assert!(!from_cache(&Method::GET, &list, &q("watch=true"), &h));
        assert!(!from_cache(&Method::GET, &list, &q("watch=1"), &h));
        assert!(from_cache(&Method::GET, &list, &q("watch=false"), &h));
        assert!(!from_cache(
            &Method::GET,
            &list,
            &q("limit=1&continue=abc"),
            &h
        ));
        assert!(!from_cache(
            &Method::GET,
            &list,
            &q("resourceVersion=5&resourceVersionMatch=Exact"),
            &h
        ));
        assert!(!from_cache(
            &Method::GET,
            &rp("/api/v1/namespaces/d/pods/p/log"),
            &q(""),
            &h
        ));
        assert!(watch_from_cache(&Method::GET, &list, &q("watch=true")));
        assert!(watch_from_cache(
            &Method::GET,
            &list,
            &q("watch=1&resourceVersion=5")
        ));
        assert!(!watch_from_cache(&Method::GET, &list, &q("watch=false")));
        assert!(!watch_from_cache(
            &Method::GET,
            &rp("/api/v1/namespaces/d/pods/p"),
            &q("watch=1")
        ));
        let mut apply = HeaderMap::new();
        apply.insert("kubectl-command", "kubectl apply".parse().unwrap());
        assert!(!from_cache(&Method::GET, &list, &q(""), &apply));
        apply.insert("kubectl-command", "kubectl get".parse().unwrap());
        assert!(from_cache(&Method::GET, &list, &q(""), &apply));
    }
}
