//! The resources kube-sim stores and serves; must agree with the discovery fixtures.

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
}

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
        format!("{}List", self.kind)
    }
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
    }
}

/// Every resource kube-sim implements.
pub static RESOURCES: [ResourceInfo; 8] = [
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
];

/// The resource with this plural name.
pub fn by_plural(plural: &str) -> Option<&'static ResourceInfo> {
    RESOURCES.iter().find(|r| r.plural == plural)
}

/// The resource served at `group/version/plural`.
pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static ResourceInfo> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// The resource whose objects have this `apiVersion` and `kind`.
pub fn by_type(api_version: &str, kind: &str) -> Option<&'static ResourceInfo> {
    RESOURCES
        .iter()
        .find(|r| r.api_version == api_version && r.kind == kind)
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
