//! Audit append throughput beside plain inserts into a table of the same shape, in the same
//! run, with 1 and 8 concurrent writers; then how long verify takes over what was written.
//!
//! ```sh
//! eval "$(bash scripts/pg-throwaway.sh start)"      # durable settings: fsync on
//! cargo bench -p adapters --bench audit              # BENCH_SECS=5 per cell by default
//! bash scripts/pg-throwaway.sh stop "$SANDLANE_TEST_PG_DIR"
//! ```
//!
//! Postgres runs when `SANDLANE_TEST_POSTGRES_URL` is set (a fresh database is created);
//! SQLite always runs, in a temp dir. An audit cell runs the sealer loop (default interval),
//! as a server would, and its time runs until every row it appended is sealed; a plain cell
//! inserts the same columns into a table with no triggers and no hash, with no sealer
//! running. The table printed has rows/s and the ratio.

use std::str::FromStr as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use adapters::sql::{DEFAULT_SEAL_INTERVAL, Store, StoreOptions, spawn_sealer};
use domain::{
    AuditAction, AuditEvent, AuditOutcome, CallerClass, Durability, IdentityId, OrgId, SandboxId, SandboxKey,
    SessionId, Timestamp, TokenId,
};
use ports::AuditLog;
use sqlx::{Pool, Postgres, Sqlite};

/// Alternating rounds per cell.
const ROUNDS: u32 = 2;

const PLAIN_TABLE: &str = "CREATE TABLE bench_plain (
    seq BIGSERIAL PRIMARY KEY, org TEXT NOT NULL, action TEXT NOT NULL, kind TEXT NOT NULL,
    key TEXT NOT NULL, sandbox_id TEXT, caller_id TEXT NOT NULL, caller_class TEXT NOT NULL,
    durability TEXT, driver TEXT NOT NULL, outcome TEXT NOT NULL, message TEXT NOT NULL,
    token_id TEXT, at BIGINT NOT NULL, hash BYTEA NOT NULL, appended_at BIGINT NOT NULL)";

const PLAIN_INSERT: &str = "INSERT INTO bench_plain (org, action, kind, key, sandbox_id, \
    caller_id, caller_class, durability, driver, outcome, message, token_id, at, hash, \
    appended_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15) \
    RETURNING seq";

fn event(n: u64) -> AuditEvent {
    AuditEvent {
        action: AuditAction::Ensure,
        key: SandboxKey::Session {
            org: OrgId::parse("acme").expect("org"),
            session_id: SessionId::parse(format!("s-{n}")).expect("session"),
        },
        sandbox_id: Some(SandboxId::generate(1_796_000_000_000 + n, u128::from(n))),
        caller_id: IdentityId::parse("u-1").expect("id"),
        caller_class: CallerClass::User,
        durability: Some(Durability::Durable),
        driver: "bubblewrap".into(),
        outcome: AuditOutcome::Provisioned,
        message: String::new(),
        token_id: Some(TokenId::parse(format!("jti-{n}")).expect("jti")),
        at: Timestamp::from_unix_millis(1_796_000_000_000 + n as i64),
    }
}

macro_rules! plain_insert {
    ($pool:expr, $e:expr) => {{
        let e = $e;
        let _: i64 = sqlx::query_scalar(PLAIN_INSERT)
            .bind(e.org().as_str().to_owned())
            .bind(e.action.as_str())
            .bind(e.key.kind().as_str())
            .bind(e.key.key().to_owned())
            .bind(e.sandbox_id.as_ref().map(|s| s.as_str().to_owned()))
            .bind(e.caller_id.as_str().to_owned())
            .bind(e.caller_class.as_str())
            .bind(e.durability.map(Durability::as_str))
            .bind(e.driver.clone())
            .bind(e.outcome.as_str())
            .bind(e.message.clone())
            .bind(e.token_id.as_ref().map(|s| s.as_str().to_owned()))
            .bind(e.at.unix_millis())
            .bind(vec![0u8; 32])
            .bind(0i64)
            .fetch_one($pool)
            .await
            .expect("plain insert");
    }};
}

#[derive(Clone)]
enum Plain {
    Pg(Pool<Postgres>),
    Lite(Pool<Sqlite>),
}

impl Plain {
    async fn insert(&self, n: u64) {
        match self {
            Self::Pg(p) => plain_insert!(p, event(n)),
            Self::Lite(p) => plain_insert!(p, event(n)),
        }
    }
}

