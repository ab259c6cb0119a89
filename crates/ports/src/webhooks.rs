//! Webhooks: per org, a receiver and its signing secret, a cursor over the org's audit log,
//! and the durable outbox of deliveries (leased by one replica at a time); and the sender
//! that posts one delivery.

use async_trait::async_trait;
use domain::{OrgId, SecretValue, Timestamp};

use crate::Cause;

/// An org's webhook as the store keeps it (the secret stays sealed in the store).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookEntry {
    /// The org.
    pub org: OrgId,
    /// The receiver's URL.
    pub url: String,
    /// The last audit sequence number of the org turned into deliveries.
    pub cursor: i64,
    /// When it was set.
    pub updated_at: Timestamp,
}

/// A delivery to make: one audit event of an org, as its JSON body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewDelivery {
    /// The message id (`msg_…`), the `webhook-id` of every attempt.
    pub id: String,
    /// The audit event's sequence number (one delivery per event).
    pub audit_seq: i64,
    /// The event's type (`sandbox.ready`, …).
    pub event_type: String,
    /// The body, exactly as sent.
    pub payload: String,
}

/// Where a delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryStatus {
    /// Not delivered yet; attempted again at `next_attempt_at`.
    Pending,
    /// A receiver answered 2xx.
    Delivered,
    /// Given up after the last attempt.
    Failed,
}

impl DeliveryStatus {
    /// `pending`, `delivered` or `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Delivered => "delivered",
            Self::Failed => "failed",
        }
    }

    /// The inverse of [`DeliveryStatus::as_str`].
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "pending" => Some(Self::Pending),
            "delivered" => Some(Self::Delivered),
            "failed" => Some(Self::Failed),
            _ => None,
        }
    }
}

/// A delivery as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryRecord {
    /// The message id.
    pub id: String,
    /// The org.
    pub org: OrgId,
    /// The audit event it carries.
    pub audit_seq: i64,
    /// The event's type.
    pub event_type: String,
    /// Where it stands.
    pub status: DeliveryStatus,
    /// Attempts made.
    pub attempts: u32,
    /// When it is attempted next (pending).
    pub next_attempt_at: Timestamp,
    /// The receiver's last HTTP status, when it answered.
    pub last_status: Option<u16>,
    /// Why the last attempt failed, in words (never the secret).
    pub last_error: Option<String>,
    /// When it was made.
    pub created_at: Timestamp,
    /// When it last changed.
    pub updated_at: Timestamp,
}

/// A delivery leased for one attempt, with what the attempt needs.
#[derive(Debug, Clone)]
pub struct DueDelivery {
    /// The record.
    pub record: DeliveryRecord,
    /// The body to send.
    pub payload: String,
    /// The org's receiver now.
    pub url: String,
    /// The org's signing secret now (`whsec_…`).
    pub secret: SecretValue,
}

/// How an attempt ended, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptResult {
    /// The status after it.
    pub status: DeliveryStatus,
    /// When to try again (pending).
    pub next_attempt_at: Timestamp,
    /// The receiver's HTTP status, if it answered.
    pub http_status: Option<u16>,
    /// The failure, in words.
    pub error: Option<String>,
}

/// Why a webhook store call failed. Never holds the secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WebhookStoreError {
    /// The store failed, or its sealing key is missing or cannot open a secret.
    #[error("webhook store: {0}")]
    Store(#[source] Cause),
}

/// The webhooks and their outbox.
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
#[async_trait]
pub trait WebhookStore: Send + Sync {
    /// Sets `org`'s receiver and secret. A new webhook's cursor starts at the org's last
    /// audit event, so only later events are delivered; one set over an existing webhook
    /// keeps its cursor, and what was owed (pending retries too) goes to the new URL with
    /// the new secret.
    ///
    /// # Errors
    /// [`WebhookStoreError::Store`].
    async fn set(
        &self,
        org: &OrgId,
        url: &str,
        secret: &SecretValue,
        now: Timestamp,
    ) -> Result<(), WebhookStoreError>;

    /// Removes `org`'s webhook; its pending deliveries are given up. `true` if it had one.
    ///
    /// # Errors
    /// [`WebhookStoreError::Store`].
    async fn remove(&self, org: &OrgId, now: Timestamp) -> Result<bool, WebhookStoreError>;

