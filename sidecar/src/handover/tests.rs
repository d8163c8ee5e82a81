use serde_json::json;
use spinlink_proto::v1::{self, watch_event::Type as EventType};

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::*;

fn pods() -> v1::Kind {
    v1::Kind {
        group: String::new(),
        version: "v1".into(),
        resource: "pods".into(),
        kind: "Pod".into(),
        namespaced: true,
    }
}

fn pod(name: &str, rv: &str) -> v1::WatchEvent {
    let object = json!({"metadata": {"name": name, "namespace": "a", "resourceVersion": rv}});
    v1::WatchEvent {
        r#type: EventType::Added as i32,
        kind: Some(pods()),
        resource_version: rv.into(),
        object: serde_json::to_vec(&object).unwrap(),
    }
}

/// An old owner holding account `prod` (pods p1, p2 at 7; messages up to
/// 42 applied), serving snapshots on a plaintext peer port on loopback.
async fn old_owner() -> (Accounts, Arc<Handover>, String, CancellationToken) {
    let accounts = Accounts::new();
    let prod = accounts.get_or_create("prod");
    prod.cache_opened("agent");
    prod.record_seq(42);
    {
        let mut c = prod.write_cache();
        c.sync_start(&pods());
        c.apply(&pod("p1", "5")).unwrap();
        c.apply(&pod("p2", "6")).unwrap();
        c.sync_end(&pods(), "7");
    }
    let handover = Handover::new(accounts.clone(), Settings::default(), Metrics::default());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    let service = crate::peer::Service {
        facade: Arc::new(crate::facade::Facade::new(
            accounts.clone(),
            Duration::from_secs(60),
        )),
        handover: handover.clone(),
        metrics: Metrics::default(),
    };
    tokio::spawn(crate::peer::serve(
        listener,
        crate::peer::Security::Insecure,
        service,
        stop.clone(),
    ));
    (accounts, handover, url, stop)
}

fn names(account: &Account) -> Vec<String> {
    account
        .read_cache()
        .kind("", "v1", "pods")
        .map(|k| k.objects.keys().map(|(_, n)| n.clone()).collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn a_new_owner_loads_the_old_owners_cache_once_it_gave_the_account_up() {
    let (old, served, url, stop) = old_owner().await;
    let store = Store::open("sqlite::memory:").await.unwrap();
    let metrics = Metrics::default();
    let new = Accounts::new();
    let settings = Settings {
        timeout: Duration::from_millis(500),
        ..Settings::default()
    };
    let handover = Handover::new(new.clone(), settings, metrics.clone());
    let from = PreviousOwner {
        instance: "s1".into(),
        url: Some(url),
    };
    let prod = new.get_or_create("prod");

    // Still online at the old owner for longer than the timeout: its cache
    // is still moving, nothing is loaded.
    assert_eq!(
        handover.take_over(&prod, Some(&from), &store).await,
        Some(Outcome::Cold(Cold::Refused(StatusCode::CONFLICT)))
    );
    assert!(names(&prod).is_empty());
    assert_eq!(prod.highest_seq(), None);

    // Its stream ends (a drain) while the new owner asks: handed over.
    assert!(!served.was_fetched("prod"));
    let closing = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(150)).await;
        old.get("prod").unwrap().cache_closed();
    });
    assert_eq!(
        handover.take_over(&prod, Some(&from), &store).await,
        Some(Outcome::Warm {
            kinds: 1,
            objects: 2
        })
    );
    closing.await.unwrap();
    assert_eq!(names(&prod), ["p1", "p2"]);
    let kind = prod.read_cache().kind("", "v1", "pods").unwrap().clone();
    assert!(kind.synced);
    assert_eq!(kind.resource_version, "7");
    // The numbering continues from the old owner's: the agent's replay of
    // messages up to 42 is skipped, 43 follows without a gap.
    assert_eq!(prod.highest_seq(), Some(42));
    assert_eq!(prod.record_seq(40), (42, false));
    assert_eq!(prod.record_seq(43), (43, false));
    assert!(
        served
            .wait_fetched(&["prod".to_owned()], Duration::from_secs(5))
            .await
    );
    // Numbered by a stream here, nothing synced: nothing to decide.
    let numbered = new.get_or_create("numbered");
    numbered.record_seq(5);
    assert_eq!(
        handover.take_over(&numbered, Some(&from), &store).await,
        None
    );

    let text = metrics.render(&new.gauges());
    for line in [
        "spinlink_sidecar_handovers_total{outcome=\"warm\",reason=\"\"} 1",
        "spinlink_sidecar_handovers_total{outcome=\"cold\",reason=\"refused\"} 1",
    ] {
        assert!(text.contains(line), "{line} in\n{text}");
    }
    stop.cancel();
}

