//! The SQLite and Postgres stores (issue 4): the sandbox registry, the caller directory,
//! the sealed audit log, the org policies, the quota leases and the brokered secrets on sqlx, one
//! implementation over both databases.
//!
//! [`Store::connect`] picks the database from the URL (`postgres://…` or
//! `postgresql://…` selects Postgres; `sqlite:…` or no URL selects SQLite, by default
//! `<data_dir>/sandlane.db` in WAL mode), applies the migrations and hands out the
//! ports. SQL that both databases accept is written once; the few places that differ
//! (advisory locks, `FOR UPDATE`, `BEGIN IMMEDIATE`) branch on the backend.

use std::path::{Path, PathBuf};
use std::str::FromStr as _;
use std::sync::Arc;
use std::time::Duration;

use ports::{AuditLog, CallerDirectory, PolicyStore, QuotaLeases, SandboxRegistry, SecretStore};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

mod audit;
mod callers;
mod fast;
mod policy;
mod preview;
mod registry;
pub mod seal;
pub mod secret_keys;
mod secrets;
mod snapshots;
mod tickets;
mod webhooks;

pub use audit::{DEFAULT_LATE_GRACE, DEFAULT_SEAL_INTERVAL, SqlAuditLog, spawn_sealer};
pub use callers::SqlCallerDirectory;
pub use policy::{SqlPolicyStore, SqlQuotaLeases};
pub use registry::SqlRegistry;
pub use secrets::{Rotation, SqlSecretStore};
pub use tickets::SqlTerminalTickets;
pub use webhooks::SqlWebhookStore;

#[cfg(test)]
pub(crate) mod contract;

/// The SQLite database file in the data dir when no URL is given.
pub const SQLITE_FILE: &str = "sandlane.db";

/// Why the store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database URL is not one the store understands.
    #[error("database URL: {0}")]
    Url(String),
    /// Connecting failed.
    #[error("cannot connect to the {backend} database: {message}")]
    Connect {
        /// `sqlite` or `postgres`.
        backend: &'static str,
        /// What failed.
        message: String,
    },
    /// Applying the migrations failed.
    #[error("database migrations failed: {0}")]
    Migrate(String),
    /// The audit key could not be loaded or created.
    #[error(transparent)]
    AuditKey(#[from] ports::AuditError),
    /// The database does not answer.
    #[error("database ping failed: {0}")]
    Ping(String),
}

/// How to open the store. Its `Debug` shows the URL's scheme only (a URL may hold a
/// password).
#[derive(Clone)]
pub struct StoreOptions {
    /// `postgres://…` / `postgresql://…` for Postgres, `sqlite:PATH` for a SQLite file,
    /// `None` for `<data_dir>/sandlane.db`. Never logged (it may hold a password).
    pub database_url: Option<String>,
    /// The data dir: the SQLite file's default home and the audit key's home.
    pub data_dir: PathBuf,
    /// Most connections to Postgres, in all (half of them, rounded down, serve the
    /// statements on a request's path, see `fast.rs`; SQLite: readers; it has one writer).
    pub max_connections: u32,
    /// How long after a seal an unsealed row below its range counts as inserted (see
    /// [`seal`]); also how late a row may commit and still be sealed.
    pub late_grace: Duration,
    /// Whether to create `<data_dir>/audit-key` when it is missing (`true` for the server;
    /// `false` suits `sandlane audit verify`, which must not mint a fresh key).
    pub create_audit_key: bool,
}

impl std::fmt::Debug for StoreOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let url = self
            .database_url
            .as_deref()
            .map(|u| format!("{}:<redacted>", u.split(':').next().unwrap_or_default()));
        f.debug_struct("StoreOptions")
            .field("database_url", &url)
            .field("data_dir", &self.data_dir)
            .field("max_connections", &self.max_connections)
            .field("late_grace", &self.late_grace)
            .field("create_audit_key", &self.create_audit_key)
            .finish()
    }
}

impl StoreOptions {
    /// Defaults: SQLite in `data_dir`, 16 connections, [`DEFAULT_LATE_GRACE`], the audit
    /// key created when missing.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            database_url: None,
            data_dir: data_dir.into(),
            max_connections: 16,
            late_grace: DEFAULT_LATE_GRACE,
            create_audit_key: true,
        }
    }

    /// The same options with a database URL.
    #[must_use]
    pub fn with_url(mut self, url: Option<&str>) -> Self {
        self.database_url = url.map(str::to_owned);
        self
    }
}

