//! A PostgreSQL schema of its own for one test or benchmark run, so runs
//! sharing one server (`SPINLINK_TEST_POSTGRES_URL` in CI) never see each
//! other's tables: [`Schema::create`] makes it, [`Schema::url`] is a store
//! URL whose connections use it, [`Schema::drop_schema`] removes it and
//! everything in it.

use sqlx::postgres::PgPool;

use super::{Error, Result, redact};

/// A schema created for one run.
#[derive(Debug)]
pub struct Schema {
    server: String,
    name: String,
}

impl Schema {
    /// Creates a schema named `<prefix>_<random hex>` on the server at
    /// `server` (a `postgres://` URL).
    pub async fn create(server: &str, prefix: &str) -> Result<Schema> {
        let name = format!("{prefix}_{:016x}", rand::random::<u64>());
        exec(server, &format!("CREATE SCHEMA {name}")).await?;
        Ok(Schema {
            server: server.to_owned(),
            name,
        })
    }

    /// The schema's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A store URL whose connections work in this schema; `application`
    /// names them in `pg_stat_activity` (a test finds its sidecars'
    /// connections by it).
    pub fn url(&self, application: Option<&str>) -> String {
        let sep = if self.server.contains('?') { '&' } else { '?' };
        let mut url = format!(
            "{}{sep}options=-c%20search_path%3D{}",
            self.server, self.name
        );
        if let Some(app) = application {
            url.push_str(&format!("&application_name={app}"));
        }
        url
    }

    /// Drops the schema and everything in it.
    pub async fn drop_schema(self) -> Result<()> {
        exec(
            &self.server,
            &format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name),
        )
        .await
    }

    /// [`Schema::create`] from synchronous code (a runtime of its own on a
    /// thread of its own, so it also works inside a runtime).
    pub fn create_blocking(server: &str, prefix: &str) -> Result<Schema> {
        let (server, prefix) = (server.to_owned(), prefix.to_owned());
        blocking(async move { Schema::create(&server, &prefix).await })
    }

    /// [`Schema::drop_schema`] from synchronous code, as
    /// [`Schema::create_blocking`]: for `Drop` implementations.
    pub fn drop_blocking(self) -> Result<()> {
        blocking(self.drop_schema())
    }
}

fn blocking<T: Send + 'static>(
    f: impl std::future::Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::Query(sqlx::Error::Io(e)))?
            .block_on(f)
    })
    .join()
    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

async fn exec(server: &str, sql: &str) -> Result<()> {
    let pool = PgPool::connect(server)
        .await
        .map_err(|source| Error::Open {
            url: redact(server),
            source,
        })?;
    let result = sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(&pool)
        .await;
    pool.close().await;
    result?;
    Ok(())
}
