//! The cluster owner's relay policy: which verbs, resources and namespaces
//! relayed requests may use (`kubernetes.accounts[].relay`), and whether
//! Secret values may be read. [`RelayPolicy::check`] decides for one request
//! from its method, path and query; a denial names the rule that refused it
//! and becomes a 403 `metav1.Status` ([`Denied::status_body`]).
//!
//! The request's resource is read from the path the way the API server
//! routes it: `/api/v1/…` or `/apis/{group}/{version}/…`, an optional legacy
//! `watch/`, `namespaces/{ns}/`, the resource, a name and a subresource.
//! Paths that are not resource paths (discovery, `/version`, `/openapi`) may
//! only be read. Paths with `.`/`..` segments or percent-escapes are refused
//! outright, so no spelling of a path can reach a resource the policy does
//! not see.

use globset::{Glob, GlobSet, GlobSetBuilder};

use crate::config::RelayPolicyConfig;

/// The resource of a `SelfSubjectAccessReview`, as [`Target::resource`] names it.
const SELF_REVIEW: &str = "selfsubjectaccessreviews.authorization.k8s.io";

/// A compiled relay policy.
#[derive(Debug, Clone)]
pub struct RelayPolicy {
    account: String,
    verbs: GlobSet,
    resources: GlobSet,
    namespaces: GlobSet,
    read_secrets: bool,
}

/// What a request does, as the policy sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
    /// `deletecollection`; for non-resource paths the lower-case method.
    pub verb: String,
    /// `resource` (core) or `resource.group`, then `/subresource` if any;
    /// `None` for non-resource paths.
    pub resource: Option<String>,
    /// The namespace; empty for cluster-scoped and all-namespace requests.
    pub namespace: String,
}

/// A refused request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denied {
    /// HTTP status: 403, or 400 for a path that cannot be judged.
    pub code: u16,
    /// The `metav1.Status` message, naming the rule.
    pub message: String,
}

impl Denied {
    /// The `metav1.Status` JSON for the response body, written as the API
    /// server writes its own ([`spinlink_kube_api::json`]).
    pub fn status_body(&self) -> Vec<u8> {
        let reason = if self.code == 403 {
            "Forbidden"
        } else {
            "BadRequest"
        };
        let status = spinlink_kube_api::Status::new(self.code, reason, self.message.clone());
        spinlink_kube_api::json::encode(&status)
    }
}

fn globs(patterns: &[String]) -> Result<GlobSet, globset::Error> {
    let mut b = GlobSetBuilder::new();
    for p in patterns {
        b.add(Glob::new(p)?);
    }
    b.build()
}

impl RelayPolicy {
    /// Compiles an account's `relay:` section (patterns were checked when the
    /// configuration was loaded; a bad one here is reported the same way).
    pub fn new(account: &str, config: &RelayPolicyConfig) -> Result<Self, globset::Error> {
        Ok(Self {
            account: account.to_owned(),
            verbs: globs(&config.verbs)?,
            resources: globs(&config.resources)?,
            namespaces: globs(&config.namespaces)?,
            read_secrets: config.read_secrets,
        })
    }

    /// Whether Secret values are relayed unchanged (`relay.readSecrets`).
    pub fn reads_secrets(&self) -> bool {
        self.read_secrets
    }

    /// Decides one request; `Ok` carries what it does (for metrics).
    pub fn check(&self, method: &str, path: &str, query: &str) -> Result<Target, (Target, Denied)> {
        let target = match parse(method, path, query) {
            Ok(t) => t,
            Err(message) => {
                let t = Target {
                    verb: method.to_ascii_lowercase(),
                    resource: None,
                    namespace: String::new(),
                };
                return Err((t, Denied { code: 400, message }));
            }
        };
        let deny = |key: &str, what: String| Denied {
            code: 403,
            message: format!(
                "relay policy of account {:?} denies {what}: not allowed by relay.{key}",
                self.account
            ),
        };
        let Some(resource) = &target.resource else {
            if target.verb == "get" {
                return Ok(target);
            }
            let d = deny(
                "verbs",
                format!("{} on non-resource path {path:?}", target.verb),
            );
            return Err((target, d));
        };
        // The sidecar asks, before it answers a read from its cache, whether
        // the account's identity may make it: a SelfSubjectAccessReview
        // changes nothing and tells only what the account itself may do, so
        // no policy keeps the sidecar from asking.
        if target.verb == "create" && resource == SELF_REVIEW && target.namespace.is_empty() {
            return Ok(target);
        }
        if !self.verbs.is_match(&target.verb) {
            let d = deny("verbs", format!("verb {:?}", target.verb));
            return Err((target, d));
        }
        if !self.resources.is_match(resource) {
            let d = deny("resources", format!("resource {resource:?}"));
            return Err((target, d));
        }
        if !self.namespaces.is_match(&target.namespace) {
            let what = if target.namespace.is_empty() {
                "requests across namespaces or on cluster-scoped resources (needs \"*\")".to_owned()
            } else {
                format!("namespace {:?}", target.namespace)
            };
            let d = deny("namespaces", what);
            return Err((target, d));
        }
        Ok(target)
    }
}

