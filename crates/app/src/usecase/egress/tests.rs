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

/// Counts the log lines (INFO and above, the server's default) this thread writes while
/// the returned guard lives (use a current-thread runtime), whatever other tests run in
/// the same process.
struct LogLines(Arc<std::sync::atomic::AtomicUsize>);

impl LogLines {
    fn capture() -> (Self, tracing::subscriber::DefaultGuard) {
        // As `usecase::tests::Logs`: a second dispatcher that lives as long as the process
        // makes every callsite ask this thread's default too, whichever thread hit it first.
        static SECOND: std::sync::OnceLock<tracing::Dispatch> = std::sync::OnceLock::new();
        SECOND.get_or_init(|| tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default()));
        let lines = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || LineCounter(counted.clone()))
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        (Self(lines), tracing::subscriber::set_default(subscriber))
    }

    fn count(&self) -> usize {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

struct LineCounter(Arc<std::sync::atomic::AtomicUsize>);

impl std::io::Write for LineCounter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let lines = buf.iter().filter(|b| **b == b'\n').count();
        self.0.fetch_add(lines, std::sync::atomic::Ordering::SeqCst);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The process's resident memory, in bytes (`/proc/self/statm`: pages).
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// Sends `GET http://NAME/` for each name on one keep-alive connection to the proxy and
/// reads each answer: how many were refused by the proxy (403).
async fn ask_names(proxy: std::net::SocketAddr, names: impl Iterator<Item = String>) -> usize {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
    let stream = tokio::net::TcpStream::connect(proxy).await.unwrap();
    let (rx, mut tx) = stream.into_split();
    let mut rx = tokio::io::BufReader::new(rx);
    let (mut refused, mut line, mut body) = (0, String::new(), Vec::new());
    for name in names {
        tx.write_all(format!("GET http://{name}/ HTTP/1.1\r\nhost: {name}\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut length = 0;
        let mut status = None;
        loop {
            line.clear();
            rx.read_line(&mut line).await.unwrap();
            if status.is_none() {
                status = line.split_whitespace().nth(1).map(str::to_owned);
            } else if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap();
            }
            if line == "\r\n" || line.is_empty() {
                break;
            }
        }
        body.resize(length, 0);
        rx.read_exact(&mut body).await.unwrap();
        if status.as_deref() == Some("403") && body.windows(13).any(|w| w == b"not in the eg") {
            refused += 1;
        }
    }
    refused
}

/// A name of ~200 characters, distinct for each `i` (names as long as DNS allows cost a
/// server that remembers each one the most).
fn long_name(i: usize) -> String {
    format!("n{i:07}-{}.{}.{}.refused.test", "a".repeat(50), "b".repeat(60), "c".repeat(60))
}

/// 50,000 distinct refused names through one sandbox's proxy (the real proxy, its client on
/// the loopback, the real gate): the server's memory grows by less than 10 MiB, the
/// throttle holds at most its cap of destinations, and the audit events and log lines are
/// bounded by the cap, every decision still counted in them.
///
/// The memory is the process's resident set, so the test runs alone in a child process of
/// this test binary: beside the other tests (plain `cargo test` runs them as threads of one
/// process) it would count their memory too.
#[test]
fn fifty_thousand_refused_names_cost_the_server_a_bounded_amount() {
    const ALONE: &str = "SANDLANE_TEST_ALONE";
    if std::env::var_os(ALONE).is_some() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        return runtime.block_on(fifty_thousand_refused_names_alone());
    }
    let module = module_path!().split_once("::").map_or("", |(_, rest)| rest);
    let name = format!("{module}::fifty_thousand_refused_names_cost_the_server_a_bounded_amount");
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([name.as_str(), "--exact", "--test-threads=1", "--nocapture"])
        .env(ALONE, "1")
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the test alone failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("1 passed"), "the test alone did not run:\n{stdout}");
}

