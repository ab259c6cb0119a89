//! What an agent does inside its sandbox, end to end on a real driver (bubblewrap, and
//! containers on the throwaway podman): streamed exec, background processes across a
//! server restart, files and archives byte-exact, paths that never lead out, an upload
//! over the cap, and who may.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{Backend, Env, Server, assert_error};

/// How a test runs its sandboxes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    Bubblewrap,
    Container,
}

/// The environment for `driver`, with the files cap at 100 MiB (a 64 MiB file fits; 1 GiB
/// does not). `None` when the driver's service is skipped by name.
fn env_for(driver: Driver) -> Option<Env> {
    let mut env = Env::new(Backend::Sqlite)?;
    if driver == Driver::Container {
        let engine = tests::services::podman_engine()?;
        env.set("SANDLANE_DRIVER", "container");
        env.set("SANDLANE_DOCKER_HOST", &engine.docker_host);
        env.set("SANDLANE_CONTAINER_IMAGE", &engine.image);
    }
    env.set("SANDLANE_STREAMS__MAX_FILE_BYTES", &(100u64 << 20).to_string());
    Some(env)
}

fn ensure(server: &Server, key: &str, session: &str) -> String {
    let got = server.call(
        "PUT",
        &format!("/v1/orgs/acme/sessions/{session}/sandbox"),
        Some(key),
        Some(json!({"execution_id": format!("exec-{session}")})),
    );
    assert_eq!((got.0, got.1["outcome"].as_str()), (200, Some("ready")), "{}", got.1);
    got.1["sandbox"]["id"].as_str().unwrap().to_owned()
}

pub(crate) fn agent() -> ureq::Agent {
    ureq::Agent::config_builder().http_status_as_error(false).build().new_agent()
}

fn sh(server: &Server, key: &str, sandbox: &str, script: &str) -> Value {
    let got = server.call(
        "POST",
        &format!("/v1/orgs/acme/sandboxes/{sandbox}/exec"),
        Some(key),
        Some(json!({"argv": ["/bin/sh", "-c", script], "timeout_ms": 30_000})),
    );
    assert_eq!(got.0, 200, "{}", got.1);
    got.1
}

/// The kernel's uptime in seconds, as the host sees it (the sandboxes share the clock).
fn uptime() -> f64 {
    let text = std::fs::read_to_string("/proc/uptime").unwrap();
    text.split_whitespace().next().unwrap().parse().unwrap()
}

/// A streamed exec: the response's lines as they come.
pub(crate) fn exec_lines(
    server: &Server,
    key: &str,
    sandbox: &str,
    argv: &[&str],
) -> impl Iterator<Item = Value> + use<> {
    let response = agent()
        .post(&format!("{}/v1/orgs/acme/sandboxes/{sandbox}/exec", server.base))
        .header("authorization", &format!("Bearer {key}"))
        .header("accept", "application/x-ndjson")
        .send_json(json!({"argv": argv, "timeout_ms": 60_000}))
        .expect("exec");
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(response.headers()["content-type"], "application/x-ndjson");
    BufReader::new(response.into_body().into_reader())
        .lines()
        .map(|l| serde_json::from_str::<Value>(&l.expect("a line")).expect("a JSON line"))
}

fn host_processes_with(marker: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())))
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|c| String::from_utf8_lossy(c).replace('\0', " ").contains(marker))
        .count()
}