/// Reads verb, resource and namespace from a request.
pub fn parse(method: &str, path: &str, query: &str) -> Result<Target, String> {
    let mut segments: Vec<&str> = path.split('/').skip(1).collect();
    if !path.starts_with('/')
        || path.contains('%')
        || segments.iter().any(|s| *s == "." || *s == "..")
    {
        return Err(format!(
            "request path {path:?} is not a plain absolute path"
        ));
    }
    if segments.last() == Some(&"") {
        segments.pop();
    }
    let non_resource = |verb: &str| Target {
        verb: verb.to_owned(),
        resource: None,
        namespace: String::new(),
    };
    let method_verb = method.to_ascii_lowercase();
    let (group, rest) = match segments.as_slice() {
        ["api", "v1", rest @ ..] if !rest.is_empty() => ("", rest),
        ["apis", group, _version, rest @ ..] if !rest.is_empty() => (*group, rest),
        _ => return Ok(non_resource(&method_verb)),
    };
    let mut rest = rest.to_vec();
    let mut watch = is_watch(path, query);
    if rest.first() == Some(&"watch") {
        rest.remove(0);
        watch = true;
    }
    if rest.iter().any(|s| s.is_empty()) {
        return Err(format!("request path {path:?} has an empty segment"));
    }
    let (namespace, rest) = match rest.as_slice() {
        // A Namespace's own subresources.
        ["namespaces", _, "status" | "finalize"] => (String::new(), rest),
        ["namespaces", ns, tail @ ..] if !tail.is_empty() => ((*ns).to_owned(), tail.to_vec()),
        _ => (String::new(), rest),
    };
    let (resource, name, sub) = match rest.as_slice() {
        [resource] => (*resource, None, None),
        [resource, name] => (*resource, Some(*name), None),
        [resource, name, sub] => (*resource, Some(*name), Some(*sub)),
        _ => return Err(format!("request path {path:?} is not a resource path")),
    };
    let mut qualified = if group.is_empty() {
        resource.to_owned()
    } else {
        format!("{resource}.{group}")
    };
    if let Some(sub) = sub {
        qualified = format!("{qualified}/{sub}");
    }
    // The API server's verb, as kube-sim's authorizer and the facade's read
    // reviews derive it; another method is named by itself.
    let verb = http::Method::from_bytes(method.as_bytes())
        .ok()
        .and_then(|m| spinlink_kube_api::request_verb(&m, name.is_some(), watch))
        .unwrap_or(method_verb.as_str());
    Ok(Target {
        verb: verb.to_owned(),
        resource: Some(qualified),
        namespace,
    })
}

/// True for watch requests: `watch=true|1` in the query or a legacy
/// `/watch/` path.
pub fn is_watch(path: &str, query: &str) -> bool {
    path.contains("/watch/")
        || query.split('&').any(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            k == "watch" && (v == "true" || v == "1" || v.is_empty())
        })
}

