//! One command in a sandbox's container: an exec attached to its output stream, read to
//! EOF (the stream ends when the command exits, so no polling), then one inspect for the
//! exit code. At timeout the command's process tree is killed from inside.

use std::time::Duration;

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use domain::ExecOutput;
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

use super::spec::KILL_TREE;

/// What one exec needs.
pub struct Launch<'a> {
    /// The container.
    pub container: &'a str,
    /// The full command (already wrapped, see [`super::spec::wrapped_command`]).
    pub cmd: Vec<String>,
    /// The user it runs as (`uid:gid`).
    pub user: &'a str,
    /// Bytes for standard input.
    pub stdin: &'a [u8],
    /// The wall-clock limit.
    pub timeout: Duration,
    /// Per-stream cap of captured output.
    pub output_cap: usize,
}

/// Captured output: the pid line on stderr is taken out, the rest capped per stream.
struct Capture {
    cap: usize,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    truncated: bool,
    pid_line: Option<Vec<u8>>,
    pid: Option<u32>,
}

impl Capture {
    fn new(cap: usize) -> Self {
        Self {
            cap,
            stdout: Vec::new(),
            stderr: Vec::new(),
            truncated: false,
            pid_line: Some(Vec::new()),
            pid: None,
        }
    }

    fn push(buf: &mut Vec<u8>, cap: usize, bytes: &[u8], truncated: &mut bool) {
        let room = cap.saturating_sub(buf.len());
        if bytes.len() > room {
            *truncated = true;
        }
        buf.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    fn stdout(&mut self, bytes: &[u8]) {
        Self::push(&mut self.stdout, self.cap, bytes, &mut self.truncated);
    }

    fn stderr(&mut self, mut bytes: &[u8]) {
        if let Some(line) = &mut self.pid_line {
            match bytes.iter().position(|b| *b == b'\n') {
                Some(end) => {
                    line.extend_from_slice(&bytes[..end]);
                    self.pid = std::str::from_utf8(line).ok().and_then(|t| t.trim().parse().ok());
                    self.pid_line = None;
                    bytes = &bytes[end + 1..];
                }
                None if line.len() + bytes.len() <= 32 => {
                    line.extend_from_slice(bytes);
                    return;
                }
                None => {
                    // Not a pid line after all: keep it as output.
                    let held = std::mem::take(line);
                    self.pid_line = None;
                    Self::push(&mut self.stderr, self.cap, &held, &mut self.truncated);
                }
            }
        }
        Self::push(&mut self.stderr, self.cap, bytes, &mut self.truncated);
    }
}

/// Runs `launch`, returning its output (a non-zero exit or a timeout is an output).
///
/// # Errors
/// The Engine API error when the exec could not be created or started.
pub async fn run(docker: &Docker, launch: Launch<'_>) -> Result<ExecOutput, bollard::errors::Error> {
    let deadline = Instant::now() + launch.timeout;
    let with_stdin = !launch.stdin.is_empty();
    let exec = docker
        .create_exec(
            launch.container,
            CreateExecOptions {
                attach_stdin: Some(with_stdin),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                tty: Some(false),
                cmd: Some(launch.cmd),
                user: Some(launch.user.to_owned()),
                ..Default::default()
            },
        )
        .await?;
    let started = docker
        .start_exec(&exec.id, Some(StartExecOptions { detach: false, tty: false, output_capacity: None }))
        .await?;
    let StartExecResults::Attached { mut output, mut input } = started else {
        return Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 500,
            message: "the engine started the exec detached".to_owned(),
        });
    };
    let feed = if with_stdin {
        let bytes = launch.stdin.to_vec();
        Some(tokio::spawn(async move {
            // A command that does not read its input closes it: not an error.
            let _ = input.write_all(&bytes).await;
            let _ = input.shutdown().await;
        }))
    } else {
        drop(input);
        None
    };

    let mut capture = Capture::new(launch.output_cap);
    let mut timed_out = false;
    loop {
        match tokio::time::timeout_at(deadline, output.next()).await {
            Ok(Some(Ok(LogOutput::StdOut { message } | LogOutput::Console { message }))) => {
                capture.stdout(&message);
            }
            Ok(Some(Ok(LogOutput::StdErr { message }))) => capture.stderr(&message),
            Ok(Some(Ok(LogOutput::StdIn { .. }))) => {}
            Ok(Some(Err(e))) => {
                tracing::debug!(error = %e, "exec output stream ended with an error");
                break;
            }
            Ok(None) => break,
            Err(_) => {
                timed_out = true;
                break;
            }
        }
    }
    if timed_out {
        // A short timeout on a loaded engine can pass before the command's pid line has
        // arrived: wait for it (bounded), or the command would be left running.
        let started = Instant::now() + Duration::from_secs(5);
        while capture.pid.is_none() && capture.pid_line.is_some() {
            match tokio::time::timeout_at(started, output.next()).await {
                Ok(Some(Ok(LogOutput::StdErr { message }))) => capture.stderr(&message),
                Ok(Some(Ok(LogOutput::StdOut { message } | LogOutput::Console { message }))) => {
                    capture.stdout(&message);
                }
                Ok(Some(Ok(LogOutput::StdIn { .. }))) => {}
                _ => break,
            }
        }
        if let Some(pid) = capture.pid {
            kill_tree(docker, launch.container, launch.user, pid).await;
        }
        // Read what is left until the stream closes (bounded), so the exit is recorded.
        let grace = Instant::now() + Duration::from_secs(2);
        while let Ok(Some(Ok(item))) = tokio::time::timeout_at(grace, output.next()).await {
            match item {
                LogOutput::StdOut { message } | LogOutput::Console { message } => capture.stdout(&message),
                LogOutput::StdErr { message } => capture.stderr(&message),
                LogOutput::StdIn { .. } => {}
            }
        }
    }
    drop(output);
    if let Some(feed) = feed {
        feed.abort();
    }
    let exit_code = match docker.inspect_exec(&exec.id).await {
        Ok(info) if info.running != Some(true) => {
            info.exit_code.and_then(|c| i32::try_from(c).ok()).unwrap_or(if timed_out { 137 } else { -1 })
        }
        _ if timed_out => 137,
        Ok(_) => -1,
        Err(e) => return Err(e),
    };
    Ok(ExecOutput {
        exit_code,
        stdout: capture.stdout,
        stderr: capture.stderr,
        timed_out,
        truncated: capture.truncated,
    })
}

