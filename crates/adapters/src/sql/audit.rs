//! The audit log on SQL: rows are appended without any global lock; one sealer at a time
//! (a Postgres advisory lock across replicas, SQLite's single writer) seals what is
//! unsealed in signed, chained batches; verify recomputes everything (see [`super::seal`]).
//!
//! # Reading the tail: the watermark
//! A page shows events only up to the log's *watermark*, a sequence number below which no
//! event can still commit, and `next` never passes it. So a reader that follows `next`
//! sees every event exactly once, in `seq` order.
//!
//! - **SQLite** has one writer: appends are serialised by its write lock, so rows commit
//!   in `seq` order and the highest committed `seq` is the watermark. It is read before the
//!   page, so a row committed between the two reads lies above it.
//! - **Postgres** hands out `seq` from a sequence when the `INSERT` runs, and concurrent
//!   appends commit in any order: `seq` 7 can commit after `seq` 8 is visible. Every
//!   append therefore holds [`APPEND_BARRIER`] in *shared* mode from before it takes its
//!   `seq` until it has committed (a transaction-level advisory lock, released only after
//!   the commit is visible). A reader takes the same lock in *exclusive* mode: once it has
//!   it, no append is between taking its `seq` and committing, so every `seq` up to the
//!   highest visible one is final — committed or rolled back — and that is the watermark.
//!   Appends never wait for each other; they wait for a reader only while it takes the
//!   lock. A reader waits at most [`BARRIER_WAIT`] (an append held open, say); then it
//!   uses the last watermark it established, so the late event shows on a later page.
//!   (A reader that waits blocks new appends behind it for at most that long.)

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use domain::{
    AuditAction, AuditEvent, AuditOutcome, CallerClass, Durability, IdentityId, OrgId, SandboxId, SandboxKey,
    SandboxKind, Timestamp, TokenId,
};
use ports::{AuditEntry, AuditError, AuditLog, AuditPage, Cause, SealReport, SealStatus, VerifyReport};

use super::seal::{self, AuditKey, ChainHead, StoredRow, StoredSeal};
use super::{Backend, WritePool as _, now_ms, with_pool};

/// How often [`spawn_sealer`] seals by default: rows are sealed within a second.
pub const DEFAULT_SEAL_INTERVAL: Duration = Duration::from_millis(500);

/// The default late grace (see [`super::StoreOptions::late_grace`]).
pub const DEFAULT_LATE_GRACE: Duration = Duration::from_secs(30);

/// Most rows one seal covers.
const SEAL_BATCH: i64 = 20_000;
/// The most unsealed rows `seal_status` counts (a backlog that large is an alarm already).
const SEAL_STATUS_CAP: i64 = 100_000;

/// Rows read per round trip by verify.
const VERIFY_PAGE: i64 = 10_000;

/// The advisory lock key that makes one sealer at a time across replicas: a fixed,
/// arbitrary value (the ASCII bytes `ZNDLNESE`) that nothing else in the database uses.
const SEALER_LOCK: i64 = 0x5A4E_444C_4E45_5345;

/// The advisory lock every Postgres append holds shared and a reader takes exclusive to
/// establish the watermark (see the module docs): the ASCII bytes `ZNDLNAPP`.
pub(crate) const APPEND_BARRIER: i64 = 0x5A4E_444C_4E41_5050;

/// How long a Postgres reader waits for in-flight appends (250 ms) before it falls back to
/// the last watermark it established.
const BARRIER_WAIT: &str = "SET LOCAL lock_timeout = '250ms'";

/// The Postgres append: the barrier lock (shared) is taken by the CTE before the `INSERT`
/// draws its `seq`, and held until the statement's transaction has committed.
pub(crate) const PG_APPEND: &str = "WITH barrier AS (SELECT pg_advisory_xact_lock_shared($16)) \
     INSERT INTO audit_events (org, action, kind, key, sandbox_id, caller_id, caller_class, \
     durability, driver, outcome, message, token_id, at, hash, appended_at) \
     SELECT CAST($1 AS TEXT), CAST($2 AS TEXT), CAST($3 AS TEXT), CAST($4 AS TEXT), \
     CAST($5 AS TEXT), CAST($6 AS TEXT), CAST($7 AS TEXT), CAST($8 AS TEXT), CAST($9 AS TEXT), \
     CAST($10 AS TEXT), CAST($11 AS TEXT), CAST($12 AS TEXT), CAST($13 AS BIGINT), \
     CAST($14 AS BYTEA), CAST($15 AS BIGINT) FROM barrier RETURNING seq";

