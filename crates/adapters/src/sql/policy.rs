//! Org policies and quota leases on SQL.
//!
//! An org's changes to the default policy are one row: a JSON object of the fields
//! `sandlane org set` named and a version, replaced by compare-and-set on the version, so
//! concurrent changes never lose one another's fields.
//!
//! A quota lease is one row per (scope, replica): the slots that replica holds and when
//! they lapse. A lease is set in a transaction that holds the scope's lock (a Postgres
//! transaction-level advisory lock keyed by the scope; SQLite's single writer) while it
//! sums the other replicas' unexpired slots, so the slots of a scope never add up to more
//! than its limit.

use async_trait::async_trait;
use domain::{OrgId, PolicyPatch, Timestamp};
use ports::{PolicyOverrides, PolicyStore, PolicyStoreError, QuotaLeases};

use super::{Backend, WritePool as _, with_pool};

/// The first key of the Postgres advisory locks of quota scopes (the second is the scope's
/// `hashtext`); distinct from the org locks of the registry.
const SCOPE_LOCK_CLASS: i32 = 0x534C_5153; // "SLQS"

fn store(e: sqlx::Error) -> PolicyStoreError {
    PolicyStoreError::Store(e.to_string())
}

fn corrupt(what: impl std::fmt::Display) -> PolicyStoreError {
    PolicyStoreError::Store(format!("stored org policy is invalid: {what}"))
}

#[derive(Debug, sqlx::FromRow)]
struct PolicyRow {
    org: String,
    overrides: String,
    version: i64,
    updated_at: i64,
}

impl TryFrom<PolicyRow> for (OrgId, PolicyOverrides) {
    type Error = PolicyStoreError;

    fn try_from(r: PolicyRow) -> Result<Self, PolicyStoreError> {
        let org = OrgId::parse(r.org).map_err(corrupt)?;
        let patch: PolicyPatch =
            serde_json::from_str(&r.overrides).map_err(|e| corrupt(format!("{org}: {e}")))?;
        Ok((
            org,
            PolicyOverrides {
                patch,
                version: r.version,
                updated_at: Timestamp::from_unix_millis(r.updated_at),
            },
        ))
    }
}

/// The [`PolicyStore`] on SQLite or Postgres.
#[derive(Debug, Clone)]
pub struct SqlPolicyStore {
    backend: Backend,
}

impl SqlPolicyStore {
    pub(crate) fn new(backend: Backend) -> Self {
        Self { backend }
    }
}

#[async_trait]
impl PolicyStore for SqlPolicyStore {
    async fn overrides(&self, org: &OrgId) -> Result<Option<PolicyOverrides>, PolicyStoreError> {
        let row: Option<PolicyRow> = with_pool!(read &self.backend, p => {
            sqlx::query_as("SELECT org, overrides, version, updated_at FROM org_policies WHERE org = $1")
                .bind(org.as_str())
                .fetch_optional(p)
                .await
        })
        .map_err(store)?;
        row.map(|r| <(OrgId, PolicyOverrides)>::try_from(r).map(|(_, o)| o)).transpose()
    }

    async fn replace(
        &self,
        org: &OrgId,
        overrides: &PolicyPatch,
        expected_version: i64,
        now: Timestamp,
    ) -> Result<Option<PolicyOverrides>, PolicyStoreError> {
        let json = serde_json::to_string(overrides).map_err(|e| corrupt(e.to_string()))?;
        let now_ms = now.unix_millis();
        let written = with_pool!(write &self.backend, p => {
            if expected_version == 0 {
                sqlx::query(
                    "INSERT INTO org_policies (org, overrides, version, updated_at) VALUES ($1, $2, 1, $3) \
                     ON CONFLICT (org) DO NOTHING",
                )
                .bind(org.as_str())
                .bind(json.as_str())
                .bind(now_ms)
                .execute(p)
                .await
            } else {
                sqlx::query(
                    "UPDATE org_policies SET overrides = $2, version = version + 1, updated_at = $3 \
                     WHERE org = $1 AND version = $4",
                )
                .bind(org.as_str())
                .bind(json.as_str())
                .bind(now_ms)
                .bind(expected_version)
                .execute(p)
                .await
            }
            .map(|r| r.rows_affected() == 1)
        })
        .map_err(store)?;
        Ok(written.then(|| PolicyOverrides {
            patch: overrides.clone(),
            version: expected_version + 1,
            updated_at: now,
        }))
    }

    async fn list(&self) -> Result<Vec<(OrgId, PolicyOverrides)>, PolicyStoreError> {
        let rows: Vec<PolicyRow> = with_pool!(read &self.backend, p => {
            sqlx::query_as("SELECT org, overrides, version, updated_at FROM org_policies ORDER BY org")
                .fetch_all(p)
                .await
        })
        .map_err(store)?;
        rows.into_iter().map(TryFrom::try_from).collect()
    }
}

/// The [`QuotaLeases`] on SQLite or Postgres.
#[derive(Debug, Clone)]
pub struct SqlQuotaLeases {
    backend: Backend,
}

impl SqlQuotaLeases {
    pub(crate) fn new(backend: Backend) -> Self {
        Self { backend }
    }
}

#[async_trait]
impl QuotaLeases for SqlQuotaLeases {
    async fn lease(
        &self,
        scope: &str,
        holder: &str,
        want: u32,
        limit: u32,
        now: Timestamp,
        ttl_ms: i64,
    ) -> Result<u32, PolicyStoreError> {
        let now_ms = now.unix_millis();
        with_pool!(write &self.backend, p => {
            let mut tx = p.begin_write().await.map_err(store)?;
            if let Backend::Postgres(..) = &self.backend {
                sqlx::query("SELECT pg_advisory_xact_lock($1, hashtext($2))")
                    .bind(SCOPE_LOCK_CLASS)
                    .bind(scope)
                    .execute(&mut *tx)
                    .await
                    .map_err(store)?;
            }
            // Lapsed leases (a replica that died) give their slots back.
            sqlx::query("DELETE FROM quota_leases WHERE scope = $1 AND expires_at <= $2")
                .bind(scope)
                .bind(now_ms)
                .execute(&mut *tx)
                .await
                .map_err(store)?;
            let others: i64 = sqlx::query_scalar(
                "SELECT CAST(COALESCE(SUM(slots), 0) AS BIGINT) FROM quota_leases \
                 WHERE scope = $1 AND holder <> $2",
            )
            .bind(scope)
            .bind(holder)
            .fetch_one(&mut *tx)
            .await
            .map_err(store)?;
            let free = (i64::from(limit) - others).max(0);
            let granted = u32::try_from(free.min(i64::from(want))).unwrap_or(0);
            if granted == 0 {
                sqlx::query("DELETE FROM quota_leases WHERE scope = $1 AND holder = $2")
                    .bind(scope)
                    .bind(holder)
                    .execute(&mut *tx)
                    .await
                    .map_err(store)?;
            } else {
                sqlx::query(
                    "INSERT INTO quota_leases (scope, holder, slots, expires_at) VALUES ($1, $2, $3, $4) \
                     ON CONFLICT (scope, holder) DO UPDATE SET slots = excluded.slots, \
                     expires_at = excluded.expires_at",
                )
                .bind(scope)
                .bind(holder)
                .bind(i64::from(granted))
                .bind(now_ms.saturating_add(ttl_ms))
                .execute(&mut *tx)
                .await
                .map_err(store)?;
            }
            tx.commit().await.map_err(store)?;
            Ok(granted)
        })
    }
}
