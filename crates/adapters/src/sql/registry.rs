//! The sandbox registry on SQL: idempotent claims held by a partial unique index on live
//! records, lease take-over by compare-and-set in the claim statement, and epoch-fenced
//! state moves.
//!
//! A claim under an org's quota of running sandboxes, or one that may adopt a warm
//! sandbox, runs as one transaction holding the org's lock (a Postgres transaction-level
//! advisory lock keyed by the org; SQLite's single writer): the count of the org's running
//! sandboxes and the insert (or the adoption) are one atomic step across replicas, so
//! concurrent ensures never take an org past its quota, and no warm sandbox is adopted
//! twice. Resumes and warm-pool refills take the same lock.

use async_trait::async_trait;
use domain::sandbox::{Lease, SandboxRecord};
use domain::{
    CallerClass, Durability, ExecutionId, IdentityId, OrgId, SandboxCaller, SandboxId, SandboxKey,
    SandboxKind, SandboxState, Timestamp, TokenId,
};
use ports::{
    Cause, Claim, ClaimOutcome, ClaimRequest, KeyOwner, LiveId, OrgListing, RegistryError, ResumeRequest,
    SandboxRegistry, StateCount, TokenGrant, WarmSandbox, WarmSlotRequest,
};

use super::{Backend, WritePool as _, on_fast_path, with_pool};

/// The first key of the Postgres advisory locks that serialise one org's claims, resumes
/// and pool refills (the second is the org's `hashtext`). Two-key advisory locks do not
/// share a key space with the one-key locks of the audit log.
pub(crate) const ORG_LOCK_CLASS: i32 = 0x534C_4F52; // "SLOR"

/// Takes the org's lock inside a Postgres transaction (SQLite's `BEGIN IMMEDIATE` already
/// holds the one write lock).
macro_rules! lock_org {
    ($backend:expr, $tx:expr, $org:expr) => {
        if let Backend::Postgres(..) = $backend {
            sqlx::query("SELECT pg_advisory_xact_lock($1, hashtext($2))")
                .bind(ORG_LOCK_CLASS)
                .bind($org)
                .execute(&mut *$tx)
                .await
                .map_err(store)?;
        }
    };
}

/// The columns of a record, in [`RecordRow`] order.
macro_rules! record_cols {
    () => {
        "id, org, kind, key, durability, state, driver, caller_id, caller_class, token_caller_id, \
         token_caller_class, execution_id, token_id, token_expires_at, lease_holder, \
         lease_expires_at, lease_epoch, claim_nonce, tokens_revoked_at, message, created_at, \
         updated_at, last_active_at"
    };
}

/// The statement that makes the current Postgres transaction's commit return without
/// waiting for the WAL flush (see [`RELAXED_COMMIT`] for when that is safe).
macro_rules! relaxed_commit {
    () => {
        "SELECT set_config('synchronous_commit', 'off', true)"
    };
}

/// Whether a provisioning record's lease has lapsed, as SQL over the old row and the
/// claim's `now` (`excluded.created_at`).
macro_rules! lapsed {
    () => {
        "(sandboxes.state = 'provisioning' AND sandboxes.lease_expires_at <= excluded.created_at)"
    };
}

/// The columns a claim inserts, in the order of [`claim_row`]'s values.
macro_rules! claim_cols {
    () => {
        "INSERT INTO sandboxes (id, org, kind, key, durability, state, driver, caller_id, \
         caller_class, token_caller_id, token_caller_class, execution_id, lease_holder, \
         lease_expires_at, lease_epoch, claim_nonce, created_at, updated_at, last_active_at) "
    };
}

/// The values of a claim's new row (bound by [`bind_claim`]).
macro_rules! claim_row {
    () => {
        "$1, $2, $3, $4, $5, 'provisioning', $6, $7, $8, $7, $8, $9, $10, $11, 1, $1, $12, $12, $12"
    };
}

/// On the live record's key: take its lease over when lapsed, else leave every column as
/// it is. `DO UPDATE` always returns the one live row, so every concurrent caller sees the
/// winner.
macro_rules! claim_conflict {
    () => {
        concat!(
            " ON CONFLICT (org, kind, key) WHERE state IN ('provisioning', 'ready', 'suspended') DO UPDATE SET \
             lease_holder = CASE WHEN ",
            lapsed!(),
            " THEN excluded.lease_holder ELSE sandboxes.lease_holder END, \
             lease_expires_at = CASE WHEN ",
            lapsed!(),
            " THEN excluded.lease_expires_at ELSE sandboxes.lease_expires_at END, \
             lease_epoch = CASE WHEN ",
            lapsed!(),
            " THEN sandboxes.lease_epoch + 1 ELSE sandboxes.lease_epoch END, \
             claim_nonce = CASE WHEN ",
            lapsed!(),
            " THEN excluded.claim_nonce ELSE sandboxes.claim_nonce END, \
             updated_at = CASE WHEN ",
            lapsed!(),
            " THEN excluded.updated_at ELSE sandboxes.updated_at END \
             RETURNING ",
            record_cols!()
        )
    };
}

/// The claim: insert a provisioning record, or (on the live record's key) take its lease
/// over when lapsed, or leave it ([`claim_conflict`]). `claim_nonce` records which call
/// created or last took over the record: its candidate id. SQLite's form (its commits are
/// local); Postgres runs [`CLAIM_POSTGRES`].
const CLAIM: &str = concat!(claim_cols!(), "VALUES (", claim_row!(), ")", claim_conflict!());

/// [`CLAIM`] on Postgres, whose commit does not wait for the WAL flush
/// (`synchronous_commit` off for this transaction, as [`RELAXED_COMMIT`]). No caller hears
/// of a claim before a durable commit of the same ensure that follows it: the audit event
/// of a reuse (written before the credential is delivered), the ready move with its audit
/// event, or the audit event of a failure; and a durable commit flushes all WAL before it.
/// So only a database crash in between can lose a claim, and then:
/// - a claim of a live record changed nothing (its `DO UPDATE` rewrites every column to
///   itself unless the lease lapsed): nothing is lost;
/// - a created record is gone: the sandbox the driver may have started for it is an orphan
///   the reconciler removes, and the ensure's next write fails or is fenced;
/// - a taken-over lease is back at its old epoch: the holder's ready move is fenced.
///
/// It saves one disk flush per ensure, the whole cost of a re-ensure's claim, which used to
/// write and flush a row it left unchanged.
const CLAIM_POSTGRES: &str = concat!(
    "WITH relaxed AS (",
    relaxed_commit!(),
    ") ",
    claim_cols!(),
    "SELECT ",
    claim_row!(),
    " FROM relaxed",
    claim_conflict!()
);

/// A record as stored.
#[derive(Debug, sqlx::FromRow)]
struct RecordRow {
    id: String,
    org: String,
    kind: String,
    key: String,
    durability: String,
    state: String,
    driver: String,
    caller_id: String,
    caller_class: String,
    token_caller_id: String,
    token_caller_class: String,
    execution_id: String,
    token_id: Option<String>,
    token_expires_at: Option<i64>,
    lease_holder: String,
    lease_expires_at: i64,
    lease_epoch: i64,
    claim_nonce: String,
    tokens_revoked_at: Option<i64>,
    message: Option<String>,
    created_at: i64,
    updated_at: i64,
    last_active_at: i64,
}

fn corrupt(what: impl std::fmt::Display) -> RegistryError {
    RegistryError::Store(format!("stored sandbox record is invalid: {what}").into())
}

