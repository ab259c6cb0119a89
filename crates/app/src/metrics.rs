//! Prometheus metrics: ensure and exec counts and latencies, rendered in the text format.
//!
//! A small hand-written registry (a few counters and histograms) rather than a metrics
//! framework: the lock is hidden in this type and held only to add a sample or render.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

/// Histogram bucket upper bounds, in seconds.
const BUCKETS: [f64; 12] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];

#[derive(Debug, Default, Clone)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, secs: f64) {
        for (i, bound) in BUCKETS.iter().enumerate() {
            if secs <= *bound {
                self.counts[i] += 1;
            }
        }
        self.count += 1;
        self.sum += secs;
    }
}

#[derive(Debug, Default)]
struct Inner {
    ensure: BTreeMap<(String, String), Histogram>,
    exec: BTreeMap<String, Histogram>,
}

/// The server's metrics.
#[derive(Debug, Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

/// A gauge value computed at scrape time.
#[derive(Debug, Clone)]
pub struct Gauge {
    /// Metric name.
    pub name: &'static str,
    /// Help text.
    pub help: &'static str,
    /// Value.
    pub value: f64,
}

impl Metrics {
    /// Records one ensure of `kind` (`session`, `workflow`, `recover`) ending in `outcome`.
    pub fn observe_ensure(&self, kind: &str, outcome: &str, secs: f64) {
        if let Ok(mut inner) = self.inner.lock() {
            inner.ensure.entry((kind.to_owned(), outcome.to_owned())).or_default().observe(secs);
        }
    }

    /// Records one exec ending in `outcome` (`ok`, `timed_out`, `error`).
    pub fn observe_exec(&self, outcome: &str, secs: f64) {
        if let Ok(mut inner) = self.inner.lock() {
            inner.exec.entry(outcome.to_owned()).or_default().observe(secs);
        }
    }

    /// The Prometheus text exposition, with `gauges` appended.
    pub fn render(&self, gauges: &[Gauge]) -> String {
        let (ensure, exec) = match self.inner.lock() {
            Ok(inner) => (inner.ensure.clone(), inner.exec.clone()),
            Err(_) => (BTreeMap::new(), BTreeMap::new()),
        };
        let mut out = String::new();
        let _ = writeln!(out, "# HELP sandlane_ensures_total Sandbox ensures by kind and outcome.");
        let _ = writeln!(out, "# TYPE sandlane_ensures_total counter");
        for ((kind, outcome), h) in &ensure {
            let _ =
                writeln!(out, "sandlane_ensures_total{{kind=\"{kind}\",outcome=\"{outcome}\"}} {}", h.count);
        }
        histogram(
            &mut out,
            "sandlane_ensure_duration_seconds",
            "Sandbox ensure latency by kind and outcome.",
            ensure.iter().map(|((k, o), h)| (format!("kind=\"{k}\",outcome=\"{o}\""), h)),
        );
        let _ = writeln!(out, "# HELP sandlane_execs_total Commands run in sandboxes by outcome.");
        let _ = writeln!(out, "# TYPE sandlane_execs_total counter");
        for (outcome, h) in &exec {
            let _ = writeln!(out, "sandlane_execs_total{{outcome=\"{outcome}\"}} {}", h.count);
        }
        histogram(
            &mut out,
            "sandlane_exec_duration_seconds",
            "Exec latency by outcome.",
            exec.iter().map(|(o, h)| (format!("outcome=\"{o}\""), h)),
        );
        for g in gauges {
            let _ = writeln!(out, "# HELP {} {}", g.name, g.help);
            let _ = writeln!(out, "# TYPE {} gauge", g.name);
            let _ = writeln!(out, "{} {}", g.name, g.value);
        }
        out
    }
}

fn histogram<'a>(
    out: &mut String,
    name: &str,
    help: &str,
    series: impl Iterator<Item = (String, &'a Histogram)>,
) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} histogram");
    for (labels, h) in series {
        for (bound, count) in BUCKETS.iter().zip(h.counts) {
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{bound}\"}} {count}");
        }
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", h.count);
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", h.sum);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", h.count);
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
        let text =
            m.render(&[Gauge { name: "sandlane_live_sandboxes", help: "Live sandboxes.", value: 3.0 }]);
        assert!(text.contains("sandlane_ensures_total{kind=\"session\",outcome=\"ready\"} 2"), "{text}");
        assert!(text.contains(
            "sandlane_ensure_duration_seconds_bucket{kind=\"session\",outcome=\"ready\",le=\"0.005\"} 1"
        ));
        assert!(text.contains(
            "sandlane_ensure_duration_seconds_bucket{kind=\"session\",outcome=\"ready\",le=\"0.25\"} 2"
        ));
        assert!(text.contains("sandlane_execs_total{outcome=\"ok\"} 1"));
        assert!(text.contains("sandlane_live_sandboxes 3"));
    }
}
