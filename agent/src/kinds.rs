//! The kinds the agent watches: every resource the API server's discovery
//! documents advertise with both `list` and `watch` (subresources skipped,
//! custom resources included), in the group's preferred version, narrowed by
//! the account's [`KindFilter`].
//!
//! Start at [`from_discovery`]; the cache stream calls it again on every
//! discovery refresh, so CRDs created while running get watched.

use std::collections::BTreeSet;

use kube::discovery::ApiResource;
use serde_json::Value;
use spinlink_proto::v1;

use crate::config::AccountConfig;

/// A watched resource type.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WatchedKind {
    /// API group, empty for core.
    pub group: String,
    /// Version.
    pub version: String,
    /// Plural resource name.
    pub resource: String,
    /// Kind name.
    pub kind: String,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
}

impl WatchedKind {
    /// A kind from its parts.
    pub fn new(group: &str, version: &str, resource: &str, kind: &str, namespaced: bool) -> Self {
        Self {
            group: group.to_owned(),
            version: version.to_owned(),
            resource: resource.to_owned(),
            kind: kind.to_owned(),
            namespaced,
        }
    }

    /// The kind described by a wire `Kind`.
    pub fn from_proto(k: &v1::Kind) -> Self {
        Self::new(&k.group, &k.version, &k.resource, &k.kind, k.namespaced)
    }

    /// `apiVersion` of its objects (`v1`, `apps/v1`).
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The `"group/version/resource"` form stated in `Hello` (the core group
    /// is empty: `/v1/pods`).
    pub fn gvr(&self) -> String {
        format!("{}/{}/{}", self.group, self.version, self.resource)
    }

    /// `resource` for the core group, else `resource.group`.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.resource.clone()
        } else {
            format!("{}.{}", self.resource, self.group)
        }
    }

    /// True for Secrets, whose values must never leave the agent.
    pub fn is_secret(&self) -> bool {
        self.group.is_empty() && self.resource == "secrets"
    }

    /// True for the core `namespaces` resource.
    pub fn is_namespace(&self) -> bool {
        self.group.is_empty() && self.resource == "namespaces"
    }

    /// The collection path, in `namespace` when given.
    pub fn path(&self, namespace: Option<&str>) -> String {
        let base = if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        };
        match namespace {
            Some(ns) if self.namespaced => format!("{base}/namespaces/{ns}/{}", self.resource),
            _ => format!("{base}/{}", self.resource),
        }
    }

    /// Whether a `kinds` / `omitKinds` entry names this kind. An entry matches
    /// the kind name (`Deployment`, any case), the plural resource
    /// (`deployments`), `resource.group` (`deployments.apps`) or `Kind.group`
    /// (`Deployment.apps`, the form of Spinnaker's `customResourceDefinitions`).
    pub fn matches(&self, entry: &str) -> bool {
        let entry = entry.trim();
        if entry.eq_ignore_ascii_case(&self.kind) || entry == self.resource {
            return true;
        }
        if self.group.is_empty() {
            return false;
        }
        match entry.split_once('.') {
            Some((name, group)) => {
                group == self.group
                    && (name == self.resource || name.eq_ignore_ascii_case(&self.kind))
            }
            None => false,
        }
    }

    /// The wire form.
    pub fn proto(&self) -> v1::Kind {
        v1::Kind {
            group: self.group.clone(),
            version: self.version.clone(),
            resource: self.resource.clone(),
            kind: self.kind.clone(),
            namespaced: self.namespaced,
        }
    }

    /// The kube-rs description of the resource.
    pub fn api_resource(&self) -> ApiResource {
        ApiResource {
            group: self.group.clone(),
            version: self.version.clone(),
            api_version: self.api_version(),
            kind: self.kind.clone(),
            plural: self.resource.clone(),
        }
    }
}

/// Which discovered kinds an account watches, and in which namespaces.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KindFilter {
    /// Only these kinds (every kind when empty); see [`WatchedKind::matches`].
    pub kinds: Vec<String>,
    /// Every kind but these.
    pub omit_kinds: Vec<String>,
    /// Only these namespaces (all when empty).
    pub namespaces: Vec<String>,
    /// Every namespace but these.
    pub omit_namespaces: Vec<String>,
}

impl KindFilter {
    /// The filter of an account's configuration. `customResourceDefinitions`
    /// add to `kinds` when `kinds` is set (when it is not, every kind is
    /// watched anyway).
    pub fn of(account: &AccountConfig) -> Self {
        let mut kinds = account.kinds.clone();
        if !kinds.is_empty() {
            kinds.extend(
                account
                    .custom_resource_definitions
                    .iter()
                    .map(|c| c.name().to_owned()),
            );
        }
        Self {
            kinds,
            omit_kinds: account.omit_kinds.clone(),
            namespaces: account.namespaces.clone(),
            omit_namespaces: account.omit_namespaces.clone(),
        }
    }

    /// Whether `kind` is watched.
    pub fn wants(&self, kind: &WatchedKind) -> bool {
        if !self.kinds.is_empty() && !self.kinds.iter().any(|e| kind.matches(e)) {
            return false;
        }
        !self.omit_kinds.iter().any(|e| kind.matches(e))
    }

