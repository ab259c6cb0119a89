//! Prometheus metrics through `prometheus-client` (the Prometheus project's Rust client):
//! ensure and exec counts and latencies, quota refusals by org, and gauges set at scrape
//! time (live sandboxes; per org the sandboxes by state, warm ones included, the commands
//! running through this replica and the bytes their workspaces hold; the audit sealing
//! backlog), rendered in the OpenMetrics text format.

use std::sync::atomic::AtomicU64;

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
struct QuotaLabels {
    org: String,
    quota: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OrgStateLabels {
    org: String,
    state: String,
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

type Seconds = Family<EnsureLabels, Histogram, fn() -> Histogram>;
type ExecSeconds = Family<ExecLabels, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

/// The server's metrics: the registry and a handle on each metric in it.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    ensures: Family<EnsureLabels, Counter>,
    ensure_seconds: Seconds,
    execs: Family<ExecLabels, Counter>,
    exec_seconds: ExecSeconds,
    live_sandboxes: Gauge<f64, AtomicU64>,
    unsealed_rows: Gauge<f64, AtomicU64>,
    seal_lag_seconds: Gauge<f64, AtomicU64>,
    quota_refusals: Family<QuotaLabels, Counter>,
    org_sandboxes: Family<OrgStateLabels, Gauge>,
    org_commands: Family<OrgLabels, Gauge>,
    org_workspace_bytes: Family<OrgLabels, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let ensures = Family::<EnsureLabels, Counter>::default();
        // Counters are exposed with `_total` appended: `sandlane_ensures_total`.
        registry.register("sandlane_ensures", "Sandbox ensures by kind and outcome", ensures.clone());
        let ensure_seconds: Seconds = Family::new_with_constructor(latency_histogram);
        registry.register(
            "sandlane_ensure_duration_seconds",
            "Sandbox ensure latency by kind and outcome",
            ensure_seconds.clone(),
        );
        let execs = Family::<ExecLabels, Counter>::default();
        registry.register("sandlane_execs", "Commands run in sandboxes by outcome", execs.clone());
        let exec_seconds: ExecSeconds = Family::new_with_constructor(latency_histogram);
        registry.register("sandlane_exec_duration_seconds", "Exec latency by outcome", exec_seconds.clone());
        let live_sandboxes = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "sandlane_live_sandboxes",
            "Live sandboxes (NaN when the registry did not answer)",
            live_sandboxes.clone(),
        );
        let unsealed_rows = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "sandlane_audit_unsealed_rows",
            "Audit rows waiting for a seal (NaN when the log did not answer)",
            unsealed_rows.clone(),
        );
        let seal_lag_seconds = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "sandlane_audit_seal_lag_seconds",
            "Age of the oldest unsealed audit row (NaN when the log did not answer)",
            seal_lag_seconds.clone(),
        );
        let quota_refusals = Family::<QuotaLabels, Counter>::default();
        registry.register(
            "sandlane_quota_refusals",
            "Requests refused by an org's quota, by org and quota",
            quota_refusals.clone(),
        );
        let org_sandboxes = Family::<OrgStateLabels, Gauge>::default();
        registry.register(
            "sandlane_org_sandboxes",
            "Sandboxes per org and state (provisioning, ready, suspended; pooled: warm, not yet adopted)",
            org_sandboxes.clone(),
        );
        let org_commands = Family::<OrgLabels, Gauge>::default();
        registry.register(
            "sandlane_org_commands_running",
            "Commands running per org through this replica",
            org_commands.clone(),
        );
        let org_workspace_bytes = Family::<OrgLabels, Gauge>::default();
        registry.register(
            "sandlane_org_workspace_bytes",
            "Bytes the org's running sandboxes hold in their workspaces (quota images on this host)",
            org_workspace_bytes.clone(),
        );
        Self {
            quota_refusals,
            org_sandboxes,
            org_commands,
            org_workspace_bytes,
            registry,
            ensures,
            ensure_seconds,
            execs,
            exec_seconds,
            live_sandboxes,
            unsealed_rows,
            seal_lag_seconds,
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
        self.quota_refusals
            .get_or_create(&QuotaLabels { org: org.to_owned(), quota: quota.to_owned() })
            .inc();
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

    /// Sets the per-org gauges read at scrape time: every series is replaced, so an org
    /// with nothing left shows no stale value.
    pub fn set_orgs(&self, snapshot: &OrgSnapshot) {
        self.org_sandboxes.clear();
        for (org, state, n) in &snapshot.sandboxes {
            let labels = OrgStateLabels { org: org.clone(), state: state.clone() };
            self.org_sandboxes.get_or_create(&labels).set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
        self.org_commands.clear();
        for (org, n) in &snapshot.commands {
            let labels = OrgLabels { org: org.clone() };
            self.org_commands.get_or_create(&labels).set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
        self.org_workspace_bytes.clear();
        for (org, n) in &snapshot.workspace_bytes {
            let labels = OrgLabels { org: org.clone() };
            self.org_workspace_bytes.get_or_create(&labels).set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
    }

    /// The OpenMetrics text exposition ([`CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counts_buckets_and_gauges() {
        let m = Metrics::default();
        m.observe_ensure("session", "ready", 0.004);
        m.observe_ensure("session", "ready", 0.2);
        m.observe_exec("ok", 0.006);
        m.set_live_sandboxes(Some(3));
        m.set_audit_backlog(None);
        let text = m.render();
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

    #[test]
    fn per_org_gauges_and_refusals_are_labelled_by_org_and_replaced_each_scrape() {
        let m = Metrics::default();
        m.observe_quota_refusal("acme", "max_sandboxes");
        m.observe_quota_refusal("acme", "max_sandboxes");
        m.set_orgs(&OrgSnapshot {
            sandboxes: vec![
                ("acme".into(), "ready".into(), 3),
                ("acme".into(), "suspended".into(), 1),
                ("beta".into(), "pooled".into(), 2),
            ],
            commands: vec![("acme".into(), 4)],
            workspace_bytes: vec![("acme".into(), 1 << 20)],
        });
        let text = m.render();
        for line in [
            "sandlane_quota_refusals_total{org=\"acme\",quota=\"max_sandboxes\"} 2",
            "sandlane_org_sandboxes{org=\"acme\",state=\"ready\"} 3",
            "sandlane_org_sandboxes{org=\"acme\",state=\"suspended\"} 1",
            "sandlane_org_sandboxes{org=\"beta\",state=\"pooled\"} 2",
            "sandlane_org_commands_running{org=\"acme\"} 4",
            "sandlane_org_workspace_bytes{org=\"acme\"} 1048576",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        m.set_orgs(&OrgSnapshot::default());
        assert!(!m.render().contains("sandlane_org_sandboxes{"), "stale series are dropped");
    }
}
