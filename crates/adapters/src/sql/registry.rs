//! The sandbox registry on SQL: idempotent claims held by a partial unique index on live
//! records, lease take-over by compare-and-set in the claim statement, and epoch-fenced
//! state moves.

use async_trait::async_trait;
use domain::sandbox::{Lease, SandboxRecord};
use domain::{
    CallerClass, Durability, ExecutionId, IdentityId, OrgId, SandboxCaller, SandboxId, SandboxKey,
    SandboxKind, SandboxState, Timestamp, TokenId,
};
use ports::{Cause, Claim, ClaimOutcome, ClaimRequest, KeyOwner, RegistryError, SandboxRegistry, TokenGrant};

use super::{Backend, WritePool as _, with_pool};

/// The columns of a record, in [`RecordRow`] order.
macro_rules! record_cols {
    () => {
        "id, org, kind, key, durability, state, driver, caller_id, caller_class, token_caller_id, \
         token_caller_class, execution_id, token_id, token_expires_at, lease_holder, \
         lease_expires_at, lease_epoch, claim_nonce, tokens_revoked_at, message, created_at, \
         updated_at"
    };
}

/// Whether a provisioning record's lease has lapsed, as SQL over the old row and the
/// claim's `now` (`excluded.created_at`).
macro_rules! lapsed {
    () => {
        "(sandboxes.state = 'provisioning' AND sandboxes.lease_expires_at <= excluded.created_at)"
    };
}

/// The claim: insert a provisioning record, or (on the live record's key) take its lease
/// over when lapsed, or leave it. `DO UPDATE` always returns the one live row, so every
/// concurrent caller sees the winner. `claim_nonce` records which call created or last
/// took over the record: its candidate id.
const CLAIM: &str = concat!(
    "INSERT INTO sandboxes (id, org, kind, key, durability, state, driver, caller_id, \
     caller_class, token_caller_id, token_caller_class, execution_id, lease_holder, \
     lease_expires_at, lease_epoch, claim_nonce, created_at, updated_at) \
     VALUES ($1, $2, $3, $4, $5, 'provisioning', $6, $7, $8, $7, $8, $9, $10, $11, 1, $1, $12, \
     $12) \
     ON CONFLICT (org, kind, key) WHERE state IN ('provisioning', 'ready') DO UPDATE SET \
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
        })
    }
}

/// A key's owner as stored.
#[derive(Debug, sqlx::FromRow)]
struct OwnerRow {
    owner_id: String,
    owner_class: String,
    created_at: i64,
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

#[async_trait]
impl SandboxRegistry for SqlRegistry {
    async fn claim(&self, request: &ClaimRequest) -> Result<Claim, RegistryError> {
        let key = &request.key;
        let now = request.now.unix_millis();
        let row: RecordRow = with_pool!(write &self.backend, p => {
            sqlx::query_as(CLAIM)
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
                .fetch_one(p)
                .await
        })
        .map_err(store)?;
        let outcome = if row.id == request.candidate_id.as_str() {
            ClaimOutcome::Created
        } else if row.claim_nonce == request.candidate_id.as_str() {
            ClaimOutcome::TakenOver
        } else {
            ClaimOutcome::Existing
        };
        Ok(Claim { record: row.try_into()?, outcome })
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
                 execution_id = $5, token_caller_id = $6, token_caller_class = $7, updated_at = $8 \
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

    async fn record_token(
        &self,
        sandbox: &SandboxId,
        grant: &TokenGrant,
        now: Timestamp,
    ) -> Result<(), RegistryError> {
        let updated = with_pool!(write &self.backend, p => {
            sqlx::query(
                "UPDATE sandboxes SET token_id = $2, token_expires_at = $3, execution_id = $4, \
                 token_caller_id = $5, token_caller_class = $6, updated_at = $7 \
                 WHERE id = $1 AND state IN ('provisioning', 'ready')",
            )
            .bind(sandbox.as_str())
            .bind(grant.token_id.as_str())
            .bind(grant.expires_at.unix_millis())
            .bind(grant.execution_id.as_str())
            .bind(grant.caller.identity_id().as_str())
            .bind(grant.caller.class().as_str())
            .bind(now.unix_millis())
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
                Backend::Postgres(_) => {
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

    async fn get_live(&self, key: &SandboxKey) -> Result<Option<SandboxRecord>, RegistryError> {
        let row: Option<RecordRow> = with_pool!(read &self.backend, p => {
            sqlx::query_as(concat!(
                "SELECT ",
                record_cols!(),
                " FROM sandboxes WHERE org = $1 AND kind = $2 AND key = $3 \
                 AND state IN ('provisioning', 'ready')"
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

    async fn list_live(&self) -> Result<Vec<SandboxRecord>, RegistryError> {
        let rows: Vec<RecordRow> = with_pool!(read &self.backend, p => {
            sqlx::query_as(concat!(
                "SELECT ",
                record_cols!(),
                " FROM sandboxes WHERE state IN ('provisioning', 'ready') ORDER BY created_at, id"
            ))
            .fetch_all(p)
            .await
        })
        .map_err(store)?;
        rows.into_iter().map(SandboxRecord::try_from).collect()
    }

    async fn renew_lease(
        &self,
        sandbox: &SandboxId,
        epoch: i64,
        until: Timestamp,
        now: Timestamp,
    ) -> Result<(), RegistryError> {
        let done = with_pool!(write &self.backend, p => {
            sqlx::query(
                "UPDATE sandboxes SET lease_expires_at = $3, updated_at = $4 \
                 WHERE id = $1 AND lease_epoch = $2 AND state = 'provisioning'",
            )
            .bind(sandbox.as_str())
            .bind(epoch)
            .bind(until.unix_millis())
            .bind(now.unix_millis())
            .execute(p)
            .await
            .map(|r| r.rows_affected())
        })
        .map_err(store)?;
        if done == 1 { Ok(()) } else { Err(self.fenced(sandbox, epoch).await) }
    }

    async fn claim_owner(
        &self,
        key: &SandboxKey,
        caller: &SandboxCaller,
        now: Timestamp,
    ) -> Result<KeyOwner, RegistryError> {
        // `DO UPDATE` (a no-op write) rather than `DO NOTHING`: it always returns the one
        // row, the winner's, under any concurrency.
        let row: OwnerRow = with_pool!(write &self.backend, p => {
            sqlx::query_as(
                "INSERT INTO sandbox_owners (org, kind, key, owner_id, owner_class, created_at) \
                 VALUES ($1, $2, $3, $4, $5, $6) \
                 ON CONFLICT (org, kind, key) DO UPDATE SET owner_id = sandbox_owners.owner_id \
                 RETURNING owner_id, owner_class, created_at",
            )
            .bind(key.org().as_str())
            .bind(key.kind().as_str())
            .bind(key.key())
            .bind(caller.identity_id().as_str())
            .bind(caller.class().as_str())
            .bind(now.unix_millis())
            .fetch_one(p)
            .await
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
}