/// The SQLite append (its single writer orders commits by `seq`).
pub(crate) const SQLITE_APPEND: &str = "INSERT INTO audit_events (org, action, kind, key, sandbox_id, \
     caller_id, caller_class, durability, driver, outcome, message, token_id, at, hash, \
     appended_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15) \
     RETURNING seq";

/// Binds an event's 15 columns to an append statement, in the statements' order.
macro_rules! bind_event {
    ($query:expr, $event:expr, $hash:expr, $appended_at:expr) => {
        $query
            .bind($event.org().as_str())
            .bind($event.action.as_str())
            .bind($event.key.kind().as_str())
            .bind($event.key.key())
            .bind($event.sandbox_id.as_ref().map(SandboxId::as_str))
            .bind($event.caller_id.as_str())
            .bind($event.caller_class.as_str())
            .bind($event.durability.map(Durability::as_str))
            .bind($event.driver.as_str())
            .bind($event.outcome.as_str())
            .bind($event.message.as_str())
            .bind($event.token_id.as_ref().map(TokenId::as_str))
            .bind($event.at.unix_millis())
            .bind(&$hash[..])
            .bind($appended_at)
    };
}
pub(crate) use bind_event;

macro_rules! event_cols {
    () => {
        "seq, org, action, kind, key, sandbox_id, caller_id, caller_class, durability, driver, \
         outcome, message, token_id, at, hash"
    };
}

/// An audit row as stored.
#[derive(Debug, sqlx::FromRow)]
struct EventRow {
    seq: i64,
    org: String,
    action: String,
    kind: String,
    key: String,
    sandbox_id: Option<String>,
    caller_id: String,
    caller_class: String,
    durability: Option<String>,
    driver: String,
    outcome: String,
    message: String,
    token_id: Option<String>,
    at: i64,
    hash: Vec<u8>,
}

impl EventRow {
    fn event(&self) -> Result<AuditEvent, String> {
        let s = |e: &dyn std::fmt::Display| e.to_string();
        let org = OrgId::parse(self.org.clone()).map_err(|e| s(&e))?;
        let kind = SandboxKind::parse(&self.kind).map_err(|e| s(&e))?;
        Ok(AuditEvent {
            action: AuditAction::parse(&self.action).map_err(|e| s(&e))?,
            key: SandboxKey::from_parts(org, kind, &self.key).map_err(|e| s(&e))?,
            sandbox_id: self.sandbox_id.clone().map(SandboxId::parse).transpose().map_err(|e| s(&e))?,
            caller_id: IdentityId::parse(self.caller_id.clone()).map_err(|e| s(&e))?,
            caller_class: CallerClass::parse_stored(&self.caller_class).map_err(|e| s(&e))?,
            durability: self.durability.as_deref().map(Durability::parse).transpose().map_err(|e| s(&e))?,
            driver: self.driver.clone(),
            outcome: AuditOutcome::parse(&self.outcome).map_err(|e| s(&e))?,
            message: self.message.clone(),
            token_id: self.token_id.clone().map(TokenId::parse).transpose().map_err(|e| s(&e))?,
            at: Timestamp::from_unix_millis(self.at),
        })
    }

    fn stored(self) -> StoredRow {
        StoredRow { seq: self.seq, event: self.event(), stored_hash: self.hash }
    }
}

#[derive(Debug, sqlx::FromRow)]
struct PageRow {
    #[sqlx(flatten)]
    event: EventRow,
    sealed: i64,
}

#[derive(Debug, sqlx::FromRow)]
struct SealRow {
    id: i64,
    prev_hash: Vec<u8>,
    sealed_at: i64,
    through: i64,
    row_count: i64,
    entries: Vec<u8>,
    key_id: String,
    hash: Vec<u8>,
    signature: Vec<u8>,
}

impl From<SealRow> for StoredSeal {
    fn from(r: SealRow) -> Self {
        Self {
            id: r.id,
            prev_hash: r.prev_hash,
            sealed_at: r.sealed_at,
            through: r.through,
            row_count: r.row_count,
            entries: r.entries,
            key_id: r.key_id,
            hash: r.hash,
            signature: r.signature,
        }
    }
}

#[derive(Debug, sqlx::FromRow)]
struct HeadRow {
    id: i64,
    hash: Vec<u8>,
    through: i64,
}

fn store(e: sqlx::Error) -> AuditError {
    AuditError::Store(Cause::new(e))
}