fn wait_until(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn nonce() -> u32 {
    let mut bytes = [0u8; 4];
    std::fs::File::open("/dev/urandom").unwrap().read_exact(&mut bytes).unwrap();
    u32::from_le_bytes(bytes) % 1_000_000
}

/// Frames arrive before the command exits: the first within 200 ms of its print.
fn frames_arrive_as_printed(server: &Server, key: &str, sandbox: &str) {
    let started = Instant::now();
    let mut lines = exec_lines(server, key, sandbox, &["sh", "-c", "cat /proc/uptime; sleep 2; echo second"]);
    let first = lines.next().expect("a first line");
    let read_at = uptime();
    let printed_at: f64 = first["text"].as_str().unwrap().split_whitespace().next().unwrap().parse().unwrap();
    let lag = read_at - printed_at;
    // /proc/uptime has 10 ms steps.
    assert!(lag < 0.2 + 0.011, "the first frame was read {lag:.3} s after the command printed it");
    assert!(
        started.elapsed() < Duration::from_millis(1800),
        "the first frame came only at {:?}",
        started.elapsed()
    );
    let rest: Vec<Value> = lines.collect();
    assert!(started.elapsed() >= Duration::from_secs(2), "positive control: the command slept 2 s");
    assert_eq!(rest[0], json!({"type": "stdout", "text": "second\n"}));
    assert_eq!(rest[1], json!({"type": "exit", "exit_code": 0, "timed_out": false, "truncated": false}));
    assert_eq!(rest.len(), 2);
}

/// A client that goes away ends the command, though it prints nothing more.
fn a_client_that_goes_away_ends_the_command(server: &Server, key: &str, sandbox: &str) {
    let marker = format!("4400.{}", nonce());
    let script = format!("echo up; sleep {marker}");
    let mut lines = exec_lines(server, key, sandbox, &["sh", "-c", &script]);
    assert_eq!(lines.next().unwrap(), json!({"type": "stdout", "text": "up\n"}));
    wait_until("the command to run (positive control)", Duration::from_secs(10), || {
        host_processes_with(&format!("sleep {marker}")) >= 1
    });
    drop(lines);
    wait_until("the command to end with its client", Duration::from_secs(10), || {
        host_processes_with(&format!("sleep {marker}")) == 0
    });
}

pub(crate) fn random_bytes(len: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    std::fs::File::open("/dev/urandom").unwrap().read_exact(&mut bytes).unwrap();
    bytes
}

pub(crate) fn put_bytes(server: &Server, key: &str, route: &str, bytes: &[u8]) -> (u16, Value) {
    let mut r = agent()
        .put(&format!("{}{route}", server.base))
        .header("authorization", &format!("Bearer {key}"))
        .content_type("application/octet-stream")
        .send(bytes)
        .expect("PUT");
    let status = r.status().as_u16();
    (status, serde_json::from_str(&r.body_mut().read_to_string().unwrap_or_default()).unwrap_or(Value::Null))
}

pub(crate) fn get_bytes(server: &Server, key: &str, route: &str) -> (u16, Vec<u8>) {
    let mut r = agent()
        .get(&format!("{}{route}", server.base))
        .header("authorization", &format!("Bearer {key}"))
        .call()
        .expect("GET");
    let status = r.status().as_u16();
    let bytes = r.body_mut().with_config().limit(u64::MAX).read_to_vec().expect("the body");
    (status, bytes)
}

/// A 64 MiB file and a directory tree round-trip byte-exact, through files and archive.
fn files_and_archives_round_trip(server: &Server, key: &str, sandbox: &str, scratch: &std::path::Path) {
    let files = format!("/v1/orgs/acme/sandboxes/{sandbox}/files");
    let big = random_bytes(64 << 20);
    let got = put_bytes(server, key, &format!("{files}?path=/workspace/in/big.bin"), &big);
    assert_eq!(got.0, 200, "{}", got.1);
    assert_eq!(got.1, json!({"path": "/workspace/in/big.bin", "size": 64 << 20}));
    let (status, back) = get_bytes(server, key, &format!("{files}?path=in/big.bin"));
    assert_eq!(status, 200);
    assert!(back == big, "the 64 MiB file came back changed ({} bytes)", back.len());
    let out = sh(server, key, sandbox, "stat -c '%s %u' /workspace/in/big.bin; id -u");
    let text = out["stdout"].as_str().unwrap();
    let (stat, uid) = text.trim().split_once('\n').unwrap();
    assert_eq!(stat, format!("{} {uid}", 64 << 20), "the sandbox's user owns it");

    // A tree with nested directories, an empty file, a symlink, binary contents.
    let tree = scratch.join("tree");
    std::fs::create_dir_all(tree.join("a/b/c")).unwrap();
    std::fs::write(tree.join("a/b/c/blob"), random_bytes(3 << 20)).unwrap();
    std::fs::write(tree.join("a/empty"), b"").unwrap();
    std::fs::write(tree.join("top.txt"), "héllo\n").unwrap();
    std::os::unix::fs::symlink("b/c/blob", tree.join("a/link")).unwrap();
    let tar =
        std::process::Command::new("tar").arg("-C").arg(&tree).args(["-cf", "-", "."]).output().unwrap();
    assert!(tar.status.success());
    let archive = format!("/v1/orgs/acme/sandboxes/{sandbox}/archive");
    let got = put_bytes(server, key, &format!("{archive}?path=/workspace/tree"), &tar.stdout);
    assert_eq!(got.0, 200, "{}", got.1);
    let (status, back) = get_bytes(server, key, &format!("{archive}?path=/workspace/tree"));
    assert_eq!(status, 200);
    let copy = scratch.join("copy");
    std::fs::create_dir_all(&copy).unwrap();
    let mut untar = std::process::Command::new("tar")
        .arg("-C")
        .arg(&copy)
        .arg("-xf")
        .arg("-")
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    untar.stdin.take().unwrap().write_all(&back).unwrap();
    assert!(untar.wait().unwrap().success());
    let diff = std::process::Command::new("diff")
        .arg("-r")
        .arg("--no-dereference")
        .arg(&tree)
        .arg(&copy)
        .output()
        .unwrap();
    assert!(diff.status.success(), "the tree round-trips: {}", String::from_utf8_lossy(&diff.stdout));
    assert_eq!(std::fs::read_link(copy.join("a/link")).unwrap(), std::path::Path::new("b/c/blob"));
}

/// A symlink to the host's data dir and a `../../` path are refused; nothing leaks.
fn paths_never_lead_out(server: &Server, key: &str, sandbox: &str, data_dir: &str) {
    let files = format!("/v1/orgs/acme/sandboxes/{sandbox}/files");
    let out =
        sh(server, key, sandbox, &format!("ln -s '{data_dir}' /workspace/host && ln -s ../.. /workspace/up"));
    assert_eq!(out["exit_code"], 0, "{out}");
    for path in ["/workspace/host", "/workspace/host/signing-keys.json", "/workspace/up/etc/passwd"] {
        let got = server.call("GET", &format!("{files}?path={path}"), Some(key), None);
        assert_error(&got, 400, "invalid_argument");
        assert!(got.1["message"].as_str().unwrap().contains("leads outside"), "{path}: {}", got.1);
    }
    let got = put_bytes(server, key, &format!("{files}?path=/workspace/host/planted"), b"x");
    assert_eq!((got.0, got.1["error"].as_str()), (400, Some("invalid_argument")), "{}", got.1);
    assert!(!std::path::Path::new(data_dir).join("planted").exists(), "nothing reached the host");
    for path in ["/workspace/../../etc/passwd", "../../etc/passwd", "/etc/passwd"] {
        let got = server.call("GET", &format!("{files}?path={path}"), Some(key), None);
        assert_error(&got, 400, "invalid_argument");
    }
    // Positive control: the same kind of request inside is served.
    let got = put_bytes(server, key, &format!("{files}?path=/workspace/inside"), b"mine");
    assert_eq!(got.0, 200, "{}", got.1);
    assert_eq!(get_bytes(server, key, &format!("{files}?path=/workspace/inside")), (200, b"mine".to_vec()));
}

/// Sends a request head and then `body_len` bytes (chunked when `None`), reading the
/// answer beside; returns the status and body the server answered with.
fn upload_raw(
    server: &Server,
    key: &str,
    route: &str,
    declared: Option<u64>,
    body_len: u64,
) -> (u16, String) {
    let address = server.base.trim_start_matches("http://");
    let mut stream = TcpStream::connect(address).unwrap();
    let length = match declared {
        Some(n) => format!("content-length: {n}\r\n"),
        None => "transfer-encoding: chunked\r\n".to_owned(),
    };
    let head = format!(
        "PUT {route} HTTP/1.1\r\nhost: {address}\r\nauthorization: Bearer {key}\r\n\
         content-type: application/octet-stream\r\n{length}\r\n"
    );
    stream.write_all(head.as_bytes()).unwrap();
    let mut writer = stream.try_clone().unwrap();
    let chunked = declared.is_none();
    let feeder = std::thread::spawn(move || {
        let chunk = vec![b'z'; 1 << 20];
        let mut sent = 0u64;
        while sent < body_len {
            let piece = if chunked {
                let mut framed = format!("{:x}\r\n", chunk.len()).into_bytes();
                framed.extend_from_slice(&chunk);
                framed.extend_from_slice(b"\r\n");
                framed
            } else {
                chunk.clone()
            };
            if writer.write_all(&piece).is_err() {
                return sent;
            }
            sent += chunk.len() as u64;
        }
        if chunked {
            let _ = writer.write_all(b"0\r\n\r\n");
        }
        sent
    });
    stream.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut reader = BufReader::new(stream);
    let mut status = String::new();
    reader.read_line(&mut status).unwrap();
    let code: u16 = status.split_whitespace().nth(1).unwrap().parse().unwrap();
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        if line.trim().is_empty() {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().unwrap();
        }
    }
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body).unwrap();
    drop(reader);
    let sent = feeder.join().unwrap();
    assert!(
        sent < body_len || declared.is_some(),
        "the server read the whole body over the cap ({sent} bytes)"
    );
    (code, String::from_utf8_lossy(&body).into_owned())
}