    /// Whether objects in `namespace` (empty: cluster-scoped) are kept.
    pub fn wants_namespace(&self, namespace: &str) -> bool {
        if namespace.is_empty() {
            return true;
        }
        if !self.namespaces.is_empty() && !self.namespaces.iter().any(|n| n == namespace) {
            return false;
        }
        !self.omit_namespaces.iter().any(|n| n == namespace)
    }

    /// Whether a Namespace object named `name` is kept (namespace filters
    /// apply to the namespaces themselves too).
    pub fn wants_object(&self, kind: &WatchedKind, namespace: &str, name: &str) -> bool {
        if kind.is_namespace() {
            self.wants_namespace(name)
        } else {
            self.wants_namespace(namespace)
        }
    }

    /// The namespaces a namespaced kind is listed and watched in, one by one;
    /// `None` for all at once.
    pub fn scopes(&self) -> Option<&[String]> {
        (!self.namespaces.is_empty()).then_some(self.namespaces.as_slice())
    }
}

/// The `group/version` of each group's preferred version, from `/apis`.
fn preferred_versions(apis: &Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for group in apis["groups"].as_array().into_iter().flatten() {
        let preferred = group["preferredVersion"]["groupVersion"]
            .as_str()
            .or_else(|| group["versions"][0]["groupVersion"].as_str());
        if let Some(gv) = preferred {
            out.insert(gv.to_owned());
        }
    }
    out
}