/// The [`AuditLog`] on SQLite or Postgres.
#[derive(Debug)]
pub struct SqlAuditLog {
    backend: Backend,
    key: AuditKey,
    late_grace_ms: i64,
    /// The highest watermark a Postgres reader of this process has established.
    watermark: AtomicI64,
}

impl SqlAuditLog {
    pub(crate) fn new(backend: Backend, key: AuditKey, late_grace: Duration) -> Self {
        Self {
            backend,
            key,
            late_grace_ms: i64::try_from(late_grace.as_millis()).unwrap_or(i64::MAX),
            watermark: AtomicI64::new(0),
        }
    }

    /// The sequence number below which no event can still commit (see the module docs).
    async fn watermark(&self) -> Result<i64, AuditError> {
        match &self.backend {
            Backend::Sqlite { reader, .. } => {
                sqlx::query_scalar("SELECT COALESCE(MAX(seq), 0) FROM audit_events")
                    .fetch_one(reader)
                    .await
                    .map_err(store)
            }
            Backend::Postgres(pool, _) => {
                let mut tx = pool.begin().await.map_err(store)?;
                sqlx::query(BARRIER_WAIT).execute(&mut *tx).await.map_err(store)?;
                let barrier = sqlx::query("SELECT pg_advisory_xact_lock($1)")
                    .bind(APPEND_BARRIER)
                    .execute(&mut *tx)
                    .await;
                match barrier {
                    Ok(_) => {
                        let through: i64 =
                            sqlx::query_scalar("SELECT COALESCE(MAX(seq), 0) FROM audit_events")
                                .fetch_one(&mut *tx)
                                .await
                                .map_err(store)?;
                        tx.commit().await.map_err(store)?;
                        Ok(self.watermark.fetch_max(through, Ordering::AcqRel).max(through))
                    }
                    // 55P03 lock_not_available: an append is still in flight after
                    // BARRIER_WAIT; what this process established before still holds.
                    Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("55P03") => {
                        drop(tx);
                        Ok(self.watermark.load(Ordering::Acquire))
                    }
                    Err(e) => Err(store(e)),
                }
            }
        }
    }

    /// The audit key's id (the first 8 bytes of SHA-256 of its public key, hex).
    pub fn key_id(&self) -> &str {
        self.key.key_id()
    }
}

/// Runs `$body` inside the sealer's transaction `$tx`: Postgres takes the advisory lock
/// (returning an empty report when another replica holds it), SQLite holds its write lock.
macro_rules! sealer_tx {
    ($backend:expr, $tx:ident => $body:expr) => {
        with_pool!(write $backend, p => {
            let mut $tx = p.begin_write().await.map_err(store)?;
            if matches!($backend, Backend::Postgres(..)) {
                let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1)")
                    .bind(SEALER_LOCK)
                    .fetch_one(&mut *$tx)
                    .await
                    .map_err(store)?;
                if !locked {
                    return Ok(SealReport::default());
                }
            }
            let report = $body;
            $tx.commit().await.map_err(store)?;
            Ok(report)
        })
    };
}

#[async_trait]
impl AuditLog for SqlAuditLog {
    async fn append(&self, event: &AuditEvent) -> Result<i64, AuditError> {
        let hash = event.hash();
        match &self.backend {
            Backend::Sqlite { writer, .. } => {
                bind_event!(sqlx::query_scalar(SQLITE_APPEND), event, hash, now_ms()).fetch_one(writer).await
            }
            Backend::Postgres(pool, _) => {
                bind_event!(sqlx::query_scalar(PG_APPEND), event, hash, now_ms())
                    .bind(APPEND_BARRIER)
                    .fetch_one(pool)
                    .await
            }
        }
        .map_err(store)
    }