#[tokio::test]
async fn anything_that_fails_leaves_the_cache_empty_for_a_full_list() {
    let (_old, _served, url, stop) = old_owner().await;
    let store = Store::open("sqlite::memory:").await.unwrap();
    let new = Accounts::new();
    let handover = Handover::new(new.clone(), Settings::default(), Metrics::default());
    let cases = [
        (None, Cold::NoAddress),
        // Nobody listens there any more.
        (Some("http://127.0.0.1:1".to_owned()), Cold::Unreachable),
        // An account it does not hold.
        (Some(url.clone()), Cold::Refused(StatusCode::NOT_FOUND)),
    ];
    for (i, (url, want)) in cases.into_iter().enumerate() {
        let name = if i == 2 { "other" } else { "prod" };
        let account = new.get_or_create(name);
        let from = PreviousOwner {
            instance: "s1".into(),
            url,
        };
        assert_eq!(
            handover.take_over(&account, Some(&from), &store).await,
            Some(Outcome::Cold(want))
        );
        assert!(names(&account).is_empty());
        assert_eq!(account.highest_seq(), None);
    }
    stop.cancel();
}

#[tokio::test]
async fn a_peer_that_does_not_answer_in_time_is_cold() {
    // Accepts connections, never answers.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let store = Store::open("sqlite::memory:").await.unwrap();
    let new = Accounts::new();
    let settings = Settings {
        timeout: Duration::from_millis(200),
        ..Settings::default()
    };
    let handover = Handover::new(new.clone(), settings, Metrics::default());
    let from = PreviousOwner {
        instance: "s1".into(),
        url: Some(url),
    };
    assert_eq!(
        handover
            .take_over(&new.get_or_create("prod"), Some(&from), &store)
            .await,
        Some(Outcome::Cold(Cold::Timeout))
    );
    drop(listener);
}

#[test]
fn only_snapshot_paths_of_known_accounts_are_answered() {
    let accounts = Accounts::new();
    let handover = Handover::new(accounts.clone(), Settings::default(), Metrics::default());
    let status = |m: Method, p: &str| handover.respond(&m, p).status();
    assert_eq!(
        status(Method::GET, "/internal/accounts/prod/snapshot"),
        StatusCode::NOT_FOUND
    );
    assert_eq!(status(Method::GET, "/v1/accounts"), StatusCode::NOT_FOUND);
    assert_eq!(
        status(Method::GET, "/internal/accounts/a/b/snapshot"),
        StatusCode::NOT_FOUND
    );
    let prod = accounts.get_or_create("prod");
    // Known but nothing complete cached.
    assert_eq!(
        status(Method::GET, "/internal/accounts/prod/snapshot"),
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        status(Method::POST, "/internal/accounts/prod/snapshot"),
        StatusCode::METHOD_NOT_ALLOWED
    );
    prod.cache_opened("agent");
    assert_eq!(
        status(Method::GET, "/internal/accounts/prod/snapshot"),
        StatusCode::CONFLICT
    );
}

/// A sidecar that held `prod` before (pods p1 at resourceVersion 5,
/// messages up to 30): its cache is stale here, in the grace period.
fn held_before(accounts: &Accounts) -> Arc<Account> {
    let prod = accounts.get_or_create("prod");
    prod.cache_opened("agent");
    prod.record_seq(30);
    {
        let mut c = prod.write_cache();
        c.sync_start(&pods());
        c.apply(&pod("p1", "5")).unwrap();
        c.sync_end(&pods(), "5");
    }
    prod.cache_closed();
    prod
}

