//! The `sandlane-supervisor` program itself, run as the drivers run it (outside a sandbox
//! here: a socket path in a temp dir): it refuses a bad command line with its usage, and
//! it answers the protocol's hello and a command on the socket it was given.
//!
//! (Its being an integration test also makes `cargo test` build the program, which the
//! adapters' driver tests start inside real sandboxes.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use supervisor::protocol::{ExecSpec, Frame, FrameType, Reply, Request, VERSION, read_frame, write_frame};
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
