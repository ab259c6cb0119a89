//! An audit stream written one event at a time in bursts, then counted in summaries
//! ([`ThrottledAudit`]): the egress decisions and the brokered secrets' uses each have one,
//! so a hammering sandbox can flood neither the log nor the audit.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use domain::egress::{AuditThrottle, Destination, Summary};
use domain::{AuditAction, AuditEvent, AuditOutcome, SandboxId};
use ports::{AuditLog, Clock};
use tracing::{info, warn};

/// What an event passed to [`ThrottledAudit::admit`] became.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Recorded {
    /// Written one by one.
    Written,
    /// Counted, to be written in a summary.
    Counted,
    /// It should have been written and could not be.
    Failed,
}

/// How the summaries of one stream read.
#[derive(Debug, Clone, Copy)]
pub(super) struct Wording {
    /// The action of a summary event (`None`: the counted events' own).
    pub summary_action: Option<AuditAction>,
    /// What is counted: `decisions`, `uses`.
    pub counted: &'static str,
    /// What the sandbox's cap covers (the throttle's catch-all destination `*`).
    pub past_cap: &'static str,
    /// Whether a destination shows its port.
    pub with_port: bool,
    /// Whether the refusals a summary counts are logged with it (each was not).
    pub log_refusals: bool,
}

/// One throttled audit stream (see the module's documentation).
pub(super) struct ThrottledAudit {
    audit: Arc<dyn AuditLog>,
    clock: Arc<dyn Clock>,
    wording: Wording,
    throttle: Mutex<AuditThrottle<SandboxId>>,
    /// The latest event of each sandbox with events counted: what its summaries carry.
    templates: Mutex<HashMap<SandboxId, AuditEvent>>,
}

impl ThrottledAudit {
    /// A stream of `burst` events per destination and `sandbox_cap` per sandbox in each
    /// window of `window_ms`.
    pub fn new(
        audit: Arc<dyn AuditLog>,
        clock: Arc<dyn Clock>,
        wording: Wording,
        (burst, sandbox_cap, window_ms): (u32, u32, i64),
    ) -> Self {
        Self {
            audit,
            clock,
            wording,
            throttle: Mutex::new(AuditThrottle::new(burst, sandbox_cap, window_ms)),
            templates: Mutex::new(HashMap::new()),
        }
    }

    /// The stream's clock (events are stamped with it).
    pub fn now(&self) -> domain::Timestamp {
        self.clock.now()
    }

    /// Writes `event` about `destination`, or counts it for a summary; writes the
    /// summaries whose windows ended meanwhile.
    pub async fn admit(&self, event: &AuditEvent, destination: &Destination<SandboxId>) -> Recorded {
        let (write, due) = self
            .throttle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .admit(destination, event.at.unix_millis());
        self.templates
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(destination.sandbox.clone(), event.clone());
        self.write_summaries(due).await;
        if !write {
            return Recorded::Counted;
        }
        match self.audit.append(event).await {
            Ok(_) => Recorded::Written,
            Err(e) => {
                warn!(sandbox = %destination.sandbox, error = %e, counted = self.wording.counted, "egress: cannot write an audit event");
                Recorded::Failed
            }
        }
    }

    /// How many destinations the throttle holds (bounded by its caps).
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.throttle.lock().unwrap_or_else(PoisonError::into_inner).held()
    }

    /// Writes the summaries whose windows have ended.
    pub async fn flush(&self) {
        let now = self.clock.now().unix_millis();
        let due = self.throttle.lock().unwrap_or_else(PoisonError::into_inner).flush(now);
        self.write_summaries(due).await;
    }

    /// Writes the open summaries of a sandbox that ended, and forgets it.
    pub async fn forget(&self, sandbox: &SandboxId) {
        let due = self.throttle.lock().unwrap_or_else(PoisonError::into_inner).drain_sandbox(sandbox);
        self.write_summaries(due).await;
        self.templates.lock().unwrap_or_else(PoisonError::into_inner).remove(sandbox);
    }

    async fn write_summaries(&self, due: Vec<Summary<SandboxId>>) {
        let w = self.wording;
        for summary in due {
            let template = self
                .templates
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(&summary.destination.sandbox)
                .cloned();
            let Some(mut event) = template else { continue };
            let d = &summary.destination;
            let what = match (d.host.as_str(), w.with_port) {
                ("*", _) => w.past_cap.to_owned(),
                (host, true) => format!("{host}:{}", d.port),
                (host, false) => host.to_owned(),
            };
            if let Some(action) = w.summary_action {
                event.action = action;
            }
            event.outcome = if d.allowed { AuditOutcome::Allowed } else { AuditOutcome::Refused };
            event.message = format!(
                "{} more {} {} for {what} since {} (counted, not written one by one)",
                summary.count,
                if d.allowed { "allowed" } else { "refused" },
                w.counted,
                domain::Timestamp::from_unix_millis(summary.since_ms).to_rfc3339()
            );
            event.at = self.clock.now();
            if w.log_refusals && !d.allowed {
                info!(
                    sandbox = %d.sandbox, org = %event.key.org(), count = summary.count, destinations = %what,
                    "egress refusals counted"
                );
            }
            if let Err(e) = self.audit.append(&event).await {
                warn!(sandbox = %d.sandbox, error = %e, count = summary.count, "egress: cannot write an audit summary");
            }
        }
    }
}