    async fn page(&self, org: &OrgId, after: i64, limit: u32) -> Result<AuditPage, AuditError> {
        if limit == 0 {
            return Ok(AuditPage { entries: Vec::new(), next: after });
        }
        // First the watermark, then the rows: a row committed in between lies above it.
        let watermark = self.watermark().await?;
        let rows: Vec<PageRow> = with_pool!(read &self.backend, p => {
            sqlx::query_as(
                "SELECT e.seq, e.org, e.action, e.kind, e.key, e.sandbox_id, e.caller_id, \
                 e.caller_class, e.durability, e.driver, e.outcome, e.message, e.token_id, e.at, \
                 e.hash, CASE WHEN s.seq IS NULL THEN CAST(0 AS BIGINT) \
                 ELSE CAST(1 AS BIGINT) END AS sealed \
                 FROM audit_events e LEFT JOIN audit_sealed s ON s.seq = e.seq \
                 WHERE e.org = $1 AND e.seq > $2 AND e.seq <= $3 ORDER BY e.seq LIMIT $4",
            )
            .bind(org.as_str())
            .bind(after)
            .bind(watermark)
            .bind(i64::from(limit))
            .fetch_all(p)
            .await
        })
        .map_err(store)?;
        let mut entries = Vec::with_capacity(rows.len());
        for row in rows {
            let event = row
                .event
                .event()
                .map_err(|why| AuditError::Store(format!("row {}: {why}", row.event.seq).into()))?;
            entries.push(AuditEntry { seq: row.event.seq, event, sealed: row.sealed != 0 });
        }
        // A full page ends at its last event; a short one saw everything of the org up to
        // the watermark, so the next page may start there.
        let next = match entries.last() {
            Some(last) if entries.len() == limit as usize => last.seq,
            _ => after.max(watermark),
        };
        Ok(AuditPage { entries, next })
    }