/// Runs `writers` tasks calling `op` for `secs`; returns how many operations completed.
async fn run<F, Fut>(writers: u64, secs: f64, op: F) -> u64
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    let done = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for w in 0..writers {
        let (op, done) = (op.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = w << 40;
            while Instant::now() < until {
                op(n).await;
                n += 1;
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.expect("writer");
    }
    done.load(Ordering::Relaxed)
}

async fn bench(name: &str, store: Store, plain: Plain, secs: f64) {
    let log: Arc<dyn AuditLog> = store.audit();
    println!(
        "\n{name}: {ROUNDS} x {secs} s of writes per cell; audit cells with the sealer every \
         {DEFAULT_SEAL_INTERVAL:?}, timed until sealed; plain cells without it"
    );
    println!("| writers | plain insert rows/s | audit append rows/s | audit / plain |");
    println!("|--------:|--------------------:|--------------------:|--------------:|");
    for writers in [1u64, 8] {
        // Alternate plain and audit rounds so drift in the machine's load hits both alike.
        let (mut plain_rate, mut audit_rate) = (0.0, 0.0);
        for _ in 0..ROUNDS {
            let p = plain.clone();
            let start = Instant::now();
            let n = run(writers, secs, move |n| {
                let p = p.clone();
                async move { p.insert(n).await }
            })
            .await;
            plain_rate += n as f64 / start.elapsed().as_secs_f64() / f64::from(ROUNDS);

            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let sealer = spawn_sealer(log.clone(), DEFAULT_SEAL_INTERVAL, async move {
                let _ = stopped.await;
            });
            let l = log.clone();
            let start = Instant::now();
            let n = run(writers, secs, move |n| {
                let l = l.clone();
                async move {
                    l.append(&event(n)).await.expect("append");
                }
            })
            .await;
            while log.seal_status().await.expect("status").unsealed > 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            audit_rate += n as f64 / start.elapsed().as_secs_f64() / f64::from(ROUNDS);
            stop.send(()).ok();
            sealer.await.expect("sealer");
        }
        println!(
            "| {writers:>7} | {plain_rate:>19.0} | {audit_rate:>19.0} | {:>13.2} |",
            audit_rate / plain_rate
        );
    }
    let lag = log.seal_status().await.expect("status");
    let t = Instant::now();
    let report = log.verify().await.expect("verify");
    println!(
        "verify: {} rows, {} seals, intact={}, unsealed={}, {:.3} s",
        report.rows,
        report.seals,
        report.is_intact(),
        lag.unsealed,
        t.elapsed().as_secs_f64()
    );
    store.close().await;
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    // `cargo bench` passes `--bench`; a filter argument is accepted and ignored.
    let secs: f64 = std::env::var("BENCH_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(5.0);

    match std::env::var("SANDLANE_TEST_POSTGRES_URL") {
        Ok(admin) => {
            let mut random = [0u8; 6];
            getrandom::fill(&mut random).expect("random");
            let db: String = random.iter().map(|b| format!("{b:02x}")).collect();
            let db = format!("bench_{db}");
            let mut admin_conn =
                <sqlx::PgConnection as sqlx::Connection>::connect(&admin).await.expect("connect");
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {db}")))
                .execute(&mut admin_conn)
                .await
                .expect("create database");
            let settings: Vec<(String, String)> = sqlx::query_as(
                "SELECT name, setting FROM pg_settings \
                 WHERE name IN ('fsync', 'synchronous_commit', 'full_page_writes') ORDER BY name",
            )
            .fetch_all(&mut admin_conn)
            .await
            .expect("settings");
            let base = admin.rsplit_once('/').map_or(admin.as_str(), |(b, _)| b);
            let url = format!("{base}/{db}");
            let dir = tempfile::tempdir().expect("temp dir");
            let store = Store::open(StoreOptions::new(dir.path()).with_url(Some(&url))).await.expect("store");
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(16)
                .connect(&url)
                .await
                .expect("plain pool");
            sqlx::query(PLAIN_TABLE).execute(&pool).await.expect("plain table");
            let shown: Vec<String> = settings.iter().map(|(k, v)| format!("{k}={v}")).collect();
            bench(&format!("postgres ({})", shown.join(", ")), store, Plain::Pg(pool), secs).await;
        }
        Err(_) => println!(
            "SANDLANE_TEST_POSTGRES_URL is unset: Postgres skipped \
             (start one with scripts/pg-throwaway.sh)"
        ),
    }

    let dir = tempfile::tempdir().expect("temp dir");
    let store = Store::open(StoreOptions::new(dir.path())).await.expect("sqlite store");
    let opts = sqlx::sqlite::SqliteConnectOptions::from_str("sqlite:plain.db")
        .expect("sqlite url")
        .filename(dir.path().join("plain.db"))
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .synchronous(sqlx::sqlite::SqliteSynchronous::Full)
        .busy_timeout(Duration::from_secs(10));
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(opts)
        .await
        .expect("plain sqlite");
    sqlx::query(sqlx::AssertSqlSafe(PLAIN_TABLE.replace("BIGSERIAL", "INTEGER")))
        .execute(&pool)
        .await
        .expect("plain table");
    bench("sqlite (WAL, synchronous=FULL, one writer)", store, Plain::Lite(pool), secs).await;
}
