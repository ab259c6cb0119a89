//! What a sandbox's files cost the server, end to end: the real `sandlane` binary and a
//! real bubblewrap sandbox. Twenty clients list a directory of 100,000 entries at once and
//! the server's memory (its peak resident set, `VmHWM`) grows by less than 50 MiB: each
//! listing is streamed, a batch at a time, never held whole. And a sandbox's file
//! operations under way are capped: one more than `streams.max_file_ops_per_sandbox` is
//! 429 `resource_exhausted`, and a place is given back when its client goes away.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::streams::agent;
use crate::support::{Backend, Env, Server, assert_error};

/// How many entries the big directory holds: the most a listing holds.
const ENTRIES: u32 = 100_000;
/// How many clients list it at once.
const CLIENTS: usize = 20;
/// How much the server's peak memory may grow while they do.
const BUDGET_KIB: u64 = 50 << 10;

/// A line of `/proc/<pid>/status`, in KiB.
fn status_kib(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the server's status");
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in the server's status"))
}

/// Lists `dir` in `sandbox`: the status and the entries' names.
fn list(server: &Server, key: &str, sandbox: &str, dir: &str) -> (u16, Vec<String>, String) {
    let url = format!("{}/v1/orgs/acme/sandboxes/{sandbox}/files?path={dir}", server.base);
    let mut response =
        agent().get(&url).header("authorization", &format!("Bearer {key}")).call().expect("list");
    let status = response.status().as_u16();
    let text =
        response.body_mut().with_config().limit(64 << 20).read_to_string().expect("the listing's body");
    if status != 200 {
        return (status, Vec::new(), text);
    }
    let listing: serde_json::Value = serde_json::from_str(&text).expect("the documented JSON");
    let entries = listing["entries"].as_array().expect("{\"entries\":[…]}");
    assert!(entries.iter().all(|e| e["type"] == "file"), "every entry is a file");
    let names = entries.iter().map(|e| e["name"].as_str().expect("a name").to_owned()).collect();
    (status, names, String::new())
}

/// The names of a whole listing of the big directory: every one of 1..=ENTRIES, once, in
/// name order.
fn assert_whole(names: &[String]) {
    assert_eq!(names.len(), ENTRIES as usize);
    assert!(names.windows(2).all(|w| w[0] < w[1]), "sorted by name");
    let mut numbers: Vec<u32> = names.iter().map(|n| n.parse().expect("a number")).collect();
    numbers.sort_unstable();
    assert!(numbers.iter().copied().eq(1..=ENTRIES), "every entry, once");
}

/// Starts a download of `path` and reads only its head, leaving its body unread (so the
/// transfer stays under way); the connection, to drop later.
fn download_held(server: &Server, key: &str, sandbox: &str, path: &str) -> TcpStream {
    let address = server.base.trim_start_matches("http://");
    let mut stream = TcpStream::connect(address).expect("connect");
    write!(
        stream,
        "GET /v1/orgs/acme/sandboxes/{sandbox}/files?path={path} HTTP/1.1\r\nhost: {address}\r\n\
         authorization: Bearer {key}\r\n\r\n"
    )
    .expect("send the request");
    stream.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(
            stream.read(&mut byte).expect("the head"),
            1,
            "the head: {}",
            String::from_utf8_lossy(&head)
        );
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    stream
}

pub fn twenty_listings_of_a_big_directory_cost_the_server_little() {
    let Some(mut env) = Env::new(Backend::Sqlite) else { return };
    // Room for every client at once: the bound shown is the streaming's, not the cap's.
    env.set("SANDLANE_STREAMS__MAX_FILE_OPS_PER_SANDBOX", &CLIENTS.to_string());
    // A workspace without a quota image: 100,000 files need more inodes than 1 GiB of ext4.
    env.set("SANDLANE_POLICY__WORKSPACE_BYTES", "unlimited");
    let key = env.add_caller("svc-files", "service", &["acme"]);
    let server = Server::start_binary(&env);
    let got = server.call(
        "PUT",
        "/v1/orgs/acme/sessions/files-1/sandbox",
        Some(&key),
        Some(json!({"execution_id": "exec-files-1"})),
    );
    assert_eq!((got.0, got.1["outcome"].as_str()), (200, Some("ready")), "{}", got.1);
    let sandbox = got.1["sandbox"]["id"].as_str().unwrap().to_owned();
    let script = format!(
        "mkdir /workspace/big && cd /workspace/big && seq 1 {ENTRIES} | xargs touch 2>&1 | tail -3 && ls | wc -l && \
         head -c 67108864 /dev/zero > /workspace/blob && echo made"
    );
    let made = server.call(
        "POST",
        &format!("/v1/orgs/acme/sandboxes/{sandbox}/exec"),
        Some(&key),
        Some(json!({"argv": ["/bin/sh", "-c", script], "timeout_ms": 120_000})),
    );
    assert_eq!(
        (made.0, made.1["stdout"].as_str()),
        (200, Some(format!("{ENTRIES}\nmade\n").as_str())),
        "{}",
        made.1
    );

    // One listing first, whole: whatever the server sets up once is set up.
    let (status, names, body) = list(&server, &key, &sandbox, "/workspace/big");
    assert_eq!(status, 200, "{body}");
    assert_whole(&names);
    let pid = server.pid();
    let before = status_kib(pid, "VmHWM");

    let start = std::sync::Barrier::new(CLIENTS);
    let started = Instant::now();
    let listed: Vec<usize> = std::thread::scope(|s| {
        let clients: Vec<_> = (0..CLIENTS)
            .map(|_| {
                s.spawn(|| {
                    start.wait();
                    let (status, names, body) = list(&server, &key, &sandbox, "/workspace/big");
                    assert_eq!(status, 200, "{body}");
                    assert_whole(&names);
                    names.len()
                })
            })
            .collect();
        clients.into_iter().map(|c| c.join().expect("a client")).collect()
    });
    let after = status_kib(pid, "VmHWM");
    assert_eq!(listed, vec![ENTRIES as usize; CLIENTS]);
    let grown = after.saturating_sub(before);
    eprintln!(
        "{CLIENTS} listings of {ENTRIES} entries in {:?}: the server's VmHWM {before} kB -> {after} kB \
         (+{grown} kB; VmRSS now {} kB)",
        started.elapsed(),
        status_kib(pid, "VmRSS")
    );
    assert!(grown < BUDGET_KIB, "the server's peak memory grew by {grown} kB, over {BUDGET_KIB} kB");

    // The cap: with every place held by a download under way, one more file operation
    // (of any kind) is refused; a client that goes away gives its place back.
    let held: Vec<TcpStream> =
        (0..CLIENTS).map(|_| download_held(&server, &key, &sandbox, "/workspace/blob")).collect();
    let (status, _, body) = list(&server, &key, &sandbox, "/workspace/big");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    assert_error(&(status, body.clone()), 429, "resource_exhausted");
    assert!(body["message"].as_str().unwrap().contains("streams.max_file_ops_per_sandbox"), "{body}");
    let delete = server.call(
        "DELETE",
        &format!("/v1/orgs/acme/sandboxes/{sandbox}/files?path=/workspace/blob"),
        Some(&key),
        None,
    );
    assert_error(&delete, 429, "resource_exhausted");
    let mut held = held.into_iter();
    drop(held.next());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, names, body) = list(&server, &key, &sandbox, "/workspace/big");
        if status == 200 {
            assert_whole(&names);
            break;
        }
        assert_eq!(status, 429, "{body}");
        assert!(Instant::now() < deadline, "the place of a client that went away was never given back");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(held);
}