/// Kills the process tree of `pid` inside `container`, as the container's user (so it
/// can only reach the sandbox's own processes).
async fn kill_tree(docker: &Docker, container: &str, user: &str, pid: u32) {
    let cmd =
        vec!["/bin/sh".to_owned(), "-c".to_owned(), KILL_TREE.to_owned(), "kill".to_owned(), pid.to_string()];
    let launch =
        Launch { container, cmd, user, stdin: &[], timeout: Duration::from_secs(5), output_cap: 4096 };
    if let Err(e) = run_plain(docker, launch).await {
        tracing::warn!(container, error = %e, "could not kill a timed-out command");
    }
}

/// Runs a helper command to its end, discarding its output.
async fn run_plain(docker: &Docker, launch: Launch<'_>) -> Result<(), bollard::errors::Error> {
    let exec = docker
        .create_exec(
            launch.container,
            CreateExecOptions {
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                cmd: Some(launch.cmd),
                user: Some(launch.user.to_owned()),
                ..Default::default()
            },
        )
        .await?;
    let started = docker
        .start_exec(&exec.id, Some(StartExecOptions { detach: false, tty: false, output_capacity: None }))
        .await?;
    if let StartExecResults::Attached { mut output, .. } = started {
        let deadline = Instant::now() + launch.timeout;
        while let Ok(Some(Ok(_))) = tokio::time::timeout_at(deadline, output.next()).await {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Capture;

    #[test]
    fn the_pid_line_is_taken_out_of_stderr() {
        let mut c = Capture::new(100);
        c.stderr(b"12");
        c.stderr(b"3\noops");
        c.stdout(b"hello");
        assert_eq!(
            (c.pid, c.stderr.as_slice(), c.stdout.as_slice()),
            (Some(123), &b"oops"[..], &b"hello"[..])
        );
    }

    #[test]
    fn output_is_capped_per_stream() {
        let mut c = Capture::new(4);
        c.stderr(b"1\n");
        c.stdout(b"abcdef");
        assert!(c.truncated);
        assert_eq!(c.stdout, b"abcd");
        assert!(c.stderr.is_empty());
    }
}
