//! The gate against mocks: the rules, the limits, the audit, and refusing when it cannot
//! tell.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use domain::egress::{AddressRange, Allowlist, HostRule, RangeRule};
use domain::{AuditAction, AuditOutcome, CallerClass, OrgId, SandboxId, SandboxKey, SessionId};
use ports::{
    AuditError, EgressGate, EgressKind, EgressRefusal, EgressRequest, MockAuditLog, MockClock, MockResolver,
    MockSandboxRegistry, RegistryError, ResolveError,
};

use super::*;
use crate::test_support::{NOW, existing_ready, org, recording_audit};

struct Fixed(Allowlist);

#[async_trait]
impl AllowlistSource for Fixed {
    async fn allowlist(&self, _org: &OrgId, class: CallerClass) -> Result<Allowlist, AllowlistError> {
        // Only user callers get the list: the class is the one the sandbox's token is for.
        Ok(if class == CallerClass::User { self.0.clone() } else { Allowlist::default() })
    }
}

fn sandbox() -> SandboxId {
    SandboxId::generate(1, 7)
}

fn registry() -> MockSandboxRegistry {
    let mut registry = MockSandboxRegistry::new();
    registry.expect_get().returning(|id| {
        let key = SandboxKey::Session { org: org(), session_id: SessionId::parse("sess-1").unwrap() };
        Ok(Some(existing_ready(key, id)))
    });
    registry
}

fn clock() -> MockClock {
    let mut clock = MockClock::new();
    clock.expect_now().returning(|| domain::Timestamp::from_unix_millis(NOW));
    clock
}

fn resolver(ip: &'static str) -> MockResolver {
    let mut resolver = MockResolver::new();
    resolver.expect_resolve().returning(move |host| {
        if host.starts_with("nowhere.") {
            return Err(ResolveError(format!("{host} does not resolve")));
        }
        Ok(vec![ip.parse::<IpAddr>().unwrap()])
    });
    resolver
}

fn limits() -> EgressLimits {
    EgressLimits {
        max_connections: 2,
        max_bytes: 100,
        audit_burst: 10,
        audit_sandbox_cap: 100,
        audit_window_ms: 60_000,
    }
}

fn list() -> Allowlist {
    Allowlist::new(
        vec![HostRule::new(true, "example.com", Some(443)), HostRule::new(false, "local.test", None)],
        vec![RangeRule::new(AddressRange::parse("127.0.0.0/8").unwrap(), None)],
    )
}

fn gate_with(
    registry: MockSandboxRegistry,
    audit: MockAuditLog,
    resolver: MockResolver,
    limits: EgressLimits,
) -> (EgressService, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::default());
    let gate = EgressService::new(
        Arc::new(registry),
        Arc::new(audit),
        Arc::new(clock()),
        Arc::new(resolver),
        Arc::new(Fixed(list())),
        limits,
        metrics.clone(),
    );
    (gate, metrics)
}

fn gate(ip: &'static str) -> (EgressService, Arc<Mutex<Vec<domain::AuditEvent>>>, Arc<Metrics>) {
    let mut audit = MockAuditLog::new();
    let events = recording_audit(&mut audit);
    let (gate, metrics) = gate_with(registry(), audit, resolver(ip), limits());
    (gate, events, metrics)
}

fn ask(host: &str, port: u16) -> EgressRequest {
    EgressRequest { sandbox: sandbox(), host: host.to_owned(), port, kind: EgressKind::Connect }
}

#[tokio::test]
async fn allowed_hosts_get_checked_addresses_and_an_audit_event() {
    let (gate, events, metrics) = gate("93.184.216.34");
    let grant = gate.open(&ask("API.Example.com", 443)).await.unwrap();
    assert_eq!(grant.addrs, vec!["93.184.216.34:443".parse().unwrap()]);
    let events = events.lock().unwrap().clone();
    assert_eq!(events.len(), 1);
    let e = &events[0];
    assert_eq!((e.action, e.outcome), (AuditAction::Egress, AuditOutcome::Allowed));
    assert_eq!(e.message, "connect api.example.com:443: allowed by *.example.com:443, to 93.184.216.34");
    assert_eq!(e.sandbox_id.as_ref(), Some(&sandbox()));
    assert_eq!(
        e.caller_id.as_str(),
        crate::test_support::CALLER_ID,
        "the caller whose token the sandbox holds"
    );
    assert!(acme_series(&metrics).contains("sandlane_org_egress_allowed_total{org=\"acme\"} 1"));
}