/// The connection pools of one database.
#[derive(Debug, Clone)]
pub(crate) enum Backend {
    /// SQLite: one writer connection (SQLite's single writer, so no busy retries within
    /// the process) and a pool of readers (WAL lets them read while it writes).
    Sqlite {
        /// The one writer.
        writer: SqlitePool,
        /// The readers.
        reader: SqlitePool,
    },
    /// Postgres: sqlx's pool, and the connections for the statements on a request's path
    /// ([`fast::FastPath`]).
    Postgres(PgPool, Arc<fast::FastPath>),
}

/// Runs `$body` with `$p` bound to the pool that serves the backend (for SQLite the writer
/// for `write`, a reader for `read`). The body is compiled once per database.
macro_rules! with_pool {
    (write $backend:expr, $p:ident => $body:expr) => {
        match $backend {
            $crate::sql::Backend::Sqlite { writer: $p, .. } => $body,
            $crate::sql::Backend::Postgres($p, _) => $body,
        }
    };
    (read $backend:expr, $p:ident => $body:expr) => {
        match $backend {
            $crate::sql::Backend::Sqlite { reader: $p, .. } => $body,
            $crate::sql::Backend::Postgres($p, _) => $body,
        }
    };
    // One statement on a request's path: on Postgres `$p` is a `&mut PgConnection` of the
    // fast path, given back by the body's result (see `fast.rs`); on SQLite as `read` or
    // `write`.
    (fast $mode:ident $backend:expr, $p:ident => $body:expr) => {
        match $backend {
            $crate::sql::Backend::Postgres(_, fast) => $crate::sql::on_fast_path!(fast, $p => $body),
            sqlite => $crate::sql::with_pool!($mode sqlite, $p => $body),
        }
    };
}
pub(crate) use with_pool;

/// Runs `$body`, one statement returning `Result<_, sqlx::Error>`, with `$c` bound to a
/// `&mut PgConnection` of the fast path `$fast` (see `fast.rs`), and gives the connection
/// back by the statement's result.
macro_rules! on_fast_path {
    ($fast:expr, $c:ident => $body:expr) => {
        match $fast.checkout().await {
            Ok(mut held) => {
                let result = {
                    let $c = &mut *held;
                    $body
                };
                held.give_back(&result);
                result
            }
            Err(e) => Err(e),
        }
    };
}
pub(crate) use on_fast_path;

/// Begins a write transaction: `BEGIN IMMEDIATE` on SQLite (takes the write lock up front,
/// so a transaction that reads before it writes cannot fail to upgrade), `BEGIN` on
/// Postgres.
pub(crate) trait WritePool {
    /// The database.
    type Db: sqlx::Database;
    /// Begins the transaction.
    fn begin_write(
        &self,
    ) -> impl Future<Output = Result<sqlx::Transaction<'static, Self::Db>, sqlx::Error>> + Send;
}

impl WritePool for SqlitePool {
    type Db = sqlx::Sqlite;
    fn begin_write(
        &self,
    ) -> impl Future<Output = Result<sqlx::Transaction<'static, Self::Db>, sqlx::Error>> + Send {
        self.begin_with("BEGIN IMMEDIATE")
    }
}

impl WritePool for PgPool {
    type Db = sqlx::Postgres;
    fn begin_write(
        &self,
    ) -> impl Future<Output = Result<sqlx::Transaction<'static, Self::Db>, sqlx::Error>> + Send {
        self.begin()
    }
}

/// The opened store: one database, the audit key, and the three ports over them.
#[derive(Debug, Clone)]
pub struct Store {
    backend: Backend,
    registry: Arc<SqlRegistry>,
    audit: Arc<SqlAuditLog>,
    callers: Arc<SqlCallerDirectory>,
    policies: Arc<SqlPolicyStore>,
    leases: Arc<SqlQuotaLeases>,
    secrets: Arc<SqlSecretStore>,
    snapshots: Arc<snapshots::SqlSnapshotStore>,
    tickets: Arc<SqlTerminalTickets>,
    webhooks: Arc<SqlWebhookStore>,
    preview_links: Arc<preview::SqlPreviewLinkStore>,
}