    /// Every org's webhook.
    ///
    /// # Errors
    /// [`WebhookStoreError::Store`].
    async fn list(&self) -> Result<Vec<WebhookEntry>, WebhookStoreError>;

    /// Adds `deliveries` of `org` (each made once per audit seq, whichever replica adds it
    /// first) and moves the org's cursor forward to `cursor` (never back), in one
    /// transaction. Only what the org's webhook, as it is when the transaction runs, is
    /// owed: nothing when it was removed since the caller read it, and no delivery at or
    /// before its cursor (a webhook set again since starts after the events before it).
    ///
    /// # Errors
    /// [`WebhookStoreError::Store`].
    async fn enqueue(
        &self,
        org: &OrgId,
        deliveries: &[NewDelivery],
        cursor: i64,
        now: Timestamp,
    ) -> Result<(), WebhookStoreError>;

    /// Leases up to `limit` pending deliveries due at `now` and not leased by anyone,
    /// until `lease_until`, oldest first and at most `per_org` of any one org less what
    /// `busy` says that org has under way already (an org whose receiver hangs never takes
    /// every place, nor a place another org could use): no two callers (replicas) get the
    /// same delivery while its lease lasts. A delivery whose webhook is gone is given up
    /// (failed); one that cannot be read (its secret does not open) is skipped, its lease
    /// left to lapse, and the others are still handed out.
    ///
    /// # Errors
    /// [`WebhookStoreError::Store`].
    async fn lease_due(
        &self,
        now: Timestamp,
        lease_until: Timestamp,
        limit: u32,
        per_org: u32,
        busy: &[(OrgId, u32)],
    ) -> Result<Vec<DueDelivery>, WebhookStoreError>;

    /// Records an attempt of delivery `id` and frees its lease, if the lease is still the
    /// one this caller took (`leased_until`, as given to [`Self::lease_due`]). Whether it
    /// was recorded: not when the lease lapsed and another caller leased the delivery
    /// since (that caller's attempt is the one that counts), nor when the delivery is no
    /// longer pending (its webhook was removed); the row is then left as it is.
    ///
    /// # Errors
    /// [`WebhookStoreError::Store`].
    async fn record_attempt(
        &self,
        id: &str,
        leased_until: Timestamp,
        result: &AttemptResult,
        now: Timestamp,
    ) -> Result<bool, WebhookStoreError>;

    /// Deletes up to `limit` deliveries that ended (delivered, or given up) before
    /// `ended_before`, oldest first; a pending delivery is never deleted, and one deleted is
    /// never queued again (its audit event is behind its org's cursor). How many were
    /// deleted.
    ///
    /// # Errors
    /// [`WebhookStoreError::Store`].
    async fn prune(&self, ended_before: Timestamp, limit: u32) -> Result<u64, WebhookStoreError>;

    /// `org`'s deliveries, newest first (by audit seq), up to `limit`, those of audit seqs
    /// below `before_seq` when given (the last seq of an earlier page: a page goes on from
    /// there even when that delivery has been pruned since).
    ///
    /// # Errors
    /// [`WebhookStoreError::Store`].
    async fn deliveries(
        &self,
        org: &OrgId,
        before_seq: Option<i64>,
        limit: u32,
    ) -> Result<Vec<DeliveryRecord>, WebhookStoreError>;
}

/// Why a webhook could not be sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The URL is not one the server may send to (its form, its scheme, or an address
    /// that is not public while private ones are not allowed).
    #[error("refused receiver: {0}")]
    Refused(String),
    /// The connection or the exchange failed, or took too long.
    #[error("{0}")]
    Failed(String),
}

/// Posts one webhook.
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
#[async_trait]
pub trait WebhookSender: Send + Sync {
    /// Checks `url` as [`WebhookSender::send`] would, without sending: its form, scheme,
    /// and (resolved) addresses.
    ///
    /// # Errors
    /// [`SendError::Refused`].
    async fn check(&self, url: &str) -> Result<(), SendError>;

    /// POSTs `body` (JSON) with `headers` to `url`; the receiver's HTTP status.
    ///
    /// # Errors
    /// [`SendError`].
    async fn send(&self, url: &str, headers: &[(String, String)], body: &str) -> Result<u16, SendError>;
}