/// A 1 GiB upload beyond the cap gets 413 and leaves no partial file, whether it says its
/// length or not.
fn an_upload_beyond_the_cap_is_refused_whole(server: &Server, key: &str, sandbox: &str) {
    let route = format!("/v1/orgs/acme/sandboxes/{sandbox}/files?path=/workspace/over/huge.bin");
    let (status, body) = upload_raw(server, key, &route, Some(1 << 30), 4 << 20);
    assert_eq!(status, 413, "{body}");
    assert!(body.contains("too_large"), "{body}");
    let (status, body) = upload_raw(server, key, &route, None, 1 << 30);
    assert_eq!(status, 413, "{body}");
    assert!(body.contains("too_large"), "{body}");
    let got = server.call("GET", &route, Some(key), None);
    assert_error(&got, 404, "not_found");
    let out = sh(server, key, sandbox, "ls -A /workspace/over 2>&1; echo end");
    assert_eq!(out["stdout"], "end\n", "no partial or temporary file: {out}");
}

/// A background process lives across two requests and a restart of the server, its
/// output replays from the start, and SIGTERM ends it.
fn a_background_process_outlives_requests_and_the_server(
    env: &Env,
    server: &mut Server,
    key: &str,
    sandbox: &str,
    driver: Driver,
) -> Server {
    let processes = format!("/v1/orgs/acme/sandboxes/{sandbox}/processes");
    let (argv, probe) = if driver == Driver::Bubblewrap && std::path::Path::new("/usr/bin/python3").exists() {
        (
            json!([
                "python3",
                "-u",
                "-c",
                "import http.server, sys; print('serving', flush=True); \
                   http.server.HTTPServer(('127.0.0.1', 8000), http.server.SimpleHTTPRequestHandler).serve_forever()"
            ]),
            Some(
                "python3 -c \"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8000/').status)\"",
            ),
        )
    } else {
        (
            json!(["sh", "-c", "echo serving; i=0; while :; do i=$((i+1)); echo tick $i; sleep 0.2; done"]),
            None,
        )
    };
    let got = server.call("POST", &processes, Some(key), Some(json!({"argv": argv})));
    assert_eq!(got.0, 201, "{}", got.1);
    assert_eq!(
        (got.1["running"].as_bool(), got.1["exit_code"].clone()),
        (Some(true), Value::Null),
        "{}",
        got.1
    );
    let pid = got.1["pid"].as_u64().unwrap();
    std::thread::sleep(Duration::from_millis(800));
    // Two more requests: it is listed, and it serves (where it is a server).
    let got = server.call("GET", &processes, Some(key), None);
    assert!(
        got.1["processes"].as_array().unwrap().iter().any(|p| p["pid"] == pid && p["running"] == true),
        "{}",
        got.1
    );
    if let Some(probe) = probe {
        let out = sh(server, key, sandbox, probe);
        assert_eq!(out["stdout"], "200\n", "{out}");
    }
    assert!(server.stop(), "the server stops cleanly with a background process running");
    let server = Server::start(env);
    let got = server.call("GET", &format!("{processes}/{pid}"), Some(key), None);
    assert_eq!(
        (got.0, got.1["running"].as_bool()),
        (200, Some(true)),
        "listed again after the restart: {}",
        got.1
    );
    // Its output replays from the start.
    let (status, body) = get_bytes(&server, key, &format!("{processes}/{pid}/output"));
    assert_eq!(status, 200);
    let lines: Vec<Value> =
        String::from_utf8(body).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let text: String =
        lines.iter().filter(|l| l["type"] == "stdout").filter_map(|l| l["text"].as_str()).collect();
    assert!(text.starts_with("serving\n"), "replayed from the start: {lines:?}");
    assert!(lines.iter().all(|l| l["type"] != "exit"), "still running: {lines:?}");
    // A follower sees its end by SIGTERM.
    let follow = agent()
        .get(&format!("{}{processes}/{pid}/output?follow=true", server.base))
        .header("authorization", &format!("Bearer {key}"))
        .call()
        .unwrap();
    let mut lines = BufReader::new(follow.into_body().into_reader()).lines();
    let first: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert!(first["text"].as_str().is_some_and(|t| t.starts_with("serving\n")), "{first}");
    let got =
        server.call("POST", &format!("{processes}/{pid}/signal"), Some(key), Some(json!({"signal": "TERM"})));
    assert_eq!(got.0, 204, "{}", got.1);
    let last: Value = lines.map(|l| serde_json::from_str(&l.unwrap()).unwrap()).last().unwrap();
    assert_eq!(last, json!({"type": "exit", "exit_code": 143, "timed_out": false, "truncated": false}));
    let got = server.call("GET", &format!("{processes}/{pid}"), Some(key), None);
    assert_eq!(
        (got.1["running"].as_bool(), got.1["exit_code"].as_i64()),
        (Some(false), Some(143)),
        "{}",
        got.1
    );
    let got =
        server.call("POST", &format!("{processes}/{pid}/signal"), Some(key), Some(json!({"signal": "KILL"})));
    assert_error(&got, 409, "conflict");
    server
}

