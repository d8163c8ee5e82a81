//! The resources kube-sim stores and serves: the built-in kinds of [`RESOURCES`] (which
//! must agree with the discovery fixtures and have behaviour of their own), every other
//! listable resource the recorded discovery advertises ([`advertised`], plain objects,
//! empty to start, as a real server serves them), and, per simulator, the kinds its
//! CustomResourceDefinitions define ([`CustomResource`], registered by the store).

use std::sync::{Mutex, OnceLock};

/// A served resource type.
#[derive(Debug, PartialEq, Eq)]
pub struct ResourceInfo {
    /// Plural resource name used in paths, e.g. `deployments`.
    pub plural: &'static str,
    /// API group (`""` for core).
    pub group: &'static str,
    /// API version within the group.
    pub version: &'static str,
    /// `apiVersion` of objects (`v1`, `apps/v1`).
    pub api_version: &'static str,
    /// Object kind.
    pub kind: &'static str,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
    /// Whether the resource has a `status` subresource (main-resource writes keep status).
    pub status_subresource: bool,
    /// Whether the resource has a `scale` subresource.
    pub scale_subresource: bool,
    /// Whether `metadata.generation` is maintained.
    pub generation: bool,
    /// What a CustomResourceDefinition says of a custom resource (`None`: built in).
    pub custom: Option<&'static CustomResource>,
}

/// The parts of a CustomResourceDefinition a served custom resource version needs
/// beyond [`ResourceInfo`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CustomResource {
    /// `plural.group`: the CRD's name, and the key objects of every version share.
    pub crd_name: String,
    /// `spec.names.singular`.
    pub singular: String,
    /// `spec.names.shortNames`.
    pub short_names: Vec<String>,
    /// `spec.names.categories`.
    pub categories: Vec<String>,
    /// `spec.names.listKind`.
    pub list_kind: String,
    /// The version objects are stored as (`spec.versions[].storage`).
    pub storage_version: String,
    /// `additionalPrinterColumns` of this version, as (name, type, format, description,
    /// priority, jsonPath).
    pub printer_columns: Vec<PrinterColumn>,
    /// The scale subresource's `specReplicasPath`, `statusReplicasPath` and
    /// `labelSelectorPath` (JSON paths such as `.spec.replicas`).
    pub scale_paths: Option<(String, String, Option<String>)>,
}

/// One `additionalPrinterColumns` entry of a CRD version (shared with the
/// sidecar, which prints custom resources from its cache the same way).
pub use crate::table::PrinterColumn;

impl ResourceInfo {
    /// `plural` or `plural.group`, as error messages name the resource.
    pub fn qualified(&self) -> String {
        self.api().qualified()
    }

    /// The resource as the shared API semantics (selectors, tables, statuses) take it.
    pub fn api(&self) -> spinlink_kube_api::Resource<'static> {
        spinlink_kube_api::Resource {
            group: self.group,
            version: self.version,
            plural: self.plural,
            kind: self.kind,
        }
    }

    /// Kind of the list type, e.g. `PodList`.
    pub fn list_kind(&self) -> String {
        match self.custom {
            Some(c) => c.list_kind.clone(),
            None => format!("{}List", self.kind),
        }
    }

    /// The name objects are stored under: the plural for built-in kinds, the CRD's
    /// name (`plural.group`) for custom ones, so every version of a custom resource
    /// shares its objects and a custom plural never collides with a built-in one.
    pub fn storage_key(&self) -> &'static str {
        match self.custom {
            Some(c) => c.crd_name.as_str(),
            None => self.plural,
        }
    }
}

/// Custom resource infos handed out so far: a CRD created again (in any simulator of
/// the process) reuses its `'static` description instead of leaking another.
static INTERNED: Mutex<Vec<&'static ResourceInfo>> = Mutex::new(Vec::new());

/// What [`intern`] builds a custom [`ResourceInfo`] from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CustomSpec {
    pub group: String,
    pub version: String,
    pub plural: String,
    pub kind: String,
    pub namespaced: bool,
    pub status_subresource: bool,
    pub custom: CustomResource,
}

