//! The `sandlane-supervisor` program itself, run as the drivers run it (outside a sandbox
//! here: a socket path in a temp dir): it refuses a bad command line with its usage, and
//! it answers the protocol's hello and a command on the socket it was given, and it keeps
//! a terminal (a background process on a pseudo-terminal) that is resized, typed into
//! over a long-lived input, replayed, and ends with its exit code.
//!
//! (Its being an integration test also makes `cargo test` build the program, which the
//! adapters' driver tests start inside real sandboxes.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use supervisor::protocol::{
    ExecSpec, Frame, FrameType, ProcessStart, Reply, Request, TerminalStart, VERSION, read_frame, write_frame,
};
use tokio::net::UnixStream;

const PROGRAM: &str = env!("CARGO_BIN_EXE_sandlane-supervisor");

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_bad_command_line_is_refused_with_the_usage() {
    for args in [&[][..], &["supervise", "--socket", "/tmp/x"][..], &["--listen-fd", "nope"][..]] {
        let out = Command::new(PROGRAM).args(args).stdin(Stdio::null()).output().unwrap();
        assert_eq!(out.status.code(), Some(64), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("usage: sandlane-supervisor"), "{args:?}: {stderr}");
    }
}

/// A connection to the supervisor at `socket`, hello exchanged; its hello's features.
async fn open(socket: &std::path::Path) -> (UnixStream, Vec<String>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut stream = loop {
        match UnixStream::connect(socket).await {
            Ok(stream) => break stream,
            Err(e) => {
                assert!(Instant::now() < deadline, "the supervisor never listened: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    write_frame(&mut stream, &Frame::control(&Request::Hello { version: VERSION }).unwrap()).await.unwrap();
    let hello = read_frame(&mut stream).await.unwrap().unwrap().parse::<Reply>().unwrap();
    let Reply::Hello { features, .. } = hello else { panic!("not a hello: {hello:?}") };
    (stream, features)
}

async fn next(stream: &mut UnixStream) -> Frame {
    tokio::time::timeout(Duration::from_secs(10), read_frame(stream)).await.unwrap().unwrap().unwrap()
}

/// Reads a process's output stream until `needle` appears; what was read.
async fn output_until(stream: &mut UnixStream, needle: &str) -> String {
    let mut seen = String::new();
    while !seen.contains(needle) {
        let frame = next(stream).await;
        match frame.kind {
            FrameType::Stdout => seen.push_str(&String::from_utf8_lossy(&frame.payload)),
            FrameType::Control => match frame.parse::<Reply>().unwrap() {
                Reply::Replay { .. } => {}
                other => panic!("{other:?} before {needle:?} in {seen:?}"),
            },
            other => panic!("a {other:?} frame"),
        }
    }
    seen
}

#[tokio::test(flavor = "current_thread")]
async fn a_terminal_is_resized_typed_into_replayed_and_ends_with_its_code() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("sock");
    let _child = Running(Command::new(PROGRAM).arg("--socket").arg(&socket).spawn().unwrap());
    let (mut start, features) = open(&socket).await;
    assert!(features.iter().any(|f| f == "terminals"), "{features:?}");
    let spec = ExecSpec {
        argv: vec!["/bin/sh".into()],
        env: vec![("PATH".into(), "/usr/bin:/bin".into()), ("PS1".into(), "$ ".into())],
        cwd: dir.path().to_string_lossy().into_owned(),
        timeout_ms: 0,
        output_cap: 0,
        stdin: true,
        rlimits: Vec::new(),
    };
    let request = Request::ProcessStart(ProcessStart {
        spec,
        buffer_bytes: 65 * 1024,
        max_processes: 4,
        max_buffered_bytes: 1 << 20,
        terminal: Some(TerminalStart { id: "term_x".into(), cols: 80, rows: 24 }),
    });
    write_frame(&mut start, &Frame::control(&request).unwrap()).await.unwrap();
    write_frame(&mut start, &Frame { kind: FrameType::Stdin, payload: Vec::new() }).await.unwrap();
    let Reply::Process(status) = next(&mut start).await.parse::<Reply>().unwrap() else {
        panic!("no process")
    };
    assert_eq!(status.terminal.as_deref(), Some("term_x"));
    assert!(status.running);
    let pid = status.pid;

    // A resize on its own connection, then keystrokes and a resize on a long-lived input.
    let (mut resize, _) = open(&socket).await;
    let request = Request::ProcessResize { pid, cols: 100, rows: 30 };
    write_frame(&mut resize, &Frame::control(&request).unwrap()).await.unwrap();
    assert_eq!(next(&mut resize).await.parse::<Reply>().unwrap(), Reply::Done);
    let (mut output, _) = open(&socket).await;
    write_frame(&mut output, &Frame::control(&Request::ProcessOutput { pid, follow: true }).unwrap())
        .await
        .unwrap();
    let (mut input, _) = open(&socket).await;
    write_frame(&mut input, &Frame::control(&Request::ProcessInput { pid }).unwrap()).await.unwrap();
    assert_eq!(next(&mut input).await.parse::<Reply>().unwrap(), Reply::Done);
    let typed = |s: &str| Frame { kind: FrameType::Stdin, payload: s.as_bytes().to_vec() };
    write_frame(&mut input, &typed("stty size\n")).await.unwrap();
    output_until(&mut output, "30 100").await;
    let request = Request::ProcessResize { pid, cols: 132, rows: 43 };
    write_frame(&mut input, &Frame::control(&request).unwrap()).await.unwrap();
    write_frame(&mut input, &typed("stty size; echo $((6*7))\n")).await.unwrap();
    let seen = output_until(&mut output, "\r\n42\r\n").await;
    assert!(seen.contains("43 132"), "{seen:?}");

    // A second reader replays what came before.
    let (mut replay, _) = open(&socket).await;
    let request = Request::ProcessOutput { pid, follow: false };
    write_frame(&mut replay, &Frame::control(&request).unwrap()).await.unwrap();
    let replayed = output_until(&mut replay, "43 132").await;
    assert!(replayed.contains("30 100"), "{replayed:?}");

    // `exit 3` ends it with code 3; the input stream closes with it.
    write_frame(&mut input, &typed("exit 3\n")).await.unwrap();
    let code = loop {
        let frame = next(&mut output).await;
        if frame.kind == FrameType::Control {
            match frame.parse::<Reply>().unwrap() {
                Reply::Exit { code, .. } => break code,
                other => panic!("{other:?}"),
            }
        }
    };
    assert_eq!(code, 3);
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(10), read_frame(&mut input)).await.unwrap(),
        Ok(None)
    );
    // A resize of an ended terminal is refused.
    let (mut resize, _) = open(&socket).await;
    let request = Request::ProcessResize { pid, cols: 10, rows: 10 };
    write_frame(&mut resize, &Frame::control(&request).unwrap()).await.unwrap();
    assert!(
        matches!(next(&mut resize).await.parse::<Reply>().unwrap(), Reply::Error { code, .. } if code == "conflict")
    );
}

#[tokio::test(flavor = "current_thread")]
async fn it_answers_hello_and_runs_a_command_on_its_socket() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("sock");
    let _child = Running(Command::new(PROGRAM).arg("--socket").arg(&socket).spawn().unwrap());
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut stream = loop {
        match UnixStream::connect(&socket).await {
            Ok(stream) => break stream,
            Err(e) => {
                assert!(Instant::now() < deadline, "the supervisor never listened: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let (mut rx, mut tx) = stream.split();
    write_frame(&mut tx, &Frame::control(&Request::Hello { version: VERSION }).unwrap()).await.unwrap();
    let hello = read_frame(&mut rx).await.unwrap().unwrap().parse::<Reply>().unwrap();
    let Reply::Hello { version, features, .. } = hello else { panic!("not a hello: {hello:?}") };
    assert_eq!(version, VERSION);
    assert!(features.iter().any(|f| f == "exec"), "{features:?}");

    let spec = ExecSpec {
        argv: vec!["/bin/sh".into(), "-c".into(), "printf out; exit 7".into()],
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        cwd: dir.path().to_string_lossy().into_owned(),
        timeout_ms: 10_000,
        output_cap: 1 << 20,
        stdin: false,
        rlimits: Vec::new(),
    };
    write_frame(&mut tx, &Frame::control(&Request::Exec(spec)).unwrap()).await.unwrap();
    let mut stdout = Vec::new();
    let code = loop {
        let frame = tokio::time::timeout(Duration::from_secs(10), read_frame(&mut rx))
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        match frame.kind {
            FrameType::Stdout => stdout.extend_from_slice(&frame.payload),
            FrameType::Control => match frame.parse::<Reply>().unwrap() {
                Reply::Exit { code, .. } => break code,
                Reply::Started { .. } => {}
                other => panic!("unexpected {other:?}"),
            },
            _ => {}
        }
    };
    assert_eq!(stdout, b"out");
    assert_eq!(code, 7);
}
