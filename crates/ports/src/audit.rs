//! The tamper-evident audit log.

use async_trait::async_trait;

use crate::Cause;
use domain::{AuditEvent, OrgId, Timestamp};

/// One stored event with its sequence number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEntry {
    /// Position in the log (ascending, not necessarily contiguous).
    pub seq: i64,
    /// The event.
    pub event: AuditEvent,
    /// Whether a seal covers it yet.
    pub sealed: bool,
}

/// A page of events, oldest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditPage {
    /// The events.
    pub entries: Vec<AuditEntry>,
    /// The `after` to pass for the next page. Never beyond a sequence number below which
    /// an event could still commit, so a reader following it sees every event once.
    pub next: i64,
}

/// What one sealing pass did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SealReport {
    /// Rows sealed by this pass.
    pub rows: u64,
    /// Seals written by this pass (0 or 1).
    pub seals: u64,
}

/// How far sealing lags behind appends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SealStatus {
    /// Rows not yet sealed.
    pub unsealed: u64,
    /// When the oldest unsealed row was appended.
    pub oldest_unsealed: Option<Timestamp>,
}

/// The first record verification found bad.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRecord {
    /// What it is: `row 17`, `seal 3`.
    pub record: String,
    /// What is wrong with it.
    pub reason: String,
}

/// The result of verifying the whole log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyReport {
    /// Rows checked.
    pub rows: u64,
    /// Seals checked.
    pub seals: u64,
    /// Rows appended but not yet sealed (checked for their hash only).
    pub unsealed: u64,
    /// The first bad record, or `None` when the log is intact.
    pub first_bad: Option<BadRecord>,
}

impl VerifyReport {
    /// Whether the log is intact.
    pub fn is_intact(&self) -> bool {
        self.first_bad.is_none()
    }
}

/// Why an audit call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuditError {
    /// The store failed; the event MUST be treated as not written.
    #[error("audit store: {0}")]
    Store(#[source] Cause),
    /// The audit signing key is missing or unusable.
    #[error("audit key: {0}")]
    Key(#[source] Cause),
}

/// The append-only, sealed, verifiable audit log.
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
#[async_trait]
pub trait AuditLog: Send + Sync {
    /// Appends one event durably and returns its sequence number. When this returns `Ok`
    /// the event is stored; it is sealed by a later [`AuditLog::seal`].
    ///
    /// # Errors
    /// [`AuditError::Store`] when it was not stored.
    async fn append(&self, event: &AuditEvent) -> Result<i64, AuditError>;

    /// Up to `limit` events of `org` with `seq > after`, oldest first, and only events at
    /// or below the log's *watermark*: a sequence number below which no event can still
    /// commit. A reader that starts at `after = 0` and follows `next` MUST see every event
    /// of the org exactly once, in `seq` order, however many writers commit concurrently
    /// and in whatever order they commit. An event appended but not yet below the
    /// watermark appears on a later page.
    ///
    /// # Errors
    /// [`AuditError::Store`].
    async fn page(&self, org: &OrgId, after: i64, limit: u32) -> Result<AuditPage, AuditError>;

    /// Seals every unsealed row in one signed seal chained to the previous one, if this
    /// process can take the sealer's role (one sealer at a time across replicas);
    /// otherwise does nothing and returns an empty report.
    ///
    /// # Errors
    /// [`AuditError`].
    async fn seal(&self) -> Result<SealReport, AuditError>;

    /// How many rows wait for a seal, and since when: the rows the sealer can still seal
    /// (a row older than the late-append grace that no seal covers is verify's to name, not
    /// a backlog), counted up to a cap. It reads only the log's tail, so a caller may poll it
    /// (`/metrics` does on every scrape).
    ///
    /// # Errors
    /// [`AuditError::Store`].
    async fn seal_status(&self) -> Result<SealStatus, AuditError>;

    /// Recomputes every row hash, seal link and signature; names the first bad record.
    ///
    /// # Errors
    /// [`AuditError`] when the log cannot be read (a bad log is an `Ok` report).
    async fn verify(&self) -> Result<VerifyReport, AuditError>;
}
