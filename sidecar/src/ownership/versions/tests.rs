use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use spinlink_proto::v1::{self, watch_event::Type as EventType};
use tokio_util::sync::CancellationToken;

use super::*;
use crate::accounts::Accounts;
use crate::cache::tests::{event, pods};
use crate::ownership::Ownership;

fn modified(rv: u64) -> v1::WatchEvent {
    event(EventType::Modified, "a", "web", &rv.to_string(), json!({}))
}

/// Instance `s1` with `lease` leases, owning account `prod` (online, pods
/// synced at resourceVersion 100), its ownership loop running.
struct Owner {
    store: Store,
    accounts: Accounts,
    prod: Arc<Account>,
    writes: Counter,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

async fn owner(lease: Duration) -> Owner {
    let store = Store::open("sqlite::memory:").await.unwrap();
    let own = Ownership::new(
        store.clone(),
        "s1",
        Some("https://s1:7011"),
        crate::peer_client::Client::default(),
        lease,
        Duration::from_secs(600),
    );
    own.claim("prod").await.unwrap();
    let accounts = Accounts::new();
    let prod = accounts.get_or_create("prod");
    prod.cache_opened("agent");
    {
        let mut c = prod.write_cache();
        c.sync_start(&pods());
        c.sync_end(&pods(), "100");
    }
    let writes = Counter::default();
    let recorder = Recorder::new(store.clone(), "s1", writes.clone());
    let stop = CancellationToken::new();
    let task = tokio::spawn(own.run(accounts.clone(), recorder, true, stop.clone()));
    Owner {
        store,
        accounts,
        prod,
        writes,
        stop,
        task,
    }
}

async fn recorded(store: &Store) -> Option<String> {
    store
        .resource_versions("prod")
        .await
        .unwrap()
        .into_iter()
        .find(|k| k.resource == "pods")
        .map(|k| k.resource_version)
}

async fn released(store: &Store) {
    until("the lease released", || async {
        store
            .lease("prod")
            .await
            .unwrap()
            .is_some_and(|l| l.expires_at == 0)
    })
    .await;
}

async fn until<F: std::future::Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    tokio::time::timeout(Duration::from_secs(10), async {
        while !check().await {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for {what}"));
}

#[tokio::test]
async fn a_stream_of_events_is_recorded_a_few_times_not_per_event() {
    // Renewed (and recorded) every 200 ms.
    let o = owner(Duration::from_millis(600)).await;
    // 500 events over about a second.
    for rv in 101..=600 {
        o.prod.write_cache().apply(&modified(rv)).unwrap();
        if rv % 50 == 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    until("pods@600 recorded", || async {
        recorded(&o.store).await.as_deref() == Some("600")
    })
    .await;
    let n = o.writes.get();
    assert!(
        (1..=15).contains(&n),
        "500 events were recorded in {n} writes, not one per event"
    );
    o.stop.cancel();
    o.task.await.unwrap();
}

#[tokio::test]
async fn the_last_position_is_recorded_before_the_lease_is_released() {
    // Renewed every 20 s: nothing periodic within the test.
    let o = owner(Duration::from_secs(60)).await;
    // The loop's first pass renews at once.
    until("pods@100 recorded", || async {
        recorded(&o.store).await.as_deref() == Some("100")
    })
    .await;
    o.prod.write_cache().apply(&modified(101)).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        recorded(&o.store).await.as_deref(),
        Some("100"),
        "not before the next renewal"
    );
    assert!(o.prod.cache_closed());
    released(&o.store).await;
    assert_eq!(
        recorded(&o.store).await.as_deref(),
        Some("101"),
        "recorded before the release"
    );
    o.stop.cancel();
    o.task.await.unwrap();
}

#[tokio::test]
async fn a_removed_account_is_forgotten_and_one_that_came_back_recorded_whole() {
    let o = owner(Duration::from_millis(600)).await;
    until("pods@100 recorded", || async {
        recorded(&o.store).await.as_deref() == Some("100")
    })
    .await;
    assert!(o.prod.cache_closed());
    // Another owner meanwhile records where its cache stood.
    released(&o.store).await;
    let ttl = Duration::from_secs(60);
    o.store.acquire_lease("prod", "s2", ttl).await.unwrap();
    let s2 = KindVersion {
        group: String::new(),
        version: "v1".into(),
        resource: "pods".into(),
        resource_version: "150".into(),
    };
    assert!(
        o.store
            .record_resource_versions("prod", "s2", &[s2], &[])
            .await
            .unwrap()
    );
    let lease = o.store.lease("prod").await.unwrap().unwrap();
    o.store
        .release_lease("prod", "s2", lease.epoch)
        .await
        .unwrap();
    // Back at s1 with its cache unchanged: the record is s1's again,
    // although pods@100 is what s1 wrote last.
    o.store.acquire_lease("prod", "s1", ttl).await.unwrap();
    o.prod.cache_opened("agent");
    until("pods@100 recorded again", || async {
        recorded(&o.store).await.as_deref() == Some("100")
    })
    .await;
    // The grace period ends: the cache and its record go.
    assert!(o.prod.cache_closed());
    assert!(o.prod.remove_if_offline());
    until("the record cleared", || async {
        recorded(&o.store).await.is_none()
    })
    .await;
    assert!(o.accounts.get("prod").is_some());
    o.stop.cancel();
    o.task.await.unwrap();
}