fn leak(s: &str) -> &'static str {
    Box::leak(s.to_string().into_boxed_str())
}

/// The `'static` [`ResourceInfo`] of a custom resource version, leaked once per distinct
/// description for the life of the process (CRDs are few; their descriptions small).
pub(crate) fn intern(spec: &CustomSpec) -> &'static ResourceInfo {
    let mut interned = INTERNED.lock().unwrap_or_else(|e| e.into_inner());
    let same = |r: &&&'static ResourceInfo| {
        r.group == spec.group
            && r.version == spec.version
            && r.plural == spec.plural
            && r.kind == spec.kind
            && r.namespaced == spec.namespaced
            && r.status_subresource == spec.status_subresource
            && r.custom == Some(&spec.custom)
    };
    if let Some(r) = interned.iter().find(same) {
        return r;
    }
    let info: &'static ResourceInfo = Box::leak(Box::new(ResourceInfo {
        plural: leak(&spec.plural),
        group: leak(&spec.group),
        version: leak(&spec.version),
        api_version: leak(&format!("{}/{}", spec.group, spec.version)),
        kind: leak(&spec.kind),
        namespaced: spec.namespaced,
        status_subresource: spec.status_subresource,
        scale_subresource: spec.custom.scale_paths.is_some(),
        generation: true,
        custom: Some(Box::leak(Box::new(spec.custom.clone()))),
    }));
    interned.push(info);
    info
}

const fn core(
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
    status: bool,
) -> ResourceInfo {
    ResourceInfo {
        plural,
        group: "",
        version: "v1",
        api_version: "v1",
        kind,
        namespaced,
        status_subresource: status,
        scale_subresource: false,
        generation: false,
        custom: None,
    }
}

const fn apps(plural: &'static str, kind: &'static str) -> ResourceInfo {
    ResourceInfo {
        plural,
        group: "apps",
        version: "v1",
        api_version: "apps/v1",
        kind,
        namespaced: true,
        status_subresource: true,
        scale_subresource: true,
        generation: true,
        custom: None,
    }
}

/// Every built-in resource kube-sim implements.
pub static RESOURCES: [ResourceInfo; 10] = [
    core("namespaces", "Namespace", false, true),
    ResourceInfo {
        generation: true,
        ..core("pods", "Pod", true, true)
    },
    core("services", "Service", true, true),
    core("configmaps", "ConfigMap", true, false),
    core("secrets", "Secret", true, false),
    core("events", "Event", true, false),
    apps("deployments", "Deployment"),
    apps("replicasets", "ReplicaSet"),
    ResourceInfo {
        plural: "leases",
        group: "coordination.k8s.io",
        version: "v1",
        api_version: "coordination.k8s.io/v1",
        kind: "Lease",
        namespaced: true,
        status_subresource: false,
        scale_subresource: false,
        generation: false,
        custom: None,
    },
    ResourceInfo {
        plural: "customresourcedefinitions",
        group: "apiextensions.k8s.io",
        version: "v1",
        api_version: "apiextensions.k8s.io/v1",
        kind: "CustomResourceDefinition",
        namespaced: false,
        status_subresource: true,
        scale_subresource: false,
        generation: true,
        custom: None,
    },
];

/// Every built-in resource: [`RESOURCES`] first, then [`advertised`].
fn built_in() -> impl Iterator<Item = &'static ResourceInfo> {
    RESOURCES.iter().chain(advertised().iter().copied())
}

