//! Egress: the gate the server's proxy asks for every destination a sandbox wants
//! ([`EgressService`], the [`EgressGate`] of the composition).
//!
//! Who may do this: the process inside a live sandbox, acting for the caller whose token
//! the sandbox holds now, so the rules are that caller's org's for that caller's class
//! ([`AllowlistSource`]). What a compromised sandbox can send: any host and port, any
//! name that resolves anywhere, any number of connections. So the host must be covered
//! by a rule; the name is resolved here, never by the sandbox, and only addresses outside
//! the refused ranges (or in a range the org names) are handed to the proxy; connections
//! and bytes are capped per sandbox; and every decision is audited (a burst one by one,
//! then counted in summaries, so a hammering sandbox cannot flood the log). The log lines
//! of refusals follow the audit: one per decision written one by one, one per summary; and
//! what the gate holds per sandbox does not grow with the names it asks for
//! ([`domain::egress::AuditThrottle`]). When the decision cannot be recorded, or the rules cannot be read,
//! the destination is refused.
//!
//! Brokered secrets ([`EgressService::with_secrets`]): once a destination is allowed, the
//! org's secrets for that host and port are read from the store (on every connection, so a
//! deleted secret or a revoked caller stops at the next connection on every replica), the
//! ones in scope for the caller the sandbox's token is for now are chosen
//! (`domain::broker::choose`), and, unless that caller is revoked, handed to the proxy with
//! a [`BrokerAudit`] that writes one event per use (throttled like the decisions). When the
//! secrets or the caller cannot be read, the destination is refused: never let through
//! without the secret it should carry.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use domain::egress::{Allowlist, Destination, normalize_host};
use domain::{
    AuditAction, AuditEvent, AuditOutcome, CallerClass, OrgId, SandboxId, SandboxRecord, SandboxState,
};
use ports::egress::{
    BrokerAudit, BrokerUse, Brokered, EgressBudget, EgressGate, EgressGrant, EgressRefusal, EgressRequest,
    Resolver,
};
use ports::{AuditLog, CallerDirectory, Clock, SandboxRegistry, SecretStore};
use tokio::time::Instant;
use tracing::{Instrument as _, info, info_span, warn};

use crate::metrics::Metrics;

mod throttled;

use throttled::{Recorded, ThrottledAudit, Wording};

/// Why an org's allowlist could not be read.
#[derive(Debug, thiserror::Error)]
#[error("the egress allowlist of org {org} cannot be read")]
pub struct AllowlistError {
    /// The org.
    pub org: OrgId,
    /// Why.
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

/// Where the allowlists come from: the org's policy, for a caller class.
#[async_trait]
pub trait AllowlistSource: Send + Sync {
    /// What sandboxes of `org` acting for a caller of `class` may reach.
    ///
    /// # Errors
    /// [`AllowlistError`] when the policy cannot be read (the destination is refused).
    async fn allowlist(&self, org: &OrgId, class: CallerClass) -> Result<Allowlist, AllowlistError>;
}

/// The org policies' egress rules (`egress_allow`), read through their cache (a change
/// holds within the cache's time to live, on every replica).
pub struct PolicyAllowlists(pub Arc<crate::usecase::Policies>);

#[async_trait]
impl AllowlistSource for PolicyAllowlists {
    async fn allowlist(&self, org: &OrgId, class: CallerClass) -> Result<Allowlist, AllowlistError> {
        let effective =
            self.0.of(org).await.map_err(|e| AllowlistError { org: org.clone(), source: Box::new(e) })?;
        Ok(Allowlist::from_rules(effective.policy.egress_allow(), class))
    }
}

/// The caps of the egress proxy and its audit throttle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EgressLimits {
    /// Most connections one sandbox holds open at once.
    pub max_connections: u32,
    /// Most bytes one sandbox moves while the server runs.
    pub max_bytes: u64,
    /// Per window, decisions of one sandbox for one destination audited one by one.
    pub audit_burst: u32,
    /// Per window, decisions of one sandbox audited one by one in all.
    pub audit_sandbox_cap: u32,
    /// The throttle's window, in milliseconds.
    pub audit_window_ms: u64,
}

