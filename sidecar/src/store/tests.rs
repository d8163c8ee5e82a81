//! Every store test runs on SQLite and, when `SPINLINK_TEST_POSTGRES_URL`
//! is set (`.ci/run` sets it to the machine's server), on PostgreSQL too,
//! each PostgreSQL run in a schema of its own.

use std::time::Duration;

use super::*;

/// The engines to test, with what to drop afterwards.
struct Engines {
    stores: Vec<Store>,
    postgres: Option<scratch::Schema>,
}

impl Engines {
    async fn new() -> Self {
        let mut stores = vec![Store::open("sqlite::memory:").await.unwrap()];
        let mut postgres = None;
        if let Ok(url) = std::env::var("SPINLINK_TEST_POSTGRES_URL") {
            let schema = scratch::Schema::create(&url, "spinlink_test")
                .await
                .unwrap_or_else(|e| panic!("SPINLINK_TEST_POSTGRES_URL is set but unusable: {e}"));
            let store = Store::open(&schema.url(None)).await.unwrap();
            assert_eq!(store.engine(), "postgres");
            stores.push(store);
            postgres = Some(schema);
        }
        Self { stores, postgres }
    }

    async fn done(self) {
        for s in &self.stores {
            s.close().await;
        }
        if let Some(schema) = self.postgres {
            schema.drop_schema().await.unwrap();
        }
    }
}

#[tokio::test]
async fn upsert_then_state_change() {
    let engines = Engines::new().await;
    for store in &engines.stores {
        let e = store.engine();
        store
            .upsert_account("a", "spiffe://x/agent/1", AccountState::Online)
            .await
            .unwrap();
        store
            .set_account_state("a", AccountState::Offline)
            .await
            .unwrap();
        store
            .upsert_account("b", "id2", AccountState::Online)
            .await
            .unwrap();
        let rows = store.accounts().await.unwrap();
        assert_eq!(rows.len(), 2, "{e}");
        assert_eq!(rows[0].state, "offline", "{e}");
        assert_eq!(rows[0].agent_identity, "spiffe://x/agent/1", "{e}");
        assert!(rows[0].last_seen >= rows[0].first_seen, "{e}");
    }
    engines.done().await;
}

#[tokio::test]
async fn leases_are_exclusive_renewable_and_taken_over_after_expiry() {
    let engines = Engines::new().await;
    for store in &engines.stores {
        let e = store.engine();
        let long = Duration::from_secs(60);
        let Acquired::Owned(first) = store
            .acquire_lease("prod", "sidecar-1", long)
            .await
            .unwrap()
        else {
            panic!("{e}: a free lease is taken");
        };
        assert_eq!((first.owner.as_str(), first.epoch), ("sidecar-1", 1), "{e}");
        // Another instance is refused and told who holds it.
        assert_eq!(
            store
                .acquire_lease("prod", "sidecar-2", long)
                .await
                .unwrap(),
            Acquired::HeldBy(first.clone()),
            "{e}"
        );
        // The owner renews with the same epoch.
        let Acquired::Owned(renewed) = store
            .acquire_lease("prod", "sidecar-1", long)
            .await
            .unwrap()
        else {
            panic!("{e}: the owner renews");
        };
        assert_eq!(renewed.epoch, 1, "{e}");
        assert!(renewed.expires_at >= first.expires_at, "{e}");
        // Expired (a zero TTL expires at once): another instance takes it, next epoch.
        store
            .acquire_lease("prod", "sidecar-1", Duration::ZERO)
            .await
            .unwrap();
        let Acquired::Owned(taken) = store
            .acquire_lease("prod", "sidecar-2", long)
            .await
            .unwrap()
        else {
            panic!("{e}: an expired lease is taken over");
        };
        assert_eq!((taken.owner.as_str(), taken.epoch), ("sidecar-2", 2), "{e}");
        // A stale owner cannot release the new owner's lease; the owner can.
        assert!(
            !store.release_lease("prod", "sidecar-1", 1).await.unwrap(),
            "{e}"
        );
        assert!(
            store.release_lease("prod", "sidecar-2", 2).await.unwrap(),
            "{e}"
        );
        let Acquired::Owned(back) = store
            .acquire_lease("prod", "sidecar-1", long)
            .await
            .unwrap()
        else {
            panic!("{e}: a released lease is free");
        };
        assert_eq!(back.epoch, 3, "{e}");
        assert_eq!(store.lease("other").await.unwrap(), None, "{e}");
    }
    engines.done().await;
}

