use super::*;

const PB: &str = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";
const SNAPSHOT: Digest = [1; 32];
const CRD_ADDED: Digest = [2; 32];

fn key(path: &str, query: Option<&str>, accept: &str) -> Key {
    Key::new(path, query, accept).unwrap()
}

fn json_headers() -> Vec<(HeaderName, HeaderValue)> {
    vec![(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    )]
}

fn doc(fill: u8, len: usize) -> Bytes {
    Bytes::from(vec![fill; len])
}

#[test]
fn only_openapi_paths_with_bounded_keys_are_kept() {
    assert!(Key::new("/openapi/v2", None, "application/json").is_some());
    assert!(Key::new("/openapi/v3", None, "").is_some());
    assert!(Key::new("/openapi/v3/apis/apps/v1", Some("hash=AB"), "").is_some());
    assert!(Key::new("/openapi/v3x", None, "").is_none());
    assert!(Key::new("/api/v1/pods", None, "").is_none());
    assert!(Key::new("/openapi/v2", None, &"a".repeat(MAX_ACCEPT_LEN + 1)).is_none());
    assert!(key("/openapi/v3/api/v1", Some("hash=AB"), "").immutable());
    assert!(!key("/openapi/v3/api/v1", Some("hash="), "").immutable());
    assert!(!key("/openapi/v3", None, "").immutable());
}

#[test]
fn json_and_protobuf_are_kept_apart() {
    let cache = OpenApiCache::new(1 << 20);
    let json = key("/openapi/v2", None, "application/json");
    let pb = key("/openapi/v2", None, PB);
    assert!(cache.insert(
        "prod",
        json.clone(),
        &SNAPSHOT,
        json_headers(),
        doc(b'j', 100)
    ));
    assert!(cache.get("prod", &pb, &SNAPSHOT).is_none());
    let pb_headers = vec![(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/com.github.proto-openapi.spec.v2.v1.0+protobuf"),
    )];
    assert!(cache.insert("prod", pb.clone(), &SNAPSHOT, pb_headers, doc(b'p', 80)));
    let j = cache.get("prod", &json, &SNAPSHOT).unwrap();
    let p = cache.get("prod", &pb, &SNAPSHOT).unwrap();
    assert_eq!(j.body, doc(b'j', 100));
    assert_eq!(p.body, doc(b'p', 80));
    assert_eq!(j.headers[0].1, "application/json");
    assert!(p.headers[0].1.to_str().unwrap().ends_with("+protobuf"));
    assert_eq!(cache.documents(), 2);
}

#[test]
fn hash_documents_outlive_a_discovery_change_the_index_does_not() {
    let cache = OpenApiCache::new(1 << 20);
    let index = key("/openapi/v3", None, "application/json");
    let v2 = key("/openapi/v2", None, "application/json");
    let apps = key(
        "/openapi/v3/apis/apps/v1",
        Some("hash=0123ABCD"),
        "application/json",
    );
    let unhashed = key("/openapi/v3/apis/apps/v1", None, "application/json");
    for (k, fill) in [
        (&index, b'i'),
        (&v2, b'2'),
        (&apps, b'a'),
        (&unhashed, b'u'),
    ] {
        assert!(cache.insert("prod", k.clone(), &SNAPSHOT, json_headers(), doc(fill, 50)));
    }
    // Another account's entries are not touched by this account's change.
    assert!(cache.insert(
        "other",
        index.clone(),
        &SNAPSHOT,
        json_headers(),
        doc(b'i', 50)
    ));
    assert!(cache.get("prod", &index, &SNAPSHOT).is_some());
    // A CRD was added: the snapshot digest moved.
    assert!(cache.get("prod", &index, &CRD_ADDED).is_none());
    assert!(cache.get("prod", &v2, &CRD_ADDED).is_none());
    assert!(cache.get("prod", &unhashed, &CRD_ADDED).is_none());
    let kept = cache.get("prod", &apps, &CRD_ADDED).unwrap();
    assert_eq!(kept.body, doc(b'a', 50));
    assert!(cache.get("other", &index, &SNAPSHOT).is_some());
    // Dropped, not just hidden: prod keeps only the hash document.
    assert_eq!(cache.entries(), 2);
    // Even going back to the old snapshot does not revive them.
    assert!(cache.get("prod", &v2, &SNAPSHOT).is_none());
}