/// One sandbox's use of the proxy.
#[derive(Debug, Default)]
struct Usage {
    open: AtomicU32,
    bytes: AtomicU64,
}

/// A connection's hold on its sandbox's limits.
struct Lease {
    usage: Arc<Usage>,
    max_bytes: u64,
}

impl EgressBudget for Lease {
    fn spend(&self, bytes: u64) -> bool {
        self.usage.bytes.fetch_add(bytes, Ordering::Relaxed).saturating_add(bytes) <= self.max_bytes
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.usage.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A decision before it is audited.
struct Decision<'a> {
    request: &'a EgressRequest,
    host: &'a str,
    allowed: bool,
    reason: String,
}

/// How the decisions' summaries read.
const DECISIONS: Wording = Wording {
    summary_action: Some(AuditAction::EgressSummary),
    counted: "decisions",
    past_cap: "destinations past the sandbox's cap",
    with_port: true,
    log_refusals: true,
};

/// How the brokered uses' summaries read.
const USES: Wording = Wording {
    summary_action: None,
    counted: "uses",
    past_cap: "secrets past the sandbox's cap",
    with_port: false,
    log_refusals: false,
};

/// The throttle's burst, sandbox cap and window of `limits`.
fn throttle_of(limits: &EgressLimits) -> (u32, u32, i64) {
    let window = i64::try_from(limits.audit_window_ms).unwrap_or(i64::MAX);
    (limits.audit_burst, limits.audit_sandbox_cap, window)
}

/// Why a connection's secrets were not found.
enum BrokerLookup {
    /// The store or the caller directory cannot be read (the detail, for the log).
    Unreadable(String),
    /// The record the destination was decided on is stale: its caller's class changed.
    Stale,
}

/// The egress gate.
pub struct EgressService {
    registry: Arc<dyn SandboxRegistry>,
    audit: Arc<dyn AuditLog>,
    clock: Arc<dyn Clock>,
    resolver: Arc<dyn Resolver>,
    allowlists: Arc<dyn AllowlistSource>,
    limits: EgressLimits,
    metrics: Arc<Metrics>,
    usage: Mutex<HashMap<SandboxId, Arc<Usage>>>,
    /// The decisions' audit: a burst one by one, then summaries.
    decisions: ThrottledAudit,
    /// The record of each ready sandbox with connections, and when it was read: a
    /// connection within [`RECORD_TTL`] of the read costs no read of the registry.
    ready: Mutex<HashMap<SandboxId, (Instant, Arc<SandboxRecord>)>>,
    /// Brokered secrets, when the composition gives them.
    broker: Option<Broker>,
}

/// Where brokered secrets come from, and where their uses go.
struct Broker {
    secrets: Arc<dyn SecretStore>,
    directory: Arc<dyn CallerDirectory>,
    /// The audit of brokered requests: one event per use, throttled per sandbox, secret,
    /// host and outcome as the egress decisions are.
    uses: Arc<ThrottledAudit>,
}

/// The longest path or method an event of a use shows (the sandbox chose them).
const SHOWN_LEN: usize = 256;

/// Up to `max` characters of `text`, control characters replaced.
fn shown(text: &str, max: usize) -> String {
    text.chars().take(max).map(|c| if c.is_control() { '?' } else { c }).collect()
}

/// The [`BrokerAudit`] of one brokered connection.
struct ConnectionUses {
    uses: Arc<ThrottledAudit>,
    record: Arc<SandboxRecord>,
}

#[async_trait]
impl BrokerAudit for ConnectionUses {
    async fn record(&self, used: &BrokerUse) -> bool {
        let record = &self.record;
        let caller = &record.token_caller;
        let (method, path) = (shown(&used.method, 16), shown(&used.path, SHOWN_LEN));
        let event = AuditEvent {
            action: AuditAction::SecretUse,
            key: record.key.clone(),
            sandbox_id: Some(record.id.clone()),
            caller_id: caller.identity_id().clone(),
            caller_class: caller.class(),
            durability: Some(record.durability),
            driver: record.driver.clone(),
            outcome: if used.allowed { AuditOutcome::Allowed } else { AuditOutcome::Refused },
            message: format!(
                "{} {method} {}{path}: {}",
                used.secret,
                used.host,
                if used.allowed {
                    "sent with the secret"
                } else {
                    "refused: outside the secret's methods or paths"
                }
            ),
            token_id: record.token_id.clone(),
            at: self.uses.now(),
        };
        let destination = Destination {
            sandbox: record.id.clone(),
            host: format!("{} at {}", used.secret, used.host),
            port: 0,
            allowed: used.allowed,
        };
        // A use that cannot be recorded is refused (the proxy answers 503).
        self.uses.admit(&event, &destination).await != Recorded::Failed
    }
}

/// How long the gate decides a sandbox's connections on the record it read last before it
/// reads it again: a change of the caller its token is for (a re-ensure by another caller,
/// another class, another allowlist) or its end holds for new connections within this.
pub const RECORD_TTL: Duration = Duration::from_millis(250);

impl EgressService {
    /// A gate over these ports.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        registry: Arc<dyn SandboxRegistry>,
        audit: Arc<dyn AuditLog>,
        clock: Arc<dyn Clock>,
        resolver: Arc<dyn Resolver>,
        allowlists: Arc<dyn AllowlistSource>,
        limits: EgressLimits,
        metrics: Arc<Metrics>,
    ) -> Self {
        let decisions = ThrottledAudit::new(audit.clone(), clock.clone(), DECISIONS, throttle_of(&limits));
        Self {
            registry,
            audit,
            clock,
            resolver,
            allowlists,
            limits,
            metrics,
            usage: Mutex::new(HashMap::new()),
            decisions,
            ready: Mutex::new(HashMap::new()),
            broker: None,
        }
    }