impl Store {
    /// Opens the database named by `url` (see [`StoreOptions::database_url`]) with
    /// defaults, applies the migrations, and loads (or creates) `<data_dir>/audit-key`.
    ///
    /// # Errors
    /// [`StoreError`] naming what failed.
    pub async fn connect(url: Option<&str>, data_dir: &Path) -> Result<Self, StoreError> {
        Self::open(StoreOptions::new(data_dir).with_url(url)).await
    }

    /// Opens the store with explicit options.
    ///
    /// # Errors
    /// [`StoreError`] naming what failed.
    pub async fn open(options: StoreOptions) -> Result<Self, StoreError> {
        let backend = match options.database_url.as_deref() {
            Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
                open_postgres(url, options.max_connections).await?
            }
            Some(url) if url.starts_with("sqlite:") => {
                let opts = SqliteConnectOptions::from_str(url)
                    .map_err(|e| StoreError::Url(format!("not a SQLite URL: {e}")))?;
                open_sqlite(opts, options.max_connections).await?
            }
            Some(other) => {
                let scheme = other.split(':').next().unwrap_or_default();
                return Err(StoreError::Url(format!(
                    "unsupported scheme {scheme:?}; use postgres://… or sqlite:…"
                )));
            }
            None => {
                std::fs::create_dir_all(&options.data_dir).map_err(|e| StoreError::Connect {
                    backend: "sqlite",
                    message: format!("data dir {}: {e}", options.data_dir.display()),
                })?;
                let opts = SqliteConnectOptions::new().filename(options.data_dir.join(SQLITE_FILE));
                open_sqlite(opts, options.max_connections).await?
            }
        };
        let key = if options.create_audit_key {
            seal::AuditKey::load_or_create(&options.data_dir)?
        } else {
            seal::AuditKey::load(&options.data_dir)?
        };
        // One set of sealing keys for the brokered secrets and the webhooks' secrets.
        let secret_keys = Arc::new(secret_keys::SecretKeys::new(&options.data_dir));
        Ok(Self {
            webhooks: Arc::new(SqlWebhookStore::new(backend.clone(), secret_keys.clone())),
            registry: Arc::new(SqlRegistry::new(backend.clone())),
            audit: Arc::new(SqlAuditLog::new(backend.clone(), key, options.late_grace)),
            callers: Arc::new(SqlCallerDirectory::new(backend.clone())),
            policies: Arc::new(SqlPolicyStore::new(backend.clone())),
            leases: Arc::new(SqlQuotaLeases::new(backend.clone())),
            secrets: Arc::new(SqlSecretStore::new(backend.clone(), secret_keys)),
            snapshots: Arc::new(snapshots::SqlSnapshotStore::new(backend.clone())),
            tickets: Arc::new(SqlTerminalTickets::new(backend.clone())),
            preview_links: Arc::new(preview::SqlPreviewLinkStore::new(backend.clone())),
            backend,
        })
    }

    /// `sqlite` or `postgres`.
    pub fn backend_name(&self) -> &'static str {
        match self.backend {
            Backend::Sqlite { .. } => "sqlite",
            Backend::Postgres(..) => "postgres",
        }
    }

    /// The sandbox registry.
    pub fn registry(&self) -> Arc<dyn SandboxRegistry> {
        self.registry.clone()
    }

    /// The audit log.
    pub fn audit(&self) -> Arc<dyn AuditLog> {
        self.audit.clone()
    }

    /// The audit log as its concrete type (for [`spawn_sealer`] and the benchmark).
    pub fn audit_log(&self) -> Arc<SqlAuditLog> {
        self.audit.clone()
    }

    /// The caller directory.
    pub fn callers(&self) -> Arc<dyn CallerDirectory> {
        self.callers.clone()
    }

    /// The org policies.
    pub fn policies(&self) -> Arc<dyn PolicyStore> {
        self.policies.clone()
    }

    /// The leases on shared concurrency quotas.
    pub fn leases(&self) -> Arc<dyn QuotaLeases> {
        self.leases.clone()
    }

    /// The brokered secrets.
    pub fn secrets(&self) -> Arc<dyn SecretStore> {
        self.secrets.clone()
    }

    /// The snapshot records.
    pub fn snapshots(&self) -> Arc<dyn ports::SnapshotStore> {
        self.snapshots.clone()
    }

    /// The terminal tickets.
    pub fn terminal_tickets(&self) -> Arc<dyn ports::TerminalTickets> {
        self.tickets.clone()
    }

    /// The webhooks and their outbox.
    pub fn webhooks(&self) -> Arc<dyn ports::WebhookStore> {
        self.webhooks.clone()
    }

    /// The preview links.
    pub fn preview_links(&self) -> Arc<dyn ports::PreviewLinkStore> {
        self.preview_links.clone()
    }

    /// The brokered secrets as their concrete type (for `sandlane secret rotate-key`).
    pub fn secret_store(&self) -> Arc<SqlSecretStore> {
        self.secrets.clone()
    }

    /// Readiness: one round trip to the database.
    ///
    /// # Errors
    /// [`StoreError::Ping`].
    pub async fn ping(&self) -> Result<(), StoreError> {
        with_pool!(read &self.backend, p => sqlx::query("SELECT 1").execute(p).await.map(|_| ()))
            .map(|_| ())
            .map_err(|e| StoreError::Ping(e.to_string()))
    }

    /// Closes the pools.
    pub async fn close(&self) {
        match &self.backend {
            Backend::Sqlite { writer, reader } => {
                reader.close().await;
                writer.close().await;
            }
            Backend::Postgres(p, fast) => {
                fast.close().await;
                p.close().await;
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn backend(&self) -> &Backend {
        &self.backend
    }
}

async fn open_sqlite(opts: SqliteConnectOptions, readers: u32) -> Result<Backend, StoreError> {
    let connect =
        |message: sqlx::Error| StoreError::Connect { backend: "sqlite", message: message.to_string() };
    let opts = opts
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        // WAL + NORMAL is durable against application crashes; FULL also against power
        // loss. The audit log promises "stored" on Ok, so keep FULL.
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(Duration::from_secs(10))
        .foreign_keys(true);
    let writer =
        SqlitePoolOptions::new().max_connections(1).connect_with(opts.clone()).await.map_err(connect)?;
    sqlx::migrate!("./migrations/sqlite")
        .run(&writer)
        .await
        .map_err(|e| StoreError::Migrate(e.to_string()))?;
    let reader = SqlitePoolOptions::new()
        .max_connections(readers.max(1))
        .connect_with(opts.read_only(true))
        .await
        .map_err(connect)?;
    Ok(Backend::Sqlite { writer, reader })
}

/// A pooled Postgres connection idle at least this long is pinged before it is handed out
/// (a restarted database or a dropped connection is then replaced, not failed into a
/// request). A connection in steady use is not: sqlx's default pings before every checkout,
/// one more round trip on every query of every request (0.1 to 0.3 ms here). A connection
/// that breaks while busy fails its query; sqlx closes it rather than returning it.
pub(crate) const PING_IDLE: Duration = Duration::from_secs(5);

async fn open_postgres(url: &str, max: u32) -> Result<Backend, StoreError> {
    // The URL's own text may hold a password: report only the parser's complaint.
    let opts = PgConnectOptions::from_str(url)
        .map_err(|_| StoreError::Url("not a valid postgres:// URL".to_owned()))?;
    // Half the connections for the statements on a request's path, the rest for sqlx's
    // pool (everything else: transactions, background passes, migrations).
    let fast = fast::FastPath::new(opts.clone(), max / 2);
    let pool = PgPoolOptions::new()
        .max_connections(max.saturating_sub(max / 2).max(2))
        .acquire_timeout(Duration::from_secs(10))
        // A ping only before handing out a connection that sat idle (see PING_IDLE).
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for >= PING_IDLE {
                    sqlx::Connection::ping(conn).await?;
                }
                Ok(true)
            })
        })
        .connect_with(opts)
        .await
        .map_err(|e| StoreError::Connect { backend: "postgres", message: e.to_string() })?;
    // sqlx's migrator takes a Postgres advisory lock, so replicas starting together apply
    // each migration once.
    sqlx::migrate!("./migrations/postgres")
        .run(&pool)
        .await
        .map_err(|e| StoreError::Migrate(e.to_string()))?;
    fast.warm().await;
    Ok(Backend::Postgres(pool, Arc::new(fast)))
}

/// The current wall-clock time in unix milliseconds (for audit bookkeeping only; the ports
/// pass the lane's clock in where it matters).
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