impl TryFrom<RecordRow> for SandboxRecord {
    type Error = RegistryError;

    fn try_from(r: RecordRow) -> Result<Self, RegistryError> {
        let org = OrgId::parse(r.org).map_err(corrupt)?;
        let kind = SandboxKind::parse(&r.kind).map_err(corrupt)?;
        Ok(Self {
            id: SandboxId::parse(r.id).map_err(corrupt)?,
            key: SandboxKey::from_parts(org, kind, &r.key).map_err(corrupt)?,
            durability: Durability::parse(&r.durability).map_err(corrupt)?,
            state: SandboxState::parse(&r.state).map_err(corrupt)?,
            driver: r.driver,
            caller_id: IdentityId::parse(r.caller_id).map_err(corrupt)?,
            caller_class: CallerClass::parse_stored(&r.caller_class).map_err(corrupt)?,
            token_caller: SandboxCaller::from_record(
                IdentityId::parse(r.token_caller_id).map_err(corrupt)?,
                CallerClass::parse_stored(&r.token_caller_class).map_err(corrupt)?,
            ),
            execution_id: ExecutionId::parse(r.execution_id).map_err(corrupt)?,
            token_id: r.token_id.map(TokenId::parse).transpose().map_err(corrupt)?,
            token_expires_at: r.token_expires_at.map(Timestamp::from_unix_millis),
            lease: Lease {
                holder: r.lease_holder,
                expires_at: Timestamp::from_unix_millis(r.lease_expires_at),
                epoch: r.lease_epoch,
            },
            tokens_revoked_at: r.tokens_revoked_at.map(Timestamp::from_unix_millis),
            message: r.message,
            created_at: Timestamp::from_unix_millis(r.created_at),
            updated_at: Timestamp::from_unix_millis(r.updated_at),
            last_active_at: Timestamp::from_unix_millis(r.last_active_at),
        })
    }
}

/// A warm sandbox as stored.
#[derive(Debug, sqlx::FromRow)]
struct WarmRow {
    id: String,
    org: String,
    workspace_bytes: Option<i64>,
    driver: String,
    state: String,
    lease_holder: String,
    lease_expires_at: i64,
    lease_epoch: i64,
    created_at: i64,
}

/// The columns of a warm sandbox, in [`WarmRow`] order.
macro_rules! warm_cols {
    () => {
        "id, org, workspace_bytes, driver, state, lease_holder, lease_expires_at, lease_epoch, created_at"
    };
}

impl TryFrom<WarmRow> for WarmSandbox {
    type Error = RegistryError;

    fn try_from(r: WarmRow) -> Result<Self, RegistryError> {
        Ok(Self {
            id: SandboxId::parse(r.id).map_err(corrupt)?,
            org: OrgId::parse(r.org).map_err(corrupt)?,
            workspace_bytes: r.workspace_bytes.map(|b| u64::try_from(b).map_err(corrupt)).transpose()?,
            driver: r.driver,
            ready: r.state == "ready",
            lease: Lease {
                holder: r.lease_holder,
                expires_at: Timestamp::from_unix_millis(r.lease_expires_at),
                epoch: r.lease_epoch,
            },
            created_at: Timestamp::from_unix_millis(r.created_at),
        })
    }
}

/// A stored byte count.
fn bytes_column(bytes: Option<u64>) -> Option<i64> {
    bytes.map(|b| i64::try_from(b).unwrap_or(i64::MAX))
}

/// A key's owner as stored.
#[derive(Debug, sqlx::FromRow)]
struct OwnerRow {
    owner_id: String,
    owner_class: String,
    created_at: i64,
}

/// A record and its key's owner, as [`SandboxRegistry::get_with_owner`] reads them (the
/// owner's columns are null when the key has none).
#[derive(Debug, sqlx::FromRow)]
struct OwnedRow {
    #[sqlx(flatten)]
    record: RecordRow,
    owner_id: Option<String>,
    owner_class: Option<String>,
    owner_since: Option<i64>,
}

impl TryFrom<OwnerRow> for KeyOwner {
    type Error = RegistryError;

    fn try_from(r: OwnerRow) -> Result<Self, RegistryError> {
        Ok(Self {
            identity_id: IdentityId::parse(r.owner_id).map_err(corrupt)?,
            class: CallerClass::parse_stored(&r.owner_class).map_err(corrupt)?,
            since: Timestamp::from_unix_millis(r.created_at),
        })
    }
}

fn store(e: sqlx::Error) -> RegistryError {
    RegistryError::Store(Cause::new(e))
}

/// The [`SandboxRegistry`] on SQLite or Postgres.
#[derive(Debug, Clone)]
pub struct SqlRegistry {
    backend: Backend,
}

impl SqlRegistry {
    pub(crate) fn new(backend: Backend) -> Self {
        Self { backend }
    }

    /// The records `sql` lists: it selects `record_cols!()` with one bound cut-off, `$1`.
    async fn records_up_to(
        &self,
        sql: &'static str,
        cutoff: Timestamp,
    ) -> Result<Vec<SandboxRecord>, RegistryError> {
        let rows: Vec<RecordRow> = with_pool!(read &self.backend, p => {
            sqlx::query_as(sql).bind(cutoff.unix_millis()).fetch_all(p).await
        })
        .map_err(store)?;
        rows.into_iter().map(SandboxRecord::try_from).collect()
    }

    /// The record's current state, to explain why a conditional update matched nothing.
    async fn state_of(&self, sandbox: &SandboxId) -> Result<Option<SandboxState>, RegistryError> {
        let state: Option<String> = with_pool!(write &self.backend, p => {
            sqlx::query_scalar("SELECT state FROM sandboxes WHERE id = $1")
                .bind(sandbox.as_str())
                .fetch_optional(p)
                .await
        })
        .map_err(store)?;
        state.map(|s| SandboxState::parse(&s).map_err(corrupt)).transpose()
    }

    /// A fenced move that matched no row: not found, or fenced.
    async fn fenced(&self, sandbox: &SandboxId, epoch: i64) -> RegistryError {
        match self.state_of(sandbox).await {
            Ok(None) => RegistryError::NotFound(sandbox.clone()),
            Ok(Some(_)) => RegistryError::Fenced { sandbox_id: sandbox.clone(), epoch },
            Err(e) => e,
        }
    }
}

/// Binds a claim request to [`CLAIM`].
macro_rules! bind_claim {
    ($query:expr, $request:expr) => {{
        let request: &ClaimRequest = $request;
        let key = &request.key;
        let now = request.now.unix_millis();
        $query
            .bind(request.candidate_id.as_str())
            .bind(key.org().as_str())
            .bind(key.kind().as_str())
            .bind(key.key())
            .bind(request.durability.as_str())
            .bind(request.driver.as_str())
            .bind(request.caller.identity_id().as_str())
            .bind(request.caller.class().as_str())
            .bind(request.execution_id.as_str())
            .bind(request.holder.as_str())
            .bind(now.saturating_add(request.lease_ms))
            .bind(now)
    }};
}

/// What the claim statement's row says the call did.
fn claim_of(row: RecordRow, request: &ClaimRequest) -> Result<Claim, RegistryError> {
    let outcome = if row.id == request.candidate_id.as_str() {
        ClaimOutcome::Created
    } else if row.claim_nonce == request.candidate_id.as_str() {
        ClaimOutcome::TakenOver
    } else {
        ClaimOutcome::Existing
    };
    Ok(Claim { record: row.try_into()?, outcome })
}

