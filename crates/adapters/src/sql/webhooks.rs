//! Webhooks on SQL: one row per org (the receiver, the secret sealed by [`SecretKeys`] with
//! the org and `webhook` as associated data, the audit cursor) and the outbox of
//! deliveries. A delivery is made once per (org, audit seq) (`ON CONFLICT DO NOTHING`:
//! replicas reading the same events make one row), and leased for an attempt by a
//! conditional write (`UPDATE … WHERE id IN (…) AND lease_until < now … RETURNING`) of the
//! candidates read just before, so no two replicas attempt it at once (one that lost rows
//! to another reads again); at most a given number of one org's per lease, less what that
//! org has under way, so that an org whose receiver hangs delays the others by one
//! attempt's timeout at most, never by its whole backlog.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use domain::{OrgId, SecretValue, Timestamp};
use ports::{
    AttemptResult, Cause, DeliveryRecord, DeliveryStatus, DueDelivery, NewDelivery, WebhookEntry,
    WebhookStore, WebhookStoreError,
};

use super::secret_keys::{KeyError, SecretKeys};
use super::{Backend, WritePool as _, with_pool};

/// The name the secret is sealed under (its associated data, with the org).
pub(crate) const SEAL_NAME: &str = "webhook";

/// How many times a lease reads again for rows another replica leased first.
const LEASE_TRIES: usize = 3;

fn store(e: sqlx::Error) -> WebhookStoreError {
    WebhookStoreError::Store(Cause::new(e))
}

fn keys(e: KeyError) -> WebhookStoreError {
    WebhookStoreError::Store(Cause::new(e))
}

fn corrupt(what: impl std::fmt::Display) -> WebhookStoreError {
    WebhookStoreError::Store(format!("stored webhook delivery is invalid: {what}").into())
}

/// The [`WebhookStore`] on SQLite or Postgres.
#[derive(Debug, Clone)]
pub struct SqlWebhookStore {
    backend: Backend,
    keys: Arc<SecretKeys>,
}

#[derive(Debug, sqlx::FromRow)]
struct Row {
    id: String,
    org: String,
    audit_seq: i64,
    event_type: String,
    status: String,
    attempts: i64,
    next_attempt_at: i64,
    last_status: Option<i64>,
    last_error: Option<String>,
    created_at: i64,
    updated_at: i64,
}

impl Row {
    fn record(self) -> Result<DeliveryRecord, WebhookStoreError> {
        Ok(DeliveryRecord {
            id: self.id,
            org: OrgId::parse(self.org).map_err(corrupt)?,
            audit_seq: self.audit_seq,
            event_type: self.event_type,
            status: DeliveryStatus::parse(&self.status).ok_or_else(|| corrupt(&self.status))?,
            attempts: u32::try_from(self.attempts).map_err(corrupt)?,
            next_attempt_at: Timestamp::from_unix_millis(self.next_attempt_at),
            last_status: self.last_status.and_then(|s| u16::try_from(s).ok()),
            last_error: self.last_error,
            created_at: Timestamp::from_unix_millis(self.created_at),
            updated_at: Timestamp::from_unix_millis(self.updated_at),
        })
    }
}

const COLUMNS: &str = "d.id, d.org, d.audit_seq, d.event_type, d.status, d.attempts, d.next_attempt_at, \
                       d.last_status, d.last_error, d.created_at, d.updated_at";

impl SqlWebhookStore {
    pub(crate) fn new(backend: Backend, keys: Arc<SecretKeys>) -> Self {
        Self { backend, keys }
    }

