//! Content negotiation as the API server does it for the media types that
//! carry parameters (aggregated discovery, Tables): a media range of
//! `Accept` matches when it names the type and every parameter asked for.
//! [`refusal`] is the server's 406: an `Accept` that names nothing a path can
//! be written as.

use crate::Status;

/// Whether `accept` lists the media type `essence` (`application/json`)
/// with all of `params` (`v=v2`, `as=APIGroupDiscoveryList`, ...).
pub fn accepts(accept: &str, essence: &str, params: &[&str]) -> bool {
    accept.split(',').any(|media| {
        let mut parts = media.split(';').map(str::trim);
        parts.next() == Some(essence) && {
            let rest: Vec<&str> = parts.collect();
            params.iter().all(|p| rest.contains(p))
        }
    })
}

/// Whether `accept` lists `content_type` exactly: its type and each of its
/// parameters in one media range.
pub fn accepts_content_type(accept: &str, content_type: &str) -> bool {
    let mut parts = content_type.split(';').map(str::trim);
    let essence = parts.next().unwrap_or_default();
    let params: Vec<&str> = parts.collect();
    accepts(accept, essence, &params)
}

/// A conversion a media range asks for with its `as`, `g` and `v`
/// parameters (`as=Table;g=meta.k8s.io;v=v1`).
type Conversion = (&'static str, &'static str, &'static str);

/// What `/api` and `/apis` convert to: aggregated discovery, v2 only (the
/// server no longer serves `v2beta1`).
const DISCOVERY_ROOT: &[Conversion] = &[("APIGroupDiscoveryList", "apidiscovery.k8s.io", "v2")];

/// What a resource path converts to: Tables and metadata-only objects.
const RESOURCE: &[Conversion] = &[
    ("Table", "meta.k8s.io", "v1"),
    ("Table", "meta.k8s.io", "v1beta1"),
    ("PartialObjectMetadata", "meta.k8s.io", "v1"),
    ("PartialObjectMetadata", "meta.k8s.io", "v1beta1"),
    ("PartialObjectMetadataList", "meta.k8s.io", "v1"),
    ("PartialObjectMetadataList", "meta.k8s.io", "v1beta1"),
];

/// The media types every API path writes objects as.
const ESSENCES: &[&str] = &[
    "application/json",
    "application/yaml",
    "application/vnd.kubernetes.protobuf",
    "application/*",
    "*/*",
];

/// The 406 the API server answers a request to `path` whose `accept` names
/// nothing the path can be written as, or `None` when some media range is
/// acceptable (or the path does not negotiate: `/version`, `/openapi/...`).
///
/// As recorded from a kube-apiserver 1.36 (`errors/406-*.json`): a range
/// asking for a conversion the path cannot make (aggregated discovery of
/// `/api/v1`, `/apis/{group}[/{version}]` or of a resource) is skipped, and
/// when every range was skipped so the answer is "only the following media
/// types are accepted"; a resource asked only for types it has no writer
/// for (`text/html`) gets "406: Not Acceptable" with the representations
/// it has. Discovery paths asked for such types were not recorded and keep
/// answering JSON.
pub fn refusal(path: &str, accept: &str) -> Option<Status> {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (conversions, resource) = match segs.as_slice() {
        ["api"] | ["apis"] => (DISCOVERY_ROOT, false),
        ["api", _] | ["apis", _] | ["apis", _, _] => (&[][..], false),
        // Logs, exec, attach, port-forward and proxy stream what they
        // stream, whatever the Accept header says.
        [.., "log" | "exec" | "attach" | "portforward"] => return None,
        _ if segs.contains(&"proxy") => return None,
        ["api", _, _, ..] | ["apis", _, _, _, ..] => (RESOURCE, true),
        _ => return None,
    };
    if accept.trim().is_empty() {
        return None;
    }
    let mut writable_type = false;
    for range in accept.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let essence = parts.next().unwrap_or_default().to_ascii_lowercase();
        let (mut target, mut q) = ((None, None, None), 1.0_f32);
        for param in parts {
            match param.split_once('=') {
                Some(("as", v)) => target.0 = Some(v),
                Some(("g", v)) => target.1 = Some(v),
                Some(("v", v)) => target.2 = Some(v),
                Some(("q", v)) => q = v.parse().unwrap_or(1.0),
                _ => {}
            }
        }
        if q <= 0.0 || !ESSENCES.contains(&essence.as_str()) {
            continue;
        }
        writable_type = true;
        let convertible = match target {
            (None, _, _) => true,
            (Some(kind), Some(group), Some(version)) => {
                conversions.contains(&(kind, group, version))
            }
            _ => false,
        };
        if convertible {
            return None;
        }
    }
    if writable_type {
        Some(Status::not_acceptable())
    } else if resource {
        Some(Status::no_representation())
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_media_range_matches_with_every_parameter() {
        let v2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
        // The answer's media type as the real server wrote it
        // (../shared/kube-fixtures/errors/requests.json, `Content-Type` of
        // the aggregated `/api`); the Accept headers are those kubectl 1.33
        // and 1.27 send, which tests/e2e_kubectl.rs checks end to end by
        // running every kubectl 1.27–1.33 through the facade.
        let new = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
        let old = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
        assert!(accepts_content_type(new, v2));
        assert!(!accepts_content_type(old, v2));
        assert!(!accepts_content_type("application/json", v2));
        assert!(accepts_content_type(old, "application/json"));
    }

    /// Each 406 a kube-apiserver 1.36 answered (`kube-sim/fixtures/errors/`),
    /// byte for byte, for the request it answered.
    #[test]
    fn refusals_match_the_recorded_server() {
        let aggregated = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
        for (path, accept, file) in [
            (
                "/api/v1",
                aggregated,
                "406-aggregated-discovery-api-v1.json",
            ),
            (
                "/apis/apps",
                aggregated,
                "406-aggregated-discovery-group.json",
            ),
            (
                "/apis/apps/v1",
                aggregated,
                "406-aggregated-discovery-group-version.json",
            ),
            (
                "/apis/fx.example.com/v1",
                aggregated,
                "406-aggregated-discovery-crd-group-version.json",
            ),
            (
                "/api/v1/namespaces/fx-a/configmaps",
                aggregated,
                "406-aggregated-discovery-resource.json",
            ),
            (
                "/api/v1/namespaces/fx-a/configmaps",
                "text/html",
                "406-accept-text-html.json",
            ),
        ] {
            let want = std::fs::read(format!(
                "{}/../kube-sim/fixtures/errors/{file}",
                env!("CARGO_MANIFEST_DIR")
            ))
            .unwrap();
            let status = refusal(path, accept).unwrap_or_else(|| panic!("{file}: accepted"));
            let resp = status.to_http();
            assert_eq!(resp.status(), 406, "{file}");
            assert_eq!(
                String::from_utf8_lossy(resp.body()),
                String::from_utf8_lossy(&want),
                "{file}"
            );
        }
    }

    #[test]
    fn what_the_server_accepted_is_not_refused() {
        let aggregated = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
        let kubectl_get = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
        for (path, accept) in [
            // Recorded 200s: the aggregated documents, and every request
            // of the tables/ and objects/ recordings.
            ("/api", aggregated),
            ("/apis", aggregated),
            ("/version", aggregated),
            ("/openapi/v3", aggregated),
            ("/api/v1/namespaces/fx-tables/pods", kubectl_get),
            (
                "/apis/apps/v1/namespaces/fx-tables/deployments",
                "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
            ),
            (
                "/api/v1/configmaps",
                "application/vnd.kubernetes.protobuf,application/json",
            ),
            ("/api/v1/configmaps", ""),
            ("/api/v1/configmaps", "*/*"),
            // kubectl 1.27 asks for v2beta1 or plain JSON.
            (
                "/api",
                "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json",
            ),
        ] {
            assert!(refusal(path, accept).is_none(), "{path} {accept}");
        }
        // Raw subresources are not negotiated.
        assert!(refusal("/api/v1/namespaces/a/pods/p/log", "text/plain").is_none());
        assert!(refusal("/api/v1/namespaces/a/services/s/proxy/x", "text/html").is_none());
        // A range weighted q=0 is not acceptable.
        assert!(refusal("/api/v1/pods", "application/json;q=0").is_some());
    }
}