/// Adopts a warm sandbox for a claim: its record enters `sandboxes` under the warm
/// sandbox's id and epoch, provisioning, with the claim's lease; `claim_nonce` is the
/// claim's candidate id, as for a created record.
const ADOPT: &str = concat!(
    "INSERT INTO sandboxes (id, org, kind, key, durability, state, driver, caller_id, \
     caller_class, token_caller_id, token_caller_class, execution_id, lease_holder, \
     lease_expires_at, lease_epoch, claim_nonce, created_at, updated_at, last_active_at) \
     VALUES ($13, $2, $3, $4, $5, 'provisioning', $6, $7, $8, $7, $8, $9, $10, $11, $14, $1, $12, \
     $12, $12) \
     ON CONFLICT (org, kind, key) WHERE state IN ('provisioning', 'ready', 'suspended') DO NOTHING \
     RETURNING ",
    record_cols!()
);

/// The condition (after `WHERE`, over `warm_sandboxes w`) that picks the warm sandbox an
/// adoption of the claim's key takes: the org's (`$2`) oldest ready one of the driver
/// (`$6`) with the workspace quota `$13`, skipping rows another adopter holds, unless the
/// key already has a live record.
macro_rules! warm_for_key {
    () => {
        "w.org = $2 AND w.state = 'ready' AND w.driver = $6 \
         AND w.workspace_bytes IS NOT DISTINCT FROM $13 \
         AND NOT EXISTS (SELECT 1 FROM sandboxes s WHERE s.org = $2 AND s.kind = $3 AND s.key = $4 \
         AND s.state IN ('provisioning', 'ready', 'suspended')) \
         ORDER BY w.created_at, w.id LIMIT 1 FOR UPDATE SKIP LOCKED"
    };
}

/// Makes the `picked` warm sandbox the key's record, as [`ADOPT`]; `RETURNING` follows.
macro_rules! insert_picked {
    () => {
        "INSERT INTO sandboxes (id, org, kind, key, durability, state, driver, caller_id, \
         caller_class, token_caller_id, token_caller_class, execution_id, lease_holder, \
         lease_expires_at, lease_epoch, claim_nonce, created_at, updated_at, last_active_at) \
         SELECT picked.id, $2, $3, $4, $5, 'provisioning', $6, $7, $8, $7, $8, $9, $10, $11, \
         picked.lease_epoch, $1, $12, $12, $12 FROM picked, relaxed \
         ON CONFLICT (org, kind, key) WHERE state IN ('provisioning', 'ready', 'suspended') DO NOTHING \
         RETURNING "
    };
}

/// Adoption in one Postgres statement (no quota to count): takes the org's oldest ready
/// warm sandbox with the workspace quota `$13` (skipping rows another adopter holds), unless
/// the key already has a live record, and makes it the key's record, as [`ADOPT`]. A claim
/// of the same key committing in between leaves the insert empty: that warm sandbox is then
/// out of the pool, and the reconciler removes it.
///
/// Its commit does not wait for the WAL flush (`synchronous_commit` off for this
/// transaction, see [`RELAXED_COMMIT`]).
const ADOPT_ONE: &str = concat!(
    "WITH relaxed AS (",
    relaxed_commit!(),
    "), picked AS (DELETE FROM warm_sandboxes WHERE id = (SELECT w.id FROM warm_sandboxes w WHERE ",
    warm_for_key!(),
    ") RETURNING id, lease_epoch) ",
    insert_picked!(),
    record_cols!()
);

/// The owner's adoption in one Postgres statement (no quota to count): records the caller
/// (`$7`, `$8`) as the key's owner when it has none, as [`OWNER_UPSERT_POSTGRES`], and
/// adopts as [`ADOPT_ONE`] only when the key's owner is the caller. The owner's decision
/// and the claim are one round trip and one commit, not two.
///
/// Its commit does not wait for the WAL flush, as [`ADOPT_ONE`]'s.
const ADOPT_OWNED: &str = concat!(
    "WITH relaxed AS (",
    relaxed_commit!(),
    "), owner AS (INSERT INTO sandbox_owners (org, kind, key, owner_id, owner_class, created_at) \
     SELECT $2, $3, $4, $7, $8, $12 FROM relaxed \
     ON CONFLICT (org, kind, key) DO UPDATE SET owner_id = sandbox_owners.owner_id \
     RETURNING owner_id), \
     picked AS (DELETE FROM warm_sandboxes WHERE id = (SELECT w.id FROM warm_sandboxes w \
     WHERE EXISTS (SELECT 1 FROM owner WHERE owner.owner_id = $7) AND ",
    warm_for_key!(),
    ") RETURNING id, lease_epoch) ",
    insert_picked!(),
    record_cols!()
);

/// Records the caller as the key's owner when it has none and returns the owner, on
/// Postgres. `DO UPDATE` (a no-op write) rather than `DO NOTHING`: it always returns the
/// one row, the winner's, under any concurrency.
///
/// The commit does not wait for the WAL flush (`synchronous_commit` off for this
/// transaction only): an ensure or recovery always writes after it (its claim, or the
/// audit event of its refusal or failure), and that synchronous commit flushes this one's
/// WAL with it. Only a database crash in the few hundred ms before could lose the owner
/// row, and then nothing was claimed under it. It saves one disk flush (≈ 1 ms here) per
/// ensure.
const OWNER_UPSERT_POSTGRES: &str = concat!(
    "WITH relaxed AS (",
    relaxed_commit!(),
    ") INSERT INTO sandbox_owners (org, kind, key, owner_id, owner_class, created_at) \
     SELECT $1, $2, $3, $4, $5, $6 FROM relaxed \
     ON CONFLICT (org, kind, key) DO UPDATE SET owner_id = sandbox_owners.owner_id \
     RETURNING owner_id, owner_class, created_at"
);

/// [`OWNER_UPSERT_POSTGRES`] on SQLite (whose commits are local).
const OWNER_UPSERT_SQLITE: &str = "INSERT INTO sandbox_owners (org, kind, key, owner_id, owner_class, created_at) \
     VALUES ($1, $2, $3, $4, $5, $6) \
     ON CONFLICT (org, kind, key) DO UPDATE SET owner_id = sandbox_owners.owner_id \
     RETURNING owner_id, owner_class, created_at";

/// Binds the owner upsert's parameters: the key, the caller, the time.
macro_rules! bind_owner {
    ($query:expr, $key:expr, $caller:expr, $now:expr) => {{
        let (key, caller): (&SandboxKey, &SandboxCaller) = ($key, $caller);
        $query
            .bind(key.org().as_str())
            .bind(key.kind().as_str())
            .bind(key.key())
            .bind(caller.identity_id().as_str())
            .bind(caller.class().as_str())
            .bind($now.unix_millis())
    }};
}

