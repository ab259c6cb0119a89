//! Snapshot records on SQL: one row per org and id. A new record is checked against the
//! org's quota and written in one transaction, under a per-org lock (Postgres: an advisory
//! transaction lock in a key space of its own; SQLite: its single writer), so snapshots
//! taken at once on several replicas cannot pass the quota together.

use async_trait::async_trait;
use domain::{IdentityId, OrgId, SandboxKey, SandboxKind, Snapshot, SnapshotId, SnapshotName, Timestamp};
use ports::{Cause, SnapshotLimits, SnapshotStore, SnapshotStoreError, SnapshotUsage};

use super::{Backend, WritePool as _, with_pool};

/// The first key of the advisory locks taken per org (`snp` in ASCII): the two-key lock
/// space is apart from the one-key space the audit sealer uses.
const LOCK_SPACE: i32 = 0x0073_6e70;

fn store(e: sqlx::Error) -> SnapshotStoreError {
    SnapshotStoreError::Store(Cause::new(e))
}

fn corrupt(what: impl std::fmt::Display) -> SnapshotStoreError {
    SnapshotStoreError::Store(format!("stored snapshot is invalid: {what}").into())
}

#[derive(Debug, sqlx::FromRow)]
struct Row {
    org: String,
    id: String,
    source: String,
    source_kind: String,
    source_key: String,
    owner: String,
    created_by: String,
    name: Option<String>,
    created_at: i64,
    bytes: i64,
}

impl Row {
    fn snapshot(self) -> Result<Snapshot, SnapshotStoreError> {
        let org = OrgId::parse(self.org).map_err(corrupt)?;
        let kind = SandboxKind::parse(&self.source_kind).map_err(corrupt)?;
        Ok(Snapshot {
            id: SnapshotId::parse(self.id).map_err(corrupt)?,
            source: domain::SandboxId::parse(self.source).map_err(corrupt)?,
            source_key: SandboxKey::from_parts(org.clone(), kind, &self.source_key).map_err(corrupt)?,
            org,
            owner: IdentityId::parse(self.owner).map_err(corrupt)?,
            created_by: IdentityId::parse(self.created_by).map_err(corrupt)?,
            name: self.name.map(SnapshotName::parse).transpose().map_err(corrupt)?,
            created_at: Timestamp::from_unix_millis(self.created_at),
            bytes: u64::try_from(self.bytes).map_err(corrupt)?,
        })
    }
}

/// The columns, in [`Row`]'s order (a macro: statements are static strings).
macro_rules! columns {
    () => {
        "org, id, source, source_kind, source_key, owner, created_by, name, created_at, bytes"
    };
}

/// The [`SnapshotStore`] on SQLite or Postgres.
#[derive(Debug, Clone)]
pub struct SqlSnapshotStore {
    backend: Backend,
}

impl SqlSnapshotStore {
    pub(crate) fn new(backend: Backend) -> Self {
        Self { backend }
    }
}

fn usage_of(row: (i64, Option<i64>)) -> SnapshotUsage {
    SnapshotUsage {
        count: u64::try_from(row.0).unwrap_or(0),
        bytes: row.1.and_then(|b| u64::try_from(b).ok()).unwrap_or(0),
    }
}