#[tokio::test]
async fn racing_instances_never_both_own_a_lease() {
    let engines = Engines::new().await;
    for store in &engines.stores {
        let mut tasks = Vec::new();
        for i in 0..8 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                store
                    .acquire_lease("race", &format!("sidecar-{i}"), Duration::from_secs(60))
                    .await
                    .unwrap()
            }));
        }
        let mut owners = Vec::new();
        for t in tasks {
            if let Acquired::Owned(l) = t.await.unwrap() {
                owners.push(l.owner);
            }
        }
        assert_eq!(owners.len(), 1, "{}: {owners:?}", store.engine());
    }
    engines.done().await;
}

fn entry(account: &str, id: i64) -> JournalEntry {
    JournalEntry {
        account: account.into(),
        instance: "sidecar-1".into(),
        request_id: id,
        method: "PATCH".into(),
        path: "/apis/apps/v1/namespaces/a/deployments/web".into(),
        query: "fieldManager=kubectl-edit".into(),
        kubectl_command: "kubectl edit".into(),
        status: 200,
        outcome: "answered".into(),
        message: String::new(),
        received_at: 1000 + id,
        sent_at: 1500 + id,
        agent_started_at: Some(1600 + id),
        agent_finished_at: Some(1900 + id),
        answered_at: 2000 + id,
    }
}

#[tokio::test]
async fn the_journal_is_appended_in_batches_read_newest_and_pruned() {
    let engines = Engines::new().await;
    for store in &engines.stores {
        let e = store.engine();
        let batch: Vec<JournalEntry> = (1..=5).map(|id| entry("prod", id)).collect();
        store.journal(&batch).await.unwrap();
        // An agent that reported no times: none are made up.
        let untimed = JournalEntry {
            agent_started_at: None,
            agent_finished_at: None,
            ..entry("other", 1)
        };
        store.journal(std::slice::from_ref(&untimed)).await.unwrap();
        store.journal(&[]).await.unwrap();
        let last = store.journaled("prod", 2).await.unwrap();
        assert_eq!(
            last.iter().map(|j| j.request_id).collect::<Vec<_>>(),
            [4, 5],
            "{e}"
        );
        assert_eq!(last[1], entry("prod", 5), "{e}: every field round-trips");
        assert!(
            store.journaled("nobody", 10).await.unwrap().is_empty(),
            "{e}"
        );
        // Retention: the newest 3 of prod stay, other accounts are untouched.
        assert_eq!(store.prune_journal("prod", 3).await.unwrap(), 2, "{e}");
        assert_eq!(store.prune_journal("prod", 3).await.unwrap(), 0, "{e}");
        let kept = store.journaled("prod", 10).await.unwrap();
        assert_eq!(
            kept.iter().map(|j| j.request_id).collect::<Vec<_>>(),
            [3, 4, 5],
            "{e}"
        );
        assert_eq!(
            store.journaled("other", 10).await.unwrap(),
            [untimed],
            "{e}"
        );
    }
    engines.done().await;
}

