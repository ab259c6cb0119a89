//! How long a supervisor program takes from `execve` to its answer to the first hello, and
//! how large it is: the default build (dynamic, beside `sandlane`) beside the static one
//! (`scripts/supervisor-static.sh`), interleaved round by round on this noisy machine.
//!
//! `cargo bench -p supervisor --bench start` (release); the programs are
//! `$SANDLANE_SUPERVISOR_BIN` (default: `target/<profile>/sandlane-supervisor`) and, when
//! set, `$SANDLANE_SUPERVISOR_STATIC`. `BENCH_ROUNDS` (default 200) rounds each.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use supervisor::protocol::{Frame, Reply, Request, VERSION, read_frame, write_frame};

fn default_program() -> PathBuf {
    if let Some(path) = std::env::var_os("SANDLANE_SUPERVISOR_BIN") {
        return path.into();
    }
    let exe = std::env::current_exe().unwrap();
    exe.ancestors().skip(1).take(3).map(|d| d.join(supervisor::PROGRAM)).find(|p| p.is_file()).expect(
        "build the supervisor first: cargo build --release -p supervisor (or set SANDLANE_SUPERVISOR_BIN)",
    )
}

/// One start: spawn, connect as soon as the socket exists, hello, then kill.
fn start_once(program: &Path, dir: &Path, rt: &tokio::runtime::Runtime) -> Duration {
    let socket = dir.join("sock");
    let _ = std::fs::remove_file(&socket);
    let began = Instant::now();
    let mut child = Command::new(program)
        .arg("--socket")
        .arg(&socket)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let took = rt.block_on(async {
        let mut stream = loop {
            match tokio::net::UnixStream::connect(&socket).await {
                Ok(stream) => break stream,
                Err(_) => {
                    assert!(
                        began.elapsed() < Duration::from_secs(10),
                        "{} never listened",
                        program.display()
                    );
                    tokio::task::yield_now().await;
                }
            }
        };
        let (mut rx, mut tx) = stream.split();
        write_frame(&mut tx, &Frame::control(&Request::Hello { version: VERSION }).unwrap()).await.unwrap();
        let reply = read_frame(&mut rx).await.unwrap().unwrap().parse::<Reply>().unwrap();
        assert!(matches!(reply, Reply::Hello { .. }), "{reply:?}");
        began.elapsed()
    });
    let _ = child.kill();
    let _ = child.wait();
    took
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn linkage(program: &Path) -> &'static str {
    let out = Command::new("ldd").arg(program).output();
    match out {
        Ok(out)
            if !out.status.success()
                || String::from_utf8_lossy(&out.stdout).contains("statically linked") =>
        {
            "static"
        }
        Ok(_) => "dynamic",
        Err(_) => "unknown (no ldd)",
    }
}

fn main() {
    let rounds: usize = std::env::var("BENCH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(200);
    let mut programs = vec![("default build", default_program())];
    if let Some(path) = std::env::var_os("SANDLANE_SUPERVISOR_STATIC") {
        programs.push(("static build", PathBuf::from(path)));
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut times: Vec<Vec<Duration>> = vec![Vec::with_capacity(rounds); programs.len()];
    for _ in 0..rounds {
        for (i, (_, program)) in programs.iter().enumerate() {
            times[i].push(start_once(program, dir.path(), &rt));
        }
    }
    println!("| program | linkage | size | start to first hello, p50 | ratio |");
    println!("|---|---|---|---|---|");
    let base = median(times[0].clone());
    for ((name, program), t) in programs.iter().zip(times) {
        let size = std::fs::metadata(program).map(|m| m.len()).unwrap_or(0);
        let p50 = median(t);
        println!(
            "| {name} | {} | {:.1} MiB | {:.2} ms | {:.2}x |",
            linkage(program),
            size as f64 / f64::from(1 << 20),
            p50.as_secs_f64() * 1e3,
            p50.as_secs_f64() / base.as_secs_f64()
        );
    }
}