    /// The same gate, brokering the secrets of `secrets` for callers `directory` does not
    /// say are revoked.
    #[must_use]
    pub fn with_secrets(
        mut self,
        secrets: Arc<dyn SecretStore>,
        directory: Arc<dyn CallerDirectory>,
    ) -> Self {
        let uses = Arc::new(ThrottledAudit::new(
            self.audit.clone(),
            self.clock.clone(),
            USES,
            throttle_of(&self.limits),
        ));
        self.broker = Some(Broker { secrets, directory, uses });
        self
    }

    /// The secrets a connection of `record` to `host:port` carries (`in_clear`: a plain
    /// HTTP request, which carries only secrets bound to that port by name): `Ok(None)`
    /// when none applies (or the caller is revoked); `Err` (for the log) when it cannot be
    /// told.
    async fn brokered(
        &self,
        record: &Arc<SandboxRecord>,
        host: &str,
        port: u16,
        in_clear: bool,
    ) -> Result<Option<Brokered>, BrokerLookup> {
        let Some(broker) = &self.broker else { return Ok(None) };
        let org = record.key.org();
        let found = broker
            .secrets
            .for_host(org, host, port)
            .await
            .map_err(|e| BrokerLookup::Unreadable(crate::usecase::chain(&e)))?;
        if found.is_empty() {
            return Ok(None);
        }
        // Whose secrets: the caller the sandbox acts for at this instant, not as read up to
        // RECORD_TTL ago (another caller's ensure switches them at the next connection).
        let Some(fresh) = self
            .read_ready(&record.id)
            .await
            .map_err(|e| BrokerLookup::Unreadable(crate::usecase::chain(&e)))?
        else {
            return Ok(None);
        };
        if fresh.token_caller.class() != record.token_caller.class() {
            // The destination was decided for the other class's allowlist: decided again
            // on the record just read (kept by `read_ready`).
            return Err(BrokerLookup::Stale);
        }
        let record = &fresh;
        let injections = domain::broker::choose(&found, &record.token_caller, host, port, in_clear);
        if injections.is_empty() {
            return Ok(None);
        }
        let caller = record.token_caller.identity_id();
        if broker
            .directory
            .is_revoked(caller)
            .await
            .map_err(|e| BrokerLookup::Unreadable(crate::usecase::chain(&e)))?
        {
            info!(sandbox = %record.id, %org, %caller, host, "egress: the caller is revoked; no secret is added");
            return Ok(None);
        }
        let audit = Arc::new(ConnectionUses { uses: broker.uses.clone(), record: record.clone() });
        Ok(Some(Brokered { injections, audit }))
    }