/// A sandbox token may start a helper process in its own sandbox; another sandbox's
/// token gets 403 on every route inside.
fn tokens_act_only_in_their_own_sandbox(server: &Server, key: &str, mine: &str, other: &str) {
    let token =
        sh(server, key, mine, "cat \"$SANDLANE_TOKEN_FILE\"")["stdout"].as_str().unwrap().trim().to_owned();
    let got = server.call(
        "POST",
        &format!("/v1/orgs/acme/sandboxes/{mine}/processes"),
        Some(&token),
        Some(json!({"argv": ["sh", "-c", "echo helper"]})),
    );
    assert_eq!(got.0, 201, "its own sandbox: {}", got.1);
    let base = format!("/v1/orgs/acme/sandboxes/{other}");
    let cases: Vec<(&str, String, Option<Value>)> = vec![
        ("POST", format!("{base}/processes"), Some(json!({"argv": ["true"]}))),
        ("GET", format!("{base}/processes"), None),
        ("GET", format!("{base}/processes/1/output"), None),
        ("GET", format!("{base}/files?path=/workspace"), None),
        ("DELETE", format!("{base}/files?path=/workspace/x"), None),
        ("GET", format!("{base}/archive?path=/workspace"), None),
        ("POST", format!("{base}/exec"), Some(json!({"argv": ["true"]}))),
    ];
    for (method, route, body) in cases {
        let got = server.call(method, &route, Some(&token), body);
        assert_error(&got, 403, "permission_denied");
    }
    let got = put_bytes(server, &token, &format!("{base}/files?path=/workspace/x"), b"x");
    assert_eq!((got.0, got.1["error"].as_str()), (403, Some("permission_denied")), "{}", got.1);
}

