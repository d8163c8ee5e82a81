//! Which resource a path, an object or a name means: the built-in kinds of
//! [`resources::RESOURCES`] first, then the custom resources this simulator's CRDs serve.

use super::Sim;
use crate::resources::{self, ResourceInfo};

impl Sim {
    /// The resource served at `/apis/{group}/{version}/{plural}` (or `/api/v1/{plural}`).
    pub fn find_resource(
        &self,
        group: &str,
        version: &str,
        plural: &str,
    ) -> Option<&'static ResourceInfo> {
        resources::find(group, version, plural).or_else(|| {
            self.lock()
                .custom
                .iter()
                .find(|r| r.group == group && r.version == version && r.plural == plural)
                .copied()
        })
    }

    /// The resource whose objects have this `apiVersion` and `kind`.
    pub fn resource_by_type(&self, api_version: &str, kind: &str) -> Option<&'static ResourceInfo> {
        resources::by_type(api_version, kind).or_else(|| {
            self.lock()
                .custom
                .iter()
                .find(|r| r.api_version == api_version && r.kind == kind)
                .copied()
        })
    }

    /// The resource named `name`: a built-in plural, or a custom resource's plural or
    /// `plural.group` (its storage version when it has several).
    pub fn resource_by_name(&self, name: &str) -> Option<&'static ResourceInfo> {
        resources::by_plural(name).or_else(|| {
            let st = self.lock();
            let mut matching = st
                .custom
                .iter()
                .filter(|r| r.plural == name || r.storage_key() == name);
            let first = matching.clone().next().copied();
            matching
                .find(|r| r.custom.is_some_and(|c| c.storage_version == r.version))
                .copied()
                .or(first)
        })
    }

    /// Every custom resource version served now, in CRD creation order.
    pub fn custom_resources(&self) -> Vec<&'static ResourceInfo> {
        self.lock().custom.clone()
    }

    /// Whether `res` is (still) served.
    pub(crate) fn serves(&self, res: &'static ResourceInfo) -> bool {
        res.custom.is_none() || self.lock().custom.iter().any(|r| std::ptr::eq(*r, res))
    }
}