#[tokio::test]
async fn hosts_and_ports_not_covered_are_refused_and_audited() {
    let (gate, events, metrics) = gate("93.184.216.34");
    for (host, port) in [("example.com", 443), ("api.example.com", 80), ("evil.net", 443)] {
        let refused = gate.open(&ask(host, port)).await.unwrap_err();
        assert!(
            matches!(&refused, EgressRefusal::NotAllowed(m) if m.contains("is not in the egress allowlist of org acme for user callers")),
            "{refused:?}"
        );
    }
    let events = events.lock().unwrap().clone();
    assert_eq!(events.iter().filter(|e| e.outcome == AuditOutcome::Refused).count(), 3);
    assert!(
        events[2].message.starts_with("connect evil.net:443: refused: evil.net:443 is not in"),
        "{}",
        events[2].message
    );
    assert!(
        acme_series(&metrics)
            .contains("sandlane_org_egress_refusals_total{org=\"acme\",reason=\"not_allowed\"} 3")
    );
}

#[tokio::test]
async fn names_resolving_into_refused_ranges_are_refused_unless_named() {
    let (private, _, _) = gate("10.0.0.5");
    let refused = private.open(&ask("api.example.com", 443)).await.unwrap_err();
    assert!(
        matches!(&refused, EgressRefusal::NotAllowed(m) if m.contains("10.0.0.5 (private")),
        "{refused:?}"
    );
    // 127/8 is named by the list: allowed.
    let (loopback, _, _) = gate("127.0.0.1");
    assert!(loopback.open(&ask("local.test", 8080)).await.is_ok());
    let (mapped, _, _) = gate("::ffff:169.254.169.254");
    assert!(mapped.open(&ask("local.test", 80)).await.is_err(), "the mapped form of a refused range");
}

#[tokio::test]
async fn bad_and_unresolvable_hosts_are_refused() {
    let (gate, events, metrics) = gate("1.1.1.1");
    assert!(matches!(gate.open(&ask("a b", 443)).await, Err(EgressRefusal::BadRequest(_))));
    let refused = gate.open(&ask("nowhere.example.com", 443)).await.unwrap_err();
    assert!(
        matches!(&refused, EgressRefusal::Unresolvable(m) if m.contains("does not resolve")),
        "{refused:?}"
    );
    let events = events.lock().unwrap().clone();
    assert_eq!(events.len(), 2, "both audited: {events:?}");
    assert!(events.iter().all(|e| e.outcome == AuditOutcome::Refused));
    let text = acme_series(&metrics);
    assert!(
        text.contains("reason=\"bad_request\"} 1") && text.contains("reason=\"unresolvable\"} 1"),
        "{text}"
    );
}

#[tokio::test]
async fn connections_and_bytes_are_capped_per_sandbox() {
    let (gate, _, metrics) = gate("93.184.216.34");
    let first = gate.open(&ask("a.example.com", 443)).await.unwrap();
    let second = gate.open(&ask("b.example.com", 443)).await.unwrap();
    let third = gate.open(&ask("c.example.com", 443)).await.unwrap_err();
    assert!(
        matches!(&third, EgressRefusal::Limited(m) if m.contains("holds 2 egress connections")),
        "{third:?}"
    );
    drop(first);
    let again = gate.open(&ask("c.example.com", 443)).await.unwrap();
    // Bytes: 100 in all, whichever connection spends them.
    assert!(second.budget.spend(60));
    assert!(!again.budget.spend(41), "past the allowance");
    drop((second, again));
    let refused = gate.open(&ask("d.example.com", 443)).await.unwrap_err();
    assert!(
        matches!(&refused, EgressRefusal::Limited(m) if m.contains("used its egress allowance")),
        "{refused:?}"
    );
    let text = acme_series(&metrics);
    assert!(
        text.contains("reason=\"connections_limit\"} 1") && text.contains("reason=\"bytes_limit\"} 1"),
        "{text}"
    );
    // A sandbox that ended is forgotten: its allowance starts afresh.
    gate.forget(&sandbox()).await;
    assert!(gate.open(&ask("d.example.com", 443)).await.is_ok());
}