async fn fifty_thousand_refused_names_alone() {
    const CAP: u32 = 100;
    const WARM: usize = 1_000;
    const NAMES: usize = 50_000;
    const CLIENTS: usize = 8;
    let (lines, _guard) = LogLines::capture();
    let mut audit = MockAuditLog::new();
    let events = recording_audit(&mut audit);
    let limits = EgressLimits {
        max_connections: 64,
        max_bytes: 1 << 30,
        audit_burst: 10,
        audit_sandbox_cap: CAP,
        audit_window_ms: 60_000,
    };
    let (gate, _) = gate_with(registry(), audit, resolver("93.184.216.34"), limits);
    let gate = Arc::new(gate);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy = listener.local_addr().unwrap();
    let port: Arc<dyn EgressGate> = gate.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let gate = port.clone();
            tokio::spawn(async move { adapters::egress::serve_http(stream, &sandbox(), gate).await });
        }
    });
    let run = |from: usize, to: usize| async move {
        let per = (to - from).div_ceil(CLIENTS);
        let clients: Vec<_> = (0..CLIENTS)
            .map(|c| {
                let range = (from + c * per)..(from + (c + 1) * per).min(to);
                tokio::spawn(ask_names(proxy, range.map(long_name)))
            })
            .collect();
        let mut refused = 0;
        for client in clients {
            refused += client.await.unwrap();
        }
        refused
    };
    // Warm up the connections, the runtime and the throttle's first window.
    assert_eq!(run(0, WARM).await, WARM);
    let before = rss();
    assert_eq!(run(WARM, WARM + NAMES).await, NAMES, "every name refused by the proxy");
    let after = rss();
    let held = gate.decisions.held();
    assert!(held <= CAP as usize, "the throttle holds {held} destinations, past its cap of {CAP}");
    let grown = after.saturating_sub(before);
    assert!(grown < 10 << 20, "the server's memory grew by {} KiB for {NAMES} names", grown >> 10);

    // The sandbox ends: its summaries are written.
    gate.forget(&sandbox()).await;
    let events = events.lock().unwrap().clone();
    assert!(events.len() <= CAP as usize + 2, "{} audit events", events.len());
    let one_by_one = events.iter().filter(|e| e.action == AuditAction::Egress).count();
    assert_eq!(one_by_one, CAP as usize);
    let counted: u64 = events
        .iter()
        .filter(|e| e.action == AuditAction::EgressSummary)
        .map(|e| e.message.split(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(one_by_one as u64 + counted, (WARM + NAMES) as u64, "every refusal in the audit");
    assert!(events.iter().all(|e| e.outcome == AuditOutcome::Refused));
    // One line per event written: the refusals one by one, then the summary's.
    assert!(lines.count() <= events.len(), "{} log lines for {} audit events", lines.count(), events.len());
    assert!(lines.count() >= one_by_one, "the refusals written one by one are logged");
}

// ---------------------------------------------------------------------------------------
// brokered secrets

mod brokered {
    use std::sync::atomic::{AtomicBool, Ordering};

    use domain::broker::{BindingInput, SecretBinding, SecretName, SecretScope};
    use domain::{IdentityId, SandboxCaller, SecretValue};
    use ports::{BrokerUse, MockCallerDirectory, SecretGuard, SecretStore};

    use super::*;
    use crate::test_support::MemorySecretStore;

    struct Broker {
        gate: EgressService,
        store: Arc<MemorySecretStore>,
        events: Arc<Mutex<Vec<domain::AuditEvent>>>,
        caller: Arc<Mutex<SandboxCaller>>,
        revoked: Arc<AtomicBool>,
    }

    fn broker() -> Broker {
        let caller = Arc::new(Mutex::new(SandboxCaller::from_record(
            IdentityId::parse("alice").unwrap(),
            CallerClass::User,
        )));
        let now = caller.clone();
        let mut registry = MockSandboxRegistry::new();
        registry.expect_get().returning(move |id| {
            let key = SandboxKey::Session { org: org(), session_id: SessionId::parse("sess-1").unwrap() };
            let mut record = existing_ready(key, id);
            record.token_caller = now.lock().unwrap().clone();
            Ok(Some(record))
        });
        let mut audit = MockAuditLog::new();
        let events = recording_audit(&mut audit);
        let revoked = Arc::new(AtomicBool::new(false));
        let is_revoked = revoked.clone();
        let mut directory = MockCallerDirectory::new();
        directory.expect_is_revoked().returning(move |_| Ok(is_revoked.load(Ordering::Relaxed)));
        let store = Arc::new(MemorySecretStore::default());
        // Both classes get the list here: the caller switches class in these tests.
        struct Both(Allowlist);
        #[async_trait]
        impl AllowlistSource for Both {
            async fn allowlist(&self, _: &OrgId, _: CallerClass) -> Result<Allowlist, AllowlistError> {
                Ok(self.0.clone())
            }
        }
        let gate = EgressService::new(
            Arc::new(registry),
            Arc::new(audit),
            Arc::new(clock()),
            Arc::new(resolver("93.184.216.34")),
            Arc::new(Both(list())),
            limits(),
            Arc::new(Metrics::default()),
        )
        .with_secrets(store.clone(), Arc::new(directory));
        Broker { gate, store, events, caller, revoked }
    }

    async fn put(store: &MemorySecretStore, name: &str, scope: SecretScope, value: &str) {
        let hosts = vec!["api.example.com:443".to_owned()];
        let paths = vec!["/repos".to_owned()];
        let input = BindingInput { hosts: &hosts, paths: &paths, ..BindingInput::default() };
        let b = SecretBinding::new(SecretName::parse(name).unwrap(), scope, &input).unwrap();
        store
            .put(
                &org(),
                &b,
                &SecretValue::new(value),
                &SecretGuard::Any,
                ports::SecretLimits { per_org: 100, per_identity: 100 },
                domain::Timestamp::from_unix_millis(NOW),
            )
            .await
            .unwrap();
    }

    /// The (secret, rendered value) of the grant for api.example.com:443, if brokered.
    async fn injected(b: &Broker) -> Option<(String, String)> {
        b.gate.forget(&sandbox()).await;
        let grant = b.gate.open(&ask("api.example.com", 443)).await.unwrap();
        grant.broker.map(|br| {
            assert_eq!(br.injections.len(), 1);
            let i = &br.injections[0];
            assert_eq!(i.header, "authorization");
            (i.secret.clone(), i.value.expose().to_owned())
        })
    }

    #[tokio::test]
    async fn identity_beats_class_beats_org_for_the_caller_the_sandbox_acts_for_now() {
        let b = broker();
        assert_eq!(injected(&b).await, None, "no secret: end to end");
        put(&b.store, "org", SecretScope::Org, "o").await;
        assert_eq!(injected(&b).await, Some(("org".into(), "Bearer o".into())));
        put(&b.store, "users", SecretScope::Class(CallerClass::User), "u").await;
        assert_eq!(injected(&b).await, Some(("users".into(), "Bearer u".into())));
        put(&b.store, "alice", SecretScope::Identity(IdentityId::parse("alice").unwrap()), "a").await;
        assert_eq!(injected(&b).await, Some(("alice".into(), "Bearer a".into())));
        // A service ensured the same session: its token, its secrets.
        *b.caller.lock().unwrap() =
            SandboxCaller::from_record(IdentityId::parse("svc").unwrap(), CallerClass::Service);
        assert_eq!(injected(&b).await, Some(("org".into(), "Bearer o".into())));
        // Another host: none.
        let grant = b.gate.open(&ask("www.example.com", 443)).await.unwrap();
        assert!(grant.broker.is_none());
        // The allowed decision names the secrets, never their values.
        let events = b.events.lock().unwrap().clone();
        assert!(events.iter().any(|e| e.message.contains("brokered secrets org")));
        assert!(events.iter().all(|e| !e.message.contains("Bearer")));
    }

    /// A plain HTTP request goes in clear: a secret bound to a host without a port, or to
    /// 443, is not added to it (`http://api.example.com:443/` would carry it in clear on
    /// the way to a TLS port); the same destination through `CONNECT` (TLS) gets it.
    #[tokio::test]
    async fn a_secret_is_never_sent_in_clear_to_a_port_its_binding_does_not_name() {
        let b = broker();
        put(&b.store, "org", SecretScope::Org, "o").await;
        let plain = EgressRequest { kind: EgressKind::Http, ..ask("api.example.com", 443) };
        let grant = b.gate.open(&plain).await.unwrap();
        assert!(grant.broker.is_none(), "a plain request to 443 carries no secret");
        assert_eq!(injected(&b).await, Some(("org".into(), "Bearer o".into())), "through TLS it does");
    }

    #[tokio::test]
    async fn a_revoked_caller_or_a_deleted_secret_stops_at_the_next_connection() {
        let b = broker();
        put(&b.store, "alice", SecretScope::Identity(IdentityId::parse("alice").unwrap()), "a").await;
        assert!(injected(&b).await.is_some());
        b.revoked.store(true, Ordering::Relaxed);
        assert_eq!(injected(&b).await, None, "revoked: no secret");
        b.revoked.store(false, Ordering::Relaxed);
        assert!(injected(&b).await.is_some());
        b.store.delete(&org(), &SecretName::parse("alice").unwrap(), &SecretGuard::Any).await.unwrap();
        assert_eq!(injected(&b).await, None, "deleted: no secret");
    }

    #[tokio::test]
    async fn a_store_failure_refuses_the_destination() {
        let b = broker();
        put(&b.store, "org", SecretScope::Org, "o").await;
        b.store.failing.store(true, Ordering::Relaxed);
        let refused = b.gate.open(&ask("api.example.com", 443)).await.unwrap_err();
        assert!(matches!(refused, EgressRefusal::Unavailable(_)), "{refused:?}");
        let last = b.events.lock().unwrap().last().cloned().unwrap();
        assert_eq!(last.outcome, AuditOutcome::Refused);
    }

    #[tokio::test]
    async fn each_use_is_audited_without_the_value_and_a_failed_audit_refuses() {
        let b = broker();
        put(&b.store, "org", SecretScope::Org, "sekrit-value").await;
        let grant = b.gate.open(&ask("api.example.com", 443)).await.unwrap();
        let brokered = grant.broker.unwrap();
        let used = BrokerUse {
            sandbox: sandbox(),
            secret: "org".into(),
            host: "api.example.com".into(),
            method: "GET".into(),
            path: "/repos/x".into(),
            allowed: true,
        };
        assert!(brokered.audit.record(&used).await);
        assert!(
            brokered.audit.record(&BrokerUse { allowed: false, path: "/admin".into(), ..used.clone() }).await
        );
        let events = b.events.lock().unwrap().clone();
        let uses: Vec<_> = events.iter().filter(|e| e.action == AuditAction::SecretUse).collect();
        assert_eq!(uses.len(), 2);
        assert_eq!(uses[0].message, "org GET api.example.com/repos/x: sent with the secret");
        assert_eq!((uses[0].outcome, uses[1].outcome), (AuditOutcome::Allowed, AuditOutcome::Refused));
        assert_eq!(uses[0].caller_id.as_str(), "alice", "the caller it acted for");
        assert!(events.iter().all(|e| !e.message.contains("sekrit")));

        // When the audit cannot take the event, the proxy is told to refuse.
        let mut audit = MockAuditLog::new();
        audit.expect_append().returning(|_| Err(AuditError::Store(ports::Cause::msg("down"))));
        let uses = Arc::new(ThrottledAudit::new(Arc::new(audit), Arc::new(clock()), USES, (10, 100, 60_000)));
        let key = SandboxKey::Session { org: org(), session_id: SessionId::parse("sess-1").unwrap() };
        let failing = ConnectionUses { uses, record: Arc::new(existing_ready(key, &sandbox())) };
        assert!(!failing.record(&used).await);
    }
}
