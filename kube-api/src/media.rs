//! Content negotiation as the API server does it for the media types that
//! carry parameters (aggregated discovery, Tables): a media range of
//! `Accept` matches when it names the type and every parameter asked for.

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
}
