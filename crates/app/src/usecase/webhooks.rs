//! Webhooks: an org's receiver is told of its sandboxes' lives, signed per the Standard
//! Webhooks specification, at least once.
//!
//! **Where the events come from.** Every event a webhook carries is already written, once,
//! durably and in order, to the audit log (each ensure, suspension, resume, deprovision,
//! quota refusal, egress refusal and snapshot writes its audit event). So deliveries are
//! derived from the log: each replica, every `webhooks.interval_ms`, reads each org's
//! events past the org's cursor (only below the log's watermark, so no event that commits
//! late is skipped), turns those of a webhook type into outbox rows (one per audit seq,
//! whichever replica writes it first) and moves the cursor, in one transaction. There is
//! no second write on the request path and nothing to keep in step with the audit
//! append; an event is delivered iff it was audited.
//!
//! **Delivery.** A replica leases the rows due (a lease in the row, taken by one
//! statement: no two replicas attempt one delivery at once), posts each with its
//! `webhook-id`, `webhook-timestamp` and `webhook-signature`, and records the attempt: a
//! 2xx answer delivers it; anything else is tried again after a wait doubling from
//! `webhooks.backoff_initial_ms` up to `webhooks.backoff_max_ms`, until
//! `webhooks.max_attempts` (then `failed`). A replica that dies mid-attempt leaves a lease
//! that lapses, and another replica sends it again: at least once.
//!
//! **One org's receiver never slows the others'.** A pass waits for its attempts for
//! [`PASS_WAIT`] at most; slower ones go on and keep their places ([`InFlight`]), so a
//! receiver that holds every attempt until its timeout does not hold the next pass. A
//! pass leases only what the batch has room for, and of an org only its share less what
//! it has under way, so an org with its share under way has no more leased (nor started)
//! until one ends, and its older backlog never takes another org's place.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use domain::{AuditAction, AuditOutcome, OrgId, SecretValue, Timestamp};
use hmac::{KeyInit as _, Mac as _};
use ports::{
    AttemptResult, AuditEntry, AuditLog, Clock, DeliveryRecord, DeliveryStatus, DueDelivery, NewDelivery,
    SendError, WebhookSender, WebhookStore, WebhookStoreError,
};
use serde_json::json;
use tracing::{Instrument as _, info, info_span, warn};

/// Every event type a webhook carries.
pub const EVENT_TYPES: [&str; 8] = [
    "sandbox.ready",
    "sandbox.failed",
    "sandbox.suspended",
    "sandbox.resumed",
    "sandbox.deprovisioned",
    "quota.refused",
    "egress.refused",
    "snapshot.created",
];

/// The prefix of a signing secret.
pub const SECRET_PREFIX: &str = "whsec_";

/// The webhook event type of an audit event, if it is one.
pub fn event_type(action: AuditAction, outcome: AuditOutcome) -> Option<&'static str> {
    use AuditAction as A;
    use AuditOutcome as O;
    Some(match (action, outcome) {
        (_, O::QuotaExceeded) => "quota.refused",
        (A::Ensure | A::Recover | A::Fork, O::Provisioned | O::Adopted) => "sandbox.ready",
        (_, O::Resumed) => "sandbox.resumed",
        (A::Ensure | A::Recover | A::Fork | A::Resume, O::Failed) => "sandbox.failed",
        (A::Suspend, O::Suspended) => "sandbox.suspended",
        (A::Deprovision, O::Deprovisioned | O::Expired) => "sandbox.deprovisioned",
        (A::Egress, O::Refused) => "egress.refused",
        (A::Snapshot, O::Taken) => "snapshot.created",
        _ => return None,
    })
}

