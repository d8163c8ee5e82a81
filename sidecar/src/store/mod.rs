//! The sidecar's database: SQLite embedded by default, PostgreSQL when several
//! sidecars share one store (`store.url` picks: `sqlite:…` or `postgres://…`).
//! It records which accounts have been served and by which agent, which
//! sidecar instance owns each account ([`Lease`]: owner, epoch, expiry), the
//! journal of relayed operations, and the last resourceVersion held per
//! account and kind, from which a new owner resumes the agent's watches.
//!
//! Both engines run the same SQL (`$n` parameters, `ON CONFLICT` upserts,
//! `RETURNING`), with their own migrations under `migrations/{sqlite,postgres}`.
//! Start with [`Store::open`].

use std::str::FromStr;

use sqlx::Row;
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};

/// Connections kept to a file or server database.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 4;
/// How long opening a server database keeps retrying a refused connection
/// (a database restarting beside the sidecar).
pub const DEFAULT_CONNECT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Why the store failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The URL is not a usable database URL.
    #[error("store url {url}: {message}")]
    InvalidUrl {
        /// The URL, with any password removed.
        url: String,
        /// What is wrong with it.
        message: String,
    },
    /// The database could not be opened.
    #[error("opening {url}: {source}")]
    Open {
        /// The URL, with any password removed.
        url: String,
        /// sqlx's error.
        #[source]
        source: sqlx::Error,
    },
    /// The schema could not be brought up to date.
    #[error("migrating the store: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A query failed.
    #[error("store query failed: {0}")]
    Query(#[from] sqlx::Error),
}

/// Result with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An account's state as recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccountState {
    /// A cache stream is open.
    Online,
    /// No cache stream is open.
    Offline,
}

impl AccountState {
    fn as_str(self) -> &'static str {
        match self {
            Self::Online => "online",
            Self::Offline => "offline",
        }
    }
}

/// A recorded account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountRow {
    /// Account name.
    pub name: String,
    /// The agent identity that last served it.
    pub agent_identity: String,
    /// `online` or `offline`.
    pub state: String,
    /// Unix milliseconds when first seen.
    pub first_seen: i64,
    /// Unix milliseconds when last changed.
    pub last_seen: i64,
}

/// Who owns an account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The owning sidecar instance.
    pub owner: String,
    /// Grows with every change of owner.
    pub epoch: i64,
    /// Unix milliseconds after which another instance may take it.
    pub expires_at: i64,
}

/// A sidecar instance that registered in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceRow {
    /// Its instance id (the pod name, in Kubernetes).
    pub id: String,
    /// Where its peers reach it (its peer port), or its facade before it
    /// served one; empty when it serves neither to peers.
    pub url: String,
    /// Unix milliseconds when it last said it runs.
    pub last_seen: i64,
}

/// The result of [`Store::acquire_lease`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquired {
    /// The caller owns the account until the lease expires.
    Owned(Lease),
    /// Another instance holds an unexpired lease.
    HeldBy(Lease),
}

/// One journaled relayed operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalEntry {
    /// The account.
    pub account: String,
    /// The sidecar instance that relayed it.
    pub instance: String,
    /// The request id on the relay stream.
    pub request_id: i64,
    /// HTTP method.
    pub method: String,
    /// Kubernetes path.
    pub path: String,
    /// The raw query string.
    pub query: String,
    /// The `Kubectl-Command` header; empty when none.
    pub kubectl_command: String,
    /// HTTP status answered.
    pub status: i64,
    /// How it ended (`answered`, `failed`, …).
    pub outcome: String,
    /// Why it failed; empty when it did not.
    pub message: String,
    /// Unix milliseconds when received.
    pub received_at: i64,
    /// Unix milliseconds when its head went down the relay stream; 0: never.
    pub sent_at: i64,
    /// Unix milliseconds when the agent began on it, placed on the relaying
    /// sidecar's clock; `None` when the agent reported no times.
    pub agent_started_at: Option<i64>,
    /// Unix milliseconds when the agent had its answer, placed likewise.
    pub agent_finished_at: Option<i64>,
    /// Unix milliseconds when answered.
    pub answered_at: i64,
}