/// The listable resources the recorded discovery documents advertise beyond
/// [`RESOURCES`]: served as plain objects (list, watch, get, create, update, patch,
/// delete), empty to start. A kind with several versions (`autoscaling/v1` and `v2`)
/// shares its objects, as do `events` and `events.k8s.io` events, because the store
/// keys built-in kinds by plural.
pub fn advertised() -> &'static [&'static ResourceInfo] {
    static ADVERTISED: OnceLock<Vec<&'static ResourceInfo>> = OnceLock::new();
    ADVERTISED.get_or_init(|| {
        let mut out = Vec::new();
        for (group, version, doc) in discovery_documents() {
            let Some(entries) = doc["resources"].as_array() else {
                continue;
            };
            for entry in entries {
                let (Some(plural), Some(kind)) = (entry["name"].as_str(), entry["kind"].as_str())
                else {
                    continue;
                };
                let (group, version) = (&group, &version);
                let listable = entry["verbs"]
                    .as_array()
                    .is_some_and(|v| v.iter().any(|v| v == "list"));
                if plural.contains('/')
                    || !listable
                    || RESOURCES
                        .iter()
                        .any(|r| r.group == group && r.version == version && r.plural == plural)
                    || out.iter().any(|r: &&ResourceInfo| {
                        r.group == group && r.version == version && r.plural == plural
                    })
                {
                    continue;
                }
                let status = entries
                    .iter()
                    .any(|e| e["name"].as_str() == Some(&format!("{plural}/status")));
                let api_version = if group.is_empty() {
                    version.clone()
                } else {
                    format!("{group}/{version}")
                };
                out.push(&*Box::leak(Box::new(ResourceInfo {
                    plural: leak(plural),
                    group: leak(group),
                    version: leak(version),
                    api_version: leak(&api_version),
                    kind: leak(kind),
                    namespaced: entry["namespaced"].as_bool().unwrap_or(true),
                    status_subresource: status,
                    scale_subresource: false,
                    generation: !group.is_empty(),
                    custom: None,
                })));
            }
        }
        out
    })
}

/// Every recorded group version with its `APIResourceList`: `/api/v1`, then each
/// version `/apis` lists (recorded, or derived from the aggregated discovery as the
/// server answers it).
fn discovery_documents() -> Vec<(String, String, serde_json::Value)> {
    let json = |rel: &str| {
        crate::fixtures::file(rel).and_then(|b| serde_json::from_slice::<serde_json::Value>(b).ok())
    };
    let mut docs = Vec::new();
    if let Some(doc) = json("discovery/api_v1.json") {
        docs.push((String::new(), "v1".to_owned(), doc));
    }
    let groups = json("discovery/apis.json").unwrap_or_default();
    for group in groups["groups"].as_array().into_iter().flatten() {
        for version in group["versions"].as_array().into_iter().flatten() {
            let (Some(g), Some(v)) = (group["name"].as_str(), version["version"].as_str()) else {
                continue;
            };
            let doc = json(&format!("discovery/apis_{g}_{v}.json"))
                .or_else(|| crate::server::discovery::derived_group_version(g, v));
            if let Some(doc) = doc {
                docs.push((g.to_owned(), v.to_owned(), doc));
            }
        }
    }
    docs
}

/// The built-in resource with this plural name.
pub fn by_plural(plural: &str) -> Option<&'static ResourceInfo> {
    built_in().find(|r| r.plural == plural)
}

/// The built-in resource served at `group/version/plural`.
pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static ResourceInfo> {
    built_in().find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// The built-in resource whose objects have this `apiVersion` and `kind`.
pub fn by_type(api_version: &str, kind: &str) -> Option<&'static ResourceInfo> {
    built_in().find(|r| r.api_version == api_version && r.kind == kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every served resource is in the discovery fixture with the same kind and scope.
    #[test]
    fn resources_match_discovery_fixtures() {
        for res in &RESOURCES {
            let rel = if res.group.is_empty() {
                "discovery/api_v1.json".to_string()
            } else {
                format!("discovery/apis_{}_{}.json", res.group, res.version)
            };
            let doc: serde_json::Value =
                serde_json::from_slice(crate::fixtures::file(&rel).expect("fixture")).unwrap();
            let entry = doc["resources"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["name"] == res.plural)
                .unwrap_or_else(|| panic!("{} not in {rel}", res.plural));
            assert_eq!(entry["kind"], res.kind, "{}", res.plural);
            assert_eq!(entry["namespaced"], res.namespaced, "{}", res.plural);
            let sub = |s: &str| {
                doc["resources"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|r| r["name"] == format!("{}/{s}", res.plural))
            };
            assert_eq!(sub("status"), res.status_subresource, "{}", res.plural);
            assert_eq!(sub("scale"), res.scale_subresource, "{}", res.plural);
        }
    }
}
