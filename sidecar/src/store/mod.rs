//! The sidecar's database (sqlx, SQLite for now): which accounts it has
//! served, by which agent identity, and whether they are online. Later:
//! ownership leases, the operation journal and last resourceVersions, and
//! PostgreSQL when several sidecars share one store.

use std::str::FromStr;

use sqlx::Row;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};

/// Connections kept to a file database.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 4;

/// Why the store failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The URL is not a usable SQLite URL.
    #[error("store url {url:?}: {source}")]
    InvalidUrl {
        /// The URL.
        url: String,
        /// sqlx's error.
        #[source]
        source: sqlx::Error,
    },
    /// The database could not be opened.
    #[error("opening {url:?}: {source}")]
    Open {
        /// The URL.
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

/// The database handle; cheap to clone.
#[derive(Debug, Clone)]
pub struct Store {
    pool: SqlitePool,
}

fn now_millis() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

impl Store {
    /// Opens (creating if missing) and migrates the database at `url`.
    pub async fn open(url: &str) -> Result<Self> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|source| Error::InvalidUrl {
                url: url.to_owned(),
                source,
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
                url: url.to_owned(),
                source,
            })?;
        sqlx::migrate!("./migrations").run(&pool).await?;
        Ok(Self { pool })
    }

    /// Records that `name` is served by `identity` in `state`.
    pub async fn upsert_account(
        &self,
        name: &str,
        identity: &str,
        state: AccountState,
    ) -> Result<()> {
        let now = now_millis();
        sqlx::query(
            "INSERT INTO accounts (name, agent_identity, state, first_seen, last_seen)
             VALUES (?1, ?2, ?3, ?4, ?4)
             ON CONFLICT(name) DO UPDATE SET
               agent_identity = excluded.agent_identity,
               state = excluded.state,
               last_seen = excluded.last_seen",
        )
        .bind(name)
        .bind(identity)
        .bind(state.as_str())
        .bind(now)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Records a state change of a known account.
    pub async fn set_account_state(&self, name: &str, state: AccountState) -> Result<()> {
        sqlx::query("UPDATE accounts SET state = ?1, last_seen = ?2 WHERE name = ?3")
            .bind(state.as_str())
            .bind(now_millis())
            .bind(name)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Every recorded account, by name.
    pub async fn accounts(&self) -> Result<Vec<AccountRow>> {
        let rows = sqlx::query(
            "SELECT name, agent_identity, state, first_seen, last_seen FROM accounts ORDER BY name",
        )
        .fetch_all(&self.pool)
        .await?;
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
    }

    /// Closes the pool.
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn upsert_then_state_change_in_memory() {
        let store = Store::open("sqlite::memory:").await.unwrap();
        store
            .upsert_account("a", "spiffe://x/agent/1", AccountState::Online)
            .await
            .unwrap();
        store
            .set_account_state("a", AccountState::Offline)
            .await
            .unwrap();
        let rows = store.accounts().await.unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].state, "offline");
        assert_eq!(rows[0].agent_identity, "spiffe://x/agent/1");
        assert!(rows[0].last_seen >= rows[0].first_seen);
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
}