/// A kind as the store keys resourceVersions.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct KindVersion {
    /// API group, empty for the core group.
    pub group: String,
    /// API version.
    pub version: String,
    /// Plural resource name.
    pub resource: String,
    /// The last resourceVersion held.
    pub resource_version: String,
}

/// A dynamic account as stored. `Debug` leaves the sealed kubeconfig out.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct DynamicRow {
    /// Account name.
    pub name: String,
    /// The zone whose agents may take it; empty: agents without a zone.
    pub zone: String,
    /// Namespaces to watch; empty means all.
    pub namespaces: Vec<String>,
    /// The kubeconfig context; empty: its current context.
    pub context: String,
    /// The kubeconfig, sealed (see `dynamic::crypto`).
    pub sealed_kubeconfig: Vec<u8>,
    /// SHA-256 (hex) of the cluster CA; empty when unknown.
    pub ca_fingerprint: String,
    /// The agent that holds it; empty when none.
    pub agent_id: String,
    /// Unix milliseconds when its agent last renewed the claim.
    pub agent_seen_at: i64,
    /// Unix milliseconds when created.
    pub created_at: i64,
    /// Unix milliseconds when last changed.
    pub updated_at: i64,
}

impl std::fmt::Debug for DynamicRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DynamicRow")
            .field("name", &self.name)
            .field("zone", &self.zone)
            .field("namespaces", &self.namespaces)
            .field("agent_id", &self.agent_id)
            .field("updated_at", &self.updated_at)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone)]
enum Pool {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// Runs `$body` with `$pool` bound to whichever pool the store has: the SQL
/// is the same for both engines, the types are not.
macro_rules! with_pool {
    ($store:expr, $pool:ident => $body:expr) => {
        match &$store.pool {
            Pool::Sqlite($pool) => $body,
            Pool::Postgres($pool) => $body,
        }
    };
}

/// Reads a [`DynamicRow`] from a row of either engine (a macro: the row
/// types differ, the code does not).
macro_rules! dynamic_row {
    ($r:expr) => {{
        let r = $r;
        (|| -> Result<DynamicRow> {
            let namespaces: String = r.try_get("namespaces")?;
            Ok(DynamicRow {
                name: r.try_get("name")?,
                zone: r.try_get("zone")?,
                // Written by `put_dynamic` only; an unreadable list means all.
                namespaces: serde_json::from_str(&namespaces).unwrap_or_default(),
                context: r.try_get("context")?,
                sealed_kubeconfig: r.try_get("kubeconfig")?,
                ca_fingerprint: r.try_get("ca_fingerprint")?,
                agent_id: r.try_get("agent_id")?,
                agent_seen_at: r.try_get("agent_seen_at")?,
                created_at: r.try_get("created_at")?,
                updated_at: r.try_get("updated_at")?,
            })
        })()
    }};
}

/// The database handle; cheap to clone.
#[derive(Debug, Clone)]
pub struct Store {
    pool: Pool,
}

fn now_millis() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// `url` without its password, for errors and logs.
pub fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("****"));
            u.to_string()
        }
        Ok(_) => url.to_owned(),
        Err(_) => "<unparsable url>".to_owned(),
    }
}

impl Store {
    /// Opens (creating a SQLite file if missing) and migrates the database
    /// at `url`.
    pub async fn open(url: &str) -> Result<Self> {
        Self::open_within(url, DEFAULT_CONNECT_WAIT).await
    }

    /// [`Store::open`], retrying a server database for at most `wait`.
    pub async fn open_within(url: &str, wait: std::time::Duration) -> Result<Self> {
        if url.starts_with("sqlite:") {
            Self::open_sqlite(url).await
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Self::open_postgres(url, wait).await
        } else {
            Err(Error::InvalidUrl {
                url: redact(url),
                message: "must start with sqlite: or postgres://".into(),
            })
        }
    }