#[tokio::test]
async fn resource_versions_are_written_only_by_the_lease_holder() {
    let engines = Engines::new().await;
    let ttl = Duration::from_secs(30);
    for store in &engines.stores {
        let e = store.engine();
        let kv = |resource: &str, rv: &str| KindVersion {
            group: if resource == "deployments" {
                "apps".into()
            } else {
                String::new()
            },
            version: "v1".into(),
            resource: resource.into(),
            resource_version: rv.into(),
        };
        // Nobody holds the lease yet: nothing is written.
        assert!(
            !store
                .record_resource_versions("prod", "s1", &[kv("pods", "10")], &[])
                .await
                .unwrap(),
            "{e}"
        );
        store.acquire_lease("prod", "s1", ttl).await.unwrap();
        store.acquire_lease("dev", "s1", ttl).await.unwrap();
        let set = [
            kv("pods", "10"),
            kv("deployments", "7"),
            kv("services", "3"),
        ];
        assert!(
            store
                .record_resource_versions("prod", "s1", &set, &[])
                .await
                .unwrap()
        );
        assert!(
            store
                .record_resource_versions("prod", "s1", &[kv("pods", "12")], &[kv("services", "")])
                .await
                .unwrap()
        );
        store
            .record_resource_versions("dev", "s1", &[kv("pods", "1")], &[])
            .await
            .unwrap();
        assert_eq!(
            store.resource_versions("prod").await.unwrap(),
            [kv("pods", "12"), kv("deployments", "7")],
            "{e}"
        );
        // s1 lets go; until another instance claims it, s1's last word counts.
        let Acquired::Owned(lease) = store.acquire_lease("prod", "s1", ttl).await.unwrap() else {
            panic!("{e}: s1 holds prod")
        };
        store
            .release_lease("prod", "s1", lease.epoch)
            .await
            .unwrap();
        assert!(
            store
                .record_resource_versions("prod", "s1", &[kv("pods", "13")], &[])
                .await
                .unwrap(),
            "{e}"
        );
        // s2 takes it: s1 can no longer write or clear, s2 can.
        store.acquire_lease("prod", "s2", ttl).await.unwrap();
        assert!(
            !store
                .record_resource_versions("prod", "s1", &[kv("pods", "99")], &[])
                .await
                .unwrap(),
            "{e}"
        );
        store.clear_resource_versions("prod", "s1").await.unwrap();
        assert_eq!(
            store.resource_versions("prod").await.unwrap(),
            [kv("pods", "13"), kv("deployments", "7")],
            "{e}"
        );
        store.clear_resource_versions("prod", "s2").await.unwrap();
        assert!(
            store.resource_versions("prod").await.unwrap().is_empty(),
            "{e}"
        );
        assert_eq!(
            store.resource_versions("dev").await.unwrap().len(),
            1,
            "{e}"
        );
    }
    engines.done().await;
}

#[tokio::test]
async fn file_database_is_created_and_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("s.db").display());
    let store = Store::open(&url).await.unwrap();
    store
        .upsert_account("b", "id1", AccountState::Online)
        .await
        .unwrap();
    store
        .upsert_account("b", "id2", AccountState::Online)
        .await
        .unwrap();
    store.close().await;
    let again = Store::open(&url).await.unwrap();
    let rows = again.accounts().await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].agent_identity, "id2");
}

#[tokio::test]
async fn bad_urls_are_refused_without_their_password() {
    let err = Store::open("mysql://u:hunter2@h/db")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("sqlite: or postgres://"), "{err}");
    let err = Store::open_within(
        "postgres://u:hunter2@127.0.0.1:1/db",
        Duration::from_millis(300),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(!err.contains("hunter2"), "{err}");
    assert!(err.contains("****"), "{err}");
}

#[tokio::test]
async fn instances_are_registered_and_found() {
    let engines = Engines::new().await;
    for store in &engines.stores {
        let e = store.engine();
        assert_eq!(store.instance_url("s1").await.unwrap(), None, "{e}");
        store
            .register_instance("s1", "http://10.0.0.1:7009")
            .await
            .unwrap();
        store
            .register_instance("s1", "http://10.0.0.2:7009")
            .await
            .unwrap();
        assert_eq!(
            store.instance_url("s1").await.unwrap().as_deref(),
            Some("http://10.0.0.2:7009"),
            "{e}"
        );
    }
    engines.done().await;
}

#[tokio::test]
async fn instances_are_listed_with_when_last_seen() {
    let engines = Engines::new().await;
    for store in &engines.stores {
        let e = store.engine();
        assert!(!store.touch_instance("s1").await.unwrap(), "{e}");
        store
            .register_instance("s1", "http://10.0.0.1:7009")
            .await
            .unwrap();
        store.register_instance("s2", "").await.unwrap();
        store
            .set_instance_peer_url("s2", "https://10.0.0.2:7010")
            .await
            .unwrap();
        let listed = store.instances(0).await.unwrap();
        let urls: Vec<(&str, &str)> = listed
            .iter()
            .map(|i| (i.id.as_str(), i.url.as_str()))
            .collect();
        assert_eq!(
            urls,
            [
                ("s1", "http://10.0.0.1:7009"),
                ("s2", "https://10.0.0.2:7010")
            ],
            "{e}"
        );
        // The later of the two registrations: s2 may be a millisecond
        // after s1.
        let seen = listed.iter().map(|i| i.last_seen).max().unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        assert!(store.touch_instance("s1").await.unwrap(), "{e}");
        let listed = store.instances(seen + 1).await.unwrap();
        assert_eq!(listed.len(), 1, "{e}: only the one seen since");
        assert_eq!(listed[0].id, "s1", "{e}");
        assert!(listed[0].last_seen > seen, "{e}");
    }
    engines.done().await;
}