    /// Delivery `id`, just leased, with its receiver and opened secret; `None` when its
    /// webhook is gone (the delivery is then given up, as the removal would have).
    async fn leased(&self, id: &str, now: i64) -> Result<Option<DueDelivery>, WebhookStoreError> {
        let sql = format!(
            "SELECT {COLUMNS}, d.payload, w.url, w.key_id, w.sealed FROM webhook_deliveries d \
             JOIN webhooks w ON w.org = d.org WHERE d.id = $1"
        );
        let found: Option<(Row, String, String, String, Vec<u8>)> = with_pool!(read &self.backend, p => {
            sqlx::query(sqlx::AssertSqlSafe(sql.clone())).bind(id).fetch_optional(p).await.and_then(|row| {
                row.map(|row| {
                    use sqlx::Row as _;
                    let r = <Row as sqlx::FromRow<_>>::from_row(&row)?;
                    Ok((r, row.try_get("payload")?, row.try_get("url")?, row.try_get("key_id")?, row.try_get("sealed")?))
                })
                .transpose()
            })
        })
        .map_err(store)?;
        let Some((row, payload, url, key_id, sealed)) = found else {
            with_pool!(write &self.backend, p => {
                sqlx::query(
                    "UPDATE webhook_deliveries SET status = 'failed', lease_until = 0, \
                     last_error = 'the webhook was removed', updated_at = $2 \
                     WHERE id = $1 AND status = 'pending' \
                     AND NOT EXISTS (SELECT 1 FROM webhooks w WHERE w.org = webhook_deliveries.org)",
                )
                .bind(id)
                .bind(now)
                .execute(p)
                .await
                .map(|_| ())
            })
            .map_err(store)?;
            return Ok(None);
        };
        let record = row.record()?;
        let secret = self.keys.open(&key_id, record.org.as_str(), SEAL_NAME, &sealed).map_err(keys)?;
        Ok(Some(DueDelivery { record, payload, url, secret: SecretValue::new(secret) }))
    }
}

#[async_trait]
impl WebhookStore for SqlWebhookStore {
    async fn set(
        &self,
        org: &OrgId,
        url: &str,
        secret: &SecretValue,
        now: Timestamp,
    ) -> Result<(), WebhookStoreError> {
        let (key_id, sealed) = self.keys.seal(org.as_str(), SEAL_NAME, secret.expose()).map_err(keys)?;
        let now = now.unix_millis();
        with_pool!(write &self.backend, p => {
            sqlx::query(
                "INSERT INTO webhooks (org, url, key_id, sealed, audit_cursor, created_at, updated_at) \
                 VALUES ($1, $2, $3, $4, (SELECT COALESCE(MAX(seq), 0) FROM audit_events WHERE org = $1), $5, $5) \
                 ON CONFLICT (org) DO UPDATE SET url = excluded.url, key_id = excluded.key_id, \
                 sealed = excluded.sealed, updated_at = excluded.updated_at",
            )
            .bind(org.as_str())
            .bind(url)
            .bind(key_id.as_str())
            .bind(sealed.as_slice())
            .bind(now)
            .execute(p)
            .await
            .map(|_| ())
        })
        .map_err(store)
    }

    async fn remove(&self, org: &OrgId, now: Timestamp) -> Result<bool, WebhookStoreError> {
        let now = now.unix_millis();
        with_pool!(write &self.backend, p => {
            async {
                let mut tx = p.begin_write().await?;
                let removed = sqlx::query("DELETE FROM webhooks WHERE org = $1")
                    .bind(org.as_str())
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                sqlx::query(
                    "UPDATE webhook_deliveries SET status = 'failed', last_error = 'the webhook was removed', \
                     updated_at = $2 WHERE org = $1 AND status = 'pending'",
                )
                .bind(org.as_str())
                .bind(now)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok::<_, sqlx::Error>(removed > 0)
            }
            .await
        })
        .map_err(store)
    }

    async fn list(&self) -> Result<Vec<WebhookEntry>, WebhookStoreError> {
        let rows: Vec<(String, String, i64, i64)> = with_pool!(read &self.backend, p => {
            sqlx::query_as("SELECT org, url, audit_cursor, updated_at FROM webhooks ORDER BY org").fetch_all(p).await
        })
        .map_err(store)?;
        rows.into_iter()
            .map(|(org, url, cursor, updated)| {
                Ok(WebhookEntry {
                    org: OrgId::parse(org).map_err(corrupt)?,
                    url,
                    cursor,
                    updated_at: Timestamp::from_unix_millis(updated),
                })
            })
            .collect()
    }