/// Provisioning → ready and the audit append in one Postgres statement: the append (under
/// the audit barrier, drawn after it as in `AuditLog::append`) inserts one row per row the
/// update moved, so a fenced move writes neither.
const READY_AUDITED: &str = concat!(
    "WITH moved AS (UPDATE sandboxes SET state = 'ready', token_id = $3, token_expires_at = $4, \
     execution_id = $5, token_caller_id = $6, token_caller_class = $7, updated_at = $8, \
     last_active_at = $8 WHERE id = $1 AND lease_epoch = $2 AND state = 'provisioning' RETURNING ",
    record_cols!(),
    "), barrier AS (SELECT pg_advisory_xact_lock_shared($24) FROM moved), \
     appended AS (INSERT INTO audit_events (org, action, kind, key, sandbox_id, caller_id, \
     caller_class, durability, driver, outcome, message, token_id, at, hash, appended_at) \
     SELECT CAST($9 AS TEXT), CAST($10 AS TEXT), CAST($11 AS TEXT), CAST($12 AS TEXT), \
     CAST($13 AS TEXT), CAST($14 AS TEXT), CAST($15 AS TEXT), CAST($16 AS TEXT), CAST($17 AS TEXT), \
     CAST($18 AS TEXT), CAST($19 AS TEXT), CAST($20 AS TEXT), CAST($21 AS BIGINT), \
     CAST($22 AS BYTEA), CAST($23 AS BIGINT) FROM barrier RETURNING seq) \
     SELECT moved.* FROM moved, appended"
);

/// Makes the current Postgres transaction's commit return without waiting for the WAL
/// flush (`synchronous_commit` off for this transaction only). Used for adoptions: no
/// caller hears of one before its holder's durable commit that follows (ready with its
/// audit event, or the failure and its audit event), and a durable commit flushes all WAL
/// before it, this one's included. Only a database crash in between can lose the
/// adoption, and then no caller was told of it: the warm sandbox is back in its pool, and
/// the next adoption replaces its token file and environment before anyone runs in it.
/// It saves a disk flush per adoption and, under the org's lock, lets the org's next
/// claim in without waiting for that flush.
const RELAXED_COMMIT: &str = relaxed_commit!();

/// Counts the org's running sandboxes (provisioning or ready).
const COUNT_RUNNING: &str =
    "SELECT COUNT(*) FROM sandboxes WHERE org = $1 AND state IN ('provisioning', 'ready')";

/// Who a claim under the org's lock is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gate {
    /// Anyone (the caller was authorised before): the usual claim.
    Open,
    /// The key's owner only, recorded in the same transaction when the key has none; and
    /// only an adoption ([`SandboxRegistry::adopt_as_owner`]).
    OwnerAdoption,
}

impl SqlRegistry {
    /// The claim statement of this backend: [`CLAIM_POSTGRES`] or [`CLAIM`].
    fn claim_statement(&self) -> &'static str {
        match &self.backend {
            Backend::Postgres(..) => CLAIM_POSTGRES,
            Backend::Sqlite { .. } => CLAIM,
        }
    }

    /// The statement that records a key's owner when it has none.
    fn owner_upsert(&self) -> &'static str {
        match &self.backend {
            Backend::Postgres(..) => OWNER_UPSERT_POSTGRES,
            Backend::Sqlite { .. } => OWNER_UPSERT_SQLITE,
        }
    }

    /// A claim under the org's lock: the key's live record if it has one; else, within the
    /// quota, an adopted warm sandbox or a created record. Behind [`Gate::OwnerAdoption`]
    /// only an adoption for the key's owner: `None` (and nothing written) for anything
    /// else, a refusal by the quota included.
    async fn claim_in_org(&self, request: &ClaimRequest, gate: Gate) -> Result<Option<Claim>, RegistryError> {
        let key = &request.key;
        let org = key.org();
        let owner_upsert = self.owner_upsert();
        with_pool!(write &self.backend, p => {
            let mut tx = p.begin_write().await.map_err(store)?;
            lock_org!(&self.backend, tx, org.as_str());
            if gate == Gate::OwnerAdoption {
                let owner: OwnerRow = bind_owner!(sqlx::query_as(owner_upsert), key, &request.caller, request.now)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(store)?;
                if owner.owner_id != request.caller.identity_id().as_str() {
                    tx.rollback().await.map_err(store)?;
                    return Ok(None);
                }
            }
            let live: Option<String> = sqlx::query_scalar(
                "SELECT id FROM sandboxes WHERE org = $1 AND kind = $2 AND key = $3 \
                 AND state IN ('provisioning', 'ready', 'suspended')",
            )
            .bind(org.as_str())
            .bind(key.kind().as_str())
            .bind(key.key())
            .fetch_optional(&mut *tx)
            .await
            .map_err(store)?;
            if live.is_none() {
                if let Some(limit) = request.max_running {
                    let running: i64 = sqlx::query_scalar(COUNT_RUNNING)
                        .bind(org.as_str())
                        .fetch_one(&mut *tx)
                        .await
                        .map_err(store)?;
                    if running >= i64::from(limit) {
                        tx.rollback().await.map_err(store)?;
                        if gate == Gate::OwnerAdoption {
                            return Ok(None);
                        }
                        return Err(RegistryError::OverQuota { org: org.clone(), limit });
                    }
                }
                if let Some(warm) = &request.warm {
                    let bytes = bytes_column(warm.workspace_bytes);
                    let picked: Option<(String, i64)> = sqlx::query_as(
                        "DELETE FROM warm_sandboxes WHERE id = (SELECT id FROM warm_sandboxes \
                         WHERE org = $1 AND state = 'ready' AND driver = $3 \
                         AND workspace_bytes IS NOT DISTINCT FROM $2 \
                         ORDER BY created_at, id LIMIT 1) RETURNING id, lease_epoch",
                    )
                    .bind(org.as_str())
                    .bind(bytes)
                    .bind(request.driver.as_str())
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(store)?;
                    if let Some((id, epoch)) = picked {
                        let row: Option<RecordRow> = bind_claim!(sqlx::query_as(ADOPT), request)
                            .bind(id.as_str())
                            .bind(epoch)
                            .fetch_optional(&mut *tx)
                            .await
                            .map_err(store)?;
                        if let Some(row) = row {
                            if let Backend::Postgres(..) = &self.backend {
                                sqlx::query(RELAXED_COMMIT).execute(&mut *tx).await.map_err(store)?;
                            }
                            tx.commit().await.map_err(store)?;
                            let record = row.try_into()?;
                            return Ok(Some(Claim { record, outcome: ClaimOutcome::Adopted }));
                        }
                        // A claim outside the org's lock (one made under another policy)
                        // took the key meanwhile: the warm sandbox stays in the pool.
                        tx.rollback().await.map_err(store)?;
                        if gate == Gate::OwnerAdoption {
                            return Ok(None);
                        }
                        let row: RecordRow = bind_claim!(sqlx::query_as(self.claim_statement()), request)
                            .fetch_one(p)
                            .await
                            .map_err(store)?;
                        return claim_of(row, request).map(Some);
                    }
                }
            }
            if gate == Gate::OwnerAdoption {
                tx.rollback().await.map_err(store)?;
                return Ok(None);
            }
            let row: RecordRow =
                bind_claim!(sqlx::query_as(self.claim_statement()), request).fetch_one(&mut *tx).await.map_err(store)?;
            tx.commit().await.map_err(store)?;
            claim_of(row, request).map(Some)
        })
    }
}

/// Extends the lease of a provisioning record in `sandboxes`, at its epoch.
const LEASED_SANDBOX: &str = "UPDATE sandboxes SET lease_expires_at = $3, updated_at = $4 \
     WHERE id = $1 AND lease_epoch = $2 AND state = 'provisioning'";

/// The same for a warm sandbox being provisioned.
const LEASED_WARM_SANDBOX: &str = "UPDATE warm_sandboxes SET lease_expires_at = $3, updated_at = $4 \
     WHERE id = $1 AND lease_epoch = $2 AND state = 'provisioning'";