#[test]
fn two_accounts_with_one_document_share_one_copy() {
    let cache = OpenApiCache::new(1 << 20);
    let v2 = key("/openapi/v2", None, "application/json");
    let body = doc(b'x', 10_000);
    assert!(cache.insert("a", v2.clone(), &SNAPSHOT, json_headers(), body.clone()));
    let one = cache.bytes();
    assert!(one >= 10_000);
    // A separately allocated equal body: shared by content, not by pointer.
    assert!(cache.insert(
        "b",
        v2.clone(),
        &CRD_ADDED,
        json_headers(),
        Bytes::from(body.to_vec())
    ));
    assert_eq!(cache.documents(), 1);
    assert_eq!(cache.entries(), 2);
    let two = cache.bytes();
    assert!(
        two - one < 1_000,
        "{one} then {two}: the body was stored twice"
    );
    let (a, b) = (
        cache.get("a", &v2, &SNAPSHOT).unwrap(),
        cache.get("b", &v2, &CRD_ADDED).unwrap(),
    );
    assert_eq!(a.body.as_ptr(), b.body.as_ptr());
    // The body stays while one account still points at it.
    assert!(cache.get("a", &v2, &CRD_ADDED).is_none());
    assert_eq!(cache.documents(), 1);
    assert!(cache.get("b", &v2, &SNAPSHOT).is_none());
    assert_eq!(
        (cache.documents(), cache.entries(), cache.bytes()),
        (0, 0, 0)
    );
}

#[test]
fn the_byte_cap_evicts_the_least_recently_used() {
    let cache = OpenApiCache::new(2_500);
    let k = |n: &str| key(&format!("/openapi/v3/apis/{n}/v1"), None, "");
    assert!(cache.insert("prod", k("a"), &SNAPSHOT, json_headers(), doc(b'a', 1_000)));
    assert!(cache.insert("prod", k("b"), &SNAPSHOT, json_headers(), doc(b'b', 1_000)));
    // `a` used more recently than `b`.
    assert!(cache.get("prod", &k("a"), &SNAPSHOT).is_some());
    assert!(cache.insert("prod", k("c"), &SNAPSHOT, json_headers(), doc(b'c', 1_000)));
    assert!(
        cache.get("prod", &k("b"), &SNAPSHOT).is_none(),
        "b was evicted"
    );
    assert!(cache.get("prod", &k("a"), &SNAPSHOT).is_some());
    assert!(cache.get("prod", &k("c"), &SNAPSHOT).is_some());
    assert!(cache.bytes() <= 2_500, "{}", cache.bytes());
    assert_eq!(cache.documents(), 2);
    // Larger than the cap: not kept, nothing evicted for it.
    assert!(!cache.insert("prod", k("d"), &SNAPSHOT, json_headers(), doc(b'd', 2_500)));
    assert_eq!(cache.documents(), 2);
    // A cap of 0 keeps nothing.
    let off = OpenApiCache::new(0);
    assert!(!off.enabled());
    assert!(!off.insert("prod", k("a"), &SNAPSHOT, json_headers(), doc(b'a', 1)));
}

#[test]
fn a_sweep_frees_what_changed_snapshots_and_removed_accounts_left() {
    let cache = OpenApiCache::new(1 << 20);
    let v2 = key("/openapi/v2", None, "");
    let apps = key("/openapi/v3/apis/apps/v1", Some("hash=AB"), "");
    for account in ["kept", "changed", "removed"] {
        assert!(cache.insert(
            account,
            v2.clone(),
            &SNAPSHOT,
            json_headers(),
            doc(b'2', 100)
        ));
        assert!(cache.insert(
            account,
            apps.clone(),
            &SNAPSHOT,
            json_headers(),
            doc(b'a', 100)
        ));
    }
    cache.sweep(|account| match account {
        "kept" => Some(SNAPSHOT),
        "changed" => Some(CRD_ADDED),
        _ => None,
    });
    assert!(cache.get("kept", &v2, &SNAPSHOT).is_some());
    assert!(cache.get("kept", &apps, &SNAPSHOT).is_some());
    assert!(cache.get("changed", &apps, &CRD_ADDED).is_some());
    // `changed` keeps its hash document only, `removed` nothing.
    assert_eq!(cache.entries(), 3);
    assert_eq!(cache.documents(), 2);
}

