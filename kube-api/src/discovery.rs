//! The cache validator of aggregated discovery (`/api` and `/apis` asked as
//! `APIGroupDiscoveryList`), as kube-apiserver 1.36 gives it
//! (`k8s.io/apiserver/pkg/endpoints/discovery/aggregated`, `etag.go` and
//! `handler.go`): the `ETag` is the SHA-512, in uppercase hex and quoted, of
//! the list as Go's `json.Marshal` writes it — the served document without
//! the `kind` and `apiVersion` its serializer adds on the way out — and a
//! request whose `If-None-Match` (its first) is exactly that value gets
//! `304 Not Modified` with no body, carrying the `ETag`, `Vary: Accept` and
//! `Cache-Control: public` a `200` carries. The recorded `/api` answer's
//! `Etag` (`kube-sim/fixtures/errors/requests.json`) checks [`etag`].

use http::{HeaderMap, HeaderValue, header};

/// The `ETag` of an aggregated discovery document (its JSON, in any
/// layout); `None` when it is not a JSON object.
pub fn etag(document: &[u8]) -> Option<HeaderValue> {
    let mut list: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(document).ok()?;
    // `shift_remove` keeps the other keys in the order they came.
    list.shift_remove("kind");
    list.shift_remove("apiVersion");
    let compact = serde_json::to_vec(&list).ok()?;
    let digest = ring::digest::digest(&ring::digest::SHA512, &crate::json::escaped(&compact));
    let mut quoted = String::with_capacity(2 + 2 * digest.as_ref().len());
    quoted.push('"');
    for b in digest.as_ref() {
        quoted.push_str(&format!("{b:02X}"));
    }
    quoted.push('"');
    HeaderValue::from_str(&quoted).ok()
}

/// Fuzz body: any aggregated discovery body an agent sends. Tagging it
/// answers or declines without panicking, and a JSON object's tag does not
/// depend on its layout.
pub fn fuzz_etag(data: &[u8]) {
    let tag = etag(data);
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(data)
        && value.is_object()
    {
        let pretty = serde_json::to_vec_pretty(&value).expect("a Value serializes");
        assert_eq!(etag(&pretty), tag, "the layout changed the tag");
    }
}

/// The caching headers the server gives an aggregated discovery answer,
/// a `304` too: `Cache-Control: public`, `Vary: Accept` (as recorded in
/// `errors/requests.json`) and the document's `ETag` when it has one.
pub fn cache_headers(headers: &mut HeaderMap, etag: Option<&HeaderValue>) {
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("public"));
    headers.insert(header::VARY, HeaderValue::from_static("Accept"));
    if let Some(tag) = etag {
        headers.insert(header::ETAG, tag.clone());
    }
}

/// Whether a request with `headers` already holds the document tagged
/// `etag`: its first `If-None-Match` is exactly it (Go's `Header.Get`).
pub fn not_modified(headers: &HeaderMap, etag: &HeaderValue) -> bool {
    headers.get(header::IF_NONE_MATCH) == Some(etag)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(rel: &str) -> Vec<u8> {
        std::fs::read(format!(
            "{}/../kube-sim/fixtures/{rel}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap()
    }

    /// The `Etag` the real server answered for `GET /api` as aggregated
    /// discovery (`errors/requests.json`), from the document it served
    /// (`discovery/api.aggregated.json`, recorded indented: the layout
    /// does not count).
    #[test]
    fn the_recorded_api_document_has_the_recorded_etag() {
        let requests: serde_json::Value =
            serde_json::from_slice(&fixture("errors/requests.json")).unwrap();
        let api = requests
            .as_array()
            .unwrap()
            .iter()
            .find(|r| {
                r["path"] == "/api"
                    && r["status"] == 200
                    && r["note"]
                        .as_str()
                        .is_some_and(|n| n.contains("api.aggregated.json"))
            })
            .expect("the recorded aggregated /api");
        let recorded = api["response_headers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h[0] == "Etag")
            .and_then(|h| h[1].as_str())
            .expect("its Etag");
        let ours = etag(&fixture("discovery/api.aggregated.json")).unwrap();
        assert_eq!(ours.to_str().unwrap(), recorded);
        // Another document, another tag.
        assert_ne!(
            etag(&fixture("discovery/apis.aggregated.json")).unwrap(),
            ours
        );
    }

    #[test]
    fn only_the_exact_first_if_none_match_is_not_modified() {
        let tag = HeaderValue::from_static("\"AB\"");
        let with = |values: &[&'static str]| {
            let mut headers = HeaderMap::new();
            for v in values {
                headers.append(header::IF_NONE_MATCH, HeaderValue::from_static(v));
            }
            not_modified(&headers, &tag)
        };
        assert!(with(&["\"AB\""]));
        assert!(with(&["\"AB\"", "\"CD\""]));
        assert!(!with(&[]));
        assert!(!with(&["AB"]));
        assert!(!with(&["\"CD\"", "\"AB\""]));
        assert!(!with(&["W/\"AB\""]));
    }

    #[test]
    fn fuzz_discovery_etag() {
        spinlink_fuzzing::Fuzz::new("kube-api aggregated discovery etag")
            .seeds([
                fixture("discovery/api.aggregated.json"),
                br#"{"kind":"APIGroupDiscoveryList","metadata":{},"items":[{"a":"<&>\u2028"}]}"#
                    .to_vec(),
                b"{\"a\": \"\xe2\x80\xa8\"}".to_vec(),
            ])
            .run(fuzz_etag);
    }

    #[test]
    fn anything_but_an_object_has_no_etag() {
        assert!(etag(b"[1]").is_none());
        assert!(etag(b"not json").is_none());
    }
}
