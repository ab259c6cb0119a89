//! What a client without a key can hold or learn. Half-sent requests and a full
//! connection table hold nothing for long (`http.header_timeout_ms`,
//! `http.max_connections`); `/metrics` without a key shows no org, and with a service
//! caller's key only that caller's orgs.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::{Backend, Env, Server};

/// A request's head without its final blank line.
const HALF: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: x\r\n";

/// Raises this process's soft limit on open files to its hard limit (the in-process server
/// shares it) and returns the soft limit.
#[allow(unsafe_code)]
fn raise_open_files() -> u64 {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `limit` is a valid, exclusively borrowed `rlimit` for getrlimit to fill.
    let got = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    assert_eq!(got, 0, "getrlimit: {}", std::io::Error::last_os_error());
    if limit.rlim_cur < limit.rlim_max {
        limit.rlim_cur = limit.rlim_max;
        // SAFETY: `limit` is a valid `rlimit` that setrlimit only reads; a soft limit up
        // to the hard one needs no privilege.
        let set = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) };
        assert_eq!(set, 0, "setrlimit: {}", std::io::Error::last_os_error());
    }
    limit.rlim_cur
}

/// Whether the server ended `stream` (EOF or reset) before `deadline`.
fn closed_by(stream: &mut TcpStream, deadline: Instant) -> Result<(), String> {
    let mut buf = [0u8; 256];
    loop {
        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        stream.set_read_timeout(Some(left)).map_err(|e| e.to_string())?;
        match stream.read(&mut buf) {
            Ok(0) => return Ok(()),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return Ok(()),
            Ok(n) => return Err(format!("{n} bytes of an answer to half a request")),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err("still open".into());
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// 2,000 connections that each send half a request: a new client is still served at
/// once, and the server closes every half-open connection within the header timeout.
pub fn half_sent_requests_are_cut_at_the_header_timeout() {
    const CLIENTS: usize = 2_000;
    let open_files = raise_open_files();
    assert!(
        open_files >= 2 * CLIENTS as u64 + 1_000,
        "this test holds {CLIENTS} connections at both ends: raise the hard `ulimit -n` (now {open_files})"
    );
    let Some(mut env) = Env::new(Backend::Sqlite) else { return };
    env.set("SANDLANE_HTTP__HEADER_TIMEOUT_MS", "1000");
    // Above the clients, whatever this host's open-file limit makes the default.
    env.set("SANDLANE_HTTP__MAX_CONNECTIONS", "4096");
    let server = Server::start(&env);
    let address = server.base.trim_start_matches("http://").to_owned();

    let start = Instant::now();
    let mut half: Vec<TcpStream> = (0..CLIENTS)
        .map(|i| {
            let mut stream = TcpStream::connect(&address).unwrap_or_else(|e| panic!("connection {i}: {e}"));
            stream.write_all(HALF).unwrap_or_else(|e| panic!("connection {i}: {e}"));
            stream
        })
        .collect();
    let sent = Instant::now();
    eprintln!("{CLIENTS} half requests sent in {:?}", sent - start);

    let asked = Instant::now();
    let (status, body) = server.call("GET", "/healthz", None, None);
    let answered = asked.elapsed();
    assert_eq!(status, 200, "{body}");
    assert!(answered < Duration::from_millis(500), "a new client waited {answered:?}");
    if sent - start < Duration::from_millis(500) {
        // Not refused at once: held until the timeout.
        let last = half.last_mut().unwrap();
        last.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 16];
        let read = last.read(&mut buf);
        assert!(
            matches!(&read, Err(e) if e.kind() == ErrorKind::WouldBlock),
            "the last half request was ended before its timeout: {read:?}"
        );
        last.set_nonblocking(false).unwrap();
    }

    // The timeout (1 s) runs from each accept; 1.5 s of slack for a loaded machine.
    let deadline = sent + Duration::from_millis(2_500);
    for (i, stream) in half.iter_mut().enumerate() {
        if let Err(e) = closed_by(stream, deadline) {
            panic!("half request {i} not closed {:?} after the last was sent: {e}", sent.elapsed());
        }
    }
    eprintln!("every half-open connection closed {:?} after the last was sent", sent.elapsed());
    assert_eq!(server.call("GET", "/healthz", None, None).0, 200, "the server goes on");
}

/// With `http.max_connections` 4, a fifth client is not served until one of the four
/// closes; then it is, and `/healthz` answers again once they are gone.
pub fn past_the_connection_cap_a_client_waits_for_a_place() {
    let Some(mut env) = Env::new(Backend::Sqlite) else { return };
    env.set("SANDLANE_HTTP__MAX_CONNECTIONS", "4");
    let server = Server::start(&env);
    let address = server.base.trim_start_matches("http://").to_owned();
    let mut holders: Vec<TcpStream> = (0..4).map(|_| TcpStream::connect(&address).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(200));

    let mut fifth = TcpStream::connect(&address).expect("the kernel's queue takes it");
    fifth.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    fifth.set_read_timeout(Some(Duration::from_millis(700))).unwrap();
    let mut buf = [0u8; 1024];
    let early = crate::support::read_through_signals(&mut fifth, &mut buf);
    assert!(
        matches!(&early, Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)),
        "served past the cap: {early:?}"
    );

    drop(holders.remove(0));
    fifth.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut answer = Vec::new();
    let read = fifth.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer);
    assert!(
        read.is_ok() && text.starts_with("HTTP/1.1 200"),
        "served once a place was free: {read:?} {text}"
    );

    drop(holders);
    let (status, body) = server.call("GET", "/healthz", None, None);
    assert_eq!(status, 200, "{body}");
}

