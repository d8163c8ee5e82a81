//! The store the scaled-out tests' sidecars share: PostgreSQL, in a schema
//! of its own dropped at the end, when `SPINLINK_TEST_POSTGRES_URL` is set;
//! a SQLite file in the test's directory otherwise.

use std::path::Path;
use std::time::{Duration, Instant};

use spinlink_sidecar::store::scratch::Schema;

/// One store for a test's sidecars.
pub struct SharedStore {
    sqlite: String,
    schema: Option<(String, Schema)>,
}

impl SharedStore {
    /// PostgreSQL when `SPINLINK_TEST_POSTGRES_URL` is set (a schema named
    /// after `prefix`), else `dir/shared.db`.
    pub fn new(dir: &Path, prefix: &str) -> SharedStore {
        let sqlite = format!("sqlite://{}", dir.join("shared.db").display());
        let schema = std::env::var("SPINLINK_TEST_POSTGRES_URL")
            .ok()
            .map(|server| {
                let schema = Schema::create_blocking(&server, prefix).unwrap_or_else(|e| {
                    panic!("SPINLINK_TEST_POSTGRES_URL is set but unusable: {e}")
                });
                (server, schema)
            });
        let store = SharedStore { sqlite, schema };
        eprintln!("store: {}", store.engine());
        store
    }

    /// `SQLite` or `PostgreSQL`, for messages.
    pub fn engine(&self) -> &'static str {
        if self.schema.is_some() {
            "PostgreSQL"
        } else {
            "SQLite"
        }
    }

    /// The PostgreSQL schema of this test, if on PostgreSQL.
    pub fn schema_name(&self) -> Option<&str> {
        self.schema.as_ref().map(|(_, schema)| schema.name())
    }

    /// Whether it is PostgreSQL.
    pub fn postgres(&self) -> bool {
        self.schema.is_some()
    }

    /// The store URL of sidecar `id`: on PostgreSQL its connections carry
    /// an application name that lets [`SharedStore::drop_connections`]
    /// find them.
    pub fn url(&self, id: &str) -> String {
        match &self.schema {
            Some((_, schema)) => schema.url(Some(&format!("{}_{id}", schema.name()))),
            None => self.sqlite.clone(),
        }
    }

    /// PostgreSQL only: terminates every connection of this test's
    /// sidecars, again and again for `d`, so the database is unreachable to
    /// them for that long; returns how many were terminated.
    pub fn drop_connections(&self, d: Duration) -> u64 {
        let Some((server, schema)) = &self.schema else {
            return 0;
        };
        let sql = format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE application_name LIKE '{}\\_%' AND pid <> pg_backend_pid()",
            schema.name()
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let pool = sqlx::PgPool::connect(server).await.unwrap();
            let end = Instant::now() + d;
            let mut n = 0;
            while Instant::now() < end {
                if let Ok(rows) = sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
                    .fetch_all(&pool)
                    .await
                {
                    n += rows.len() as u64;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            pool.close().await;
            n
        })
    }
}

impl Drop for SharedStore {
    fn drop(&mut self) {
        if let Some((_, schema)) = self.schema.take()
            && let Err(e) = schema.drop_blocking()
        {
            eprintln!("dropping the test schema: {e}");
        }
    }
}