/// Fuzz body: any request a sidecar could relay (method, path and query
/// separated by NUL) against a narrow policy. Whatever the text, the check
/// answers without panicking; a path with `%`, `.` or `..` segments, or not
/// starting with `/`, is refused with 400; an allowed request names only
/// what the policy allows.
pub fn fuzz_check(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.splitn(3, '\0');
    let method = parts.next().unwrap_or("");
    let path = parts.next().unwrap_or("");
    let query = parts.next().unwrap_or("");
    let narrow = RelayPolicyConfig {
        verbs: vec!["get".into(), "list".into(), "patch".into()],
        resources: vec!["pods".into(), "deployments.apps".into(), "pods/log".into()],
        namespaces: vec!["team-*".into()],
        read_secrets: false,
    };
    let policy = RelayPolicy::new("fuzz", &narrow).expect("the narrow policy compiles");
    let plain = path.starts_with('/')
        && !path.contains('%')
        && !path.split('/').any(|s| s == "." || s == "..");
    match policy.check(method, path, query) {
        Ok(target) => {
            assert!(plain, "{path:?} was allowed");
            if let Some(resource) = &target.resource {
                assert!(
                    resource == SELF_REVIEW
                        || (["get", "list", "patch"].contains(&target.verb.as_str())
                            && target.namespace.starts_with("team-")),
                    "{method} {path}?{query} was allowed as {target:?}"
                );
            } else {
                assert_eq!(target.verb, "get", "{method} {path}");
            }
        }
        Err((_, denied)) => {
            assert!(plain || denied.code == 400, "{path:?}: {denied:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fuzz_check_requests() {
        spinlink_fuzzing::Fuzz::new("agent relay policy")
            .seeds([
                b"GET\0/api/v1/namespaces/team-a/pods\0watch=true".to_vec(),
                b"PATCH\0/apis/apps/v1/namespaces/team-b/deployments/web\0".to_vec(),
                b"GET\0/api/v1/namespaces/team-a/pods/p/log\0follow=true".to_vec(),
                b"POST\0/apis/authorization.k8s.io/v1/selfsubjectaccessreviews\0".to_vec(),
                b"DELETE\0/api/v1/namespaces/kube-system/secrets/x\0".to_vec(),
                b"GET\0/api/v1/namespaces/team-a/../kube-system/pods\0".to_vec(),
                b"GET\0/openapi/v2\0".to_vec(),
            ])
            .run(fuzz_check);
    }

    #[test]
    fn watch_detection() {
        assert!(is_watch("/api/v1/pods", "watch=true&resourceVersion=5"));
        assert!(is_watch("/api/v1/pods", "labelSelector=a&watch=1"));
        assert!(is_watch("/api/v1/watch/pods", ""));
        assert!(!is_watch("/api/v1/pods", "watch=false"));
        assert!(!is_watch("/api/v1/pods", "watchers=true"));
        assert!(!is_watch("/api/v1/pods", ""));
    }

    fn target(method: &str, path: &str, query: &str) -> (String, Option<String>, String) {
        let t = parse(method, path, query).unwrap();
        (t.verb, t.resource, t.namespace)
    }

    fn t(verb: &str, resource: Option<&str>, ns: &str) -> (String, Option<String>, String) {
        (verb.into(), resource.map(str::to_owned), ns.into())
    }

    #[test]
    fn paths_are_read_like_the_api_server_routes_them() {
        assert_eq!(
            target("GET", "/api/v1/namespaces/a/pods", ""),
            t("list", Some("pods"), "a")
        );
        assert_eq!(
            target("GET", "/api/v1/namespaces/a/pods/p", ""),
            t("get", Some("pods"), "a")
        );
        assert_eq!(
            target("GET", "/api/v1/namespaces/a/pods/p/log", ""),
            t("get", Some("pods/log"), "a")
        );
        assert_eq!(
            target("GET", "/api/v1/pods", "watch=1"),
            t("watch", Some("pods"), "")
        );
        assert_eq!(
            target("GET", "/api/v1/watch/namespaces/a/pods", ""),
            t("watch", Some("pods"), "a")
        );
        assert_eq!(
            target("GET", "/api/v1/namespaces/a", ""),
            t("get", Some("namespaces"), "")
        );
        assert_eq!(
            target("DELETE", "/api/v1/namespaces/a", ""),
            t("delete", Some("namespaces"), "")
        );
        assert_eq!(
            target("PUT", "/api/v1/namespaces/a/finalize", ""),
            t("update", Some("namespaces/finalize"), "")
        );
        assert_eq!(
            target(
                "PATCH",
                "/apis/apps/v1/namespaces/a/deployments/d/scale",
                ""
            ),
            t("patch", Some("deployments.apps/scale"), "a")
        );
        assert_eq!(
            target("DELETE", "/apis/apps/v1/namespaces/a/deployments", ""),
            t("deletecollection", Some("deployments.apps"), "a")
        );
        assert_eq!(
            target("POST", "/apis/apps/v1/namespaces/a/deployments", ""),
            t("create", Some("deployments.apps"), "a")
        );
        assert_eq!(
            target("PUT", "/api/v1/nodes/n", ""),
            t("update", Some("nodes"), "")
        );
        assert_eq!(target("GET", "/apis/apps/v1", ""), t("get", None, ""));
        assert_eq!(target("GET", "/version", ""), t("get", None, ""));
        for bad in [
            "/api/v1/namespaces/a/../../secrets",
            "/api/v1/namespaces/a/sec%72ets",
            "/api/v1/./secrets",
        ] {
            assert!(parse("GET", bad, "").is_err(), "{bad}");
        }
    }

    fn policy(verbs: &[&str], resources: &[&str], namespaces: &[&str]) -> RelayPolicy {
        let v = |s: &[&str]| s.iter().map(|x| (*x).to_owned()).collect();
        RelayPolicy::new(
            "dev",
            &RelayPolicyConfig {
                verbs: v(verbs),
                resources: v(resources),
                namespaces: v(namespaces),
                read_secrets: false,
            },
        )
        .unwrap()
    }

    #[test]
    fn each_rule_is_named_when_it_denies() {
        let p = policy(
            &["get", "list", "watch"],
            &["pods", "*.apps", "pods/log"],
            &["team-*"],
        );
        assert!(p.check("GET", "/api/v1/namespaces/team-a/pods", "").is_ok());
        assert!(
            p.check("GET", "/api/v1/namespaces/team-a/pods/p/log", "")
                .is_ok()
        );
        assert!(
            p.check("GET", "/apis/apps/v1/namespaces/team-b/deployments", "")
                .is_ok()
        );
        assert!(
            p.check("GET", "/apis", "").is_ok(),
            "discovery is always readable"
        );
        let denied = |m: &str, path: &str| p.check(m, path, "").unwrap_err().1;
        let d = denied("DELETE", "/api/v1/namespaces/team-a/pods/p");
        assert_eq!(d.code, 403);
        assert!(
            d.message.contains("relay.verbs") && d.message.contains("\"delete\""),
            "{}",
            d.message
        );
        let d = denied("GET", "/api/v1/namespaces/team-a/secrets");
        assert!(
            d.message.contains("relay.resources") && d.message.contains("secrets"),
            "{}",
            d.message
        );
        let d = denied("GET", "/api/v1/namespaces/prod/pods");
        assert!(
            d.message.contains("relay.namespaces") && d.message.contains("prod"),
            "{}",
            d.message
        );
        let d = denied("GET", "/api/v1/pods");
        assert!(d.message.contains("relay.namespaces"), "{}", d.message);
        let d = denied("POST", "/apis");
        assert!(d.message.contains("non-resource"), "{}", d.message);
        assert_eq!(denied("GET", "/api/v1/namespaces/a/../x").code, 400);
        let text = d.status_body();
        let body: serde_json::Value = serde_json::from_slice(&text).unwrap();
        assert_eq!(
            (body["kind"].as_str(), body["code"].as_u64()),
            (Some("Status"), Some(403))
        );
        assert_eq!(body["reason"], "Forbidden");
        // The server's JSON: the keys in its order, compact, one newline.
        assert!(
            text.starts_with(br#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"#),
            "{}",
            String::from_utf8_lossy(&text)
        );
        assert!(text.ends_with(b",\"reason\":\"Forbidden\",\"code\":403}\n"));
        // Whatever the policy, the account may ask what it may do.
        let review = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews";
        assert!(p.check("POST", review, "").is_ok());
        assert!(
            p.check("DELETE", review, "").is_err(),
            "only creating a review is exempt"
        );
        // The default allows everything.
        let all = RelayPolicy::new("dev", &RelayPolicyConfig::default()).unwrap();
        assert!(all.check("DELETE", "/api/v1/nodes/n", "").is_ok());
        assert!(!all.reads_secrets());
    }
}