/// Every listable and watchable resource in the discovery documents
/// (`/api/v1`, `/apis` and `/apis/{group}/{version}`), preferred versions
/// only, that `filter` wants, sorted.
pub fn from_discovery(documents: &[v1::Document], filter: &KindFilter) -> Vec<WatchedKind> {
    let parse = |d: &v1::Document| serde_json::from_slice::<Value>(&d.body).ok();
    let preferred = documents
        .iter()
        .find(|d| d.path == "/apis")
        .and_then(parse)
        .map(|apis| preferred_versions(&apis))
        .unwrap_or_default();
    let mut out = BTreeSet::new();
    for doc in documents {
        let gv = if doc.path == "/api/v1" {
            "v1".to_owned()
        } else if let Some(gv) = doc.path.strip_prefix("/apis/") {
            if !preferred.contains(gv) {
                continue;
            }
            gv.to_owned()
        } else {
            continue;
        };
        let (group, version) = gv.split_once('/').unwrap_or(("", gv.as_str()));
        let Some(list) = parse(doc) else { continue };
        for r in list["resources"].as_array().into_iter().flatten() {
            let (Some(name), Some(kind)) = (r["name"].as_str(), r["kind"].as_str()) else {
                continue;
            };
            if name.contains('/') {
                continue; // a subresource
            }
            let verbs: Vec<&str> = r["verbs"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            if !(verbs.contains(&"list") && verbs.contains(&"watch")) {
                continue;
            }
            let namespaced = r["namespaced"].as_bool().unwrap_or(false);
            let kind = WatchedKind::new(group, version, name, kind, namespaced);
            if filter.wants(&kind) {
                out.insert(kind);
            }
        }
    }
    out.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn doc(path: &str, body: Value) -> v1::Document {
        v1::Document {
            path: path.into(),
            content_type: "application/json".into(),
            body: serde_json::to_vec(&body).unwrap(),
        }
    }

    fn res(name: &str, kind: &str, namespaced: bool, verbs: &[&str]) -> Value {
        json!({"name": name, "kind": kind, "namespaced": namespaced, "verbs": verbs})
    }

    fn documents() -> Vec<v1::Document> {
        let lw = ["get", "list", "watch", "create"];
        vec![
            doc(
                "/api/v1",
                json!({"groupVersion": "v1", "resources": [
                    res("pods", "Pod", true, &lw),
                    res("pods/status", "Pod", true, &["get", "patch"]),
                    res("bindings", "Binding", true, &["create"]),
                    res("secrets", "Secret", true, &lw),
                    res("namespaces", "Namespace", false, &lw),
                ]}),
            ),
            doc(
                "/apis",
                json!({"groups": [
                    {"name": "apps", "versions": [{"groupVersion": "apps/v1", "version": "v1"}],
                     "preferredVersion": {"groupVersion": "apps/v1", "version": "v1"}},
                    {"name": "autoscaling", "versions": [
                        {"groupVersion": "autoscaling/v2", "version": "v2"},
                        {"groupVersion": "autoscaling/v1", "version": "v1"}],
                     "preferredVersion": {"groupVersion": "autoscaling/v2", "version": "v2"}},
                    {"name": "stable.example.com", "versions": [
                        {"groupVersion": "stable.example.com/v1", "version": "v1"}]},
                ]}),
            ),
            doc(
                "/apis/apps/v1",
                json!({"resources": [
                    res("deployments", "Deployment", true, &lw),
                    res("deployments/scale", "Scale", true, &lw),
                ]}),
            ),
            doc(
                "/apis/autoscaling/v1",
                json!({"resources": [
                res("horizontalpodautoscalers", "HorizontalPodAutoscaler", true, &lw)]}),
            ),
            doc(
                "/apis/autoscaling/v2",
                json!({"resources": [
                res("horizontalpodautoscalers", "HorizontalPodAutoscaler", true, &lw)]}),
            ),
            doc(
                "/apis/stable.example.com/v1",
                json!({"resources": [
                res("crontabs", "CronTab", true, &lw)]}),
            ),
        ]
    }

    fn gvrs(kinds: &[WatchedKind]) -> Vec<String> {
        kinds.iter().map(WatchedKind::gvr).collect()
    }

    #[test]
    fn discovery_lists_watchable_resources_in_preferred_versions() {
        let kinds = from_discovery(&documents(), &KindFilter::default());
        assert_eq!(
            gvrs(&kinds),
            vec![
                "/v1/namespaces",
                "/v1/pods",
                "/v1/secrets",
                "apps/v1/deployments",
                "autoscaling/v2/horizontalpodautoscalers",
                "stable.example.com/v1/crontabs",
            ]
        );
        let pods = &kinds[1];
        assert!(pods.namespaced && pods.kind == "Pod");
        assert!(!kinds[0].namespaced);
    }

    #[test]
    fn kinds_and_omit_kinds_match_kind_or_resource_group() {
        let only = KindFilter {
            kinds: vec![
                "Deployment".into(),
                "crontabs.stable.example.com".into(),
                "secrets".into(),
            ],
            ..KindFilter::default()
        };
        assert_eq!(
            gvrs(&from_discovery(&documents(), &only)),
            vec![
                "/v1/secrets",
                "apps/v1/deployments",
                "stable.example.com/v1/crontabs"
            ]
        );
        let omit = KindFilter {
            omit_kinds: vec![
                "pod".into(),
                "CronTab.stable.example.com".into(),
                "deployments.apps".into(),
            ],
            ..KindFilter::default()
        };
        let got = gvrs(&from_discovery(&documents(), &omit));
        assert_eq!(
            got,
            vec![
                "/v1/namespaces",
                "/v1/secrets",
                "autoscaling/v2/horizontalpodautoscalers"
            ]
        );
        let k = WatchedKind::new("apps", "v1", "deployments", "Deployment", true);
        assert!(!k.matches("deployments.batch"));
        assert!(!k.matches("Deploy"));
    }

    #[test]
    fn custom_resource_definitions_add_to_kinds() {
        use crate::config::{CustomResourceDefinition, CustomResourceObject};
        let account = AccountConfig {
            name: "dev".into(),
            kinds: vec!["Deployment".into()],
            custom_resource_definitions: vec![CustomResourceDefinition::Object(
                CustomResourceObject {
                    kind: "CronTab.stable.example.com".into(),
                    ..CustomResourceObject::default()
                },
            )],
            ..AccountConfig::default()
        };
        assert_eq!(
            gvrs(&from_discovery(&documents(), &KindFilter::of(&account))),
            vec!["apps/v1/deployments", "stable.example.com/v1/crontabs"]
        );
        // Without `kinds` every kind is watched anyway; the entries add nothing.
        let all = AccountConfig {
            kinds: Vec::new(),
            ..account
        };
        assert!(KindFilter::of(&all).kinds.is_empty());
    }

    #[test]
    fn namespaces_filter() {
        let f = KindFilter {
            namespaces: vec!["a".into(), "b".into()],
            omit_namespaces: vec!["b".into()],
            ..KindFilter::default()
        };
        assert!(f.wants_namespace("a") && !f.wants_namespace("b") && !f.wants_namespace("c"));
        assert!(f.wants_namespace(""));
        let ns = WatchedKind::new("", "v1", "namespaces", "Namespace", false);
        assert!(f.wants_object(&ns, "", "a") && !f.wants_object(&ns, "", "c"));
        assert_eq!(f.scopes().unwrap().len(), 2);
        assert!(KindFilter::default().scopes().is_none());
    }

    #[test]
    fn names_and_paths() {
        let pods = WatchedKind::new("", "v1", "pods", "Pod", true);
        assert_eq!(pods.api_version(), "v1");
        assert_eq!(pods.gvr(), "/v1/pods");
        assert_eq!(pods.path(None), "/api/v1/pods");
        assert_eq!(pods.path(Some("x")), "/api/v1/namespaces/x/pods");
        let deploy = WatchedKind::new("apps", "v1", "deployments", "Deployment", true);
        assert_eq!(deploy.api_version(), "apps/v1");
        assert_eq!(deploy.gvr(), "apps/v1/deployments");
        assert_eq!(deploy.qualified(), "deployments.apps");
        assert_eq!(
            deploy.path(Some("x")),
            "/apis/apps/v1/namespaces/x/deployments"
        );
        let ns = WatchedKind::new("", "v1", "namespaces", "Namespace", false);
        assert_eq!(ns.path(Some("x")), "/api/v1/namespaces");
        assert!(WatchedKind::new("", "v1", "secrets", "Secret", true).is_secret());
        assert_eq!(WatchedKind::from_proto(&deploy.proto()), deploy);
    }
}