/// The delivery of an audit entry, when it is of a webhook type: its id (`msg_` and the
/// audit seq: the same whichever replica makes it) and its body.
pub fn delivery_of(entry: &AuditEntry) -> Option<NewDelivery> {
    let e = &entry.event;
    let kind = event_type(e.action, e.outcome)?;
    let payload = json!({
        "type": kind,
        "timestamp": e.at.to_rfc3339(),
        "data": {
            "org": e.org().as_str(),
            "sandbox_id": e.sandbox_id.as_ref().map(|s| s.as_str()),
            "kind": e.key.kind().as_str(),
            "key": e.key.key(),
            "action": e.action.as_str(),
            "outcome": e.outcome.as_str(),
            "caller_id": e.caller_id.as_str(),
            "caller_class": e.caller_class.as_str(),
            "message": e.message,
            "audit_seq": entry.seq,
        },
    });
    Some(NewDelivery {
        id: delivery_id(entry.seq),
        audit_seq: entry.seq,
        event_type: kind.to_owned(),
        payload: payload.to_string(),
    })
}

/// The id of the delivery of audit event `seq`: `msg_` and the seq.
pub fn delivery_id(seq: i64) -> String {
    format!("{DELIVERY_ID_PREFIX}{seq}")
}

/// The audit seq a delivery id names, if it is one.
pub fn seq_of_delivery_id(id: &str) -> Option<i64> {
    let digits = id.strip_prefix(DELIVERY_ID_PREFIX)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

const DELIVERY_ID_PREFIX: &str = "msg_";

/// A new signing secret: `whsec_` and the base64 of 32 random bytes.
///
/// # Errors
/// When the system has no randomness.
pub fn new_secret() -> Result<SecretValue, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(SecretValue::new(format!("{SECRET_PREFIX}{}", STANDARD.encode(bytes))))
}

/// Why a signature could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the webhook secret is not `whsec_` and base64")]
pub struct BadSecret;

/// The `webhook-signature` of a message (Standard Webhooks, v1): `v1,` and the base64 of
/// the HMAC-SHA256 of `{id}.{timestamp}.{body}` keyed by the secret's base64-decoded bytes.
///
/// # Errors
/// [`BadSecret`].
pub fn signature(secret: &SecretValue, id: &str, timestamp: i64, body: &str) -> Result<String, BadSecret> {
    let encoded = secret.expose().strip_prefix(SECRET_PREFIX).unwrap_or(secret.expose());
    let key = STANDARD.decode(encoded).map_err(|_| BadSecret)?;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&key).map_err(|_| BadSecret)?;
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body.as_bytes());
    Ok(format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes())))
}

/// How deliveries are retried and held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeliveryPolicy {
    /// The wait after the first failure, doubled after each.
    pub backoff_initial: Duration,
    /// The longest wait.
    pub backoff_max: Duration,
    /// Attempts before giving up.
    pub max_attempts: u32,
    /// How long an attempt holds its delivery.
    pub lease: Duration,
    /// How long a delivery that ended (delivered, or given up) is kept, for the list of
    /// deliveries; then [`prune_pass`] deletes it.
    pub retention: Duration,
}

impl DeliveryPolicy {
    /// The wait after `failures` failed attempts (1 or more).
    pub fn backoff(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(30);
        self.backoff_initial.saturating_mul(1 << doublings).min(self.backoff_max)
    }
}

/// What the webhook passes and routes need.
#[derive(Clone)]
pub struct WebhookDeps {
    /// The webhooks and outbox.
    pub store: Arc<dyn WebhookStore>,
    /// Where the events come from.
    pub audit: Arc<dyn AuditLog>,
    /// Who posts them.
    pub sender: Arc<dyn WebhookSender>,
    /// The clock.
    pub clock: Arc<dyn Clock>,
    /// Retries.
    pub policy: DeliveryPolicy,
    /// Where attempts are counted (`sandlane_webhook_attempts_total`), when served.
    pub metrics: Option<Arc<crate::metrics::Metrics>>,
    /// The attempts under way on this replica, over passes.
    pub in_flight: Arc<InFlight>,
}

/// The attempts under way on this replica, by org (each holds a place until it ends).
pub type InFlight = super::places::Places<OrgId>;