impl SqlRegistry {
    /// Runs `statement` (one of the lease extensions above): the rows it changed.
    async fn extend_lease(
        &self,
        statement: &'static str,
        sandbox: &SandboxId,
        epoch: i64,
        until: Timestamp,
        now: Timestamp,
    ) -> Result<u64, RegistryError> {
        with_pool!(write &self.backend, p => {
            sqlx::query(statement)
                .bind(sandbox.as_str())
                .bind(epoch)
                .bind(until.unix_millis())
                .bind(now.unix_millis())
                .execute(p)
                .await
                .map(|r| r.rows_affected())
        })
        .map_err(store)
    }
}

#[async_trait]
impl SandboxRegistry for SqlRegistry {
    async fn claim(&self, request: &ClaimRequest) -> Result<Claim, RegistryError> {
        if request.max_running.is_none() && request.warm.is_none() {
            // No quota to count and no pool to adopt from: the one statement decides.
            let row: RecordRow = with_pool!(fast write &self.backend, p => {
                bind_claim!(sqlx::query_as(self.claim_statement()), request).fetch_one(p).await
            })
            .map_err(store)?;
            return claim_of(row, request);
        }
        if let (Backend::Postgres(_, fast), None, Some(warm)) =
            (&self.backend, request.max_running, &request.warm)
        {
            // No quota to count: adopting needs no org lock (the warm row is taken with
            // `FOR UPDATE SKIP LOCKED`), so it is one statement; else the usual claim.
            let adopted: Option<RecordRow> = on_fast_path!(fast, c => {
                bind_claim!(sqlx::query_as(ADOPT_ONE), request)
                    .bind(bytes_column(warm.workspace_bytes))
                    .fetch_optional(c)
                    .await
            })
            .map_err(store)?;
            if let Some(row) = adopted {
                return Ok(Claim { record: row.try_into()?, outcome: ClaimOutcome::Adopted });
            }
            let row: RecordRow =
                on_fast_path!(fast, c => bind_claim!(sqlx::query_as(CLAIM_POSTGRES), request).fetch_one(c).await)
                    .map_err(store)?;
            return claim_of(row, request);
        }
        self.claim_in_org(request, Gate::Open).await?.ok_or_else(|| {
            RegistryError::Store("an open claim under the org's lock ended without a record".into())
        })
    }

    async fn adopt_as_owner(&self, request: &ClaimRequest) -> Result<Option<SandboxRecord>, RegistryError> {
        let Some(warm) = &request.warm else {
            return Ok(None);
        };
        if let (Backend::Postgres(_, fast), None) = (&self.backend, request.max_running) {
            // No quota to count: one statement, as the claim's ADOPT_ONE.
            let adopted: Option<RecordRow> = on_fast_path!(fast, c => {
                bind_claim!(sqlx::query_as(ADOPT_OWNED), request)
                    .bind(bytes_column(warm.workspace_bytes))
                    .fetch_optional(c)
                    .await
            })
            .map_err(store)?;
            return adopted.map(SandboxRecord::try_from).transpose();
        }
        Ok(self.claim_in_org(request, Gate::OwnerAdoption).await?.map(|claim| claim.record))
    }

    async fn mark_ready(
        &self,
        sandbox: &SandboxId,
        epoch: i64,
        grant: &TokenGrant,
        now: Timestamp,
    ) -> Result<SandboxRecord, RegistryError> {
        let row: Option<RecordRow> = with_pool!(write &self.backend, p => {
            sqlx::query_as(concat!(
                "UPDATE sandboxes SET state = 'ready', token_id = $3, token_expires_at = $4, \
                 execution_id = $5, token_caller_id = $6, token_caller_class = $7, updated_at = $8, \
                 last_active_at = $8 \
                 WHERE id = $1 AND lease_epoch = $2 AND state = 'provisioning' RETURNING ",
                record_cols!()
            ))
            .bind(sandbox.as_str())
            .bind(epoch)
            .bind(grant.token_id.as_str())
            .bind(grant.expires_at.unix_millis())
            .bind(grant.execution_id.as_str())
            .bind(grant.caller.identity_id().as_str())
            .bind(grant.caller.class().as_str())
            .bind(now.unix_millis())
            .fetch_optional(p)
            .await
        })
        .map_err(store)?;
        match row {
            Some(row) => row.try_into(),
            None => Err(self.fenced(sandbox, epoch).await),
        }
    }

    async fn mark_ready_audited(
        &self,
        sandbox: &SandboxId,
        epoch: i64,
        grant: &TokenGrant,
        event: &domain::AuditEvent,
        now: Timestamp,
    ) -> Result<SandboxRecord, RegistryError> {
        use super::audit::{APPEND_BARRIER, SQLITE_APPEND, bind_event};
        let hash = event.hash();
        let appended_at = super::now_ms();
        let row: Option<RecordRow> = match &self.backend {
            // One statement, one round trip: the update, then the append (under the audit
            // barrier, as `AuditLog::append` takes it) of as many rows as were updated.
            Backend::Postgres(_, fast) => {
                let query = sqlx::query_as(READY_AUDITED)
                    .bind(sandbox.as_str())
                    .bind(epoch)
                    .bind(grant.token_id.as_str())
                    .bind(grant.expires_at.unix_millis())
                    .bind(grant.execution_id.as_str())
                    .bind(grant.caller.identity_id().as_str())
                    .bind(grant.caller.class().as_str())
                    .bind(now.unix_millis());
                on_fast_path!(fast, c => {
                    bind_event!(query, event, hash, appended_at).bind(APPEND_BARRIER).fetch_optional(c).await
                })
                .map_err(store)?
            }
            Backend::Sqlite { writer, .. } => {
                let mut tx = writer.begin_write().await.map_err(store)?;
                let row: Option<RecordRow> = sqlx::query_as(concat!(
                    "UPDATE sandboxes SET state = 'ready', token_id = $3, token_expires_at = $4, \
                     execution_id = $5, token_caller_id = $6, token_caller_class = $7, updated_at = $8, \
                     last_active_at = $8 \
                     WHERE id = $1 AND lease_epoch = $2 AND state = 'provisioning' RETURNING ",
                    record_cols!()
                ))
                .bind(sandbox.as_str())
                .bind(epoch)
                .bind(grant.token_id.as_str())
                .bind(grant.expires_at.unix_millis())
                .bind(grant.execution_id.as_str())
                .bind(grant.caller.identity_id().as_str())
                .bind(grant.caller.class().as_str())
                .bind(now.unix_millis())
                .fetch_optional(&mut *tx)
                .await
                .map_err(store)?;
                if row.is_some() {
                    let _seq: i64 = bind_event!(sqlx::query_scalar(SQLITE_APPEND), event, hash, appended_at)
                        .fetch_one(&mut *tx)
                        .await
                        .map_err(store)?;
                    tx.commit().await.map_err(store)?;
                } else {
                    tx.rollback().await.map_err(store)?;
                }
                row
            }
        };
        match row {
            Some(row) => row.try_into(),
            None => Err(self.fenced(sandbox, epoch).await),
        }
    }