#[test]
fn a_matching_if_none_match_gets_not_modified() {
    let hit = Hit {
        headers: vec![
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ),
            (header::ETAG, HeaderValue::from_static("\"ABC\"")),
        ],
        body: doc(b'x', 10),
    };
    let full = hit.clone().response(None);
    assert_eq!(full.status(), StatusCode::OK);
    let other = hit
        .clone()
        .response(Some(&HeaderValue::from_static("\"XYZ\"")));
    assert_eq!(other.status(), StatusCode::OK);
    let same = hit
        .clone()
        .response(Some(&HeaderValue::from_static("\"XYZ\", W/\"ABC\"")));
    assert_eq!(same.status(), StatusCode::NOT_MODIFIED);
    assert_eq!(same.headers()[header::ETAG], "\"ABC\"");
    assert!(same.headers().get(header::CONTENT_TYPE).is_none());
}

#[tokio::test]
async fn keep_reads_a_200_whole_and_passes_anything_else_through() {
    let cache = OpenApiCache::new(1 << 20);
    let accounts = crate::Accounts::new();
    let account = accounts.get_or_create("prod");
    let digest = account.read_cache().discovery_digest();
    let v2 = key("/openapi/v2", None, "application/json");
    let answer = |status: StatusCode, body: &'static str| {
        let mut r = Response::new(full(Bytes::from_static(body.as_bytes())));
        *r.status_mut() = status;
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        r.headers_mut()
            .insert(header::SERVER, HeaderValue::from_static("not-kept"));
        r
    };
    let failed = keep(
        &cache,
        &account,
        v2.clone(),
        digest,
        answer(StatusCode::SERVICE_UNAVAILABLE, "{}"),
    )
    .await;
    assert_eq!(failed.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(cache.entries(), 0);
    let ok = keep(
        &cache,
        &account,
        v2.clone(),
        digest,
        answer(StatusCode::OK, "{\"swagger\":\"2.0\"}"),
    )
    .await;
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(
        ok.into_body().collect().await.unwrap().to_bytes(),
        "{\"swagger\":\"2.0\"}"
    );
    let hit = cache.get("prod", &v2, &digest).unwrap();
    assert_eq!(hit.headers, json_headers(), "only cache headers are kept");
    // Fetched under a snapshot that changed meanwhile: answered, not kept.
    let index = key("/openapi/v3", None, "");
    let ok = keep(
        &cache,
        &account,
        index.clone(),
        [9; 32],
        answer(StatusCode::OK, "{}"),
    )
    .await;
    assert_eq!(ok.status(), StatusCode::OK);
    assert!(cache.get("prod", &index, &digest).is_none());
}

#[tokio::test]
async fn a_document_over_the_cap_streams_through_whole() {
    let cache = OpenApiCache::new(1_000);
    let accounts = crate::Accounts::new();
    let account = accounts.get_or_create("prod");
    let digest = account.read_cache().discovery_digest();
    let chunks: Vec<Result<http_body::Frame<Bytes>, BoxError>> = (0..5)
        .map(|i| Ok(http_body::Frame::data(doc(b'0' + i, 400))))
        .collect();
    let body = http_body_util::StreamBody::new(futures::stream::iter(chunks)).boxed();
    let resp = keep(
        &cache,
        &account,
        key("/openapi/v2", None, ""),
        digest,
        Response::new(body),
    )
    .await;
    let got = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(got.len(), 2_000);
    assert_eq!(&got[..400], &doc(b'0', 400)[..]);
    assert_eq!(&got[1_600..], &doc(b'4', 400)[..]);
    assert_eq!(cache.entries(), 0);
}