    /// The record of `sandbox` if it is ready: as read within [`RECORD_TTL`], else read
    /// from the registry again (and kept for the next connections).
    async fn ready_record(
        &self,
        sandbox: &SandboxId,
    ) -> Result<Option<Arc<SandboxRecord>>, ports::RegistryError> {
        let fresh = self
            .ready
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(sandbox)
            .filter(|(read_at, _)| read_at.elapsed() < RECORD_TTL)
            .map(|(_, record)| record.clone());
        if fresh.is_some() {
            return Ok(fresh);
        }
        self.read_ready(sandbox).await
    }

    /// The record of `sandbox` read from the registry now (and kept for the next
    /// connections), if it is ready.
    async fn read_ready(
        &self,
        sandbox: &SandboxId,
    ) -> Result<Option<Arc<SandboxRecord>>, ports::RegistryError> {
        let read_at = Instant::now();
        let record =
            self.registry.get(sandbox).await?.filter(|r| r.state == SandboxState::Ready).map(Arc::new);
        let mut ready = self.ready.lock().unwrap_or_else(PoisonError::into_inner);
        match &record {
            Some(record) => ready.insert(sandbox.clone(), (read_at, record.clone())),
            None => ready.remove(sandbox),
        };
        Ok(record)
    }

    fn usage_of(&self, sandbox: &SandboxId) -> Arc<Usage> {
        self.usage.lock().unwrap_or_else(PoisonError::into_inner).entry(sandbox.clone()).or_default().clone()
    }

    /// Writes the summaries whose windows have ended.
    pub async fn flush_summaries(&self) {
        self.decisions.flush().await;
        if let Some(broker) = &self.broker {
            broker.uses.flush().await;
        }
    }

    /// Forgets a sandbox that ended: its open summaries are written, its use dropped.
    pub async fn forget(&self, sandbox: &SandboxId) {
        self.decisions.forget(sandbox).await;
        self.usage.lock().unwrap_or_else(PoisonError::into_inner).remove(sandbox);
        self.ready.lock().unwrap_or_else(PoisonError::into_inner).remove(sandbox);
        if let Some(broker) = &self.broker {
            broker.uses.forget(sandbox).await;
        }
    }

    /// Audits a decision (or counts it).
    async fn record(&self, record: &SandboxRecord, decision: &Decision<'_>) -> Recorded {
        let caller = &record.token_caller;
        let event = AuditEvent {
            action: AuditAction::Egress,
            key: record.key.clone(),
            sandbox_id: Some(record.id.clone()),
            caller_id: caller.identity_id().clone(),
            caller_class: caller.class(),
            durability: Some(record.durability),
            driver: record.driver.clone(),
            outcome: if decision.allowed { AuditOutcome::Allowed } else { AuditOutcome::Refused },
            message: format!(
                "{} {}:{}: {}",
                decision.request.kind.as_str(),
                decision.host,
                decision.request.port,
                decision.reason
            ),
            token_id: record.token_id.clone(),
            at: self.clock.now(),
        };
        let destination = Destination {
            sandbox: record.id.clone(),
            host: decision.host.to_owned(),
            port: decision.request.port,
            allowed: decision.allowed,
        };
        self.decisions.admit(&event, &destination).await
    }