    async fn mark_failed(
        &self,
        sandbox: &SandboxId,
        epoch: i64,
        message: &str,
        now: Timestamp,
    ) -> Result<(), RegistryError> {
        let done = with_pool!(write &self.backend, p => {
            sqlx::query(
                "UPDATE sandboxes SET state = 'failed', message = $3, updated_at = $4 \
                 WHERE id = $1 AND lease_epoch = $2 AND state = 'provisioning'",
            )
            .bind(sandbox.as_str())
            .bind(epoch)
            .bind(message)
            .bind(now.unix_millis())
            .execute(p)
            .await
            .map(|r| r.rows_affected())
        })
        .map_err(store)?;
        if done == 1 { Ok(()) } else { Err(self.fenced(sandbox, epoch).await) }
    }

    async fn record_token<'a>(
        &self,
        sandbox: &SandboxId,
        expected: Option<&'a TokenId>,
        grant: &TokenGrant,
        now: Timestamp,
    ) -> Result<(), RegistryError> {
        let updated = with_pool!(write &self.backend, p => {
            sqlx::query(
                "UPDATE sandboxes SET token_id = $2, token_expires_at = $3, execution_id = $4, \
                 token_caller_id = $5, token_caller_class = $6, updated_at = $7 \
                 WHERE id = $1 AND state IN ('provisioning', 'ready') AND (CAST($8 AS TEXT) IS NULL OR token_id = $8)",
            )
            .bind(sandbox.as_str())
            .bind(grant.token_id.as_str())
            .bind(grant.expires_at.unix_millis())
            .bind(grant.execution_id.as_str())
            .bind(grant.caller.identity_id().as_str())
            .bind(grant.caller.class().as_str())
            .bind(now.unix_millis())
            .bind(expected.map(TokenId::as_str))
            .execute(p)
            .await
            .map(|r| r.rows_affected() == 1)
        })
        .map_err(store)?;
        if updated {
            return Ok(());
        }
        match self.state_of(sandbox).await? {
            None => Err(RegistryError::NotFound(sandbox.clone())),
            Some(SandboxState::Provisioning | SandboxState::Ready) => {
                Err(RegistryError::Superseded(sandbox.clone()))
            }
            Some(state) => Err(RegistryError::InvalidState {
                sandbox_id: sandbox.clone(),
                state: state.as_str().to_owned(),
                action: "record a token",
            }),
        }
    }

    async fn mark_deprovisioned(
        &self,
        sandbox: &SandboxId,
        now: Timestamp,
    ) -> Result<Option<SandboxRecord>, RegistryError> {
        let before: Option<RecordRow> = with_pool!(write &self.backend, p => {
            let mut tx = p.begin_write().await.map_err(store)?;
            // SQLite: BEGIN IMMEDIATE already holds the write lock. Postgres: lock the row.
            let select = match &self.backend {
                Backend::Postgres(..) => {
                    concat!("SELECT ", record_cols!(), " FROM sandboxes WHERE id = $1 FOR UPDATE")
                }
                Backend::Sqlite { .. } => {
                    concat!("SELECT ", record_cols!(), " FROM sandboxes WHERE id = $1")
                }
            };
            let before: Option<RecordRow> = sqlx::query_as(select)
                .bind(sandbox.as_str())
                .fetch_optional(&mut *tx)
                .await
                .map_err(store)?;
            if before.as_ref().is_some_and(|r| r.state != "deprovisioned") {
                sqlx::query(
                    "UPDATE sandboxes SET state = 'deprovisioned', \
                     tokens_revoked_at = COALESCE(tokens_revoked_at, $2), updated_at = $2 \
                     WHERE id = $1",
                )
                .bind(sandbox.as_str())
                .bind(now.unix_millis())
                .execute(&mut *tx)
                .await
                .map_err(store)?;
            }
            tx.commit().await.map_err(store)?;
            before
        });
        before.map(SandboxRecord::try_from).transpose()
    }

    async fn revoke_tokens(&self, sandbox: &SandboxId, now: Timestamp) -> Result<(), RegistryError> {
        let done = with_pool!(write &self.backend, p => {
            sqlx::query(
                "UPDATE sandboxes SET tokens_revoked_at = COALESCE(tokens_revoked_at, $2) \
                 WHERE id = $1",
            )
            .bind(sandbox.as_str())
            .bind(now.unix_millis())
            .execute(p)
            .await
            .map(|r| r.rows_affected())
        })
        .map_err(store)?;
        if done == 1 { Ok(()) } else { Err(RegistryError::NotFound(sandbox.clone())) }
    }

    async fn get(&self, sandbox: &SandboxId) -> Result<Option<SandboxRecord>, RegistryError> {
        let row: Option<RecordRow> = with_pool!(read &self.backend, p => {
            sqlx::query_as(concat!("SELECT ", record_cols!(), " FROM sandboxes WHERE id = $1"))
                .bind(sandbox.as_str())
                .fetch_optional(p)
                .await
        })
        .map_err(store)?;
        row.map(SandboxRecord::try_from).transpose()
    }

    async fn get_with_owner(
        &self,
        sandbox: &SandboxId,
    ) -> Result<Option<(SandboxRecord, Option<KeyOwner>)>, RegistryError> {
        let row: Option<OwnedRow> = with_pool!(fast read &self.backend, p => {
            sqlx::query_as(concat!(
                "SELECT r.*, o.owner_id, o.owner_class, o.created_at AS owner_since FROM (SELECT ",
                record_cols!(),
                " FROM sandboxes WHERE id = $1) r LEFT JOIN sandbox_owners o \
                 ON o.org = r.org AND o.kind = r.kind AND o.key = r.key"
            ))
            .bind(sandbox.as_str())
            .fetch_optional(p)
            .await
        })
        .map_err(store)?;
        let Some(row) = row else { return Ok(None) };
        let owner = match (row.owner_id, row.owner_class, row.owner_since) {
            (Some(owner_id), Some(owner_class), Some(created_at)) => {
                Some(KeyOwner::try_from(OwnerRow { owner_id, owner_class, created_at })?)
            }
            (None, None, None) => None,
            _ => return Err(corrupt("a key owner row with a missing column")),
        };
        Ok(Some((SandboxRecord::try_from(row.record)?, owner)))
    }

    async fn list_org(
        &self,
        listing: &OrgListing,
    ) -> Result<Vec<(SandboxRecord, Option<KeyOwner>)>, RegistryError> {
        // One range of the (org, id) index; the owners joined to that page only.
        let rows: Vec<OwnedRow> = with_pool!(read &self.backend, p => {
            sqlx::query_as(concat!(
                "SELECT r.*, o.owner_id, o.owner_class, o.created_at AS owner_since FROM (SELECT ",
                record_cols!(),
                " FROM sandboxes WHERE org = $1 AND id > $2 \
                 AND (state IN ('provisioning', 'ready', 'suspended') OR $3) ORDER BY id LIMIT $4) r \
                 LEFT JOIN sandbox_owners o ON o.org = r.org AND o.kind = r.kind AND o.key = r.key \
                 ORDER BY r.id"
            ))
            .bind(listing.org.as_str())
            .bind(listing.after.as_ref().map_or("", SandboxId::as_str))
            .bind(listing.ended)
            .bind(i64::from(listing.limit))
            .fetch_all(p)
            .await
        })
        .map_err(store)?;
        rows.into_iter()
            .map(|row| {
                let owner = match (row.owner_id, row.owner_class, row.owner_since) {
                    (Some(owner_id), Some(owner_class), Some(created_at)) => {
                        Some(KeyOwner::try_from(OwnerRow { owner_id, owner_class, created_at })?)
                    }
                    (None, None, None) => None,
                    _ => return Err(corrupt("a key owner row with a missing column")),
                };
                Ok((SandboxRecord::try_from(row.record)?, owner))
            })
            .collect()
    }

    async fn get_live(&self, key: &SandboxKey) -> Result<Option<SandboxRecord>, RegistryError> {
        let row: Option<RecordRow> = with_pool!(read &self.backend, p => {
            sqlx::query_as(concat!(
                "SELECT ",
                record_cols!(),
                " FROM sandboxes WHERE org = $1 AND kind = $2 AND key = $3 \
                 AND state IN ('provisioning', 'ready', 'suspended')"
            ))
            .bind(key.org().as_str())
            .bind(key.kind().as_str())
            .bind(key.key())
            .fetch_optional(p)
            .await
        })
        .map_err(store)?;
        row.map(SandboxRecord::try_from).transpose()
    }

    async fn live_ids(&self) -> Result<Vec<LiveId>, RegistryError> {
        let rows: Vec<(String, String, String)> = with_pool!(read &self.backend, p => {
            sqlx::query_as(
                "SELECT id, org, state FROM sandboxes \
                 WHERE state IN ('provisioning', 'ready', 'suspended') ORDER BY created_at, id",
            )
            .fetch_all(p)
            .await
        })
        .map_err(store)?;
        rows.into_iter()
            .map(|(id, org, state)| {
                Ok(LiveId {
                    id: SandboxId::parse(id).map_err(corrupt)?,
                    org: OrgId::parse(org).map_err(corrupt)?,
                    state: SandboxState::parse(&state).map_err(corrupt)?,
                })
            })
            .collect()
    }

    async fn list_token_expiring(&self, horizon: Timestamp) -> Result<Vec<SandboxRecord>, RegistryError> {
        let sql = concat!(
            "SELECT ",
            record_cols!(),
            " FROM sandboxes WHERE state = 'ready' AND (token_expires_at IS NULL OR token_expires_at <= $1) \
             ORDER BY token_expires_at, id"
        );
        self.records_up_to(sql, horizon).await
    }

    async fn list_lease_expired(&self, now: Timestamp) -> Result<Vec<SandboxRecord>, RegistryError> {
        let sql = concat!(
            "SELECT ",
            record_cols!(),
            " FROM sandboxes WHERE state = 'provisioning' AND lease_expires_at <= $1 ORDER BY lease_expires_at, id"
        );
        self.records_up_to(sql, now).await
    }

    async fn list_idle(&self, active_before: Timestamp) -> Result<Vec<SandboxRecord>, RegistryError> {
        let sql = concat!(
            "SELECT ",
            record_cols!(),
            " FROM sandboxes WHERE state = 'ready' AND last_active_at <= $1 ORDER BY last_active_at, id"
        );
        self.records_up_to(sql, active_before).await
    }

    async fn ready_ids_since(&self, since: Timestamp) -> Result<Vec<SandboxId>, RegistryError> {
        let ids: Vec<String> = with_pool!(read &self.backend, p => {
            sqlx::query_scalar("SELECT id FROM sandboxes WHERE state = 'ready' AND updated_at >= $1 ORDER BY id")
                .bind(since.unix_millis())
                .fetch_all(p)
                .await
        })
        .map_err(store)?;
        ids.into_iter().map(|id| SandboxId::parse(id).map_err(corrupt)).collect()
    }

    async fn ready_ids(&self) -> Result<Vec<SandboxId>, RegistryError> {
        let ids: Vec<String> = with_pool!(read &self.backend, p => {
            sqlx::query_scalar("SELECT id FROM sandboxes WHERE state = 'ready' ORDER BY id").fetch_all(p).await
        })
        .map_err(store)?;
        ids.into_iter().map(|id| SandboxId::parse(id).map_err(corrupt)).collect()
    }

    async fn list_created_before(
        &self,
        created_before: Timestamp,
    ) -> Result<Vec<SandboxRecord>, RegistryError> {
        let sql = concat!(
            "SELECT ",
            record_cols!(),
            " FROM sandboxes WHERE state IN ('ready', 'suspended') AND created_at <= $1 ORDER BY created_at, id"
        );
        self.records_up_to(sql, created_before).await
    }

    async fn renew_lease(
        &self,
        sandbox: &SandboxId,
        epoch: i64,
        until: Timestamp,
        now: Timestamp,
    ) -> Result<(), RegistryError> {
        let done = self.extend_lease(LEASED_SANDBOX, sandbox, epoch, until, now).await?;
        if done == 1 { Ok(()) } else { Err(self.fenced(sandbox, epoch).await) }
    }

    async fn claim_owner(
        &self,
        key: &SandboxKey,
        caller: &SandboxCaller,
        now: Timestamp,
    ) -> Result<KeyOwner, RegistryError> {
        let row: OwnerRow = with_pool!(fast write &self.backend, p => {
            bind_owner!(sqlx::query_as(self.owner_upsert()), key, caller, now).fetch_one(p).await
        })
        .map_err(store)?;
        row.try_into()
    }

    async fn owner(&self, key: &SandboxKey) -> Result<Option<KeyOwner>, RegistryError> {
        let row: Option<OwnerRow> = with_pool!(read &self.backend, p => {
            sqlx::query_as(
                "SELECT owner_id, owner_class, created_at FROM sandbox_owners \
                 WHERE org = $1 AND kind = $2 AND key = $3",
            )
            .bind(key.org().as_str())
            .bind(key.kind().as_str())
            .bind(key.key())
            .fetch_optional(p)
            .await
        })
        .map_err(store)?;
        row.map(KeyOwner::try_from).transpose()
    }

    async fn resume(&self, request: &ResumeRequest) -> Result<SandboxRecord, RegistryError> {
        let id = request.sandbox.as_str();
        let now = request.now.unix_millis();
        let outcome: Result<RecordRow, RegistryError> = with_pool!(write &self.backend, p => {
            let mut tx = p.begin_write().await.map_err(store)?;
            let org: Option<(String, String)> =
                sqlx::query_as("SELECT org, state FROM sandboxes WHERE id = $1")
                    .bind(id)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(store)?;
            let Some((org, _)) = org else {
                return Err(RegistryError::NotFound(request.sandbox.clone()));
            };
            lock_org!(&self.backend, tx, org.as_str());
            // Read again under the lock: the state that decides.
            let state: String = sqlx::query_scalar("SELECT state FROM sandboxes WHERE id = $1")
                .bind(id)
                .fetch_one(&mut *tx)
                .await
                .map_err(store)?;
            if state != "suspended" {
                tx.rollback().await.map_err(store)?;
                return Err(RegistryError::InvalidState {
                    sandbox_id: request.sandbox.clone(),
                    state,
                    action: "resume",
                });
            }
            if let Some(limit) = request.max_running {
                let running: i64 =
                    sqlx::query_scalar(COUNT_RUNNING).bind(org.as_str()).fetch_one(&mut *tx).await.map_err(store)?;
                if running >= i64::from(limit) {
                    tx.rollback().await.map_err(store)?;
                    let org = OrgId::parse(org).map_err(corrupt)?;
                    return Err(RegistryError::OverQuota { org, limit });
                }
            }
            let row: RecordRow = sqlx::query_as(concat!(
                "UPDATE sandboxes SET state = 'provisioning', lease_holder = $2, lease_expires_at = $3, \
                 lease_epoch = lease_epoch + 1, updated_at = $4, last_active_at = $4 \
                 WHERE id = $1 AND state = 'suspended' RETURNING ",
                record_cols!()
            ))
            .bind(id)
            .bind(request.holder.as_str())
            .bind(now.saturating_add(request.lease_ms))
            .bind(now)
            .fetch_one(&mut *tx)
            .await
            .map_err(store)?;
            tx.commit().await.map_err(store)?;
            Ok(row)
        });
        outcome?.try_into()
    }

    async fn suspend(
        &self,
        sandbox: &SandboxId,
        idle_since: Timestamp,
        now: Timestamp,
    ) -> Result<bool, RegistryError> {
        with_pool!(write &self.backend, p => {
            sqlx::query(
                "UPDATE sandboxes SET state = 'suspended', updated_at = $3 \
                 WHERE id = $1 AND state = 'ready' AND last_active_at <= $2",
            )
            .bind(sandbox.as_str())
            .bind(idle_since.unix_millis())
            .bind(now.unix_millis())
            .execute(p)
            .await
            .map(|r| r.rows_affected() == 1)
        })
        .map_err(store)
    }

    async fn touch(&self, activity: &[(SandboxId, Timestamp)]) -> Result<(), RegistryError> {
        if activity.is_empty() {
            return Ok(());
        }
        match &self.backend {
            // One statement for the whole batch, one round trip. A transaction of one
            // update per sandbox (a round trip each) stayed open for up to 386 ms in a
            // burst of adoptions (measured), holding the rows it had updated: the adopted
            // sandboxes' own, which their ready move updates next.
            Backend::Postgres(p, _) => {
                let (ids, ats): (Vec<&str>, Vec<i64>) =
                    activity.iter().map(|(id, at)| (id.as_str(), at.unix_millis())).unzip();
                sqlx::query(
                    "UPDATE sandboxes AS s SET last_active_at = a.at \
                     FROM unnest(CAST($1 AS TEXT[]), CAST($2 AS BIGINT[])) AS a(id, at) \
                     WHERE s.id = a.id AND s.last_active_at < a.at AND s.state IN ('provisioning', 'ready')",
                )
                .bind(ids)
                .bind(ats)
                .execute(p)
                .await
                .map_err(store)?;
                Ok(())
            }
            // SQLite's one writer: the statements of a local transaction.
            Backend::Sqlite { writer, .. } => {
                let mut tx = writer.begin_write().await.map_err(store)?;
                for (id, at) in activity {
                    sqlx::query(
                        "UPDATE sandboxes SET last_active_at = $2 \
                         WHERE id = $1 AND last_active_at < $2 AND state IN ('provisioning', 'ready')",
                    )
                    .bind(id.as_str())
                    .bind(at.unix_millis())
                    .execute(&mut *tx)
                    .await
                    .map_err(store)?;
                }
                tx.commit().await.map_err(store)
            }
        }
    }

    async fn live_counts(&self) -> Result<Vec<StateCount>, RegistryError> {
        let rows: Vec<(String, String, i64)> = with_pool!(read &self.backend, p => {
            sqlx::query_as(
                "SELECT org, state, COUNT(*) FROM sandboxes \
                 WHERE state IN ('provisioning', 'ready', 'suspended') GROUP BY org, state",
            )
            .fetch_all(p)
            .await
        })
        .map_err(store)?;
        rows.into_iter()
            .map(|(org, state, count)| {
                Ok(StateCount {
                    org: OrgId::parse(org).map_err(corrupt)?,
                    state: SandboxState::parse(&state).map_err(corrupt)?,
                    count: u64::try_from(count).unwrap_or(0),
                })
            })
            .collect()
    }

    async fn claim_warm_slot(&self, request: &WarmSlotRequest) -> Result<Option<WarmSandbox>, RegistryError> {
        let org = request.org.as_str();
        let now = request.now.unix_millis();
        let bytes = bytes_column(request.workspace_bytes);
        let row: Option<WarmRow> = with_pool!(write &self.backend, p => {
            let mut tx = p.begin_write().await.map_err(store)?;
            lock_org!(&self.backend, tx, org);
            let have: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM warm_sandboxes WHERE org = $1 AND driver = $4 \
                 AND workspace_bytes IS NOT DISTINCT FROM $2 \
                 AND (state = 'ready' OR lease_expires_at > $3)",
            )
            .bind(org)
            .bind(bytes)
            .bind(now)
            .bind(request.driver.as_str())
            .fetch_one(&mut *tx)
            .await
            .map_err(store)?;
            if have >= i64::from(request.target) {
                tx.rollback().await.map_err(store)?;
                None
            } else {
                let row: WarmRow = sqlx::query_as(concat!(
                    "INSERT INTO warm_sandboxes (id, org, workspace_bytes, driver, state, lease_holder, \
                     lease_expires_at, lease_epoch, created_at, updated_at) \
                     VALUES ($1, $2, $3, $4, 'provisioning', $5, $6, 1, $7, $7) RETURNING ",
                    warm_cols!()
                ))
                .bind(request.candidate_id.as_str())
                .bind(org)
                .bind(bytes)
                .bind(request.driver.as_str())
                .bind(request.holder.as_str())
                .bind(now.saturating_add(request.lease_ms))
                .bind(now)
                .fetch_one(&mut *tx)
                .await
                .map_err(store)?;
                tx.commit().await.map_err(store)?;
                Some(row)
            }
        });
        row.map(WarmSandbox::try_from).transpose()
    }

    async fn renew_warm_lease(
        &self,
        sandbox: &SandboxId,
        epoch: i64,
        until: Timestamp,
        now: Timestamp,
    ) -> Result<(), RegistryError> {
        let done = self.extend_lease(LEASED_WARM_SANDBOX, sandbox, epoch, until, now).await?;
        if done == 1 { Ok(()) } else { Err(RegistryError::Fenced { sandbox_id: sandbox.clone(), epoch }) }
    }

    async fn mark_warm_ready(
        &self,
        sandbox: &SandboxId,
        epoch: i64,
        now: Timestamp,
    ) -> Result<(), RegistryError> {
        let done = with_pool!(write &self.backend, p => {
            sqlx::query(
                "UPDATE warm_sandboxes SET state = 'ready', updated_at = $3 \
                 WHERE id = $1 AND lease_epoch = $2 AND state = 'provisioning'",
            )
            .bind(sandbox.as_str())
            .bind(epoch)
            .bind(now.unix_millis())
            .execute(p)
            .await
            .map(|r| r.rows_affected())
        })
        .map_err(store)?;
        if done == 1 { Ok(()) } else { Err(RegistryError::Fenced { sandbox_id: sandbox.clone(), epoch }) }
    }

    async fn remove_warm(&self, sandbox: &SandboxId) -> Result<bool, RegistryError> {
        with_pool!(write &self.backend, p => {
            sqlx::query("DELETE FROM warm_sandboxes WHERE id = $1")
                .bind(sandbox.as_str())
                .execute(p)
                .await
                .map(|r| r.rows_affected() == 1)
        })
        .map_err(store)
    }

    async fn list_warm(&self) -> Result<Vec<WarmSandbox>, RegistryError> {
        let rows: Vec<WarmRow> = with_pool!(read &self.backend, p => {
            sqlx::query_as(concat!("SELECT ", warm_cols!(), " FROM warm_sandboxes ORDER BY created_at, id"))
                .fetch_all(p)
                .await
        })
        .map_err(store)?;
        rows.into_iter().map(WarmSandbox::try_from).collect()
    }
}

#[cfg(test)]
mod tests;