fn ensure(server: &Server, key: &str, org: &str, session: &str) {
    let got = server.call(
        "PUT",
        &format!("/v1/orgs/{org}/sessions/{session}/sandbox"),
        Some(key),
        Some(json!({"execution_id": "e1"})),
    );
    assert_eq!((got.0, got.1["outcome"].as_str()), (200, Some("ready")), "{}", got.1);
}

/// Sandboxes in two orgs: `/metrics` without a key names neither org; with a service
/// caller's key of one, that org's series and not the other's; a user's key is refused.
pub fn metrics_show_no_org_without_a_key_and_only_the_callers_orgs_with_one() {
    const A: &str = "tenant-a7q";
    const B: &str = "tenant-b9z";
    let Some(env) = Env::new(Backend::Sqlite) else { return };
    let service_a = env.add_caller("svc-a", "service", &[A]);
    let service_b = env.add_caller("svc-b", "service", &[B]);
    let user_a = env.add_caller("user-a", "user", &[A]);
    let server = Server::start(&env);
    ensure(&server, &service_a, A, "s1");
    ensure(&server, &service_b, B, "s1");
    ensure(&server, &service_b, B, "s2");

    let (status, anonymous) = server.get_text("/metrics");
    assert_eq!(status, 200, "{anonymous}");
    for hidden in [A, B, "org="] {
        assert!(!anonymous.contains(hidden), "{hidden} in the anonymous scrape:\n{anonymous}");
    }
    assert!(anonymous.contains("sandlane_sandboxes{state=\"ready\"} 3"), "the totals:\n{anonymous}");

    let (status, of_a) = server.get_text_as("/metrics", Some(&service_a));
    assert_eq!(status, 200, "{of_a}");
    assert!(of_a.contains(&format!("sandlane_org_sandboxes{{org=\"{A}\",state=\"ready\"}} 1")), "{of_a}");
    assert!(!of_a.contains(B), "{B} in {A}'s scrape:\n{of_a}");
    let (_, of_b) = server.get_text_as("/metrics", Some(&service_b));
    assert!(of_b.contains(&format!("sandlane_org_sandboxes{{org=\"{B}\",state=\"ready\"}} 2")), "{of_b}");
    assert!(!of_b.contains(A), "{A} in {B}'s scrape:\n{of_b}");

    assert_eq!(server.get_text_as("/metrics", Some(&user_a)).0, 403);
    assert_eq!(server.get_text_as("/metrics", Some("sk_not_a_key")).0, 401);
}

/// `sandlane serve` raises its soft limit of open files to the hard one at start, so the
/// default cap on connections (a quarter of it) is not that of a login's 1024.
#[test]
#[allow(unsafe_code)]
pub fn serve_raises_its_open_files_limit() {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `limit` is a valid, exclusively borrowed `rlimit` for getrlimit to fill.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) }, 0);
    let hard = limit.rlim_max;
    assert!(hard > 2048, "the test needs a hard limit above 2048, not {hard}");
    let Some(env) = Env::new(Backend::Sqlite) else { return };
    let server = Server::start_binary_with_soft_nofile(&env, 1024);
    // The address is read off the listening line as it is logged, just before the line is
    // kept: wait for it.
    let deadline = Instant::now() + Duration::from_secs(10);
    let logs = loop {
        let logs = server.log_text();
        if logs.contains("sandlane listening") || Instant::now() > deadline {
            break logs;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let line = logs.lines().find(|l| l.contains("sandlane listening")).expect("the listening line");
    let logged: serde_json::Value = serde_json::from_str(line).expect("a JSON log line");
    let cap = logged["fields"]["max_connections"].as_u64().expect("max_connections logged");
    let expected = (hard / 4).min(u64::from(u32::MAX));
    assert_eq!(cap, expected, "started at a soft limit of 1024 (a cap of 256), raised to {hard}: {line}");
}