/// The CLI against the running server: `sandbox exec` streams and exits with the
/// command's status; `sandbox cp` copies a file and a directory both ways, byte-exact.
fn the_cli_execs_and_copies(env: &Env, server: &Server, key: &str, sandbox: &str, scratch: &std::path::Path) {
    let run = |args: &[&str], stdin: &[u8]| {
        // `--server` before the command's own `--`.
        let mut child = std::process::Command::new(crate::support::binary())
            .args(&args[..2])
            .args(["--server", &server.base])
            .args(&args[2..])
            .envs(env.vars.iter().cloned())
            .env("SANDLANE_KEY", key)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(stdin).unwrap();
        let out = child.wait_with_output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let got =
        run(&["sandbox", "exec", "acme", sandbox, "--", "sh", "-c", "echo out; echo err >&2; exit 7"], b"");
    assert_eq!(got, (Some(7), "out\n".to_owned(), "err\n".to_owned()), "the command's output and status");
    let got =
        run(&["sandbox", "exec", "acme", sandbox, "--stdin", "--", "sh", "-c", "tr a-z A-Z"], b"piped in");
    assert_eq!((got.0, got.1.as_str()), (Some(0), "PIPED IN"), "{}", got.2);
    // sandlane's own failure is 125, not a status the command could have given.
    let got = run(&["sandbox", "exec", "acme", "sbx_00000000000000000000000000", "--", "true"], b"");
    assert_eq!(got.0, Some(125), "{got:?}");
    assert!(got.2.contains("not_found"), "{got:?}");

    let file = scratch.join("cli-file.bin");
    let bytes = random_bytes(3 << 20);
    std::fs::write(&file, &bytes).unwrap();
    let remote = format!("acme/{sandbox}:/workspace/cli/");
    let got = run(&["sandbox", "cp", file.to_str().unwrap(), &remote], b"");
    assert_eq!(got.0, Some(0), "{got:?}");
    let back = scratch.join("cli-back.bin");
    let got = run(
        &["sandbox", "cp", &format!("acme/{sandbox}:/workspace/cli/cli-file.bin"), back.to_str().unwrap()],
        b"",
    );
    assert_eq!(got.0, Some(0), "{got:?}");
    assert!(std::fs::read(&back).unwrap() == bytes, "the file round-trips through the CLI");

    let dir = scratch.join("cli-dir");
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    std::fs::write(dir.join("sub/x.txt"), b"x").unwrap();
    std::fs::write(dir.join("y.bin"), random_bytes(70_000)).unwrap();
    let got =
        run(&["sandbox", "cp", dir.to_str().unwrap(), &format!("acme/{sandbox}:/workspace/clidir")], b"");
    assert_eq!(got.0, Some(0), "{got:?}");
    let copy = scratch.join("cli-copy");
    let got =
        run(&["sandbox", "cp", &format!("acme/{sandbox}:/workspace/clidir"), copy.to_str().unwrap()], b"");
    assert_eq!(got.0, Some(0), "{got:?}");
    let diff = std::process::Command::new("diff").arg("-r").arg(&dir).arg(&copy).output().unwrap();
    assert!(diff.status.success(), "the directory round-trips: {}", String::from_utf8_lossy(&diff.stdout));
    let got = run(&["sandbox", "cp", "/nonexistent-local", &remote], b"");
    assert_eq!(got.0, Some(2), "{got:?}");
}

/// Everything above on one driver.
pub fn streams_end_to_end(driver: Driver) {
    let Some(env) = env_for(driver) else { return };
    let key = env.add_caller("svc-streams", "service", &["acme"]);
    let mut server = Server::start(&env);
    let tag = env.data.path().file_name().unwrap().to_string_lossy().replace(['.', '_'], "-");
    let sandbox = ensure(&server, &key, &format!("s{tag}"));
    let other = ensure(&server, &key, &format!("o{tag}"));
    frames_arrive_as_printed(&server, &key, &sandbox);
    a_client_that_goes_away_ends_the_command(&server, &key, &sandbox);
    let scratch = tempfile::tempdir().unwrap();
    files_and_archives_round_trip(&server, &key, &sandbox, scratch.path());
    the_cli_execs_and_copies(&env, &server, &key, &sandbox, scratch.path());
    let data_dir = env.vars.iter().find(|(k, _)| k == "SANDLANE_DATA_DIR").unwrap().1.clone();
    paths_never_lead_out(&server, &key, &sandbox, &data_dir);
    an_upload_beyond_the_cap_is_refused_whole(&server, &key, &sandbox);
    tokens_act_only_in_their_own_sandbox(&server, &key, &sandbox, &other);
    // The first server stays bound (stopped) until the end: dropping it ends the sandboxes.
    let restarted =
        a_background_process_outlives_requests_and_the_server(&env, &mut server, &key, &sandbox, driver);
    for session in [format!("s{tag}"), format!("o{tag}")] {
        let got =
            restarted.call("DELETE", &format!("/v1/orgs/acme/sessions/{session}/sandbox"), Some(&key), None);
        assert_eq!(got.0, 204, "{}", got.1);
    }
}
