//! The kinds the agent watches. A fixed list for now; later work derives it
//! from discovery and the account's `kinds`/`omitKinds`.

use kube::discovery::ApiResource;
use spinlink_proto::v1;

/// A watched resource type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchedKind {
    /// API group, empty for core.
    pub group: &'static str,
    /// Version.
    pub version: &'static str,
    /// Plural resource name.
    pub resource: &'static str,
    /// Kind name.
    pub kind: &'static str,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
}

const fn k(
    group: &'static str,
    version: &'static str,
    resource: &'static str,
    kind: &'static str,
    namespaced: bool,
) -> WatchedKind {
    WatchedKind {
        group,
        version,
        resource,
        kind,
        namespaced,
    }
}

/// The kinds every account watches.
pub const FIXED_KINDS: [WatchedKind; 8] = [
    k("", "v1", "namespaces", "Namespace", false),
    k("", "v1", "pods", "Pod", true),
    k("", "v1", "services", "Service", true),
    k("", "v1", "configmaps", "ConfigMap", true),
    k("", "v1", "secrets", "Secret", true),
    k("", "v1", "events", "Event", true),
    k("apps", "v1", "deployments", "Deployment", true),
    k("apps", "v1", "replicasets", "ReplicaSet", true),
];

impl WatchedKind {
    /// `apiVersion` of its objects (`v1`, `apps/v1`).
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The `"group/version/resource"` form stated in `Hello` (the core group
    /// is empty: `/v1/pods`).
    pub fn gvr(&self) -> String {
        format!("{}/{}/{}", self.group, self.version, self.resource)
    }

    /// True for Secrets, whose values must never leave the agent.
    pub fn is_secret(&self) -> bool {
        self.group.is_empty() && self.resource == "secrets"
    }

    /// The wire form.
    pub fn proto(&self) -> v1::Kind {
        v1::Kind {
            group: self.group.to_owned(),
            version: self.version.to_owned(),
            resource: self.resource.to_owned(),
            kind: self.kind.to_owned(),
            namespaced: self.namespaced,
        }
    }

    /// The kube-rs description used to build an `Api<DynamicObject>`.
    pub fn api_resource(&self) -> ApiResource {
        ApiResource {
            group: self.group.to_owned(),
            version: self.version.to_owned(),
            api_version: self.api_version(),
            kind: self.kind.to_owned(),
            plural: self.resource.to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        let pods = FIXED_KINDS[1];
        assert_eq!(pods.api_version(), "v1");
        assert_eq!(pods.gvr(), "/v1/pods");
        let deploy = FIXED_KINDS[6];
        assert_eq!(deploy.api_version(), "apps/v1");
        assert_eq!(deploy.gvr(), "apps/v1/deployments");
        assert_eq!(FIXED_KINDS.iter().filter(|k| k.is_secret()).count(), 1);
    }
}
