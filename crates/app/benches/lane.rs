//! The lane benchmark (issue 7): sandlane beside its floor and beside a container peer, in
//! one run, printed as one table and written into `BENCHMARKS.md`.
//!
//! Run it with `scripts/bench.sh` (release build, throwaway Postgres, podman set-up), or
//! `scripts/bench.sh --smoke` (dev profile, tiny counts; part of the test command).
//! Directly: `cargo bench -p app --bench lane -- [--smoke] [--out BENCHMARKS.md]` with
//! `SANDLANE_TEST_POSTGRES_URL` set to an admin URL of a Postgres it may create databases
//! in, and optionally `SANDLANE_BENCH_PODMAN_IMAGE` naming a local image holding `true`.
//!
//! Everything that is compared is measured pair by pair, interleaved (A, B, A, B, …), and
//! reported as medians and ratios of those medians, because the machine is shared.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::cast_precision_loss)]

use std::ffi::OsString;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use adapters::bwrap::{BwrapConfig, BwrapDriver};
use adapters::jwt::{JwtConfig, JwtMinter, KeyStore};
use adapters::sql::{DEFAULT_SEAL_INTERVAL, Store, StoreOptions, spawn_sealer};
use domain::execution::{AgentExecution, SandboxSubject};
use domain::sandbox::{Lease, SandboxRecord};
use domain::split::RecordSubject;
use domain::{
    AuditAction, AuditEvent, AuditOutcome, CallerClass, Durability, ExecRequest, ExecutionId, IdentityId,
    OrgId, Phase, SandboxCaller, SandboxId, SandboxKey, SandboxState, SandboxToken, SessionId, Timestamp,
    TokenId, split_caller,
};
use ed25519_dalek::{Signer as _, SigningKey, Verifier as _};
use ports::{
    AuditLog, Clock, CredentialMinter, CredentialVerifier, MockCallerDirectory, MockSandboxRegistry,
    ProvisionSpec, SandboxDriver, SystemClock,
};
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio::runtime::Runtime;

mod support;
use support::Served;

const ORG: &str = "bench";

/// How much of everything one run does.
struct Counts {
    /// Interleaved pairs: ensure/floor, re-ensures, exec rounds.
    pairs: usize,
    /// podman / sandlane rounds.
    peer_rounds: usize,
    /// Concurrent HTTP clients for the throughput run.
    clients: usize,
    /// Sandboxes on the small and the big server.
    small: usize,
    big: usize,
    /// Interleaved ensure pairs small/big.
    scale_pairs: usize,
    /// Crypto: batches and operations per batch.
    crypto_batches: usize,
    crypto_batch: usize,
    /// Audit: seconds per cell and alternating rounds.
    audit_secs: f64,
    audit_rounds: usize,
}

impl Counts {
    fn full() -> Self {
        Self {
            pairs: 200,
            peer_rounds: 30,
            clients: 16,
            small: 10,
            big: 1_000,
            scale_pairs: 100,
            crypto_batches: 30,
            crypto_batch: 200,
            audit_secs: 2.0,
            audit_rounds: 3,
        }
    }

    fn smoke() -> Self {
        Self {
            pairs: 5,
            peer_rounds: 2,
            clients: 4,
            small: 4,
            big: 20,
            scale_pairs: 3,
            crypto_batches: 3,
            crypto_batch: 20,
            audit_secs: 0.2,
            audit_rounds: 1,
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The `p`-quantile (0..=1) of `samples` (sorted in place).
fn quantile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    let i = ((samples.len().saturating_sub(1)) as f64 * p).round() as usize;
    samples.get(i).copied().unwrap_or_default()
}

fn median_f(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

fn random_hex(bytes: usize) -> String {
    let mut b = vec![0u8; bytes];
    getrandom::fill(&mut b).expect("entropy");
    b.iter().map(|x| format!("{x:02x}")).collect()
}

// ---------------------------------------------------------------------------------------
// Postgres

async fn fresh_database(admin: &str, tag: &str) -> String {
    let name = format!("bench_{tag}_{}", random_hex(4));
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(admin).await.expect("connect");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut conn)
        .await
        .expect("create database");
    let base = admin.rsplit_once('/').map_or(admin, |(b, _)| b);
    format!("{base}/{name}")
}

async fn durability_settings(admin: &str) -> String {
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(admin).await.expect("connect");
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT name, setting FROM pg_settings \
         WHERE name IN ('fsync', 'synchronous_commit', 'full_page_writes') ORDER BY name",
    )
    .fetch_all(&mut conn)
    .await
    .expect("settings");
    let version: String = sqlx::query_scalar("SHOW server_version").fetch_one(&mut conn).await.expect("v");
    let shown: Vec<String> = rows.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("PostgreSQL {version} ({})", shown.join(", "))
}

// ---------------------------------------------------------------------------------------
// The server under test and its HTTP clients

/// A `sandlane serve` process on its own data dir and database.
struct Server {
    served: Served,
    base: String,
    key: String,
}

impl Server {
    fn start(database_url: &str) -> Self {
        Self::start_with(database_url, &[])
    }