    async fn open_sqlite(url: &str) -> Result<Self> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| Error::InvalidUrl {
                url: redact(url),
                message: e.to_string(),
            })?
            .create_if_missing(true);
        let memory = url.contains(":memory:") || url.contains("mode=memory");
        // Every connection to `:memory:` is its own database: keep exactly one,
        // forever.
        let pool_options = if memory {
            SqlitePoolOptions::new()
                .max_connections(1)
                .min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None)
        } else {
            SqlitePoolOptions::new().max_connections(DEFAULT_MAX_CONNECTIONS)
        };
        let pool = pool_options
            .connect_with(options)
            .await
            .map_err(|source| Error::Open {
                url: redact(url),
                source,
            })?;
        sqlx::migrate!("./migrations/sqlite").run(&pool).await?;
        Ok(Self {
            pool: Pool::Sqlite(pool),
        })
    }

    async fn open_postgres(url: &str, wait: std::time::Duration) -> Result<Self> {
        let pool = PgPoolOptions::new()
            .max_connections(DEFAULT_MAX_CONNECTIONS)
            .acquire_timeout(wait)
            .connect(url)
            .await
            .map_err(|source| Error::Open {
                url: redact(url),
                source,
            })?;
        sqlx::migrate!("./migrations/postgres").run(&pool).await?;
        Ok(Self {
            pool: Pool::Postgres(pool),
        })
    }

    /// `sqlite` or `postgres`.
    pub fn engine(&self) -> &'static str {
        match self.pool {
            Pool::Sqlite(_) => "sqlite",
            Pool::Postgres(_) => "postgres",
        }
    }

    /// Records that `name` is served by `identity` in `state`.
    pub async fn upsert_account(
        &self,
        name: &str,
        identity: &str,
        state: AccountState,
    ) -> Result<()> {
        let now = now_millis();
        let sql = "INSERT INTO accounts (name, agent_identity, state, first_seen, last_seen)
             VALUES ($1, $2, $3, $4, $4)
             ON CONFLICT(name) DO UPDATE SET
               agent_identity = excluded.agent_identity,
               state = excluded.state,
               last_seen = excluded.last_seen";
        with_pool!(self, pool => {
            sqlx::query(sql).bind(name).bind(identity).bind(state.as_str()).bind(now)
                .execute(pool).await?;
        });
        Ok(())
    }

    /// Records a state change of a known account.
    pub async fn set_account_state(&self, name: &str, state: AccountState) -> Result<()> {
        let sql = "UPDATE accounts SET state = $1, last_seen = $2 WHERE name = $3";
        with_pool!(self, pool => {
            sqlx::query(sql).bind(state.as_str()).bind(now_millis()).bind(name)
                .execute(pool).await?;
        });
        Ok(())
    }

    /// Every recorded account, by name.
    pub async fn accounts(&self) -> Result<Vec<AccountRow>> {
        let sql =
            "SELECT name, agent_identity, state, first_seen, last_seen FROM accounts ORDER BY name";
        with_pool!(self, pool => {
            let rows = sqlx::query(sql).fetch_all(pool).await?;
            rows.into_iter()
                .map(|r| {
                    Ok(AccountRow {
                        name: r.try_get("name")?,
                        agent_identity: r.try_get("agent_identity")?,
                        state: r.try_get("state")?,
                        first_seen: r.try_get("first_seen")?,
                        last_seen: r.try_get("last_seen")?,
                    })
                })
                .collect()
        })
    }

    /// The recorded account `name`, if any.
    pub async fn account(&self, name: &str) -> Result<Option<AccountRow>> {
        let sql = "SELECT name, agent_identity, state, first_seen, last_seen FROM accounts
             WHERE name = $1";
        with_pool!(self, pool => {
            let Some(r) = sqlx::query(sql).bind(name).fetch_optional(pool).await? else {
                return Ok(None);
            };
            Ok(Some(AccountRow {
                name: r.try_get("name")?,
                agent_identity: r.try_get("agent_identity")?,
                state: r.try_get("state")?,
                first_seen: r.try_get("first_seen")?,
                last_seen: r.try_get("last_seen")?,
            }))
        })
    }

    /// Records that `account` names the cluster whose CA has `fingerprint`.
    /// Returns the fingerprint already held when it is a different cluster
    /// (`Some`), else records it (`None`). An empty fingerprint (unknown)
    /// neither conflicts nor is recorded; an account row is created if
    /// missing.
    pub async fn claim_fingerprint(
        &self,
        account: &str,
        fingerprint: &str,
    ) -> Result<Option<String>> {
        if fingerprint.is_empty() {
            return Ok(None);
        }
        let now = now_millis();
        // Sets it when none is held, keeps it when it is the same; either
        // way returns what is held afterwards.
        let sql = "INSERT INTO accounts (name, agent_identity, state, first_seen, last_seen, ca_fingerprint)
             VALUES ($1, '', 'offline', $2, $2, $3)
             ON CONFLICT(name) DO UPDATE SET
               ca_fingerprint = CASE WHEN accounts.ca_fingerprint = ''
                                     THEN excluded.ca_fingerprint
                                     ELSE accounts.ca_fingerprint END
             RETURNING ca_fingerprint";
        let held: String = with_pool!(self, pool => {
            sqlx::query(sql).bind(account).bind(now).bind(fingerprint)
                .fetch_one(pool).await?.try_get("ca_fingerprint")?
        });
        Ok((held != fingerprint).then_some(held))
    }

    /// Forgets the cluster `account` named (it was removed), so the name may
    /// be used for another cluster.
    pub async fn clear_fingerprint(&self, account: &str) -> Result<()> {
        let sql = "UPDATE accounts SET ca_fingerprint = '' WHERE name = $1";
        with_pool!(self, pool => {
            sqlx::query(sql).bind(account).execute(pool).await?;
        });
        Ok(())
    }

    /// Takes or renews the lease on `account` for `owner` until `ttl` from
    /// now. A free or expired lease is taken with the next epoch; the
    /// owner's own lease is renewed with the same epoch; anyone else's
    /// unexpired lease is left alone and returned as [`Acquired::HeldBy`].
    /// One statement, so two instances racing cannot both win.
    pub async fn acquire_lease(
        &self,
        account: &str,
        owner: &str,
        ttl: std::time::Duration,
    ) -> Result<Acquired> {
        let now = now_millis();
        let expires = now.saturating_add(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX));
        let sql = "INSERT INTO leases (account, owner, epoch, expires_at) VALUES ($1, $2, 1, $3)
             ON CONFLICT(account) DO UPDATE SET
               epoch = CASE WHEN leases.owner = excluded.owner
                            THEN leases.epoch ELSE leases.epoch + 1 END,
               owner = excluded.owner,
               expires_at = excluded.expires_at
             WHERE leases.owner = excluded.owner OR leases.expires_at <= $4
             RETURNING owner, epoch, expires_at";
        let won = with_pool!(self, pool => {
            sqlx::query(sql).bind(account).bind(owner).bind(expires).bind(now)
                .fetch_optional(pool).await?
                .map(|r| lease_of(r.try_get("owner"), r.try_get("epoch"), r.try_get("expires_at")))
                .transpose()?
        });
        match won {
            Some(lease) => Ok(Acquired::Owned(lease)),
            None => match self.lease(account).await? {
                Some(lease) => Ok(Acquired::HeldBy(lease)),
                // Released between the two statements: try once more.
                None => Box::pin(self.acquire_lease(account, owner, ttl)).await,
            },
        }
    }

    /// The current lease on `account`, expired or not.
    pub async fn lease(&self, account: &str) -> Result<Option<Lease>> {
        let sql = "SELECT owner, epoch, expires_at FROM leases WHERE account = $1";
        with_pool!(self, pool => {
            sqlx::query(sql).bind(account).fetch_optional(pool).await?
                .map(|r| lease_of(r.try_get("owner"), r.try_get("epoch"), r.try_get("expires_at")))
                .transpose()
        })
    }

    /// Gives up `owner`'s lease of `epoch` on `account` (a drain), so
    /// another instance need not wait for it to expire. Returns whether it
    /// was held.
    pub async fn release_lease(&self, account: &str, owner: &str, epoch: i64) -> Result<bool> {
        let sql =
            "UPDATE leases SET expires_at = 0 WHERE account = $1 AND owner = $2 AND epoch = $3";
        let n = with_pool!(self, pool => {
            sqlx::query(sql).bind(account).bind(owner).bind(epoch)
                .execute(pool).await?.rows_affected()
        });
        Ok(n > 0)
    }

    /// Appends relayed operations to the journal, in order, in one
    /// transaction.
    pub async fn journal(&self, entries: &[JournalEntry]) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let sql = "INSERT INTO operations
             (account, instance, request_id, method, path, query, kubectl_command, status,
              outcome, message, received_at, sent_at, agent_started_at, agent_finished_at,
              answered_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)";
        with_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            for e in entries {
                sqlx::query(sql)
                    .bind(&e.account).bind(&e.instance).bind(e.request_id).bind(&e.method)
                    .bind(&e.path).bind(&e.query).bind(&e.kubectl_command).bind(e.status)
                    .bind(&e.outcome).bind(&e.message).bind(e.received_at).bind(e.sent_at)
                    .bind(e.agent_started_at).bind(e.agent_finished_at).bind(e.answered_at)
                    .execute(&mut *tx).await?;
            }
            tx.commit().await?;
        });
        Ok(())
    }

    /// Keeps only the newest `keep` journaled operations of `account`;
    /// returns how many were deleted.
    pub async fn prune_journal(&self, account: &str, keep: i64) -> Result<u64> {
        // No row at that offset (fewer than `keep + 1`): `id <= NULL`
        // deletes nothing.
        let sql = "DELETE FROM operations WHERE account = $1 AND id <= (
               SELECT id FROM operations WHERE account = $1
               ORDER BY id DESC LIMIT 1 OFFSET $2)";
        Ok(with_pool!(self, pool => {
            sqlx::query(sql).bind(account).bind(keep).execute(pool).await?.rows_affected()
        }))
    }

    /// The newest `limit` journaled operations of `account`, oldest first.
    pub async fn journaled(&self, account: &str, limit: i64) -> Result<Vec<JournalEntry>> {
        let sql = "SELECT account, instance, request_id, method, path, query, kubectl_command,
                    status, outcome, message, received_at, sent_at, agent_started_at,
                    agent_finished_at, answered_at
             FROM operations WHERE account = $1 ORDER BY id DESC LIMIT $2";
        let mut out: Vec<JournalEntry> = with_pool!(self, pool => {
            sqlx::query(sql).bind(account).bind(limit).fetch_all(pool).await?
                .into_iter()
                .map(|r| -> Result<JournalEntry> {
                    Ok(JournalEntry {
                        account: r.try_get("account")?,
                        instance: r.try_get("instance")?,
                        request_id: r.try_get("request_id")?,
                        method: r.try_get("method")?,
                        path: r.try_get("path")?,
                        query: r.try_get("query")?,
                        kubectl_command: r.try_get("kubectl_command")?,
                        status: r.try_get("status")?,
                        outcome: r.try_get("outcome")?,
                        message: r.try_get("message")?,
                        received_at: r.try_get("received_at")?,
                        sent_at: r.try_get("sent_at")?,
                        agent_started_at: r.try_get("agent_started_at")?,
                        agent_finished_at: r.try_get("agent_finished_at")?,
                        answered_at: r.try_get("answered_at")?,
                    })
                })
                .collect::<Result<_>>()?
        });
        out.reverse();
        Ok(out)
    }

    /// Records, for `owner`, the resourceVersions held for kinds of
    /// `account` (`set`) and forgets kinds it no longer holds (`gone`), in
    /// one transaction — only while the account's lease names `owner`
    /// (expired or released, but not yet taken by another instance), so an
    /// instance the account has moved away from cannot overwrite what the
    /// new owner records. Returns whether it was written.
    pub async fn record_resource_versions(
        &self,
        account: &str,
        owner: &str,
        set: &[KindVersion],
        gone: &[KindVersion],
    ) -> Result<bool> {
        let fence = "SELECT owner FROM leases WHERE account = $1 AND owner = $2";
        let upsert = "INSERT INTO resource_versions
               (account, api_group, version, resource, resource_version, updated_at)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT(account, api_group, version, resource) DO UPDATE SET
               resource_version = excluded.resource_version,
               updated_at = excluded.updated_at";
        let delete = "DELETE FROM resource_versions
             WHERE account = $1 AND api_group = $2 AND version = $3 AND resource = $4";
        let now = now_millis();
        with_pool!(self, pool => {
            let mut tx = pool.begin().await?;
            if sqlx::query(fence).bind(account).bind(owner)
                .fetch_optional(&mut *tx).await?.is_none()
            {
                tx.rollback().await?;
                return Ok(false);
            }
            for k in set {
                sqlx::query(upsert)
                    .bind(account).bind(&k.group).bind(&k.version).bind(&k.resource)
                    .bind(&k.resource_version).bind(now)
                    .execute(&mut *tx).await?;
            }
            for k in gone {
                sqlx::query(delete)
                    .bind(account).bind(&k.group).bind(&k.version).bind(&k.resource)
                    .execute(&mut *tx).await?;
            }
            tx.commit().await?;
        });
        Ok(true)
    }

    /// Every kind's recorded resourceVersion for `account`, sorted.
    pub async fn resource_versions(&self, account: &str) -> Result<Vec<KindVersion>> {
        let sql = "SELECT api_group, version, resource, resource_version FROM resource_versions
             WHERE account = $1 ORDER BY api_group, version, resource";
        with_pool!(self, pool => {
            sqlx::query(sql).bind(account).fetch_all(pool).await?
                .into_iter()
                .map(|r| {
                    Ok(KindVersion {
                        group: r.try_get("api_group")?,
                        version: r.try_get("version")?,
                        resource: r.try_get("resource")?,
                        resource_version: r.try_get("resource_version")?,
                    })
                })
                .collect()
        })
    }

    /// Forgets the resourceVersions of `account` (its cache was dropped),
    /// but only while its lease names `owner` (see
    /// [`Store::record_resource_versions`]).
    pub async fn clear_resource_versions(&self, account: &str, owner: &str) -> Result<()> {
        let sql = "DELETE FROM resource_versions WHERE account = $1
               AND EXISTS (SELECT 1 FROM leases WHERE account = $1 AND owner = $2)";
        with_pool!(self, pool => {
            sqlx::query(sql).bind(account).bind(owner).execute(pool).await?;
        });
        Ok(())
    }

    /// Records that sidecar `id` runs with its facade at `facade_url`.
    pub async fn register_instance(&self, id: &str, facade_url: &str) -> Result<()> {
        let sql = "INSERT INTO instances (id, facade_url, last_seen) VALUES ($1, $2, $3)
             ON CONFLICT(id) DO UPDATE SET
               facade_url = excluded.facade_url, last_seen = excluded.last_seen";
        with_pool!(self, pool => {
            sqlx::query(sql).bind(id).bind(facade_url).bind(now_millis())
                .execute(pool).await?;
        });
        Ok(())
    }

    /// Marks sidecar `id` as running now; returns whether it is registered.
    pub async fn touch_instance(&self, id: &str) -> Result<bool> {
        let sql = "UPDATE instances SET last_seen = $2 WHERE id = $1";
        let n = with_pool!(self, pool => {
            sqlx::query(sql).bind(id).bind(now_millis())
                .execute(pool).await?.rows_affected()
        });
        Ok(n > 0)
    }

    /// The instances seen at or after `since` (Unix milliseconds), by id.
    pub async fn instances(&self, since: i64) -> Result<Vec<InstanceRow>> {
        let sql = "SELECT id, facade_url, peer_url, last_seen FROM instances
             WHERE last_seen >= $1 ORDER BY id";
        with_pool!(self, pool => {
            sqlx::query(sql).bind(since).fetch_all(pool).await?
                .iter()
                .map(|r| {
                    let peer: String = r.try_get("peer_url")?;
                    let facade: String = r.try_get("facade_url")?;
                    Ok(InstanceRow {
                        id: r.try_get("id")?,
                        url: if peer.is_empty() { facade } else { peer },
                        last_seen: r.try_get("last_seen")?,
                    })
                })
                .collect()
        })
    }

    /// Where sidecar `id`'s facade answers, if it registered.
    pub async fn instance_url(&self, id: &str) -> Result<Option<String>> {
        let sql = "SELECT facade_url FROM instances WHERE id = $1";
        with_pool!(self, pool => {
            sqlx::query(sql).bind(id).fetch_optional(pool).await?
                .map(|r| r.try_get("facade_url"))
                .transpose()
                .map_err(Error::from)
        })
    }

    /// Records where sidecar `id` serves its caches to its peers (see
    /// [`crate::handover`]). The instance must be registered already;
    /// returns whether it was.
    pub async fn set_instance_peer_url(&self, id: &str, peer_url: &str) -> Result<bool> {
        let sql = "UPDATE instances SET peer_url = $2 WHERE id = $1";
        let n = with_pool!(self, pool => {
            sqlx::query(sql).bind(id).bind(peer_url)
                .execute(pool).await?.rows_affected()
        });
        Ok(n > 0)
    }

    /// Where sidecar `id` serves its caches to its peers, if it said.
    pub async fn instance_peer_url(&self, id: &str) -> Result<Option<String>> {
        let sql = "SELECT peer_url FROM instances WHERE id = $1";
        let url: Option<String> = with_pool!(self, pool => {
            sqlx::query(sql).bind(id).fetch_optional(pool).await?
                .map(|r| r.try_get("peer_url"))
                .transpose()?
        });
        Ok(url.filter(|u| !u.is_empty()))
    }

    /// Creates dynamic account `row.name`, or updates its zone, namespaces,
    /// context, sealed kubeconfig and fingerprint. A change of zone frees it
    /// from its agent; otherwise the agent keeps it (and is sent the new
    /// settings). `agent_id`, `agent_seen_at` and `created_at` of `row` are
    /// ignored.
    pub async fn put_dynamic(&self, row: &DynamicRow) -> Result<()> {
        let now = now_millis();
        let namespaces = serde_json::to_string(&row.namespaces).unwrap_or_else(|_| "[]".into());
        let sql = "INSERT INTO dynamic_accounts (name, zone, namespaces, context, kubeconfig,
               ca_fingerprint, agent_id, agent_seen_at, created_at, updated_at)
             VALUES ($1, $2, $3, $4, $5, $6, '', 0, $7, $7)
             ON CONFLICT(name) DO UPDATE SET
               agent_id = CASE WHEN dynamic_accounts.zone = excluded.zone
                                AND dynamic_accounts.deleted_at = 0
                               THEN dynamic_accounts.agent_id ELSE '' END,
               deleted_at = 0,
               zone = excluded.zone,
               namespaces = excluded.namespaces,
               context = excluded.context,
               kubeconfig = excluded.kubeconfig,
               ca_fingerprint = excluded.ca_fingerprint,
               updated_at = excluded.updated_at";
        with_pool!(self, pool => {
            sqlx::query(sql)
                .bind(&row.name).bind(&row.zone).bind(&namespaces).bind(&row.context)
                .bind(&row.sealed_kubeconfig).bind(&row.ca_fingerprint).bind(now)
                .execute(pool).await?;
        });
        Ok(())
    }

    /// Deletes dynamic account `name`: its kubeconfig is erased and a
    /// tombstone kept (see [`Store::dynamic_deleted`]). Returns whether it
    /// existed.
    pub async fn delete_dynamic(&self, name: &str) -> Result<bool> {
        let sql = "UPDATE dynamic_accounts
             SET deleted_at = $2, kubeconfig = $3, agent_id = '', updated_at = $2
             WHERE name = $1 AND deleted_at = 0";
        let n = with_pool!(self, pool => {
            sqlx::query(sql).bind(name).bind(now_millis()).bind(Vec::<u8>::new())
                .execute(pool).await?.rows_affected()
        });
        Ok(n > 0)
    }

    /// Whether `name` is a deleted dynamic account (and not created again).
    pub async fn dynamic_deleted(&self, name: &str) -> Result<bool> {
        let sql = "SELECT name FROM dynamic_accounts WHERE name = $1 AND deleted_at > 0";
        Ok(with_pool!(self, pool => {
            sqlx::query(sql).bind(name).fetch_optional(pool).await?.is_some()
        }))
    }

    /// Every dynamic account, by name.
    pub async fn dynamic_accounts(&self) -> Result<Vec<DynamicRow>> {
        let sql = format!(
            "SELECT {DYNAMIC_COLUMNS} FROM dynamic_accounts WHERE deleted_at = 0 ORDER BY name"
        );
        with_pool!(self, pool => {
            sqlx::query(sqlx::AssertSqlSafe(sql)).fetch_all(pool).await?
                .into_iter().map(|r| dynamic_row!(&r)).collect()
        })
    }

    /// Dynamic account `name`, if there is one.
    pub async fn dynamic_account(&self, name: &str) -> Result<Option<DynamicRow>> {
        let sql = format!(
            "SELECT {DYNAMIC_COLUMNS} FROM dynamic_accounts WHERE name = $1 AND deleted_at = 0"
        );
        with_pool!(self, pool => {
            sqlx::query(sqlx::AssertSqlSafe(sql)).bind(name).fetch_optional(pool).await?
                .map(|r| dynamic_row!(&r)).transpose()
        })
    }

    /// Claims for `agent_id` every dynamic account of `zone` that `allowed`
    /// accepts and that no agent holds, or whose agent has not renewed its
    /// claim for `ttl`; renews the agent's own claims; and returns all the
    /// accounts it now holds, by name. One statement per account: two
    /// agents claiming at once never both win it.
    pub async fn claim_dynamic(
        &self,
        agent_id: &str,
        zone: &str,
        ttl: std::time::Duration,
        allowed: impl Fn(&str) -> bool,
    ) -> Result<Vec<DynamicRow>> {
        let list = "SELECT name FROM dynamic_accounts WHERE zone = $1 AND deleted_at = 0
             ORDER BY name";
        let names: Vec<String> = with_pool!(self, pool => {
            sqlx::query(list).bind(zone).fetch_all(pool).await?
                .into_iter().map(|r| r.try_get("name")).collect::<Result<_, _>>()?
        });
        let now = now_millis();
        let expired = now.saturating_sub(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX));
        let sql = format!(
            "UPDATE dynamic_accounts SET agent_id = $1, agent_seen_at = $3
             WHERE name = $5 AND zone = $2 AND deleted_at = 0
               AND (agent_id = $1 OR agent_id = '' OR agent_seen_at < $4)
             RETURNING {DYNAMIC_COLUMNS}"
        );
        let mut rows = Vec::new();
        for name in names.iter().filter(|n| allowed(n)) {
            let row: Option<DynamicRow> = with_pool!(self, pool => {
                sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
                    .bind(agent_id).bind(zone).bind(now).bind(expired).bind(name)
                    .fetch_optional(pool).await?
                    .map(|r| dynamic_row!(&r)).transpose()?
            });
            rows.extend(row);
        }
        Ok(rows)
    }

    /// Closes the pool.
    pub async fn close(&self) {
        with_pool!(self, pool => pool.close().await);
    }
}

/// The columns of a [`DynamicRow`].
const DYNAMIC_COLUMNS: &str = "name, zone, namespaces, context, kubeconfig, ca_fingerprint, \
    agent_id, agent_seen_at, created_at, updated_at";

fn lease_of(
    owner: Result<String, sqlx::Error>,
    epoch: Result<i64, sqlx::Error>,
    expires_at: Result<i64, sqlx::Error>,
) -> Result<Lease> {
    Ok(Lease {
        owner: owner?,
        epoch: epoch?,
        expires_at: expires_at?,
    })
}

pub mod scratch;

#[cfg(test)]
mod tests;