#[tokio::test]
async fn peer_urls_belong_to_registered_instances() {
    let engines = Engines::new().await;
    for store in &engines.stores {
        let e = store.engine();
        // Not registered: nothing to attach it to.
        assert!(
            !store
                .set_instance_peer_url("s1", "http://10.0.0.1:7010")
                .await
                .unwrap(),
            "{e}"
        );
        store
            .register_instance("s1", "http://10.0.0.1:7009")
            .await
            .unwrap();
        assert_eq!(store.instance_peer_url("s1").await.unwrap(), None, "{e}");
        assert!(
            store
                .set_instance_peer_url("s1", "http://10.0.0.1:7010")
                .await
                .unwrap(),
            "{e}"
        );
        // Registering again (a restart) keeps the facade and peer URLs apart.
        store
            .register_instance("s1", "http://10.0.0.2:7009")
            .await
            .unwrap();
        assert_eq!(
            store.instance_peer_url("s1").await.unwrap().as_deref(),
            Some("http://10.0.0.1:7010"),
            "{e}"
        );
        assert_eq!(
            store.instance_url("s1").await.unwrap().as_deref(),
            Some("http://10.0.0.2:7009"),
            "{e}"
        );
        assert_eq!(store.instance_peer_url("s2").await.unwrap(), None, "{e}");
    }
    engines.done().await;
}

#[tokio::test]
async fn one_account_name_names_one_cluster() {
    let engines = Engines::new().await;
    for store in &engines.stores {
        let e = store.engine();
        assert_eq!(
            store.claim_fingerprint("prod", "").await.unwrap(),
            None,
            "{e}"
        );
        assert_eq!(
            store.claim_fingerprint("prod", "aaaa").await.unwrap(),
            None,
            "{e}"
        );
        assert_eq!(
            store.claim_fingerprint("prod", "aaaa").await.unwrap(),
            None,
            "{e}"
        );
        assert_eq!(
            store
                .claim_fingerprint("prod", "bbbb")
                .await
                .unwrap()
                .as_deref(),
            Some("aaaa"),
            "{e}"
        );
        // Unknown fingerprints neither conflict nor overwrite.
        assert_eq!(
            store.claim_fingerprint("prod", "").await.unwrap(),
            None,
            "{e}"
        );
        // The row keeps its other fields when the stream records them.
        store
            .upsert_account("prod", "id", AccountState::Online)
            .await
            .unwrap();
        assert_eq!(
            store
                .claim_fingerprint("prod", "bbbb")
                .await
                .unwrap()
                .as_deref(),
            Some("aaaa"),
            "{e}"
        );
        store.clear_fingerprint("prod").await.unwrap();
        assert_eq!(
            store.claim_fingerprint("prod", "bbbb").await.unwrap(),
            None,
            "{e}"
        );
    }
    engines.done().await;
}

fn dynamic(name: &str, zone: &str) -> DynamicRow {
    DynamicRow {
        name: name.into(),
        zone: zone.into(),
        namespaces: vec!["ns-a".into(), "ns-b".into()],
        context: "ctx".into(),
        sealed_kubeconfig: vec![1, 0, 255, 7],
        ca_fingerprint: "ab".repeat(32),
        ..DynamicRow::default()
    }
}