/// Records pods at `rv` for `prod` in `store`, as its owner `by` would.
async fn record(store: &Store, by: &str, rv: &str) {
    store
        .acquire_lease("prod", by, Duration::from_secs(60))
        .await
        .unwrap();
    let pods = crate::store::KindVersion {
        group: String::new(),
        version: "v1".into(),
        resource: "pods".into(),
        resource_version: rv.into(),
    };
    assert!(
        store
            .record_resource_versions("prod", by, &[pods], &[])
            .await
            .unwrap()
    );
    let lease = store.lease("prod").await.unwrap().unwrap();
    store.release_lease("prod", by, lease.epoch).await.unwrap();
}

fn rv(account: &Account) -> String {
    account
        .read_cache()
        .kind("", "v1", "pods")
        .map(|k| k.resource_version.clone())
        .unwrap_or_default()
}

#[tokio::test]
async fn a_cache_held_here_is_resumed_when_current_and_replaced_when_the_store_shows_it_behind() {
    let (old, _served, url, stop) = old_owner().await;
    old.get("prod").unwrap().cache_closed();
    let store = Store::open("sqlite::memory:").await.unwrap();
    let metrics = Metrics::default();
    let settings = Settings {
        timeout: Duration::from_millis(500),
        ..Settings::default()
    };
    let from = PreviousOwner {
        instance: "s1".into(),
        url: Some(url),
    };
    let gone = PreviousOwner {
        instance: "s1".into(),
        url: Some("http://127.0.0.1:1".into()),
    };

    // Nobody else held it since: resumed from, though the store has no
    // record yet (the last one written may lag the cache).
    let here = Accounts::new();
    let handover = Handover::new(here.clone(), settings.clone(), metrics.clone());
    let prod = held_before(&here);
    assert_eq!(
        handover.take_over(&prod, None, &store).await,
        Some(Outcome::Resumed { current: true })
    );

    // Where the store says the account stood: resumed, even though another
    // instance held the lease since (it recorded nothing newer).
    record(&store, "s2", "5").await;
    assert_eq!(
        handover.take_over(&prod, Some(&from), &store).await,
        Some(Outcome::Resumed { current: true })
    );
    assert_eq!(
        (names(&prod), rv(&prod)),
        (vec!["p1".to_owned()], "5".into())
    );

    // The previous owner moved on (the store has pods at 7): its snapshot
    // replaces the older cache, and the numbering follows it.
    record(&store, "s1", "7").await;
    assert_eq!(
        handover.take_over(&prod, Some(&from), &store).await,
        Some(Outcome::Fresher {
            kinds: 1,
            objects: 2
        })
    );
    assert_eq!(names(&prod), ["p1", "p2"]);
    assert_eq!(rv(&prod), "7");
    assert_eq!(prod.highest_seq(), Some(42));

    // Behind, and no snapshot to be had (the previous owner died, or it
    // recorded nothing): the older cache is resumed from.
    let unrecorded = Store::open("sqlite::memory:").await.unwrap();
    for store in [&store, &unrecorded] {
        let elsewhere = Accounts::new();
        let handover = Handover::new(elsewhere.clone(), settings.clone(), metrics.clone());
        let prod = held_before(&elsewhere);
        assert_eq!(
            handover.take_over(&prod, Some(&gone), store).await,
            Some(Outcome::Resumed { current: false })
        );
        assert_eq!(
            (names(&prod), rv(&prod)),
            (vec!["p1".to_owned()], "5".into())
        );
        assert_eq!(prod.highest_seq(), Some(30));
    }

    let text = metrics.render(&here.gauges());
    for line in [
        "spinlink_sidecar_handovers_total{outcome=\"resumed\",reason=\"current\"} 2",
        "spinlink_sidecar_handovers_total{outcome=\"warm\",reason=\"fresher\"} 1",
        "spinlink_sidecar_handovers_total{outcome=\"resumed\",reason=\"behind\"} 2",
    ] {
        assert!(text.contains(line), "{line} in\n{text}");
    }
    stop.cancel();
}