    async fn enqueue(
        &self,
        org: &OrgId,
        deliveries: &[NewDelivery],
        cursor: i64,
        now: Timestamp,
    ) -> Result<(), WebhookStoreError> {
        let now = now.unix_millis();
        // The webhook as it is now: locked on PostgreSQL against a removal running beside
        // this (SQLite's write transaction holds the whole database).
        let current = if matches!(self.backend, Backend::Postgres(..)) {
            "SELECT audit_cursor FROM webhooks WHERE org = $1 FOR UPDATE"
        } else {
            "SELECT audit_cursor FROM webhooks WHERE org = $1"
        };
        with_pool!(write &self.backend, p => {
            async {
                let mut tx = p.begin_write().await?;
                let cursor_now: Option<(i64,)> =
                    sqlx::query_as(current).bind(org.as_str()).fetch_optional(&mut *tx).await?;
                // Removed since the caller read it: nothing is owed.
                let Some((cursor_now,)) = cursor_now else { return Ok(()) };
                for d in deliveries.iter().filter(|d| d.audit_seq > cursor_now) {
                    sqlx::query(
                        "INSERT INTO webhook_deliveries (id, org, audit_seq, event_type, payload, status, attempts, \
                         next_attempt_at, lease_until, created_at, updated_at) \
                         VALUES ($1, $2, $3, $4, $5, 'pending', 0, $6, 0, $6, $6) ON CONFLICT DO NOTHING",
                    )
                    .bind(d.id.as_str())
                    .bind(org.as_str())
                    .bind(d.audit_seq)
                    .bind(d.event_type.as_str())
                    .bind(d.payload.as_str())
                    .bind(now)
                    .execute(&mut *tx)
                    .await?;
                }
                sqlx::query("UPDATE webhooks SET audit_cursor = $2 WHERE org = $1 AND audit_cursor < $2")
                    .bind(org.as_str())
                    .bind(cursor)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok::<_, sqlx::Error>(())
            }
            .await
        })
        .map_err(store)
    }

    async fn lease_due(
        &self,
        now: Timestamp,
        lease_until: Timestamp,
        limit: u32,
        per_org: u32,
        busy: &[(OrgId, u32)],
    ) -> Result<Vec<DueDelivery>, WebhookStoreError> {
        let (now, until) = (now.unix_millis(), lease_until.unix_millis());
        // The candidates: the oldest due, at most `per_org` of each org. An org with
        // attempts under way may take fewer (`allowance` below), so enough more are read
        // that the others still fill `limit`: an org's rows past its allowance are at most
        // what it has under way.
        let allowance = |org: &str| {
            let under_way = busy.iter().find(|(o, _)| o.as_str() == org).map_or(0, |(_, n)| *n);
            per_org.saturating_sub(under_way)
        };
        let extra: u64 = busy.iter().map(|(_, n)| u64::from((*n).min(per_org))).sum();
        let candidates = "SELECT id, org FROM (SELECT id, org, next_attempt_at, created_at, ROW_NUMBER() OVER \
                          (PARTITION BY org ORDER BY next_attempt_at, created_at) AS n FROM webhook_deliveries \
                          WHERE status = 'pending' AND next_attempt_at <= $1 AND lease_until < $1) due \
                          WHERE n <= $2 ORDER BY next_attempt_at, created_at LIMIT $3";
        // Each row is leased only if no one leased it since it was read: of two replicas
        // that read the same rows, one leases each, and the other reads again (a few times)
        // for what it lost.
        let mut leased: Vec<(String, String)> = Vec::new();
        for _ in 0..LEASE_TRIES {
            let want = (limit as usize).saturating_sub(leased.len());
            if want == 0 {
                break;
            }
            let read_limit = i64::try_from(want as u64 + extra).unwrap_or(i64::MAX);
            let rows: Vec<(String, String)> = with_pool!(read &self.backend, p => {
                sqlx::query_as(candidates).bind(now).bind(i64::from(per_org)).bind(read_limit).fetch_all(p).await
            })
            .map_err(store)?;
            let mut taken: HashMap<&str, u32> = HashMap::new();
            for (_, org) in &leased {
                *taken.entry(org.as_str()).or_insert(0) += 1;
            }
            let mut chosen: Vec<&str> = Vec::new();
            for (id, org) in &rows {
                if chosen.len() >= want {
                    break;
                }
                let n = taken.entry(org.as_str()).or_insert(0);
                if *n < allowance(org) {
                    *n += 1;
                    chosen.push(id);
                }
            }
            if chosen.is_empty() {
                break;
            }
            let placeholders: Vec<String> = (0..chosen.len()).map(|i| format!("${}", i + 3)).collect();
            let sql = format!(
                "UPDATE webhook_deliveries SET lease_until = $2 WHERE id IN ({}) AND lease_until < $1 \
                 AND status = 'pending' RETURNING id, org",
                placeholders.join(", ")
            );
            let won: Vec<(String, String)> = with_pool!(write &self.backend, p => {
                let mut query = sqlx::query_as(sqlx::AssertSqlSafe(sql.clone())).bind(now).bind(until);
                for id in &chosen {
                    query = query.bind(*id);
                }
                query.fetch_all(p).await
            })
            .map_err(store)?;
            let lost = won.len() < chosen.len();
            leased.extend(won);
            if !lost {
                break;
            }
        }
        let mut due = Vec::with_capacity(leased.len());
        for (id, _) in leased {
            match self.leased(&id, now).await {
                Ok(Some(delivery)) => due.push(delivery),
                Ok(None) => {}
                // One row's trouble is its own: the rest of the batch still goes out.
                Err(e) => {
                    tracing::error!(delivery = %id, error = %e, "webhooks: a leased delivery cannot be read; skipped until its lease lapses")
                }
            }
        }
        Ok(due)
    }