#[tokio::test]
async fn dynamic_accounts_are_claimed_by_one_agent_of_their_zone() {
    let engines = Engines::new().await;
    let ttl = Duration::from_secs(30);
    for store in &engines.stores {
        store.put_dynamic(&dynamic("a", "eu")).await.unwrap();
        store.put_dynamic(&dynamic("b", "eu")).await.unwrap();
        store.put_dynamic(&dynamic("c", "")).await.unwrap();
        let all = store.dynamic_accounts().await.unwrap();
        assert_eq!(all.len(), 3);
        assert_eq!(all[0].namespaces, ["ns-a", "ns-b"]);
        assert_eq!(all[0].sealed_kubeconfig, [1, 0, 255, 7]);

        // Only accounts the agent's identity may serve are claimed.
        let none = store
            .claim_dynamic("agent-0", "eu", ttl, |n| n == "elsewhere")
            .await
            .unwrap();
        assert!(none.is_empty());
        // The first agent of the zone takes both; the second gets none.
        let first = store
            .claim_dynamic("agent-1", "eu", ttl, |_| true)
            .await
            .unwrap();
        let names: Vec<_> = first.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert!(first.iter().all(|r| r.agent_id == "agent-1"));
        assert!(
            store
                .claim_dynamic("agent-2", "eu", ttl, |_| true)
                .await
                .unwrap()
                .is_empty()
        );
        // An empty zone takes only the accounts without one.
        let no_zone = store
            .claim_dynamic("agent-3", "", ttl, |_| true)
            .await
            .unwrap();
        assert_eq!(no_zone.len(), 1);
        assert_eq!(no_zone[0].name, "c");

        // Renewing keeps them; an update keeps the agent in the same zone.
        store.put_dynamic(&dynamic("a", "eu")).await.unwrap();
        assert_eq!(
            store
                .claim_dynamic("agent-1", "eu", ttl, |_| true)
                .await
                .unwrap()
                .len(),
            2
        );
        // Moving to another zone frees it.
        store.put_dynamic(&dynamic("b", "us")).await.unwrap();
        let row = store.dynamic_account("b").await.unwrap().unwrap();
        assert_eq!((row.zone.as_str(), row.agent_id.as_str()), ("us", ""));
        // An agent silent for longer than the TTL loses them to another.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let taken = store
            .claim_dynamic("agent-2", "eu", Duration::from_millis(10), |_| true)
            .await
            .unwrap();
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].agent_id, "agent-2");

        assert!(!store.dynamic_deleted("a").await.unwrap());
        assert!(store.delete_dynamic("a").await.unwrap());
        assert!(!store.delete_dynamic("a").await.unwrap());
        assert!(store.dynamic_account("a").await.unwrap().is_none());
        assert!(store.dynamic_deleted("a").await.unwrap());
        assert!(
            store
                .claim_dynamic("agent-2", "eu", ttl, |_| true)
                .await
                .unwrap()
                .is_empty()
        );
        assert_eq!(store.dynamic_accounts().await.unwrap().len(), 2);
        // Created again: no longer deleted, free for the first agent.
        store.put_dynamic(&dynamic("a", "eu")).await.unwrap();
        assert!(!store.dynamic_deleted("a").await.unwrap());
        let back = store
            .claim_dynamic("agent-2", "eu", ttl, |_| true)
            .await
            .unwrap();
        assert_eq!(back.len(), 1);
        assert_eq!(back[0].name, "a");
    }
    engines.done().await;
}

/// The schema version before the newest migration: where a store is when
/// its sidecars run the previous release.
const PREVIOUS_VERSION: i64 = 20261124090000;

/// Rows as the previous release wrote them, in the previous schema (before
/// `journal_agent_times`). When a migration is added, move
/// [`PREVIOUS_VERSION`] up to the one before it and write these rows as
/// the release before it wrote them.
const PREVIOUS_ROWS: &[&str] = &[
    "INSERT INTO accounts (name, agent_identity, state, first_seen, last_seen, ca_fingerprint) \
     VALUES ('prod', 'spiffe://x/agent/a1', 'online', 1, 2, 'abc')",
    "INSERT INTO operations (account, instance, request_id, method, path, status, outcome, \
     received_at, answered_at, query, kubectl_command, sent_at, message) \
     VALUES ('prod', 's1', 7, 'PATCH', '/apis/apps/v1/namespaces/a/deployments/web', 200, \
     'answered', 1000, 1300, 'fieldManager=kubectl', 'kubectl scale', 1010, '')",
    "INSERT INTO resource_versions (account, api_group, version, resource, resource_version, \
     updated_at) VALUES ('prod', 'apps', 'v1', 'deployments', '4242', 5)",
];

