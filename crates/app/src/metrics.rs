//! Prometheus metrics through `prometheus-client` (the Prometheus project's Rust client):
//! ensure and exec counts and latencies, quota and egress refusals, and gauges read at
//! scrape time (live sandboxes, sandboxes by state, commands running through this replica
//! and the bytes the workspaces hold, the audit sealing backlog), rendered in the
//! OpenMetrics text format.
//!
//! A scrape shows what it may ([`Scope`]): every scrape gets the totals, whose series
//! name no org; a service caller's scrape also gets the per-org series of its own orgs,
//! each named `sandlane_org_*` with an `org` label. No scrape shows another org's id.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

use domain::OrgId;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// The `Content-Type` of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Histogram bucket upper bounds, in seconds.
const BUCKETS: [f64; 12] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EnsureLabels {
    kind: String,
    outcome: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ExecLabels {
    outcome: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WebhookLabels {
    outcome: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QuotaLabels {
    quota: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OrgQuotaLabels {
    org: String,
    quota: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OrgStateLabels {
    org: String,
    state: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OrgReasonLabels {
    org: String,
    reason: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OrgLabels {
    org: String,
}

/// What a scrape read of the orgs' sandboxes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OrgSnapshot {
    /// `(org, state, count)`: `provisioning`, `ready`, `suspended`, and `pooled` (warm
    /// sandboxes ready to adopt).
    pub sandboxes: Vec<(String, String, u64)>,
    /// `(org, commands)` running through this replica.
    pub commands: Vec<(String, u64)>,
    /// `(org, bytes)` the org's running sandboxes hold in their workspaces (those with a
    /// quota image, on this host).
    pub workspace_bytes: Vec<(String, u64)>,
}

/// Whose series a scrape shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope<'a> {
    /// The totals only: no series names an org (a scrape without a key).
    Totals,
    /// The totals and the per-org series of these orgs (a service caller's scrape).
    Orgs(&'a [OrgId]),
}

impl Scope<'_> {
    fn shows(&self, org: &str) -> bool {
        match self {
            Self::Totals => false,
            Self::Orgs(orgs) => orgs.iter().any(|o| o.as_str() == org),
        }
    }
}

type Seconds = Family<EnsureLabels, Histogram, fn() -> Histogram>;
type ExecSeconds = Family<ExecLabels, Histogram, fn() -> Histogram>;
/// Counts by org, then by a second label (a quota, a reason).
type ByOrg<T> = Mutex<BTreeMap<String, T>>;

fn latency_histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

/// Adds one to `map[org][key]`, allocating only for a pair not seen before.
fn count(map: &ByOrg<BTreeMap<String, u64>>, org: &str, key: &str) {
    let mut map = map.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let by_key = match map.get_mut(org) {
        Some(by_key) => by_key,
        None => map.entry(org.to_owned()).or_default(),
    };
    match by_key.get_mut(key) {
        Some(n) => *n += 1,
        None => {
            by_key.insert(key.to_owned(), 1);
        }
    }
}

fn gauge_value(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The server's metrics: a handle on each metric that is not per org, and the per-org
/// counts; each scrape renders the part its [`Scope`] may see.
#[derive(Debug)]
pub struct Metrics {
    ensures: Family<EnsureLabels, Counter>,
    ensure_seconds: Seconds,
    execs: Family<ExecLabels, Counter>,
    exec_seconds: ExecSeconds,
    live_sandboxes: Gauge<f64, AtomicU64>,
    unsealed_rows: Gauge<f64, AtomicU64>,
    seal_lag_seconds: Gauge<f64, AtomicU64>,
    /// org → quota → refusals.
    quota_refusals: ByOrg<BTreeMap<String, u64>>,
    /// org → reason → refusals (org empty: the sandbox's record could not be read).
    egress_refusals: ByOrg<BTreeMap<String, u64>>,
    /// org → destinations let through.
    egress_allowed: ByOrg<u64>,
    /// Webhook attempts by outcome (`delivered`, `retry`, `failed`).
    webhook_attempts: Family<WebhookLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            ensures: Family::default(),
            ensure_seconds: Family::new_with_constructor(latency_histogram),
            execs: Family::default(),
            exec_seconds: Family::new_with_constructor(latency_histogram),
            live_sandboxes: Gauge::default(),
            unsealed_rows: Gauge::default(),
            seal_lag_seconds: Gauge::default(),
            quota_refusals: Mutex::default(),
            egress_refusals: Mutex::default(),
            egress_allowed: Mutex::default(),
            webhook_attempts: Family::default(),
        }
    }
}

impl Metrics {
    /// Records one ensure of `kind` (`session`, `workflow`, `recover`) ending in `outcome`.
    pub fn observe_ensure(&self, kind: &str, outcome: &str, secs: f64) {
        let labels = EnsureLabels { kind: kind.to_owned(), outcome: outcome.to_owned() };
        self.ensures.get_or_create(&labels).inc();
        self.ensure_seconds.get_or_create(&labels).observe(secs);
    }

    /// Records one exec ending in `outcome` (`ok`, `timed_out`, `error`).
    pub fn observe_exec(&self, outcome: &str, secs: f64) {
        let labels = ExecLabels { outcome: outcome.to_owned() };
        self.execs.get_or_create(&labels).inc();
        self.exec_seconds.get_or_create(&labels).observe(secs);
    }

    /// Counts one refusal by `quota` (`max_sandboxes`, `max_commands`,
    /// `max_commands_per_sandbox`) in `org`.
    pub fn observe_quota_refusal(&self, org: &str, quota: &str) {
        count(&self.quota_refusals, org, quota);
    }

    /// Sets the live sandbox count read at scrape time (`None`: the registry did not answer).
    pub fn set_live_sandboxes(&self, count: Option<u64>) {
        self.live_sandboxes.set(count.map_or(f64::NAN, |n| n as f64));
    }

    /// Sets the sealing backlog read at scrape time: unsealed rows and the age of the
    /// oldest, in seconds (`None`: the audit log did not answer).
    pub fn set_audit_backlog(&self, backlog: Option<(u64, f64)>) {
        let (rows, lag) = backlog.map_or((f64::NAN, f64::NAN), |(rows, lag)| (rows as f64, lag));
        self.unsealed_rows.set(rows);
        self.seal_lag_seconds.set(lag);
    }

    /// Counts one egress refusal of `org` (empty: the sandbox's record could not be
    /// read) for `reason` (`not_allowed`, `refused_address`, `unresolvable`,
    /// `connections_limit`, `bytes_limit`, `bad_request`, `unavailable`, `not_live`).
    pub fn egress_refused(&self, org: &str, reason: &str) {
        count(&self.egress_refusals, org, reason);
    }

    /// Counts one webhook attempt ending in `outcome`: `delivered`, `retry` (to be tried
    /// again) or `failed` (given up).
    pub fn observe_webhook_attempt(&self, outcome: &str) {
        self.webhook_attempts.get_or_create(&WebhookLabels { outcome: outcome.to_owned() }).inc();
    }

    /// Counts one egress destination of `org` let through.
    pub fn egress_allowed(&self, org: &str) {
        let mut map = self.egress_allowed.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match map.get_mut(org) {
            Some(n) => *n += 1,
            None => {
                map.insert(org.to_owned(), 1);
            }
        }
    }

    /// The OpenMetrics text exposition ([`CONTENT_TYPE`]) of what `scope` may see, with
    /// the gauges of `orgs` (read at scrape time): the totals, and under
    /// [`Scope::Orgs`] the `sandlane_org_*` series of those orgs alone.
    pub fn render(&self, scope: Scope<'_>, orgs: &OrgSnapshot) -> String {
        let mut registry = Registry::default();
        // Counters are exposed with `_total` appended: `sandlane_ensures_total`.
        registry.register("sandlane_ensures", "Sandbox ensures by kind and outcome", self.ensures.clone());
        registry.register(
            "sandlane_ensure_duration_seconds",
            "Sandbox ensure latency by kind and outcome",
            self.ensure_seconds.clone(),
        );
        registry.register("sandlane_execs", "Commands run in sandboxes by outcome", self.execs.clone());
        registry.register(
            "sandlane_exec_duration_seconds",
            "Exec latency by outcome",
            self.exec_seconds.clone(),
        );
        registry.register(
            "sandlane_live_sandboxes",
            "Live sandboxes (NaN when the registry did not answer)",
            self.live_sandboxes.clone(),
        );
        registry.register(
            "sandlane_audit_unsealed_rows",
            "Audit rows waiting for a seal (NaN when the log did not answer)",
            self.unsealed_rows.clone(),
        );
        registry.register(
            "sandlane_audit_seal_lag_seconds",
            "Age of the oldest unsealed audit row (NaN when the log did not answer)",
            self.seal_lag_seconds.clone(),
        );
        registry.register(
            "sandlane_webhook_attempts",
            "Webhook delivery attempts by outcome (delivered, retry, failed)",
            self.webhook_attempts.clone(),
        );
        self.register_totals(&mut registry, orgs);
        if let Scope::Orgs(_) = scope {
            self.register_orgs(&mut registry, scope, orgs);
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &registry);
        out
    }

    /// The series every scrape sees: sums over every org, with no `org` label.
    fn register_totals(&self, registry: &mut Registry, orgs: &OrgSnapshot) {
        let sandboxes = Family::<StateLabels, Gauge>::default();
        for (_, state, n) in &orgs.sandboxes {
            sandboxes.get_or_create(&StateLabels { state: state.clone() }).inc_by(gauge_value(*n));
        }
        registry.register(
            "sandlane_sandboxes",
            "Sandboxes by state, every org together (provisioning, ready, suspended; pooled: warm, not yet adopted)",
            sandboxes,
        );
        let commands = Gauge::<i64>::default();
        commands.set(gauge_value(orgs.commands.iter().map(|(_, n)| n).sum()));
        registry.register("sandlane_commands_running", "Commands running through this replica", commands);
        let bytes = Gauge::<i64>::default();
        bytes.set(gauge_value(orgs.workspace_bytes.iter().map(|(_, n)| n).sum()));
        registry.register(
            "sandlane_workspace_bytes",
            "Bytes the running sandboxes hold in their workspaces (quota images on this host)",
            bytes,
        );
        let quota = Family::<QuotaLabels, Counter>::default();
        for by_quota in self.quota_refusals.lock().unwrap_or_else(std::sync::PoisonError::into_inner).values()
        {
            for (name, n) in by_quota {
                quota.get_or_create(&QuotaLabels { quota: name.clone() }).inc_by(*n);
            }
        }
        registry.register("sandlane_quota_refusals", "Requests refused by an org's quota, by quota", quota);
        let refusals = Family::<ReasonLabels, Counter>::default();
        for by_reason in
            self.egress_refusals.lock().unwrap_or_else(std::sync::PoisonError::into_inner).values()
        {
            for (reason, n) in by_reason {
                refusals.get_or_create(&ReasonLabels { reason: reason.clone() }).inc_by(*n);
            }
        }
        registry.register(
            "sandlane_egress_refusals",
            "Egress destinations refused by the proxy, by reason",
            refusals,
        );
        let allowed = Counter::<u64>::default();
        allowed.inc_by(
            self.egress_allowed.lock().unwrap_or_else(std::sync::PoisonError::into_inner).values().sum(),
        );
        registry.register("sandlane_egress_allowed", "Egress destinations let through", allowed);
    }

    /// The per-org series of the orgs `scope` shows.
    fn register_orgs(&self, registry: &mut Registry, scope: Scope<'_>, orgs: &OrgSnapshot) {
        let sandboxes = Family::<OrgStateLabels, Gauge>::default();
        for (org, state, n) in orgs.sandboxes.iter().filter(|(org, _, _)| scope.shows(org)) {
            let labels = OrgStateLabels { org: org.clone(), state: state.clone() };
            sandboxes.get_or_create(&labels).set(gauge_value(*n));
        }
        registry.register(
            "sandlane_org_sandboxes",
            "Sandboxes per org and state (provisioning, ready, suspended; pooled: warm, not yet adopted)",
            sandboxes,
        );
        let commands = Family::<OrgLabels, Gauge>::default();
        for (org, n) in orgs.commands.iter().filter(|(org, _)| scope.shows(org)) {
            commands.get_or_create(&OrgLabels { org: org.clone() }).set(gauge_value(*n));
        }
        registry.register(
            "sandlane_org_commands_running",
            "Commands running per org through this replica",
            commands,
        );
        let bytes = Family::<OrgLabels, Gauge>::default();
        for (org, n) in orgs.workspace_bytes.iter().filter(|(org, _)| scope.shows(org)) {
            bytes.get_or_create(&OrgLabels { org: org.clone() }).set(gauge_value(*n));
        }
        registry.register(
            "sandlane_org_workspace_bytes",
            "Bytes the org's running sandboxes hold in their workspaces (quota images on this host)",
            bytes,
        );
        let quota = Family::<OrgQuotaLabels, Counter>::default();
        let refusals = self.quota_refusals.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for (org, by_quota) in refusals.iter().filter(|(org, _)| scope.shows(org)) {
            for (name, n) in by_quota {
                quota.get_or_create(&OrgQuotaLabels { org: org.clone(), quota: name.clone() }).inc_by(*n);
            }
        }
        drop(refusals);
        registry.register(
            "sandlane_org_quota_refusals",
            "Requests refused by an org's quota, by org and quota",
            quota,
        );
        let egress = Family::<OrgReasonLabels, Counter>::default();
        let refusals = self.egress_refusals.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for (org, by_reason) in refusals.iter().filter(|(org, _)| scope.shows(org)) {
            for (reason, n) in by_reason {
                egress
                    .get_or_create(&OrgReasonLabels { org: org.clone(), reason: reason.clone() })
                    .inc_by(*n);
            }
        }
        drop(refusals);
        registry.register(
            "sandlane_org_egress_refusals",
            "Egress destinations refused by the proxy, by org and reason",
            egress,
        );
        let allowed = Family::<OrgLabels, Counter>::default();
        let counts = self.egress_allowed.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for (org, n) in counts.iter().filter(|(org, _)| scope.shows(org)) {
            allowed.get_or_create(&OrgLabels { org: org.clone() }).inc_by(*n);
        }
        drop(counts);
        registry.register("sandlane_org_egress_allowed", "Egress destinations let through, by org", allowed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn org(name: &str) -> OrgId {
        OrgId::parse(name).unwrap()
    }

    #[test]
    fn renders_counts_buckets_and_gauges() {
        let m = Metrics::default();
        m.observe_ensure("session", "ready", 0.004);
        m.observe_ensure("session", "ready", 0.2);
        m.observe_exec("ok", 0.006);
        m.set_live_sandboxes(Some(3));
        m.set_audit_backlog(None);
        m.egress_refused("acme", "not_allowed");
        m.egress_allowed("acme");
        let text = m.render(Scope::Orgs(&[org("acme")]), &OrgSnapshot::default());
        assert!(
            text.contains("sandlane_org_egress_refusals_total{org=\"acme\",reason=\"not_allowed\"} 1"),
            "{text}"
        );
        assert!(text.contains("sandlane_org_egress_allowed_total{org=\"acme\"} 1"), "{text}");
        assert!(text.contains("sandlane_ensures_total{kind=\"session\",outcome=\"ready\"} 2"), "{text}");
        assert!(
            text.contains(
                "sandlane_ensure_duration_seconds_bucket{le=\"0.005\",kind=\"session\",outcome=\"ready\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "sandlane_ensure_duration_seconds_bucket{le=\"0.25\",kind=\"session\",outcome=\"ready\"} 2"
            ),
            "{text}"
        );
        assert!(text.contains("sandlane_execs_total{outcome=\"ok\"} 1"), "{text}");
        assert!(text.contains("sandlane_live_sandboxes 3"), "{text}");
        assert!(text.contains("sandlane_audit_unsealed_rows NaN"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    fn two_orgs() -> (Metrics, OrgSnapshot) {
        let m = Metrics::default();
        m.observe_quota_refusal("acme", "max_sandboxes");
        m.observe_quota_refusal("acme", "max_sandboxes");
        m.observe_quota_refusal("beta", "max_sandboxes");
        m.egress_refused("acme", "not_allowed");
        m.egress_refused("beta", "refused_address");
        m.egress_allowed("beta");
        m.egress_allowed("beta");
        let snapshot = OrgSnapshot {
            sandboxes: vec![
                ("acme".into(), "ready".into(), 3),
                ("acme".into(), "suspended".into(), 1),
                ("beta".into(), "ready".into(), 2),
                ("beta".into(), "pooled".into(), 2),
            ],
            commands: vec![("acme".into(), 4), ("beta".into(), 1)],
            workspace_bytes: vec![("acme".into(), 1 << 20), ("beta".into(), 1)],
        };
        (m, snapshot)
    }

    #[test]
    fn webhook_attempts_are_counted_by_outcome() {
        let m = Metrics::default();
        m.observe_webhook_attempt("retry");
        m.observe_webhook_attempt("retry");
        m.observe_webhook_attempt("delivered");
        let text = m.render(Scope::Totals, &OrgSnapshot::default());
        assert!(text.contains("sandlane_webhook_attempts_total{outcome=\"retry\"} 2"), "{text}");
        assert!(text.contains("sandlane_webhook_attempts_total{outcome=\"delivered\"} 1"), "{text}");
    }

    #[test]
    fn a_scrape_without_a_key_sees_totals_and_no_org() {
        let (m, snapshot) = two_orgs();
        let text = m.render(Scope::Totals, &snapshot);
        for line in [
            "sandlane_sandboxes{state=\"ready\"} 5",
            "sandlane_sandboxes{state=\"suspended\"} 1",
            "sandlane_sandboxes{state=\"pooled\"} 2",
            "sandlane_commands_running 5",
            "sandlane_workspace_bytes 1048577",
            "sandlane_quota_refusals_total{quota=\"max_sandboxes\"} 3",
            "sandlane_egress_refusals_total{reason=\"not_allowed\"} 1",
            "sandlane_egress_refusals_total{reason=\"refused_address\"} 1",
            "sandlane_egress_allowed_total 2",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        for hidden in ["acme", "beta", "org=", "sandlane_org_"] {
            assert!(!text.contains(hidden), "{hidden} in {text}");
        }
    }

    #[test]
    fn a_service_scrape_sees_its_orgs_series_and_no_other_org() {
        let (m, snapshot) = two_orgs();
        let text = m.render(Scope::Orgs(&[org("acme")]), &snapshot);
        for line in [
            "sandlane_org_quota_refusals_total{org=\"acme\",quota=\"max_sandboxes\"} 2",
            "sandlane_org_sandboxes{org=\"acme\",state=\"ready\"} 3",
            "sandlane_org_sandboxes{org=\"acme\",state=\"suspended\"} 1",
            "sandlane_org_commands_running{org=\"acme\"} 4",
            "sandlane_org_workspace_bytes{org=\"acme\"} 1048576",
            "sandlane_org_egress_refusals_total{org=\"acme\",reason=\"not_allowed\"} 1",
            // The totals too.
            "sandlane_sandboxes{state=\"ready\"} 5",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        assert!(!text.contains("beta"), "{text}");
        let both = m.render(Scope::Orgs(&[org("acme"), org("beta")]), &snapshot);
        assert!(both.contains("sandlane_org_sandboxes{org=\"beta\",state=\"pooled\"} 2"), "{both}");
        assert!(both.contains("sandlane_org_egress_allowed_total{org=\"beta\"} 2"), "{both}");
        // Gauges come from each scrape's snapshot: nothing stale stays.
        assert!(
            !m.render(Scope::Orgs(&[org("acme")]), &OrgSnapshot::default())
                .contains("sandlane_org_sandboxes{")
        );
    }
}