/// Why setting a webhook failed.
#[derive(Debug, thiserror::Error)]
pub enum SetWebhookError {
    /// The URL is refused.
    #[error("{0}")]
    Refused(#[source] SendError),
    /// No randomness for the secret.
    #[error("cannot make a signing secret: {0}")]
    Entropy(getrandom::Error),
    /// The store failed.
    #[error("cannot store the webhook")]
    Store(#[source] WebhookStoreError),
}

/// Sets `org`'s receiver to `url` with a new signing secret, returned (to be shown once).
/// Only events audited from now on are delivered.
///
/// # Errors
/// [`SetWebhookError`].
pub async fn set_webhook(deps: &WebhookDeps, org: &OrgId, url: &str) -> Result<SecretValue, SetWebhookError> {
    deps.sender.check(url).await.map_err(SetWebhookError::Refused)?;
    let secret = new_secret().map_err(SetWebhookError::Entropy)?;
    deps.store.set(org, url, &secret, deps.clock.now()).await.map_err(SetWebhookError::Store)?;
    info!(org = %org, "webhook set");
    Ok(secret)
}

/// Removes `org`'s webhook (its pending deliveries are given up); whether it had one.
///
/// # Errors
/// [`WebhookStoreError`].
pub async fn remove_webhook(deps: &WebhookDeps, org: &OrgId) -> Result<bool, WebhookStoreError> {
    let removed = deps.store.remove(org, deps.clock.now()).await?;
    info!(org = %org, removed, "webhook removed");
    Ok(removed)
}

/// `org`'s deliveries, newest first.
///
/// # Errors
/// [`WebhookStoreError`].
pub async fn list_deliveries(
    deps: &WebhookDeps,
    org: &OrgId,
    before_seq: Option<i64>,
    limit: u32,
) -> Result<Vec<DeliveryRecord>, WebhookStoreError> {
    deps.store.deliveries(org, before_seq, limit).await
}

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Deliveries made from audit events (by this replica or another: counted as read).
    pub queued: u64,
    /// Attempts answered 2xx.
    pub delivered: u64,
    /// Attempts that failed (to be tried again, or given up).
    pub failed: u64,
    /// Attempts still under way when the pass stopped waiting for them.
    pub running: u64,
    /// Deliveries leased but not attempted: their org had its share under way.
    pub deferred: u64,
}

/// How long a pass waits for its attempts before it lets them go on alone.
pub const PASS_WAIT: Duration = Duration::from_secs(1);

/// The most audit events read per org and pass, and deliveries attempted per pass.
const PAGE: u32 = 200;
const BATCH: u32 = 32;
/// The fewest places of a pass one org may take: its share is the batch split between
/// the orgs with a webhook, but never less than this.
const MIN_SHARE: u32 = 4;

/// How many of the batch's places an org may take when `orgs` have a webhook: the whole
/// batch for one org, an equal share for several (at least [`MIN_SHARE`]), counting its
/// attempts still under way from earlier passes.
fn org_share(orgs: usize) -> u32 {
    let orgs = u32::try_from(orgs.max(1)).unwrap_or(u32::MAX);
    (BATCH / orgs).max(MIN_SHARE)
}

/// One pass: new audit events into the outbox, then the deliveries due attempted.
pub async fn webhook_pass(deps: &WebhookDeps) -> PassReport {
    let mut report = PassReport::default();
    let mut orgs = 1;
    match deps.store.list().await {
        Ok(hooks) => {
            orgs = hooks.len();
            for hook in hooks {
                match deps.audit.page(&hook.org, hook.cursor, PAGE).await {
                    Ok(page) if page.next > hook.cursor => {
                        let deliveries: Vec<NewDelivery> =
                            page.entries.iter().filter_map(delivery_of).collect();
                        report.queued += deliveries.len() as u64;
                        if let Err(e) =
                            deps.store.enqueue(&hook.org, &deliveries, page.next, deps.clock.now()).await
                        {
                            warn!(org = %hook.org, error = %crate::usecase::chain(&e), "webhooks: cannot queue deliveries");
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        warn!(org = %hook.org, error = %crate::usecase::chain(&e), "webhooks: cannot read the audit log")
                    }
                }
            }
        }
        Err(e) => warn!(error = %crate::usecase::chain(&e), "webhooks: cannot list the webhooks"),
    }
    let room = BATCH.saturating_sub(deps.in_flight.total());
    if room == 0 {
        return report;
    }
    let share = org_share(orgs);
    let now = deps.clock.now();
    let lease_until = now.plus_millis(i64::try_from(deps.policy.lease.as_millis()).unwrap_or(i64::MAX));
    let busy = deps.in_flight.held_by_all();
    let due = match deps.store.lease_due(now, lease_until, room, share, &busy).await {
        Ok(due) => due,
        Err(e) => {
            warn!(error = %crate::usecase::chain(&e), "webhooks: cannot lease deliveries");
            return report;
        }
    };
    let (done_tx, mut done) = tokio::sync::mpsc::unbounded_channel();
    let mut started = 0u64;
    for delivery in due {
        let org = delivery.record.org.clone();
        let Some(attempting) = deps.in_flight.take(&org, share) else {
            // Its receiver holds its share already: this one waits for its lease to lapse.
            report.deferred += 1;
            continue;
        };
        let (deps, done_tx) = (deps.clone(), done_tx.clone());
        tokio::spawn(async move {
            let ok = attempt(&deps, delivery, lease_until).await;
            drop(attempting);
            let _ = done_tx.send(ok);
        });
        started += 1;
    }
    drop(done_tx);
    let (mut delivered, mut failed) = (0u64, 0u64);
    let _ = tokio::time::timeout(PASS_WAIT, async {
        while let Some(ok) = done.recv().await {
            if ok {
                delivered += 1;
            } else {
                failed += 1;
            }
        }
    })
    .await;
    report.delivered = delivered;
    report.failed = failed;
    report.running = started.saturating_sub(delivered + failed);
    report
}

/// How often each replica prunes the deliveries past their retention.
pub const PRUNE_INTERVAL: Duration = Duration::from_secs(60);
/// The most deliveries one statement of a prune deletes, and the most statements of one
/// pass: a pass deletes at most 50,000 rows, in short transactions, and the next pass
/// goes on where it stopped.
const PRUNE_BATCH: u32 = 1_000;
const PRUNE_STATEMENTS: u32 = 50;

/// The deliveries that ended more than the retention ago deleted (pending ones are never
/// pruned): how many. Every replica runs it; two at once delete each row once.
pub async fn prune_pass(deps: &WebhookDeps) -> u64 {
    let retention = i64::try_from(deps.policy.retention.as_millis()).unwrap_or(i64::MAX);
    let ended_before = Timestamp::from_unix_millis(deps.clock.now().unix_millis().saturating_sub(retention));
    let mut pruned = 0;
    for _ in 0..PRUNE_STATEMENTS {
        match deps.store.prune(ended_before, PRUNE_BATCH).await {
            Ok(n) => {
                pruned += n;
                if n < u64::from(PRUNE_BATCH) {
                    break;
                }
            }
            Err(e) => {
                warn!(error = %crate::usecase::chain(&e), "webhooks: cannot prune the ended deliveries");
                break;
            }
        }
    }
    pruned
}

/// One attempt of one delivery leased until `leased_until`, recorded; whether it was
/// delivered.
async fn attempt(deps: &WebhookDeps, due: DueDelivery, leased_until: Timestamp) -> bool {
    let record = &due.record;
    let span = info_span!(
        "webhook_delivery",
        org = %record.org,
        event_type = %record.event_type,
        attempt = record.attempts + 1,
        outcome = tracing::field::Empty,
    );
    async {
        let now = deps.clock.now();
        let timestamp = now.unix_secs();
        let sent = match signature(&due.secret, &record.id, timestamp, &due.payload) {
            Ok(signature) => {
                let headers = vec![
                    ("webhook-id".to_owned(), record.id.clone()),
                    ("webhook-timestamp".to_owned(), timestamp.to_string()),
                    ("webhook-signature".to_owned(), signature),
                ];
                deps.sender.send(&due.url, &headers, &due.payload).await
            }
            Err(e) => Err(SendError::Refused(e.to_string())),
        };
        let failures = record.attempts + 1;
        let after = deps.clock.now();
        let (ok, http_status, error) = match sent {
            Ok(status) if (200..300).contains(&status) => (true, Some(status), None),
            Ok(status) => (false, Some(status), Some(format!("the receiver answered {status}"))),
            Err(e) => (false, None, Some(e.to_string())),
        };
        let status = if ok {
            DeliveryStatus::Delivered
        } else if failures >= deps.policy.max_attempts {
            DeliveryStatus::Failed
        } else {
            DeliveryStatus::Pending
        };
        let wait = i64::try_from(deps.policy.backoff(failures).as_millis()).unwrap_or(i64::MAX);
        let result = AttemptResult { status, next_attempt_at: after.plus_millis(wait), http_status, error };
        tracing::Span::current().record("outcome", status.as_str());
        if let Some(metrics) = &deps.metrics {
            metrics.observe_webhook_attempt(match status {
                DeliveryStatus::Delivered => "delivered",
                DeliveryStatus::Pending => "retry",
                DeliveryStatus::Failed => "failed",
            });
        }
        if !ok {
            warn!(error = result.error.as_deref().unwrap_or(""), next = %result.next_attempt_at, "webhook attempt failed");
        }
        match deps.store.record_attempt(&record.id, leased_until, &result, after).await {
            Ok(true) => {}
            // The attempt outlasted its lease and another replica has the delivery now (its
            // attempt is the one recorded; the receiver may get both, and dedupes), or the
            // org's webhook was removed meanwhile (its deliveries given up).
            Ok(false) => warn!(
                "webhooks: an attempt was not recorded: its lease lapsed and another replica took the delivery, \
                 or the webhook was removed meanwhile"
            ),
            Err(e) => warn!(error = %crate::usecase::chain(&e), "webhooks: cannot record an attempt"),
        }
        ok
    }
    .instrument(span)
    .await
}

/// The delivery time of a record, for views.
pub fn rfc3339(t: Timestamp) -> String {
    t.to_rfc3339()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_the_specifications() {
        // The Standard Webhooks specification's own example.
        let secret = SecretValue::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
        let body = r#"{"test": 2432232314}"#;
        let got = signature(&secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1_614_265_330, body).unwrap();
        assert_eq!(got, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
        assert!(signature(&SecretValue::new("whsec_***"), "m", 1, "").is_err());
    }

    #[test]
    fn secrets_are_whsec_and_32_bytes() {
        let s = new_secret().unwrap();
        let bytes = STANDARD.decode(s.expose().strip_prefix(SECRET_PREFIX).unwrap()).unwrap();
        assert_eq!(bytes.len(), 32);
        assert_ne!(new_secret().unwrap().expose(), s.expose());
    }

    /// Receivers: one that holds every request (`hang` in its URL), others that answer
    /// 200 at once; every send is counted by URL.
    #[derive(Default)]
    struct Receivers(std::sync::Mutex<Vec<String>>);

    #[async_trait::async_trait]
    impl WebhookSender for Receivers {
        async fn check(&self, _url: &str) -> Result<(), SendError> {
            Ok(())
        }

        async fn send(
            &self,
            url: &str,
            _headers: &[(String, String)],
            _body: &str,
        ) -> Result<u16, SendError> {
            self.0.lock().unwrap().push(url.to_owned());
            if url.contains("hang") {
                std::future::pending::<()>().await;
            }
            Ok(200)
        }
    }

    /// Retries of 5 s to 60 s, 5 attempts, leases of 30 s, an hour's retention.
    const POLICY: DeliveryPolicy = DeliveryPolicy {
        backoff_initial: Duration::from_secs(5),
        backoff_max: Duration::from_secs(60),
        max_attempts: 5,
        lease: Duration::from_secs(30),
        retention: Duration::from_secs(3600),
    };

    /// The passes' ports over `store`, `audit` and `sender`, at `now` (ms), with [`POLICY`].
    fn deps_at(
        now: i64,
        store: ports::MockWebhookStore,
        audit: ports::MockAuditLog,
        sender: Arc<Receivers>,
    ) -> WebhookDeps {
        let mut clock = ports::MockClock::new();
        clock.expect_now().return_const(Timestamp::from_unix_millis(now));
        WebhookDeps {
            store: Arc::new(store),
            audit: Arc::new(audit),
            sender,
            clock: Arc::new(clock),
            policy: POLICY,
            metrics: None,
            in_flight: Arc::default(),
        }
    }

    fn due(org: &OrgId, n: u32) -> DueDelivery {
        let at = Timestamp::from_unix_millis(1);
        let url = if org.as_str() == "o0" { "https://hang.example/" } else { "https://ok.example/" };
        DueDelivery {
            record: DeliveryRecord {
                id: format!("msg_{org}_{n}"),
                org: org.clone(),
                audit_seq: i64::from(n),
                event_type: "sandbox.ready".to_owned(),
                status: DeliveryStatus::Pending,
                attempts: 0,
                next_attempt_at: at,
                last_status: None,
                last_error: None,
                created_at: at,
                updated_at: at,
            },
            payload: "{}".to_owned(),
            url: url.to_owned(),
            secret: SecretValue::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
        }
    }

    /// A receiver that holds every attempt until its timeout holds neither the pass nor
    /// the other orgs: the pass stops waiting after `PASS_WAIT`, the next one leases only
    /// what the batch has room for, and that org gets no attempt past its share while its
    /// share is under way.
    #[tokio::test(start_paused = true)]
    async fn a_receiver_that_hangs_holds_only_its_own_share() {
        let orgs: Vec<OrgId> = (0..10).map(|n| OrgId::parse(format!("o{n}")).unwrap()).collect();
        let (slow, fast) = (orgs[0].clone(), orgs[1].clone());
        let mut store = ports::MockWebhookStore::new();
        let hooks: Vec<ports::WebhookEntry> = orgs
            .iter()
            .map(|org| ports::WebhookEntry {
                org: org.clone(),
                url: String::new(),
                cursor: 5,
                updated_at: Timestamp::from_unix_millis(1),
            })
            .collect();
        store.expect_list().returning(move || Ok(hooks.clone()));
        // Ten orgs: a share of four each.
        assert_eq!(org_share(orgs.len()), 4);
        let mut seq = mockall::Sequence::new();
        let first: Vec<DueDelivery> = (0..4).map(|n| due(&slow, n)).chain([due(&fast, 0)]).collect();
        store
            .expect_lease_due()
            .withf(|_, _, limit, per_org, busy| *limit == BATCH && *per_org == 4 && busy.is_empty())
            .times(1)
            .in_sequence(&mut seq)
            .returning(move |_, _, _, _, _| Ok(first.clone()));
        let second = vec![due(&slow, 4), due(&fast, 1)];
        let slow_org = slow.clone();
        store
            .expect_lease_due()
            .withf(move |_, _, limit, _, busy| *limit == BATCH - 4 && busy == [(slow_org.clone(), 4)])
            .times(1)
            .in_sequence(&mut seq)
            .returning(move |_, _, _, _, _| Ok(second.clone()));
        store.expect_record_attempt().returning(|_, _, _, _| Ok(true));
        let mut audit = ports::MockAuditLog::new();
        audit
            .expect_page()
            .returning(|_, after, _| Ok(ports::AuditPage { entries: Vec::new(), next: after }));
        let receivers = Arc::new(Receivers::default());
        let deps = deps_at(1_000, store, audit, receivers.clone());

        let started = tokio::time::Instant::now();
        let one = webhook_pass(&deps).await;
        assert!(
            started.elapsed() <= PASS_WAIT,
            "the pass did not wait for the hung ones: {:?}",
            started.elapsed()
        );
        assert_eq!((one.delivered, one.running, one.deferred), (1, 4, 0), "{one:?}");
        assert_eq!(deps.in_flight.held(&slow), 4);

        let two = webhook_pass(&deps).await;
        assert_eq!((two.delivered, two.running, two.deferred), (1, 0, 1), "{two:?}");
        let sent = receivers.0.lock().unwrap().clone();
        assert_eq!(
            sent.iter().filter(|u| u.contains("hang")).count(),
            4,
            "no fifth attempt for the hung org"
        );
        assert_eq!(sent.iter().filter(|u| u.contains("ok")).count(), 2, "the other org's both delivered");
    }

    #[test]
    fn an_org_takes_the_whole_batch_alone_and_a_share_among_others() {
        assert_eq!(org_share(0), BATCH);
        assert_eq!(org_share(1), BATCH);
        assert_eq!(org_share(2), BATCH / 2);
        assert_eq!(org_share(4), 8);
        assert_eq!(org_share(100), MIN_SHARE);
    }

    /// A prune deletes what ended more than the retention ago, in batches until one comes
    /// back short, and stops at the first error (the next pass goes on).
    #[tokio::test]
    async fn a_prune_deletes_past_the_retention_in_batches() {
        for (answers, want_calls, want_pruned) in [
            (vec![Ok(1_000), Ok(1_000), Ok(3)], 3, 2_003),
            (vec![Ok(0)], 1, 0),
            (vec![Ok(1_000), Err(())], 2, 1_000),
        ] {
            let mut store = ports::MockWebhookStore::new();
            let answers = std::sync::Mutex::new(answers.into_iter());
            store.expect_prune().times(want_calls).returning(move |before, limit| {
                assert_eq!(
                    before,
                    Timestamp::from_unix_millis(10_000_000 - 3_600_000),
                    "now less the retention"
                );
                assert_eq!(limit, PRUNE_BATCH);
                answers
                    .lock()
                    .unwrap()
                    .next()
                    .unwrap()
                    .map_err(|()| ports::WebhookStoreError::Store(ports::Cause::msg("down")))
            });
            let deps = deps_at(10_000_000, store, ports::MockAuditLog::new(), Arc::new(Receivers::default()));
            assert_eq!(prune_pass(&deps).await, want_pruned);
        }
    }

    #[test]
    fn a_delivery_id_names_its_audit_seq_and_nothing_else_passes() {
        assert_eq!(delivery_id(42), "msg_42");
        assert_eq!(seq_of_delivery_id(&delivery_id(42)), Some(42));
        for bad in ["", "msg_", "msg_-1", "msg_+1", "msg_1x", "msg_99999999999999999999", "42", "MSG_1"] {
            assert_eq!(seq_of_delivery_id(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_backoff_doubles_up_to_its_cap() {
        let p = POLICY;
        let waits: Vec<u64> = (1..=6).map(|n| p.backoff(n).as_secs()).collect();
        assert_eq!(waits, [5, 10, 20, 40, 60, 60]);
        assert_eq!(p.backoff(200).as_secs(), 60);
    }

    #[test]
    fn event_types_follow_the_audit() {
        use AuditAction as A;
        use AuditOutcome as O;
        assert_eq!(event_type(A::Ensure, O::Provisioned), Some("sandbox.ready"));
        assert_eq!(event_type(A::Ensure, O::Adopted), Some("sandbox.ready"));
        assert_eq!(event_type(A::Ensure, O::Reused), None);
        assert_eq!(event_type(A::Ensure, O::Resumed), Some("sandbox.resumed"));
        assert_eq!(event_type(A::Resume, O::Resumed), Some("sandbox.resumed"));
        assert_eq!(event_type(A::Ensure, O::Failed), Some("sandbox.failed"));
        assert_eq!(event_type(A::Ensure, O::QuotaExceeded), Some("quota.refused"));
        assert_eq!(event_type(A::Suspend, O::Suspended), Some("sandbox.suspended"));
        assert_eq!(event_type(A::Deprovision, O::Deprovisioned), Some("sandbox.deprovisioned"));
        assert_eq!(event_type(A::Deprovision, O::Expired), Some("sandbox.deprovisioned"));
        assert_eq!(event_type(A::Deprovision, O::Absent), None);
        assert_eq!(event_type(A::Egress, O::Refused), Some("egress.refused"));
        assert_eq!(event_type(A::Egress, O::Allowed), None);
        assert_eq!(event_type(A::Snapshot, O::Taken), Some("snapshot.created"));
        assert_eq!(event_type(A::Refresh, O::Refreshed), None);
        let mut seen: Vec<&str> =
            A::ALL.iter().flat_map(|a| O::ALL.iter().filter_map(move |o| event_type(*a, *o))).collect();
        seen.sort_unstable();
        seen.dedup();
        let mut all = EVENT_TYPES.to_vec();
        all.sort_unstable();
        assert_eq!(seen, all, "every type is made by some audit event");
    }
}