    /// Refuses: audited, counted, logged as the audit is (`detail`: what went wrong on the
    /// server's side, for the log line alone), and the refusal for the proxy.
    async fn refuse(
        &self,
        record: &SandboxRecord,
        request: &EgressRequest,
        host: &str,
        metric: &'static str,
        refusal: EgressRefusal,
        detail: Option<String>,
    ) -> EgressRefusal {
        let decision = Decision { request, host, allowed: false, reason: format!("refused: {refusal}") };
        let recorded = self.record(record, &decision).await;
        self.metrics.egress_refused(record.key.org().as_str(), metric);
        // A refusal counted rather than written is logged in its summary's line.
        if recorded != Recorded::Counted {
            let (sandbox, org, port) = (&record.id, record.key.org(), request.port);
            match detail {
                Some(error) => warn!(%sandbox, %org, host, port, reason = metric, error, "egress refused"),
                None => info!(%sandbox, %org, host, port, reason = metric, "egress refused"),
            }
        }
        refusal
    }
}

#[async_trait]
impl EgressGate for EgressService {
    async fn open(&self, request: &EgressRequest) -> Result<EgressGrant, EgressRefusal> {
        // The decision's span: who (the org, the key's kind, the class of the caller the
        // sandbox acts for), where (the port), and whether secrets were brokered; never a
        // secret's name or value, nor the host a sandbox chose (it is the audit's).
        let span = info_span!(
            "egress_decision",
            sandbox_id = %request.sandbox,
            port = request.port,
            org = tracing::field::Empty,
            key_kind = tracing::field::Empty,
            caller_class = tracing::field::Empty,
            brokered = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        let result = self.open_at(request, true).instrument(span.clone()).await;
        match &result {
            Ok(grant) => {
                span.record("outcome", "allowed");
                span.record("brokered", grant.broker.is_some());
            }
            Err(_) => {
                span.record("outcome", "refused");
            }
        }
        result
    }
}

impl EgressService {
    /// [`EgressGate::open`]; `first`: a decision that may be taken again once, on the
    /// record read anew, when the caller the sandbox acts for changed class under it.
    async fn open_at(&self, request: &EgressRequest, first: bool) -> Result<EgressGrant, EgressRefusal> {
        let record = match self.ready_record(&request.sandbox).await {
            Ok(Some(record)) => record,
            Ok(None) => {
                self.metrics.egress_refused("", "not_live");
                return Err(EgressRefusal::NotAllowed(format!("sandbox {} is not live", request.sandbox)));
            }
            Err(e) => {
                warn!(sandbox = %request.sandbox, error = %e, "egress: cannot read the sandbox's record; refusing");
                self.metrics.egress_refused("", "unavailable");
                return Err(EgressRefusal::Unavailable("the server cannot decide now; try again".to_owned()));
            }
        };
        let org = record.key.org().clone();
        let span = tracing::Span::current();
        span.record("org", org.as_str());
        span.record("key_kind", record.key.kind().as_str());
        span.record("caller_class", record.token_caller.class().as_str());
        let port = request.port;
        let host = match normalize_host(&request.host) {
            Ok(host) => host,
            Err(e) => {
                let shown: String = request.host.chars().take(64).collect();
                return Err(self
                    .refuse(
                        &record,
                        request,
                        &shown,
                        "bad_request",
                        EgressRefusal::BadRequest(e.to_string()),
                        None,
                    )
                    .await);
            }
        };
        let class = record.token_caller.class();
        let allowlist = match self.allowlists.allowlist(&org, class).await {
            Ok(list) => list,
            Err(e) => {
                let refusal = EgressRefusal::Unavailable(format!("{e}; try again"));
                let detail = Some(crate::usecase::chain(&e));
                return Err(self.refuse(&record, request, &host, "unavailable", refusal, detail).await);
            }
        };
        let Some(rule) = allowlist.allows_host(&host, port) else {
            let refusal = EgressRefusal::NotAllowed(format!(
                "{host}:{port} is not in the egress allowlist of org {org} for {} callers",
                class.as_str()
            ));
            return Err(self.refuse(&record, request, &host, "not_allowed", refusal, None).await);
        };
        let usage = self.usage_of(&record.id);
        if usage.bytes.load(Ordering::Relaxed) >= self.limits.max_bytes {
            let refusal = EgressRefusal::Limited(format!(
                "sandbox {} has used its egress allowance of {} bytes",
                record.id, self.limits.max_bytes
            ));
            return Err(self.refuse(&record, request, &host, "bytes_limit", refusal, None).await);
        }
        let open = usage.open.fetch_add(1, Ordering::AcqRel);
        let lease = Lease { usage, max_bytes: self.limits.max_bytes };
        if open >= self.limits.max_connections {
            drop(lease);
            let refusal = EgressRefusal::Limited(format!(
                "sandbox {} holds {} egress connections, its limit",
                record.id, self.limits.max_connections
            ));
            return Err(self.refuse(&record, request, &host, "connections_limit", refusal, None).await);
        }
        let ips = match self.resolver.resolve(&host).await {
            Ok(ips) => ips,
            Err(e) => {
                return Err(self
                    .refuse(
                        &record,
                        request,
                        &host,
                        "unresolvable",
                        EgressRefusal::Unresolvable(e.to_string()),
                        None,
                    )
                    .await);
            }
        };
        let mut refused = Vec::new();
        let addrs: Vec<SocketAddr> = ips
            .iter()
            .filter(|ip| match allowlist.allows_address(**ip, port) {
                Ok(()) => true,
                Err(range) => {
                    refused.push(format!("{ip} ({range})"));
                    false
                }
            })
            .map(|ip| SocketAddr::new(*ip, port))
            .collect();
        if addrs.is_empty() {
            let refusal = EgressRefusal::NotAllowed(format!(
                "{host} resolves only to addresses no sandbox may reach: {}",
                refused.join(", ")
            ));
            return Err(self.refuse(&record, request, &host, "refused_address", refusal, None).await);
        }
        let in_clear = matches!(request.kind, ports::EgressKind::Http);
        let broker = match self.brokered(&record, &host, port, in_clear).await {
            Ok(broker) => broker,
            Err(BrokerLookup::Stale) if first => return Box::pin(self.open_at(request, false)).await,
            Err(lookup) => {
                let detail = match lookup {
                    BrokerLookup::Unreadable(detail) => detail,
                    BrokerLookup::Stale => {
                        "the sandbox's caller changed class twice while deciding".to_owned()
                    }
                };
                let refusal = EgressRefusal::Unavailable(
                    "the secrets for this host cannot be read now; try again".to_owned(),
                );
                return Err(self.refuse(&record, request, &host, "unavailable", refusal, Some(detail)).await);
            }
        };
        let shown: Vec<String> = addrs.iter().map(|a| a.ip().to_string()).collect();
        let names: Vec<&str> =
            broker.iter().flat_map(|b| b.injections.iter().map(|i| i.secret.as_str())).collect();
        let decision = Decision {
            request,
            host: &host,
            allowed: true,
            reason: format!(
                "allowed by {rule}, to {}{}",
                shown.join(", "),
                if names.is_empty() {
                    String::new()
                } else {
                    format!("; brokered secrets {}", names.join(" "))
                }
            ),
        };
        if self.record(&record, &decision).await == Recorded::Failed {
            self.metrics.egress_refused(org.as_str(), "unavailable");
            return Err(EgressRefusal::Unavailable(
                "the decision cannot be audited now; try again".to_owned(),
            ));
        }
        self.metrics.egress_allowed(org.as_str());
        Ok(EgressGrant { addrs, budget: Box::new(lease), broker })
    }
}

#[cfg(test)]
mod tests;
