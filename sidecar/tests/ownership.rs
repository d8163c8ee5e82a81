//! Two sidecars sharing one store: an account is owned by the instance whose
//! lease it holds, a request to the other is forwarded once, a forwarded
//! request that finds no owner is a retryable 503, a cache stream for an
//! owned account is refused elsewhere, and a drained owner's accounts can be
//! taken over at once.

mod common;

use common::*;
use futures::StreamExt as _;
use serde_json::json;

fn pod(name: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "demo", "resourceVersion": "5"},
        "spec": {"containers": [{"name": "c"}]}})
}

/// Sidecars `sidecar-a` and `sidecar-b` on one SQLite store (in the
/// returned directory) with `lease_seconds` leases.
async fn two_sidecars(lease_seconds: u64) -> anyhow::Result<(tempfile::TempDir, Running, Running)> {
    let dir = tempfile::tempdir()?;
    let store = format!("sqlite://{}", dir.path().join("shared.db").display());
    let extra = |id: &str| {
        format!(
            "store: {{ url: \"{store}\" }}\nownership: {{ leaseSeconds: {lease_seconds} }}\ninstanceId: {id}\n"
        )
    };
    let a = start_named(&extra("sidecar-a")).await?;
    let b = start_named(&extra("sidecar-b")).await?;
    Ok((dir, a, b))
}

#[tokio::test]
async fn accounts_are_owned_forwarded_once_and_taken_over() -> anyhow::Result<()> {
    let (_dir, a, b) = two_sidecars(30).await?;

    let mut to_a = a.client().await?;
    let mut cache = CacheStream::open(&mut to_a, "prod").await?;
    let pods = kind("", "v1", "pods", "Pod", true);
    sync(&mut cache, &pods, &[pod("web-1")]).await?;
    cache.wait_acked().await?;
    wait_status(&a, "prod", |s| s.online && s.kinds_synced == 1).await?;

    let http = http();
    let path = "/accounts/prod/api/v1/namespaces/demo/pods";
    // Through B: forwarded to A, answered from A's cache.
    let via_b = get(&http, &b.url(path)).await?;
    assert_eq!(
        via_b.status,
        200,
        "{}",
        String::from_utf8_lossy(&via_b.body)
    );
    assert_eq!(via_b.json()["items"][0]["metadata"]["name"], "web-1");
    // A request already forwarded once is never forwarded again.
    let hop = request(
        &http,
        "GET",
        &b.url(path),
        &[("spinlink-forwarded-by", "sidecar-x")],
        "",
    )
    .await?;
    assert_eq!(hop.status, 503);
    assert_eq!(
        hop.headers.get("retry-after").map(|v| v.to_str().unwrap()),
        Some("1")
    );
    assert!(
        hop.json()["message"]
            .as_str()
            .unwrap()
            .contains("sidecar-a")
    );
    // The owner answers a forwarded request itself.
    let at_a = request(
        &http,
        "GET",
        &a.url(path),
        &[("spinlink-forwarded-by", "sidecar-b")],
        "",
    )
    .await?;
    assert_eq!(at_a.status, 200);
    // A forwarded request for an account nobody owns: retryable, not 404.
    let nobody = request(
        &http,
        "GET",
        &b.url("/accounts/ghost/api/v1/pods"),
        &[("spinlink-forwarded-by", "x")],
        "",
    )
    .await?;
    assert_eq!(nobody.status, 503);
    assert_eq!(
        get(&http, &b.url("/accounts/ghost/api/v1/pods"))
            .await?
            .status,
        404
    );

    // B may not take A's account while A holds it.
    let mut to_b = b.client().await?;
    let refused = CacheStream::open(&mut to_b, "prod").await;
    let err = refused.err().expect("a second owner was accepted");
    let status = err.downcast_ref::<tonic::Status>().expect("a gRPC status");
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert!(
        status.message().contains("sidecar-a"),
        "{}",
        status.message()
    );

    // A drains: its leases are released and B takes the account at once.
    drop(cache);
    a.stop().await?;
    let mut cache_b = CacheStream::open(&mut to_b, "prod").await?;
    sync(&mut cache_b, &pods, &[pod("web-2")]).await?;
    cache_b.wait_acked().await?;
    let now = get(&http, &b.url(path)).await?;
    assert_eq!(now.json()["items"][0]["metadata"]["name"], "web-2");
    drop(cache_b);
    b.stop().await
}

#[tokio::test]
async fn an_account_whose_streams_ended_is_released_for_another_owner_at_once() -> anyhow::Result<()>
{
    // A 60 s lease, renewed every 20 s: the takeover below must come from
    // the release when the streams end, long before either.
    let (_dir, a, b) = two_sidecars(60).await?;
    let mut to_a = a.client().await?;
    let mut cache = CacheStream::open(&mut to_a, "prod").await?;
    let pods = kind("", "v1", "pods", "Pod", true);
    sync(&mut cache, &pods, &[pod("web-1")]).await?;
    cache.wait_acked().await?;
    wait_status(&a, "prod", |s| s.online).await?;

    // The agent's streams to A end (its gateway died); A stays up.
    let started = tokio::time::Instant::now();
    drop(cache);
    wait_status(&a, "prod", |s| !s.online).await?;
    let mut to_b = b.client().await?;
    let deadline = started + std::time::Duration::from_secs(10);
    let mut cache_b = loop {
        match CacheStream::open(&mut to_b, "prod").await {
            Ok(stream) => break stream,
            Err(e) if tokio::time::Instant::now() < deadline => {
                let status = e.downcast_ref::<tonic::Status>().expect("a gRPC status");
                assert_eq!(status.code(), tonic::Code::Unavailable, "{status}");
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e.context("B never took over A's released account")),
        }
    };
    sync(&mut cache_b, &pods, &[pod("web-2")]).await?;
    cache_b.wait_acked().await?;
    drop(cache_b);
    a.stop().await?;
    b.stop().await
}

#[tokio::test]
async fn an_account_name_is_refused_for_a_second_cluster() -> anyhow::Result<()> {
    let sidecar = start().await?;
    let mut client = sidecar.client().await?;
    let open = |fingerprint: &str| spinlink_proto::v1::CacheUp {
        seq: 1,
        msg: Some(spinlink_proto::v1::cache_up::Msg::Open(
            spinlink_proto::v1::CacheOpen {
                account: "prod".into(),
                agent_id: "test".into(),
                ca_fingerprint: fingerprint.into(),
                ..Default::default()
            },
        )),
    };
    let first = client
        .cache(with_headers(
            futures::stream::iter([open("aa11")]).chain(futures::stream::pending()),
            "prod",
        ))
        .await;
    assert!(first.is_ok());
    let second = client
        .cache(with_headers(futures::stream::iter([open("bb22")]), "prod"))
        .await
        .expect_err("a second cluster under the same name was accepted");
    assert_eq!(second.code(), tonic::Code::FailedPrecondition);
    assert!(
        second.message().contains("another cluster"),
        "{}",
        second.message()
    );
    // The same cluster again is fine.
    let again = client
        .cache(with_headers(
            futures::stream::iter([open("aa11")]).chain(futures::stream::pending()),
            "prod",
        ))
        .await;
    assert!(again.is_ok());
    drop((first, again));
    sidecar.stop().await
}