#[async_trait]
impl SnapshotStore for SqlSnapshotStore {
    async fn insert(&self, s: &Snapshot, limits: SnapshotLimits) -> Result<(), SnapshotStoreError> {
        let bytes = i64::try_from(s.bytes).map_err(corrupt)?;
        let postgres = matches!(self.backend, Backend::Postgres(..));
        let usage_sql = if postgres {
            "SELECT COUNT(*), SUM(bytes)::BIGINT FROM snapshots WHERE org = $1"
        } else {
            "SELECT COUNT(*), SUM(bytes) FROM snapshots WHERE org = $1"
        };
        with_pool!(write &self.backend, p => {
            async {
                let mut tx = p.begin_write().await?;
                if postgres {
                    sqlx::query("SELECT pg_advisory_xact_lock($1, hashtext($2))")
                        .bind(LOCK_SPACE)
                        .bind(s.org.as_str())
                        .execute(&mut *tx)
                        .await?;
                }
                let held: (i64, Option<i64>) =
                    sqlx::query_as(usage_sql).bind(s.org.as_str()).fetch_one(&mut *tx).await?;
                let held = usage_of(held);
                let over = limits.max_count.is_some_and(|m| held.count >= u64::from(m))
                    || limits.max_bytes.is_some_and(|m| held.bytes.saturating_add(s.bytes) > m);
                if over {
                    return Ok::<_, sqlx::Error>(Err(SnapshotStoreError::OverQuota(held)));
                }
                if let Some(most) = limits.max_from_source {
                    let (from_source,): (i64,) =
                        sqlx::query_as("SELECT COUNT(*) FROM snapshots WHERE org = $1 AND source = $2")
                            .bind(s.org.as_str())
                            .bind(s.source.as_str())
                            .fetch_one(&mut *tx)
                            .await?;
                    if from_source >= i64::from(most) {
                        return Ok(Err(SnapshotStoreError::SourceCap));
                    }
                }
                sqlx::query(concat!(
                    "INSERT INTO snapshots (",
                    columns!(),
                    ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
                ))
                .bind(s.org.as_str())
                .bind(s.id.as_str())
                .bind(s.source.as_str())
                .bind(s.source_key.kind().as_str())
                .bind(s.source_key.key())
                .bind(s.owner.as_str())
                .bind(s.created_by.as_str())
                .bind(s.name.as_ref().map(SnapshotName::as_str))
                .bind(s.created_at.unix_millis())
                .bind(bytes)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(Ok(()))
            }
            .await
        })
        .map_err(store)?
    }

    async fn get(&self, org: &OrgId, id: &SnapshotId) -> Result<Option<Snapshot>, SnapshotStoreError> {
        let row: Option<Row> = with_pool!(read &self.backend, p => {
            sqlx::query_as(concat!("SELECT ", columns!(), " FROM snapshots WHERE org = $1 AND id = $2"))
                .bind(org.as_str())
                .bind(id.as_str())
                .fetch_optional(p)
                .await
        })
        .map_err(store)?;
        row.map(Row::snapshot).transpose()
    }

    async fn list(
        &self,
        org: &OrgId,
        owner: Option<IdentityId>,
    ) -> Result<Vec<Snapshot>, SnapshotStoreError> {
        let rows: Vec<Row> = with_pool!(read &self.backend, p => {
            sqlx::query_as(concat!(
                "SELECT ",
                columns!(),
                " FROM snapshots WHERE org = $1 AND ($2 IS NULL OR owner = $2) ORDER BY id"
            ))
            .bind(org.as_str())
            .bind(owner.as_ref().map(IdentityId::as_str))
            .fetch_all(p)
            .await
        })
        .map_err(store)?;
        rows.into_iter().map(Row::snapshot).collect()
    }

    async fn delete(&self, org: &OrgId, id: &SnapshotId) -> Result<bool, SnapshotStoreError> {
        let n = with_pool!(write &self.backend, p => {
            sqlx::query("DELETE FROM snapshots WHERE org = $1 AND id = $2")
                .bind(org.as_str())
                .bind(id.as_str())
                .execute(p)
                .await
                .map(|r| r.rows_affected())
        })
        .map_err(store)?;
        Ok(n > 0)
    }

    async fn usage(&self, org: &OrgId) -> Result<SnapshotUsage, SnapshotStoreError> {
        let sql = if matches!(self.backend, Backend::Postgres(..)) {
            "SELECT COUNT(*), SUM(bytes)::BIGINT FROM snapshots WHERE org = $1"
        } else {
            "SELECT COUNT(*), SUM(bytes) FROM snapshots WHERE org = $1"
        };
        let row: (i64, Option<i64>) = with_pool!(read &self.backend, p => {
            sqlx::query_as(sql).bind(org.as_str()).fetch_one(p).await
        })
        .map_err(store)?;
        Ok(usage_of(row))
    }
}