/// A store at the previous schema holding the previous release's rows is
/// migrated forward by opening it, and everything in it reads back through
/// today's store (new columns at their defaults): on SQLite and, when
/// configured, PostgreSQL.
#[tokio::test]
async fn a_store_of_the_previous_release_migrates_forward_with_its_data() {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = format!("sqlite://{}?mode=rwc", dir.path().join("s.db").display());
    let mut urls = vec![sqlite.clone()];
    let mut schema = None;
    if let Ok(server) = std::env::var("SPINLINK_TEST_POSTGRES_URL") {
        let s = scratch::Schema::create(&server, "spinlink_migrate")
            .await
            .unwrap();
        urls.push(s.url(None));
        schema = Some(s);
    }
    for url in &urls {
        // The previous release's schema and rows.
        macro_rules! previous_release {
            ($pool:ty, $migrations:literal) => {{
                let pool = <$pool>::connect(url).await.unwrap();
                sqlx::migrate!($migrations)
                    .run_to(PREVIOUS_VERSION, &pool)
                    .await
                    .unwrap();
                for row in PREVIOUS_ROWS {
                    sqlx::query(*row).execute(&pool).await.unwrap();
                }
                pool.close().await;
            }};
        }
        if url.starts_with("sqlite:") {
            previous_release!(sqlx::SqlitePool, "./migrations/sqlite");
        } else {
            previous_release!(sqlx::PgPool, "./migrations/postgres");
        }
        // Today's sidecar opens it.
        let store = Store::open(url).await.unwrap();
        let accounts = store.accounts().await.unwrap();
        assert_eq!(accounts.len(), 1, "{url}");
        assert_eq!(accounts[0].name, "prod");
        let journal = store.journaled("prod", 10).await.unwrap();
        assert_eq!(journal.len(), 1, "{url}");
        assert_eq!(journal[0].kubectl_command, "kubectl scale");
        assert_eq!(journal[0].sent_at, 1010);
        assert_eq!(journal[0].agent_started_at, None, "a column added since");
        let versions = store.resource_versions("prod").await.unwrap();
        assert_eq!(versions.len(), 1, "{url}");
        assert_eq!(versions[0].resource_version, "4242");
        store.close().await;
    }
    if let Some(s) = schema {
        s.drop_schema().await.unwrap();
    }
}

/// Migrations only expand the schema, so sidecars of the previous release
/// keep working against it while their neighbours upgrade (expand, then
/// contract): tables and columns are added — columns nullable or with a
/// default — never dropped, renamed or retyped. Removing something takes a
/// release of its own, after no running version reads it, in a migration
/// whose first line is `-- contract: <why no running version reads it>`.
#[test]
fn migrations_only_expand_the_schema() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/migrations");
    let mut seen = 0;
    for engine in ["sqlite", "postgres"] {
        for entry in std::fs::read_dir(format!("{dir}/{engine}")).unwrap() {
            let path = entry.unwrap().path();
            let sql = std::fs::read_to_string(&path).unwrap();
            seen += 1;
            if sql.starts_with("-- contract: ") {
                continue;
            }
            let problems = expansion_problems(&sql);
            assert!(problems.is_empty(), "{}: {problems:?}", path.display());
        }
    }
    assert!(seen >= 14, "{seen} migrations read");
    // The check itself.
    assert!(expansion_problems("ALTER TABLE a DROP COLUMN b;").len() == 1);
    assert!(expansion_problems("ALTER TABLE a RENAME COLUMN b TO c;").len() == 1);
    assert!(expansion_problems("ALTER TABLE a ALTER COLUMN b TYPE BIGINT;").len() == 1);
    assert!(expansion_problems("DROP TABLE a;").len() == 1);
    assert!(expansion_problems("ALTER TABLE a ADD COLUMN b TEXT NOT NULL;").len() == 1);
    assert!(expansion_problems("ALTER TABLE a ADD COLUMN b TEXT NOT NULL DEFAULT '';").is_empty());
    assert!(expansion_problems("-- drop table a\nALTER TABLE a ADD COLUMN b INTEGER;").is_empty());
}

/// What in `sql` would break a sidecar of the previous release.
fn expansion_problems(sql: &str) -> Vec<String> {
    let mut problems = Vec::new();
    for statement in sql
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join(" ")
        .split(';')
    {
        let s = statement
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .to_ascii_uppercase();
        if s.is_empty() {
            continue;
        }
        let shrinks = s.starts_with("DROP TABLE")
            || s.contains(" DROP COLUMN ")
            || s.contains(" RENAME ")
            || (s.contains(" ALTER COLUMN ") && s.contains(" TYPE "));
        let strict_column =
            s.contains(" ADD COLUMN ") && s.contains(" NOT NULL") && !s.contains(" DEFAULT ");
        if shrinks {
            problems.push(format!("drops, renames or retypes: {statement}"));
        } else if strict_column {
            problems.push(format!(
                "a NOT NULL column without a default, which the previous release does not write: {statement}"
            ));
        }
    }
    problems
}