#[tokio::test]
async fn when_the_decision_cannot_be_audited_or_the_record_read_it_is_refused() {
    let mut audit = MockAuditLog::new();
    audit
        .expect_append()
        .returning(|_| Err(AuditError::Store(ports::Cause::new(std::io::Error::other("database is down")))));
    let (gate, _) = gate_with(registry(), audit, resolver("93.184.216.34"), limits());
    let refused = gate.open(&ask("api.example.com", 443)).await.unwrap_err();
    assert!(matches!(refused, EgressRefusal::Unavailable(_)), "{refused:?}");

    let mut registry = MockSandboxRegistry::new();
    registry
        .expect_get()
        .returning(|_| Err(RegistryError::Store(ports::Cause::new(std::io::Error::other("down")))));
    let mut audit = MockAuditLog::new();
    let events = recording_audit(&mut audit);
    let (gate, _) = gate_with(registry, audit, resolver("93.184.216.34"), limits());
    assert!(matches!(gate.open(&ask("api.example.com", 443)).await, Err(EgressRefusal::Unavailable(_))));
    let mut gone = MockSandboxRegistry::new();
    gone.expect_get().returning(|_| Ok(None));
    let (gate2, _) = gate_with(gone, MockAuditLog::new(), resolver("93.184.216.34"), limits());
    assert!(matches!(gate2.open(&ask("api.example.com", 443)).await, Err(EgressRefusal::NotAllowed(_))));
    assert!(events.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_hammered_destination_is_summarized_with_its_count() {
    let mut audit = MockAuditLog::new();
    let events = recording_audit(&mut audit);
    let limits = EgressLimits { audit_burst: 2, ..limits() };
    let (gate, _) = gate_with(registry(), audit, resolver("1.1.1.1"), limits);
    for _ in 0..7 {
        let _ = gate.open(&ask("evil.net", 443)).await;
    }
    assert_eq!(events.lock().unwrap().len(), 2, "the burst");
    gate.forget(&sandbox()).await;
    let events = events.lock().unwrap().clone();
    assert_eq!(events.len(), 3);
    assert_eq!((events[2].action, events[2].outcome), (AuditAction::EgressSummary, AuditOutcome::Refused));
    assert!(
        events[2].message.starts_with("5 more refused decisions for evil.net:443 since "),
        "{}",
        events[2].message
    );
}

/// A sandbox's connections within RECORD_TTL of the gate's read of its record cost no
/// other read; the first one after reads it again and obeys what it says now (here: the
/// sandbox was deprovisioned meanwhile).
#[tokio::test(start_paused = true)]
async fn the_gate_reads_a_sandbox_record_again_after_its_ttl() {
    let reads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut registry = MockSandboxRegistry::new();
    let counted = reads.clone();
    registry.expect_get().returning(move |id| {
        let key = SandboxKey::Session { org: org(), session_id: SessionId::parse("sess-1").unwrap() };
        let mut record = existing_ready(key, id);
        if counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst) > 0 {
            record.state = domain::SandboxState::Deprovisioned;
        }
        Ok(Some(record))
    });
    let mut audit = MockAuditLog::new();
    let _events = recording_audit(&mut audit);
    let (gate, _) = gate_with(registry, audit, resolver("93.184.216.34"), limits());
    for _ in 0..3 {
        drop(gate.open(&ask("api.example.com", 443)).await.expect("allowed"));
        tokio::time::advance(RECORD_TTL / 4).await;
    }
    assert_eq!(reads.load(std::sync::atomic::Ordering::SeqCst), 1, "one read within the TTL");
    tokio::time::advance(RECORD_TTL / 4).await;
    let refused = gate.open(&ask("api.example.com", 443)).await.map(|_| ()).unwrap_err();
    assert!(refused.to_string().contains("is not live"), "{refused}");
    assert_eq!(reads.load(std::sync::atomic::Ordering::SeqCst), 2);
}

/// What a service caller of `acme` scrapes.
fn acme_series(metrics: &Metrics) -> String {
    let acme = [domain::OrgId::parse("acme").unwrap()];
    metrics.render(crate::metrics::Scope::Orgs(&acme), &crate::metrics::OrgSnapshot::default())
}