    /// A server with `extra` variables in its environment.
    fn start_with(database_url: &str, extra: &[(&'static str, String)]) -> Self {
        let mut vars = vec![("SANDLANE_DATABASE_URL", database_url.to_owned())];
        vars.extend(extra.iter().cloned());
        let served = Served::start("sandlane-bench-", "svc-bench", ORG, &vars);
        Self { base: served.base(), key: served.key.clone(), served }
    }

    fn client(&self) -> Client {
        let agent = ureq::Agent::config_builder().http_status_as_error(false).build().new_agent();
        Client { agent, base: self.base.clone(), auth: format!("Bearer {}", self.key) }
    }

    /// The ids of the sandboxes the server's driver holds (its state directories).
    fn sandbox_ids(&self) -> Vec<String> {
        std::fs::read_dir(self.served.data.path().join("data/sandboxes"))
            .map(|d| d.flatten().filter_map(|e| e.file_name().into_string().ok()).collect())
            .unwrap_or_default()
    }

    /// Resident set size in bytes.
    fn rss(&self) -> u64 {
        self.served.rss()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.served.stop();
        // Resident sandboxes outlive their server: end this run's with the driver itself.
        let mut config = BwrapConfig::new(self.served.data.path().join("data"));
        config.supervisor = adapters::supervisor_link::locate_for_tests().unwrap_or_else(|e| panic!("{e}"));
        if let Ok(driver) = BwrapDriver::new(config)
            && let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build()
        {
            rt.block_on(async {
                for id in driver.list().await.unwrap_or_default() {
                    let _ = driver.deprovision(&id).await;
                }
            });
        }
    }
}

/// Proportional set size in bytes of every process in the cgroups of `ids` (the pids
/// controller lists each sandbox's whole tree: its bubblewrap and its supervisor).
fn sandboxes_pss(ids: &[String]) -> (u64, usize) {
    let mut pss = 0;
    let mut processes = 0;
    for id in ids {
        let procs = std::fs::read_to_string(format!("/sys/fs/cgroup/pids/sandlane/{id}/cgroup.procs"))
            .unwrap_or_default();
        for pid in procs.lines() {
            let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
            if let Some(kb) = rollup
                .lines()
                .find_map(|l| l.strip_prefix("Pss:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
            {
                pss += kb * 1024;
                processes += 1;
            }
        }
    }
    (pss, processes)
}

/// One blocking HTTP client (ureq, one kept-alive connection).
struct Client {
    agent: ureq::Agent,
    base: String,
    auth: String,
}

static SESSIONS: AtomicU64 = AtomicU64::new(0);

fn new_session() -> String {
    format!("s-{}", SESSIONS.fetch_add(1, Ordering::Relaxed))
}

impl Client {
    fn read(response: Result<ureq::http::Response<ureq::Body>, ureq::Error>, what: &str) -> Value {
        let mut r = response.unwrap_or_else(|e| panic!("{what}: {e}"));
        let status = r.status().as_u16();
        let body: Value = r.body_mut().read_json().unwrap_or(Value::Null);
        assert!(status < 300, "{what}: HTTP {status}: {body}");
        body
    }

    /// Session ensure; returns the sandbox id.
    fn ensure(&self, session: &str) -> String {
        let url = format!("{}/v1/orgs/{ORG}/sessions/{session}/sandbox", self.base);
        let r = self.agent.put(&url).header("authorization", &self.auth).send_json(json!({
            "execution_id": format!("e-{}", SESSIONS.fetch_add(1, Ordering::Relaxed))
        }));
        let body = Self::read(r, "ensure");
        assert_eq!(body["outcome"], "ready", "ensure: {body}");
        body["sandbox"]["id"].as_str().expect("sandbox id").to_owned()
    }

    fn exec_true(&self, sandbox: &str) {
        let url = format!("{}/v1/orgs/{ORG}/sandboxes/{sandbox}/exec", self.base);
        let r =
            self.agent.post(&url).header("authorization", &self.auth).send_json(json!({"argv": ["true"]}));
        let body = Self::read(r, "exec");
        assert_eq!(body["exit_code"], 0, "exec: {body}");
    }

    fn deprovision(&self, session: &str) {
        let url = format!("{}/v1/orgs/{ORG}/sessions/{session}/sandbox", self.base);
        let r = self.agent.delete(&url).header("authorization", &self.auth).call();
        Self::read(r, "deprovision");
    }
}

/// `clients` threads ensure new sessions until `total` ensures are done; returns ensures/s
/// over the first tenth and over the whole run.
fn load(server: &Server, clients: usize, total: usize) -> (f64, f64) {
    if total == 0 {
        return (0.0, 0.0);
    }
    let tenth = (total / 10).max(1) as u64;
    let (claimed, finished) = (AtomicU64::new(0), AtomicU64::new(0));
    let first = std::sync::Mutex::new(Duration::ZERO);
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..clients {
            let client = server.client();
            let (claimed, finished, first) = (&claimed, &finished, &first);
            s.spawn(move || {
                while claimed.fetch_add(1, Ordering::Relaxed) < total as u64 {
                    client.ensure(&new_session());
                    if finished.fetch_add(1, Ordering::Relaxed) + 1 == tenth {
                        *first.lock().expect("lock") = start.elapsed();
                    }
                }
            });
        }
    });
    let whole = total as f64 / start.elapsed().as_secs_f64();
    let first = *first.lock().expect("lock");
    (tenth as f64 / first.as_secs_f64().max(1e-9), whole)
}

/// Raw bubblewrap probes per second with `clients` concurrent threads for `secs`: the
/// ceiling the floor's probe alone puts on new ensures per second.
fn raw_rate(raw: &RawBwrap, clients: usize, secs: f64) -> f64 {
    let done = AtomicU64::new(0);
    let start = Instant::now();
    let until = start + Duration::from_secs_f64(secs);
    std::thread::scope(|s| {
        for _ in 0..clients {
            s.spawn(|| {
                while Instant::now() < until {
                    raw.run();
                    done.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

// ---------------------------------------------------------------------------------------
// In-process driver, raw bubblewrap, and the floor

fn provision_spec(session: &str) -> ProvisionSpec {
    let millis = u64::try_from(SystemClock.now().unix_millis()).unwrap_or(0);
    let mut random = [0u8; 16];
    getrandom::fill(&mut random).expect("entropy");
    let id = SandboxId::generate(millis, u128::from_le_bytes(random));
    let execution = AgentExecution {
        org: OrgId::parse(ORG).expect("org"),
        session_id: SessionId::parse(session).expect("session"),
        execution_id: ExecutionId::parse("exec-bench").expect("execution"),
        phase: Phase::InProgress,
    };
    let caller =
        SandboxCaller::from_record(IdentityId::parse("svc-bench").expect("id"), CallerClass::Service);
    let (_mint, environment) = split_caller(&execution, &caller, &id);
    ProvisionSpec {
        key: execution.sandbox_key(),
        environment,
        durability: Durability::Ephemeral,
        credential: SandboxToken::new("bench-token"),
        epoch: 1,
        workspace_bytes: None,
        from_snapshot: None,
    }
}

/// The driver's exact command line for `true` in one sandbox, run raw (same argv, same
/// host uid drop; no rlimits, no cgroup).
struct RawBwrap {
    program: PathBuf,
    args: Vec<OsString>,
    host_uid: Option<u32>,
}

impl RawBwrap {
    fn new(driver: &BwrapDriver, sandbox: &SandboxId, request: &ExecRequest) -> Self {
        let line = driver.command_line(sandbox, request).expect("command line");
        Self { program: line.program, args: line.args, host_uid: line.host_id }
    }

    fn run(&self) -> Duration {
        let t = Instant::now();
        let mut cmd = Command::new(&self.program);
        if let Some(id) = self.host_uid {
            cmd.uid(id).gid(id);
        }
        let out = cmd
            .args(&self.args)
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .expect("raw bwrap");
        assert!(out.status.success(), "raw bwrap: {}", String::from_utf8_lossy(&out.stderr));
        t.elapsed()
    }
}

/// The floor of a new ensure: the database writes of one (claim insert, audit row, ready
/// update, owner row) in ONE transaction, the workspace directory, one raw probe.
struct Floor {
    pool: PgPool,
    dir: PathBuf,
    raw: Arc<RawBwrap>,
    n: u64,
}

impl Floor {
    fn once(&mut self, rt: &Runtime) -> Duration {
        self.n += 1;
        let n = self.n;
        let t = Instant::now();
        rt.block_on(async {
            let event = audit_event(n);
            let id = event.sandbox_id.as_ref().expect("id").as_str().to_owned();
            let now = event.at.unix_millis();
            let mut tx = self.pool.begin().await.expect("begin");
            sqlx::query(
                "INSERT INTO sandboxes (id, org, kind, key, durability, state, driver, caller_id, \
                 caller_class, execution_id, lease_holder, lease_expires_at, lease_epoch, \
                 claim_nonce, created_at, updated_at) VALUES ($1, $2, 'session', $3, \
                 'ephemeral', 'provisioning', 'bubblewrap', 'svc-bench', 'service', 'e', 'floor', \
                 $4, 1, $1, $4, $4)",
            )
            .bind(&id)
            .bind(ORG)
            .bind(event.key.key())
            .bind(now)
            .execute(&mut *tx)
            .await
            .expect("floor insert");
            insert_event_row("audit_events", &event, &mut *tx).await;
            sqlx::query(
                "UPDATE sandboxes SET state = 'ready', token_id = $2, token_expires_at = $3, \
                 updated_at = $3 WHERE id = $1 AND lease_epoch = 1 AND state = 'provisioning'",
            )
            .bind(&id)
            .bind(format!("jti-{n}"))
            .bind(now)
            .execute(&mut *tx)
            .await
            .expect("floor update");
            sqlx::query(
                "INSERT INTO sandbox_owners (org, kind, key, owner_id, owner_class, created_at) \
                 VALUES ($1, 'session', $2, 'svc-bench', 'service', $3)",
            )
            .bind(ORG)
            .bind(event.key.key())
            .bind(now)
            .execute(&mut *tx)
            .await
            .expect("floor owner");
            tx.commit().await.expect("commit");
        });
        let workspace = self.dir.join(format!("w{n}"));
        std::fs::DirBuilder::new().mode(0o700).create(&workspace).expect("workspace");
        if let Some(uid) = self.raw.host_uid {
            std::os::unix::fs::chown(&workspace, Some(uid), Some(uid)).expect("chown");
        }
        self.raw.run();
        let elapsed = t.elapsed();
        let _ = std::fs::remove_dir(&workspace);
        elapsed
    }
}

fn audit_event(n: u64) -> AuditEvent {
    let now = SystemClock.now();
    let millis = u64::try_from(now.unix_millis()).unwrap_or(0);
    let mut random = [0u8; 16];
    getrandom::fill(&mut random).expect("entropy");
    AuditEvent {
        action: AuditAction::Ensure,
        key: SandboxKey::Session {
            org: OrgId::parse(ORG).expect("org"),
            session_id: SessionId::parse(format!("floor-{n}-{}", random[0])).expect("session"),
        },
        sandbox_id: Some(SandboxId::generate(millis, u128::from_le_bytes(random))),
        caller_id: IdentityId::parse("svc-bench").expect("id"),
        caller_class: CallerClass::Service,
        durability: Some(Durability::Ephemeral),
        driver: "bubblewrap".into(),
        outcome: AuditOutcome::Provisioned,
        message: String::new(),
        token_id: Some(TokenId::parse(format!("jti-{n}")).expect("jti")),
        at: now,
    }
}

/// The audit row as a plain insert: the columns `SqlAuditLog::append` writes.
async fn insert_event_row<'c, E>(table: &str, e: &AuditEvent, executor: E)
where
    E: sqlx::Executor<'c, Database = sqlx::Postgres>,
{
    let sql = format!(
        "INSERT INTO {table} (org, action, kind, key, sandbox_id, caller_id, caller_class, \
         durability, driver, outcome, message, token_id, at, hash, appended_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $13) RETURNING seq"
    );
    let _: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .bind(e.org().as_str())
        .bind(e.action.as_str())
        .bind(e.key.kind().as_str())
        .bind(e.key.key())
        .bind(e.sandbox_id.as_ref().map(SandboxId::as_str))
        .bind(e.caller_id.as_str())
        .bind(e.caller_class.as_str())
        .bind(e.durability.map(Durability::as_str))
        .bind(e.driver.as_str())
        .bind(e.outcome.as_str())
        .bind(e.message.as_str())
        .bind(e.token_id.as_ref().map(TokenId::as_str))
        .bind(e.at.unix_millis())
        .bind(e.hash().to_vec())
        .fetch_one(executor)
        .await
        .expect("insert event row");
}

// ---------------------------------------------------------------------------------------
// Crypto and audit

fn ready_record(id: &SandboxId, key: &SandboxKey, now: Timestamp) -> SandboxRecord {
    SandboxRecord {
        id: id.clone(),
        key: key.clone(),
        durability: Durability::Ephemeral,
        state: SandboxState::Ready,
        driver: "bubblewrap".to_owned(),
        caller_id: IdentityId::parse("svc-bench").expect("id"),
        caller_class: CallerClass::Service,
        token_caller: SandboxCaller::from_record(
            IdentityId::parse("svc-bench").expect("id"),
            CallerClass::Service,
        ),
        execution_id: ExecutionId::parse("exec-bench").expect("id"),
        token_id: None,
        token_expires_at: None,
        lease: Lease { holder: "bench".to_owned(), expires_at: now, epoch: 1 },
        tokens_revoked_at: None,
        message: None,
        created_at: now,
        updated_at: now,
        last_active_at: now,
    }
}

/// Operations per second of mint, raw sign, verify, raw verify: medians of interleaved
/// batches. The registry read of verify is an in-memory stub (as in the adapters' jwt bench).
fn crypto(counts: &Counts) -> [f64; 4] {
    let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
    let dir = tempfile::tempdir().expect("temp dir");
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let now = clock.now();
    let keys = Arc::new(KeyStore::load_or_create(dir.path(), clock.clone()).expect("keys"));
    let key = SandboxKey::Session {
        org: OrgId::parse(ORG).expect("org"),
        session_id: SessionId::parse("sess-bench").expect("session"),
    };
    let sandbox = SandboxId::generate(u64::try_from(now.unix_millis()).unwrap_or(0), 42);
    let record = ready_record(&sandbox, &key, now);
    let mut registry = MockSandboxRegistry::new();
    registry.expect_get().returning(move |_| Ok(Some(record.clone())));
    let mut callers = MockCallerDirectory::new();
    callers.expect_is_revoked().returning(|_| Ok(false));
    let minter = JwtMinter::new(JwtConfig::default(), keys, Arc::new(registry), Arc::new(callers), clock)
        .expect("minter");
    let execution = ExecutionId::parse("exec-bench").expect("execution");
    let caller = IdentityId::parse("user:alice@example.com").expect("caller");
    let caller = SandboxCaller::from_record(caller, CallerClass::User);
    let (request, _) = split_caller(&RecordSubject::new(&key, &execution), &caller, &sandbox);
    let token = rt.block_on(minter.mint(&request)).expect("mint").token;
    let message = vec![b'e'; token.expose().rfind('.').unwrap_or(0)];
    let raw_key = SigningKey::from_bytes(&[7u8; 32]);
    let raw_public = raw_key.verifying_key();
    let raw_signature = raw_key.sign(&message);

    let k = counts.crypto_batch;
    let rate = |f: &mut dyn FnMut()| {
        let t = Instant::now();
        for _ in 0..k {
            f();
        }
        k as f64 / t.elapsed().as_secs_f64()
    };
    let mut rates: [Vec<f64>; 4] = Default::default();
    for _ in 0..counts.crypto_batches {
        rates[0].push(rate(&mut || {
            std::hint::black_box(rt.block_on(minter.mint(&request)).expect("mint"));
        }));
        rates[1].push(rate(&mut || {
            std::hint::black_box(raw_key.sign(std::hint::black_box(&message)));
        }));
        rates[2].push(rate(&mut || {
            std::hint::black_box(rt.block_on(minter.verify(&token)).expect("verify"));
        }));
        rates[3].push(rate(&mut || {
            raw_public.verify(std::hint::black_box(&message), &raw_signature).expect("verify");
        }));
    }
    rates.map(|mut r| median_f(&mut r))
}

/// Runs `writers` tasks calling `op` for `secs`; how many operations they completed.
async fn run_for<F, Fut>(writers: usize, secs: f64, op: F) -> u64
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    let done = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let tasks: Vec<_> = (0..writers as u64)
        .map(|w| {
            let (op, done) = (op.clone(), done.clone());
            tokio::spawn(async move {
                let mut n = w << 40;
                while Instant::now() < until {
                    op(n).await;
                    n += 1;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("writer");
    }
    done.load(Ordering::Relaxed)
}

/// Audit appends beside plain inserts of the same row into a copy of the table without
/// triggers, for 1 and 8 writers, alternating cells: (writers, plain/s, audit/s).
///
/// A plain cell runs with no sealer. An audit cell runs the sealer loop, as the server
/// does, and counts its time until every row it appended is sealed: what the audit costs
/// beside a plain insert is the append and its share of the sealing.
async fn audit(admin: &str, counts: &Counts) -> Vec<(usize, f64, f64)> {
    let url = fresh_database(admin, "audit").await;
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Store::open(StoreOptions::new(dir.path()).with_url(Some(&url))).await.expect("store");
    let pool = sqlx::postgres::PgPoolOptions::new().max_connections(16).connect(&url).await.expect("pool");
    sqlx::query("CREATE TABLE plain_events (LIKE audit_events INCLUDING ALL)")
        .execute(&pool)
        .await
        .expect("plain table");
    let log: Arc<dyn AuditLog> = store.audit();
    let mut out = Vec::new();
    for writers in [1usize, 8] {
        let (mut plain, mut audited) = (Vec::new(), Vec::new());
        for _ in 0..counts.audit_rounds {
            let p = pool.clone();
            let start = Instant::now();
            let n = run_for(writers, counts.audit_secs, move |n| {
                let p = p.clone();
                async move { insert_event_row("plain_events", &audit_event(n), &p).await }
            })
            .await;
            plain.push(n as f64 / start.elapsed().as_secs_f64());

            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let sealer = spawn_sealer(log.clone(), DEFAULT_SEAL_INTERVAL, async move {
                let _ = stopped.await;
            });
            let l = log.clone();
            let start = Instant::now();
            let n = run_for(writers, counts.audit_secs, move |n| {
                let l = l.clone();
                async move {
                    l.append(&audit_event(n)).await.expect("append");
                }
            })
            .await;
            while log.seal_status().await.expect("seal status").unsealed > 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            audited.push(n as f64 / start.elapsed().as_secs_f64());
            let _ = stop.send(());
            sealer.await.expect("sealer");
        }
        out.push((writers, median_f(&mut plain), median_f(&mut audited)));
    }
    store.close().await;
    out
}

// ---------------------------------------------------------------------------------------
// podman

/// `true` through the Engine API's exec in `container` (create, start attached, read to
/// the end, inspect): what the container driver did per command before its supervisor.
async fn engine_exec(docker: &bollard::Docker, container: &str) -> Duration {
    use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
    use futures_util::StreamExt;
    let start = Instant::now();
    let options = CreateExecOptions {
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        cmd: Some(vec!["true".to_owned()]),
        user: Some("1000:1000".to_owned()),
        ..Default::default()
    };
    let exec = docker.create_exec(container, options).await.expect("create exec");
    let attached = StartExecOptions { detach: false, tty: false, output_capacity: None };
    if let StartExecResults::Attached { mut output, .. } =
        docker.start_exec(&exec.id, Some(attached)).await.expect("start exec")
    {
        while let Some(Ok(_)) = output.next().await {}
    }
    let info = docker.inspect_exec(&exec.id).await.expect("inspect exec");
    assert_eq!(info.exit_code, Some(0), "engine exec of `true`");
    start.elapsed()
}

/// Exec `true` in one container sandbox, through its supervisor and through the engine's
/// exec API, interleaved (the order alternates); p50s.
fn container_exec(rt: &Runtime, host: &str, image: &str, rounds: usize) -> (Duration, Duration) {
    use adapters::container::{ContainerConfig, ContainerDriver};
    let state = tempfile::tempdir().expect("temp dir");
    let mut config = ContainerConfig::new(host, image);
    config.name_prefix = "sllane".to_owned();
    config.supervisor = adapters::supervisor_link::locate_for_tests().unwrap_or_else(|e| panic!("{e}"));
    config.state_dir = state.path().join("containers");
    let driver = ContainerDriver::new(config).expect("container driver");
    let docker = bollard::Docker::connect_with_unix(
        host.trim_start_matches("unix://"),
        120,
        bollard::API_DEFAULT_VERSION,
    )
    .expect("engine");
    let spec = provision_spec("container-exec");
    let id = spec.sandbox_id().clone();
    let name = format!("sllane-{id}");
    let request = ExecRequest::new(vec!["true".into()], vec![], Some(10_000)).expect("request");
    rt.block_on(async {
        driver.provision(&spec).await.expect("container provision");
        let (mut t_sup, mut t_eng) = (Vec::new(), Vec::new());
        for i in 0..=rounds {
            for k in 0..2 {
                if (i + k) % 2 == 0 {
                    let t = Instant::now();
                    let out = driver.exec(&id, &request).await.expect("container exec");
                    assert_eq!(out.exit_code, 0, "{out:?}");
                    if i > 0 {
                        t_sup.push(t.elapsed());
                    }
                } else {
                    let d = engine_exec(&docker, &name).await;
                    if i > 0 {
                        t_eng.push(d);
                    }
                }
            }
        }
        driver.deprovision(&id).await.expect("container deprovision");
        (quantile(&mut t_sup, 0.5), quantile(&mut t_eng, 0.5))
    })
}

fn podman_once(image: &str) -> Duration {
    let run = |args: &[&str]| {
        let out = Command::new("podman").args(args).stdin(Stdio::null()).output().expect("podman");
        assert!(out.status.success(), "podman {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let t = Instant::now();
    let id = run(&["create", "--network", "none", image, "true"]);
    run(&["start", &id]);
    let code = run(&["wait", &id]);
    let elapsed = t.elapsed();
    assert_eq!(code, "0", "podman wait");
    run(&["rm", "--force", &id]);
    elapsed
}

// ---------------------------------------------------------------------------------------
// The report

struct Row {
    item: &'static str,
    what: String,
    result: String,
    target: String,
    met: Option<bool>,
}

/// Row 1t: a new ensure with its spans exported over OTLP/HTTP to a receiver on loopback,
/// beside the same with traces off (no exporter built), interleaved, each on a fresh
/// server of its own.
fn traced_ensure_row(rt: &Runtime, admin: &str, pairs: usize) -> Row {
    let (url_off, url_on) =
        rt.block_on(async { (fresh_database(admin, "tr_off").await, fresh_database(admin, "tr_on").await) });
    let receiver = otlp_sink();
    let off = Server::start(&url_off);
    let on = Server::start_with(&url_on, &[("SANDLANE_OTLP_ENDPOINT", receiver.clone())]);
    let (c_off, c_on) = (off.client(), on.client());
    c_off.ensure(&new_session());
    c_on.ensure(&new_session());
    let (mut t_off, mut t_on) = (Vec::new(), Vec::new());
    for i in 0..pairs {
        let one = |client: &Client, into: &mut Vec<Duration>| {
            let t = Instant::now();
            client.ensure(&new_session());
            into.push(t.elapsed());
        };
        if i % 2 == 0 {
            one(&c_off, &mut t_off);
            one(&c_on, &mut t_on);
        } else {
            one(&c_on, &mut t_on);
            one(&c_off, &mut t_off);
        }
    }
    let (off50, on50) = (quantile(&mut t_off, 0.5), quantile(&mut t_on, 0.5));
    let ratio = on50.as_secs_f64() / off50.as_secs_f64();
    row(
        "1t",
        "new session ensure with its spans exported (OTLP/HTTP to a receiver on loopback) beside traces off",
        format!("p50 {:.2} ms exported, {:.2} ms off: {ratio:.2}×", ms(on50), ms(off50)),
    )
    .target("≤ 1.1×", ratio <= 1.1)
}

/// An OTLP/HTTP receiver on loopback that answers every export 200 and keeps nothing;
/// its base URL.
fn otlp_sink() -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the OTLP sink");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    std::thread::spawn(move || {
        for stream in listener.incoming().map_while(Result::ok) {
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                let mut writer = stream;
                loop {
                    let mut length = 0usize;
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    loop {
                        line.clear();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        let l = line.trim_end();
                        if l.is_empty() {
                            break;
                        }
                        if let Some((name, value)) = l.split_once(':')
                            && name.eq_ignore_ascii_case("content-length")
                        {
                            length = value.trim().parse().unwrap_or(0);
                        }
                    }
                    let mut body = vec![0; length];
                    if reader.read_exact(&mut body).is_err() {
                        return;
                    }
                    let _ = writer.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n");
                }
            });
        }
    });
    url
}

fn row(item: &'static str, what: impl Into<String>, result: impl Into<String>) -> Row {
    Row { item, what: what.into(), result: result.into(), target: String::new(), met: None }
}

impl Row {
    fn target(mut self, target: impl Into<String>, met: bool) -> Self {
        self.target = target.into();
        self.met = Some(met);
        self
    }
}

fn table(rows: &[Row]) -> String {
    let mut s = String::from("| # | measurement | result | target | status |\n|---|---|---|---|---|\n");
    for r in rows {
        let status = match r.met {
            Some(true) => "met",
            Some(false) => "**missed**",
            None => "",
        };
        let _ = writeln!(s, "| {} | {} | {} | {} | {} |", r.item, r.what, r.result, r.target, status);
    }
    s
}

fn command_line(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("model name").map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned()))
        .unwrap_or_else(|| "unknown".to_owned());
    let mem = command_line("free", &["-h"]);
    let mem =
        mem.lines().find(|l| l.starts_with("Mem:")).unwrap_or("").split_whitespace().nth(1).unwrap_or("?");
    format!(
        "{} CPUs (nproc), {cpu}; memory {mem} (free -h); kernel {} (uname -r); {}",
        command_line("nproc", &[]),
        command_line("uname", &["-r"]),
        command_line("bwrap", &["--version"]),
    )
}

const BEGIN: &str = "<!-- bench:begin (written by `scripts/bench.sh`; edit outside the markers) -->";
const END: &str = "<!-- bench:end -->";

/// Replaces the generated section of `path` (or creates the file).
fn write_report(path: &Path, section: &str) {
    let old = std::fs::read_to_string(path).unwrap_or_default();
    let new = match (old.find(BEGIN), old.find(END)) {
        (Some(b), Some(e)) if b < e => format!("{}{BEGIN}\n{section}{}", &old[..b], &old[e..]),
        _ => format!("# Benchmarks\n\n{BEGIN}\n{section}{END}\n{old}"),
    };
    std::fs::write(path, new).expect("write the report");
}

// ---------------------------------------------------------------------------------------

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let smoke = args.iter().any(|a| a == "--smoke");
    let out = args.iter().position(|a| a == "--out").and_then(|i| args.get(i + 1)).map(PathBuf::from);
    let c = if smoke { Counts::smoke() } else { Counts::full() };
    let admin = std::env::var("SANDLANE_TEST_POSTGRES_URL")
        .expect("SANDLANE_TEST_POSTGRES_URL must name a Postgres admin URL (scripts/bench.sh starts one)");
    let podman_image = std::env::var("SANDLANE_BENCH_PODMAN_IMAGE").ok().filter(|s| !s.is_empty());
    let started = command_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"]);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("rt");
    let step = |s: &str| eprintln!("lane bench: {s}");
    if args.iter().any(|a| a == "--traces") {
        // Row 1t alone (`cargo bench -p app --bench lane -- --traces`).
        step("ensure with traces exported beside traces off");
        print!("{}", table(&[traced_ensure_row(&rt, &admin, c.pairs)]));
        return;
    }

    let pg = rt.block_on(durability_settings(&admin));
    let (url_a, url_b, url_floor) = rt.block_on(async {
        (
            fresh_database(&admin, "small").await,
            fresh_database(&admin, "big").await,
            fresh_database(&admin, "floor").await,
        )
    });

    // Servers: A stays small (the 1-client figures), B is loaded to `big` sandboxes.
    step("starting two servers");
    let a = Server::start(&url_a);
    let b = Server::start(&url_b);
    std::thread::sleep(Duration::from_millis(500));
    let rss_idle = a.rss();
    let ca = a.client();
    ca.ensure(&new_session()); // warm up

    // The in-process driver, its raw command line, and the floor.
    let work = tempfile::Builder::new().prefix("sandlane-bench-drv-").tempdir().expect("temp dir");
    std::fs::set_permissions(work.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let mut config = BwrapConfig::new(work.path().join("data"));
    config.supervisor = adapters::supervisor_link::locate_for_tests().unwrap_or_else(|e| panic!("{e}"));
    let driver = BwrapDriver::new(config).expect("driver");
    let health = rt.block_on(driver.health());
    assert!(health.usable, "bubblewrap: {}", health.detail);
    let spec = provision_spec("drv-bench");
    rt.block_on(driver.provision(&spec)).expect("provision");
    let request = ExecRequest::new(vec!["true".into()], vec![], Some(10_000)).expect("request");
    let raw = Arc::new(RawBwrap::new(&driver, spec.sandbox_id(), &request));
    let floor_dir = work.path().join("floor");
    std::fs::DirBuilder::new().mode(0o711).create(&floor_dir).expect("floor dir");
    let floor_pool = rt.block_on(async {
        let dir = tempfile::tempdir().expect("temp dir");
        Store::open(StoreOptions::new(dir.path()).with_url(Some(&url_floor)))
            .await
            .expect("migrate")
            .close()
            .await;
        sqlx::postgres::PgPoolOptions::new().max_connections(2).connect(&url_floor).await.expect("pool")
    });
    let mut floor = Floor { pool: floor_pool, dir: floor_dir, raw: raw.clone(), n: 0 };
    floor.once(&rt);

    let mut rows = Vec::new();

    // 1 and 4: new ensure beside the floor, interleaved.
    step("ensure beside the floor");
    let (mut t_ensure, mut t_floor) = (Vec::new(), Vec::new());
    let mut pair_sessions = Vec::new();
    for _ in 0..c.pairs {
        let session = new_session();
        let t = Instant::now();
        ca.ensure(&session);
        t_ensure.push(t.elapsed());
        pair_sessions.push(session);
        t_floor.push(floor.once(&rt));
    }
    let ensure50 = quantile(&mut t_ensure, 0.5);
    let ensure99 = quantile(&mut t_ensure, 0.99);
    let floor50 = quantile(&mut t_floor, 0.5);
    rows.push(row(
        "1",
        "new session ensure over HTTP (Postgres, bubblewrap), 1 client",
        format!("p50 {:.2} ms, p99 {:.2} ms", ms(ensure50), ms(ensure99)),
    ));

    // 2: re-ensure of a ready sandbox.
    step("re-ensure");
    let session = new_session();
    ca.ensure(&session);
    let mut t_re: Vec<Duration> = (0..c.pairs)
        .map(|_| {
            let t = Instant::now();
            ca.ensure(&session);
            t.elapsed()
        })
        .collect();
    let re50 = quantile(&mut t_re, 0.5);
    rows.push(
        row(
            "2",
            "re-ensure of a ready session sandbox",
            format!("p50 {:.3} ms, p99 {:.3} ms", ms(re50), ms(quantile(&mut t_re, 0.99))),
        )
        .target("p50 ≤ 1 ms", re50 <= Duration::from_millis(1)),
    );

    // 1t: new ensure with its spans exported beside traces off.
    step("ensure with traces exported beside traces off");
    rows.push(traced_ensure_row(&rt, &admin, c.pairs));

    // 3: exec `true` through the API, through the driver, raw.
    step("exec");
    let api_sandbox = ca.ensure(&new_session());
    let (mut t_api, mut t_drv, mut t_raw) = (Vec::new(), Vec::new(), Vec::new());
    // A cgroup v1 attach right after another one skips the RCU grace period the first one
    // waited for, so each exec starts after a pause longer than a grace period (every one
    // from the same, idle, state) and the order rotates every round.
    for i in 0..c.pairs {
        for k in 0..3 {
            std::thread::sleep(Duration::from_millis(30));
            let t = Instant::now();
            match (i + k) % 3 {
                0 => {
                    ca.exec_true(&api_sandbox);
                    t_api.push(t.elapsed());
                }
                1 => {
                    let o = rt.block_on(driver.exec(spec.sandbox_id(), &request)).expect("driver exec");
                    assert_eq!(o.exit_code, 0, "driver exec: {}", String::from_utf8_lossy(&o.stderr));
                    t_drv.push(t.elapsed());
                }
                _ => t_raw.push(raw.run()),
            }
        }
    }
    let (api50, drv50, raw50) =
        (quantile(&mut t_api, 0.5), quantile(&mut t_drv, 0.5), quantile(&mut t_raw, 0.5));
    let (r_api, r_drv) =
        (api50.as_secs_f64() / raw50.as_secs_f64(), drv50.as_secs_f64() / raw50.as_secs_f64());
    rows.push(row(
        "3",
        "exec `true`: raw `bwrap`, same argv and host uid",
        format!("p50 {:.2} ms", ms(raw50)),
    ));
    rows.push(row(
        "3",
        "exec `true` through the driver (the resident sandbox's supervisor)",
        format!("p50 {:.2} ms = {r_drv:.2}× raw", ms(drv50)),
    ));
    rows.push(
        row("3", "exec `true` through the HTTP API", format!("p50 {:.2} ms = {r_api:.2}× raw", ms(api50)))
            .target("≤ 0.35× raw", r_api <= 0.35),
    );

    // 4: the floor.
    let r_floor = ensure50.as_secs_f64() / floor50.as_secs_f64();
    rows.push(row(
        "4",
        "floor: the ensure's rows in one transaction + workspace dir + one raw bwrap probe",
        format!("p50 {:.2} ms", ms(floor50)),
    ));
    rows.push(
        row("4", "ensure p50 / floor p50 (interleaved pairs)", format!("{r_floor:.2}×"))
            .target("≤ 1.5×", r_floor <= 1.5),
    );

    // 5: the container peer.
    match &podman_image {
        Some(image) => {
            step("podman beside ensure + first exec");
            podman_once(image);
            let (mut t_pod, mut t_lane) = (Vec::new(), Vec::new());
            for _ in 0..c.peer_rounds {
                t_pod.push(podman_once(image));
                let s = new_session();
                let t = Instant::now();
                let id = ca.ensure(&s);
                ca.exec_true(&id);
                t_lane.push(t.elapsed());
                ca.deprovision(&s);
            }
            let (pod50, lane50) = (quantile(&mut t_pod, 0.5), quantile(&mut t_lane, 0.5));
            let ratio = pod50.as_secs_f64() / lane50.as_secs_f64();
            rows.push(row(
                "5",
                "podman create + start + wait of `true` (runc, local image)",
                format!("p50 {:.1} ms", ms(pod50)),
            ));
            rows.push(
                row(
                    "5",
                    "sandlane ensure + first exec over HTTP",
                    format!("p50 {:.2} ms; podman / sandlane {ratio:.1}×", ms(lane50)),
                )
                .target("≥ 20× faster", ratio >= 20.0),
            );
        }
        None => rows.push(row(
            "5",
            "podman peer",
            "skipped: podman not set up (SANDLANE_BENCH_PODMAN_IMAGE unset)",
        )),
    }
    match (std::env::var("SANDLANE_TEST_DOCKER_HOST"), &podman_image) {
        (Ok(host), Some(image)) => {
            step("container driver exec: supervisor beside the engine's exec API");
            let (sup50, eng50) = container_exec(&rt, &host, image, c.peer_rounds * 2);
            let ratio = eng50.as_secs_f64() / sup50.as_secs_f64();
            rows.push(row(
                "5",
                "container driver: exec `true` through the engine's exec API (podman, runc)",
                format!("p50 {:.1} ms", ms(eng50)),
            ));
            rows.push(
                row(
                    "5",
                    "container driver: exec `true` through the supervisor",
                    format!("p50 {:.2} ms; engine exec / supervisor {ratio:.1}×", ms(sup50)),
                )
                .target("≥ 10× faster", ratio >= 10.0),
            );
        }
        _ => rows.push(row("5", "container driver exec", "skipped: podman not set up")),
    }

    // 6: mint and verify.
    step("mint and verify");
    let [mint, sign, verify, raw_verify] = crypto(&c);
    rows.push(
        row("6", "mint / raw Ed25519 sign", format!("{mint:.0}/s vs {sign:.0}/s = {:.2}×", mint / sign))
            .target("≥ 0.4×", mint / sign >= 0.4),
    );
    rows.push(row(
        "6",
        "verify / raw Ed25519 verify (registry read stubbed)",
        format!("{verify:.0}/s vs {raw_verify:.0}/s = {:.2}×", verify / raw_verify),
    ));

    // 7: audit appends.
    step("audit appends beside plain inserts");
    for (writers, plain, audited) in rt.block_on(audit(&admin, &c)) {
        let r = row(
            "7",
            format!(
                "audit append (until sealed) / plain insert, {writers} writer{}",
                if writers > 1 { "s" } else { "" }
            ),
            format!("{audited:.0}/s vs {plain:.0}/s = {:.2}×", audited / plain),
        );
        rows.push(if writers == 8 { r.target("≥ 0.7×", audited / plain >= 0.7) } else { r });
    }

    // 1 (throughput) and 8: load B with `clients` clients, then compare small and big.
    step(&format!("{} clients ensuring {} new sandboxes", c.clients, c.big));
    let (rate_first, rate) = load(&b, c.clients, c.big);
    let probes = raw_rate(&raw, c.clients, c.audit_secs * 2.0);
    rows.insert(
        1,
        row(
            "1",
            format!(
                "new ensures per second, {} concurrent clients, first {} sandboxes",
                c.clients,
                c.big / 10
            ),
            format!("{rate_first:.0}/s = {:.2}× the ceiling", rate_first / probes),
        )
        .target("≥ 0.8× ceiling", rate_first >= 0.8 * probes),
    );
    rows.insert(
        2,
        row(
            "1",
            format!("new ensures per second, {} concurrent clients, 0 → {} sandboxes", c.clients, c.big),
            format!("{rate:.0}/s = {:.2}× the ceiling", rate / probes),
        )
        .target("≥ 0.8× ceiling", rate >= 0.8 * probes),
    );
    rows.insert(
        3,
        row(
            "1",
            format!("ceiling: raw `bwrap` probes per second alone, {} concurrent threads", c.clients),
            format!("{probes:.0}/s"),
        ),
    );
    std::thread::sleep(Duration::from_millis(500));
    let rss_big = b.rss();
    let b_ids = b.sandbox_ids();
    let (pss, processes) = sandboxes_pss(&b_ids);
    // Server A back to `small` live sandboxes: its warm-up, re-ensure and exec sandboxes
    // stay; the ensure/floor pairs' are deprovisioned (their records stay, deprovisioned).
    for session in &pair_sessions {
        ca.deprovision(session);
    }
    let small_now = 3;
    load(&a, c.clients, c.small.saturating_sub(small_now));
    step("ensure against small and big registries");
    let cb = b.client();
    let (mut t_small, mut t_big) = (Vec::new(), Vec::new());
    for _ in 0..c.scale_pairs {
        for (client, samples) in [(&ca, &mut t_small), (&cb, &mut t_big)] {
            let s = new_session();
            let t = Instant::now();
            client.ensure(&s);
            samples.push(t.elapsed());
            client.deprovision(&s);
        }
    }
    let (small50, big50) = (quantile(&mut t_small, 0.5), quantile(&mut t_big, 0.5));
    let r_scale = big50.as_secs_f64() / small50.as_secs_f64();
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    rows.push(
        row("8", "server RSS idle", format!("{:.1} MiB", mib(rss_idle)))
            .target("≤ 40 MB", rss_idle <= 40_000_000),
    );
    rows.push(
        row(
            "8",
            format!("server RSS with {} live resident sandboxes", b_ids.len()),
            format!("{:.1} MiB", mib(rss_big)),
        )
        .target("≤ 80 MB", rss_big <= 80_000_000),
    );
    let per_sandbox = pss / (b_ids.len().max(1) as u64);
    rows.push(
        row(
            "8",
            format!(
                "host memory per idle resident sandbox (PSS of its {processes} processes / {})",
                b_ids.len()
            ),
            format!("{:.2} MiB", mib(per_sandbox)),
        )
        .target("≤ 2 MiB", per_sandbox <= 2 << 20),
    );
    rows.push(
        row(
            "8",
            format!("ensure p50 at {} vs at {} live sandboxes (interleaved)", c.big, c.small.max(small_now)),
            format!("{:.2} ms vs {:.2} ms = {r_scale:.2}×", ms(big50), ms(small50)),
        )
        .target("≤ 1.2×", r_scale <= 1.2),
    );

    rt.block_on(driver.deprovision(spec.sandbox_id())).ok();
    // The servers stop without deprovisioning their sandboxes (a restart keeps them);
    // dropping them ends this run's sandboxes (see `Server`'s drop).
    drop((a, b));

    let mode = if smoke { "SMOKE run (tiny counts, not a measurement)" } else { "full run" };
    let mut section = String::new();
    // scripts/bench.sh names the run (date and commit) for every table it writes.
    let run = std::env::var("SANDLANE_BENCH_RUN").unwrap_or(started);
    let _ = writeln!(section, "Run: {run}; {mode}, release build: {}.\n", !cfg!(debug_assertions));
    let _ = writeln!(section, "Machine: {}.\n", machine());
    let _ = writeln!(section, "Database: {pg}; one throwaway cluster, a fresh database per part.\n");
    let _ = writeln!(section, "Driver: {}.\n", health.detail);
    let _ = writeln!(
        section,
        "Samples: {} interleaved pairs for ensure/floor, re-ensure and exec; {} podman rounds; \
         {} × {} crypto operations; {} × {} s of writes per audit cell (audit cells: until sealed); \
         HTTP clients are ureq 3 (blocking, \
         one kept-alive connection per client thread).\n",
        c.pairs, c.peer_rounds, c.crypto_batches, c.crypto_batch, c.audit_rounds, c.audit_secs
    );
    section.push_str(&table(&rows));
    println!("\n{section}");
    if let Some(path) = out {
        write_report(&path, &section);
        eprintln!("lane bench: wrote {}", path.display());
    }
}