    async fn record_attempt(
        &self,
        id: &str,
        leased_until: Timestamp,
        result: &AttemptResult,
        now: Timestamp,
    ) -> Result<bool, WebhookStoreError> {
        // A lease's end is its holder's mark: a later lease of the same row ends later
        // (it is taken only once the earlier one has lapsed).
        with_pool!(write &self.backend, p => {
            sqlx::query(
                "UPDATE webhook_deliveries SET status = $2, attempts = attempts + 1, next_attempt_at = $3, \
                 lease_until = 0, last_status = $4, last_error = $5, updated_at = $6 \
                 WHERE id = $1 AND status = 'pending' AND lease_until = $7",
            )
            .bind(id)
            .bind(result.status.as_str())
            .bind(result.next_attempt_at.unix_millis())
            .bind(result.http_status.map(i64::from))
            .bind(result.error.as_deref())
            .bind(now.unix_millis())
            .bind(leased_until.unix_millis())
            .execute(p)
            .await
            .map(|done| done.rows_affected() == 1)
        })
        .map_err(store)
    }

    async fn prune(&self, ended_before: Timestamp, limit: u32) -> Result<u64, WebhookStoreError> {
        // `status <> 'pending'` as the partial index `webhook_deliveries_ended` says it. On
        // PostgreSQL, rows another replica's prune holds are left to it (no wait on its locks).
        let pick = "SELECT id FROM webhook_deliveries WHERE status <> 'pending' AND updated_at < $1 \
                    ORDER BY updated_at LIMIT $2";
        let skip = if matches!(self.backend, Backend::Postgres(..)) { " FOR UPDATE SKIP LOCKED" } else { "" };
        let sql = format!("DELETE FROM webhook_deliveries WHERE id IN ({pick}{skip})");
        with_pool!(write &self.backend, p => {
            sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
                .bind(ended_before.unix_millis())
                .bind(i64::from(limit))
                .execute(p)
                .await
                .map(|done| done.rows_affected())
        })
        .map_err(store)
    }

    async fn deliveries(
        &self,
        org: &OrgId,
        before_seq: Option<i64>,
        limit: u32,
    ) -> Result<Vec<DeliveryRecord>, WebhookStoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM webhook_deliveries d WHERE d.org = $1 AND d.audit_seq < $3 \
             ORDER BY d.audit_seq DESC LIMIT $2"
        );
        let rows: Vec<Row> = with_pool!(read &self.backend, p => {
            sqlx::query_as(sqlx::AssertSqlSafe(sql.clone()))
                .bind(org.as_str())
                .bind(i64::from(limit))
                .bind(before_seq.unwrap_or(i64::MAX))
                .fetch_all(p)
                .await
        })
        .map_err(store)?;
        rows.into_iter().map(Row::record).collect()
    }
}
