//! What the benches that drive a real `sandlane serve` share: the server on a data dir
//! of its own (SQLite unless told otherwise, bubblewrap), a service caller of one org and
//! its key, the server's log drained (its warnings and errors shown), and a clean stop.
//! Each bench includes it with `mod support;` and uses what it needs.
#![allow(dead_code, reason = "each bench uses a part of it")]

use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A running `sandlane serve`, stopped (`SIGTERM`, then `SIGKILL` after 20 s) when dropped.
pub struct Served {
    /// The server's process.
    pub child: Child,
    /// `host:port` it listens on.
    pub address: String,
    /// The service caller's key.
    pub key: String,
    /// The temp dir its data dir (`data`) is in.
    pub data: tempfile::TempDir,
    /// The environment it runs with (for the CLI on the same data dir).
    pub vars: Vec<(String, String)>,
}

/// How a server is set up.
pub struct Setup<'a> {
    /// The temp dir's name starts so.
    pub prefix: &'a str,
    /// Where the temp dir is made (default: the system's temp dir).
    pub parent: Option<&'a Path>,
    /// The service caller's id.
    pub caller: &'a str,
    /// The orgs it is a caller of.
    pub orgs: &'a [&'a str],
    /// Variables of its environment; they win over the defaults (a free loopback port,
    /// JSON logs at `info`).
    pub extra: &'a [(&'a str, String)],
    /// Whether the server's warnings are shown (its errors always are).
    pub warnings: bool,
}

impl Served {
    /// Starts a server whose data dir is `data` in a new temp dir named `prefix…`, with
    /// `caller` a service caller of `org`, and `extra` variables in its environment.
    pub fn start(prefix: &str, caller: &str, org: &str, extra: &[(&str, String)]) -> Self {
        Self::start_with(&Setup { prefix, parent: None, caller, orgs: &[org], extra, warnings: true })
    }

    /// Starts a server as `setup` says.
    pub fn start_with(setup: &Setup<'_>) -> Self {
        let mut dir = tempfile::Builder::new();
        dir.prefix(setup.prefix);
        let data = match setup.parent {
            Some(parent) => dir.tempdir_in(parent),
            None => dir.tempdir(),
        }
        .expect("temp dir");
        std::fs::set_permissions(data.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let mut vars: Vec<(String, String)> = vec![
            ("SANDLANE_DATA_DIR".into(), data.path().join("data").display().to_string()),
            ("SANDLANE_LISTEN".into(), "127.0.0.1:0".into()),
            ("SANDLANE_LOG_FORMAT".into(), "json".into()),
            ("RUST_LOG".into(), "info".into()),
        ];
        for (name, value) in setup.extra {
            vars.retain(|(n, _)| n != name);
            vars.push(((*name).to_owned(), value.clone()));
        }
        let bin = env!("CARGO_BIN_EXE_sandlane");
        let mut args = vec!["caller", "add", "--id", setup.caller, "--class", "service"];
        for org in setup.orgs {
            args.extend(["--org", org]);
        }
        let out = Command::new(bin)
            .args(&args)
            .envs(vars.iter().cloned())
            .output()
            .expect("run sandlane caller add");
        assert!(out.status.success(), "caller add: {}", String::from_utf8_lossy(&out.stderr));
        let key = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let warnings = setup.warnings;
        let mut child = Command::new(bin)
            .arg("serve")
            .envs(vars.iter().cloned())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn sandlane serve");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // Keep draining the log so the server never blocks on a full pipe.
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("sandlane listening")
                    && let Ok(v) = serde_json::from_str::<Value>(&line)
                    && let Some(a) = v["fields"]["address"].as_str()
                {
                    let _ = tx.send(a.to_owned());
                } else if !line.starts_with('{')
                    || line.contains("\"ERROR\"")
                    || (warnings && line.contains("\"WARN\""))
                {
                    eprintln!("server: {line}");
                }
            }
        });
        let Ok(address) = rx.recv_timeout(Duration::from_secs(60)) else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the server did not start in 60 s");
        };
        Self { child, address, key, data, vars }
    }

    /// `http://host:port`.
    pub fn base(&self) -> String {
        format!("http://{}", self.address)
    }

    /// The `Authorization` value of the service caller.
    pub fn auth(&self) -> String {
        format!("Bearer {}", self.key)
    }

    /// An HTTP client that returns error statuses as answers.
    pub fn agent() -> ureq::Agent {
        ureq::Agent::config_builder().http_status_as_error(false).build().new_agent()
    }

    /// The server's resident set size in bytes.
    pub fn rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|kb| kb.parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    }

    /// Stops the server (`SIGTERM`, up to 20 s, then `SIGKILL`); again: nothing.
    pub fn stop(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The `p` quantile (0 to 1) of `samples` (sorted here), nearest rank; 0 for none.
pub fn quantile(samples: &mut [f64], p: f64) -> f64 {
    samples.sort_by(f64::total_cmp);
    let i = ((samples.len().saturating_sub(1)) as f64 * p).round() as usize;
    samples.get(i).copied().unwrap_or(0.0)
}

/// One row of a bench's table in BENCHMARKS.md.
pub struct Row {
    /// What was measured.
    pub what: String,
    /// What came out.
    pub result: String,
    /// The target, if any.
    pub target: String,
    /// Whether the target was met; `None` without one.
    pub met: Option<bool>,
}

/// The rows as a Markdown table, numbered `{prefix}1`, `{prefix}2`, ….
pub fn table(prefix: &str, rows: &[Row]) -> String {
    let mut s = String::from("| # | measurement | result | target | status |\n|---|---|---|---|---|\n");
    for (i, r) in rows.iter().enumerate() {
        let status = match r.met {
            Some(true) => "met",
            Some(false) => "**missed**",
            None => "",
        };
        let _ = writeln!(s, "| {prefix}{} | {} | {} | {} | {} |", i + 1, r.what, r.result, r.target, status);
    }
    s
}