    async fn seal(&self) -> Result<SealReport, AuditError> {
        let now = now_ms();
        let cutoff = now.saturating_sub(self.late_grace_ms);
        let backend = &self.backend;
        sealer_tx!(backend, tx => {
            let head: Option<HeadRow> = sqlx::query_as(
                "SELECT id, hash, through FROM audit_seals ORDER BY id DESC LIMIT 1",
            )
            .fetch_optional(&mut *tx)
            .await
            .map_err(store)?;
            let head = match head {
                None => ChainHead::EMPTY,
                Some(h) => ChainHead {
                    id: h.id,
                    hash: h.hash.as_slice().try_into().map_err(|_| {
                        AuditError::Store(format!("seal {} has a malformed hash", h.id).into())
                    })?,
                    through: h.through,
                },
            };
            // Rows at or below the settled horizon are not sealed: a row that late is
            // an inserted one, left for verify to name.
            let settled: Option<i64> = sqlx::query_scalar(
                "SELECT through FROM audit_seals WHERE sealed_at <= $1 ORDER BY id DESC LIMIT 1",
            )
            .bind(cutoff)
            .fetch_optional(&mut *tx)
            .await
            .map_err(store)?;
            let rows: Vec<EventRow> = sqlx::query_as(concat!(
                "SELECT ",
                event_cols!(),
                " FROM audit_events e WHERE e.seq > $1 AND NOT EXISTS \
                 (SELECT 1 FROM audit_sealed s WHERE s.seq = e.seq) ORDER BY e.seq LIMIT $2"
            ))
            .bind(settled.unwrap_or(i64::MIN))
            .bind(SEAL_BATCH)
            .fetch_all(&mut *tx)
            .await
            .map_err(store)?;
            let mut batch = Vec::with_capacity(rows.len());
            for row in rows {
                let seq = row.seq;
                let stored = row.stored();
                match &stored.event {
                    Ok(e) if e.hash().as_slice() == stored.stored_hash.as_slice() => {
                        batch.push((seq, e.hash()));
                    }
                    _ => tracing::warn!(seq, "audit row does not match its hash; not sealing it"),
                }
            }
            if batch.is_empty() {
                SealReport::default()
            } else {
                let seal = seal::make_seal(&self.key, &head, &batch, now);
                sqlx::query(
                    "INSERT INTO audit_seals (id, prev_hash, sealed_at, through, row_count, \
                     entries, key_id, hash, signature) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                )
                .bind(seal.id)
                .bind(&seal.prev_hash)
                .bind(seal.sealed_at)
                .bind(seal.through)
                .bind(seal.row_count)
                .bind(&seal.entries)
                .bind(&seal.key_id)
                .bind(&seal.hash)
                .bind(&seal.signature)
                .execute(&mut *tx)
                .await
                .map_err(store)?;
                // The member seqs as a JSON array: one statement, one bound text, on both.
                let seqs = batch.iter().map(|(s, _)| s.to_string()).collect::<Vec<_>>();
                let membership = if matches!(backend, Backend::Postgres(..)) {
                    "INSERT INTO audit_sealed (seq, seal_id) SELECT CAST(value AS BIGINT), $2 \
                     FROM jsonb_array_elements_text(CAST($1 AS JSONB))"
                } else {
                    "INSERT INTO audit_sealed (seq, seal_id) SELECT value, $2 FROM json_each($1)"
                };
                sqlx::query(membership)
                    .bind(format!("[{}]", seqs.join(",")))
                    .bind(seal.id)
                    .execute(&mut *tx)
                    .await
                    .map_err(store)?;
                SealReport {
                    rows: batch.len() as u64,
                    seals: 1,
                }
            }
        })
    }

    async fn seal_status(&self) -> Result<SealStatus, AuditError> {
        // The tail the sealer still works on: rows above the settled horizon (as `seal`
        // reads it), at most SEAL_STATUS_CAP of them. A scrape reads an index range at the
        // end of the log, never the whole log.
        let cutoff = now_ms().saturating_sub(self.late_grace_ms);
        let (count, oldest): (i64, Option<i64>) = with_pool!(read &self.backend, p => {
            sqlx::query_as(
                "SELECT COUNT(*), MIN(appended_at) FROM (SELECT e.appended_at FROM audit_events e \
                 WHERE e.seq > COALESCE((SELECT through FROM audit_seals WHERE sealed_at <= $1 \
                 ORDER BY id DESC LIMIT 1), 0) AND NOT EXISTS \
                 (SELECT 1 FROM audit_sealed s WHERE s.seq = e.seq) ORDER BY e.seq LIMIT $2) AS tail",
            )
            .bind(cutoff)
            .bind(SEAL_STATUS_CAP)
            .fetch_one(p)
            .await
        })
        .map_err(store)?;
        Ok(SealStatus {
            unsealed: u64::try_from(count).unwrap_or(0),
            oldest_unsealed: oldest.map(Timestamp::from_unix_millis),
        })
    }

    async fn verify(&self) -> Result<VerifyReport, AuditError> {
        let cutoff = now_ms().saturating_sub(self.late_grace_ms);
        // One snapshot for seals and rows, so concurrent appends and seals cannot make an
        // intact log look torn.
        with_pool!(read &self.backend, p => {
            let begin = if matches!(self.backend, Backend::Postgres(..)) {
                "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
            } else {
                "BEGIN"
            };
            let mut tx = p.begin_with(begin).await.map_err(store)?;
            let seals: Vec<SealRow> = sqlx::query_as(
                "SELECT id, prev_hash, sealed_at, through, row_count, entries, key_id, hash, \
                 signature FROM audit_seals ORDER BY id",
            )
            .fetch_all(&mut *tx)
            .await
            .map_err(store)?;
            let seals: Vec<StoredSeal> = seals.into_iter().map(StoredSeal::from).collect();
            let check = match seal::check_seals(&self.key, &seals) {
                Ok(check) => check,
                Err(bad) => {
                    return Ok(VerifyReport {
                        rows: 0,
                        seals: seals.len() as u64,
                        unsealed: 0,
                        first_bad: Some(bad),
                    });
                }
            };
            let settled = seal::settled_through(&check.horizons, cutoff);
            let mut walk = seal::RowWalk::new(&check, settled);
            let mut after = i64::MIN;
            loop {
                let rows: Vec<EventRow> = sqlx::query_as(concat!(
                    "SELECT ",
                    event_cols!(),
                    " FROM audit_events WHERE seq > $1 ORDER BY seq LIMIT $2"
                ))
                .bind(after)
                .bind(VERIFY_PAGE)
                .fetch_all(&mut *tx)
                .await
                .map_err(store)?;
                let Some(last) = rows.last() else { break };
                after = last.seq;
                let full = rows.len() as i64 == VERIFY_PAGE;
                for row in rows {
                    walk.push(&row.stored());
                }
                if walk.done() || !full {
                    break;
                }
            }
            tx.rollback().await.map_err(store)?;
            Ok(walk.finish())
        })
    }
}

/// Spawns the sealer loop: every `interval` it seals what is unsealed (one sealer at
/// a time across replicas; a replica that is not the sealer does nothing), and once more
/// when `shutdown` resolves. Errors are logged and retried on the next tick.
pub fn spawn_sealer(
    log: Arc<dyn AuditLog>,
    interval: Duration,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        // One seal per tick, unless a pass filled a whole batch (then more are waiting).
        let seal_all = || async {
            loop {
                match log.seal().await {
                    Ok(r) if r.rows >= SEAL_BATCH as u64 => continue,
                    Ok(_) => break,
                    Err(e) => {
                        tracing::warn!(error = %e, "audit sealing failed; retrying");
                        break;
                    }
                }
            }
        };
        tokio::pin!(shutdown);
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                _ = tick.tick() => seal_all().await,
            }
        }
        seal_all().await;
    })
}
