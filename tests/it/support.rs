//! Test support: a sandlane server on a free loopback port, against SQLite in a temp data
//! dir or a fresh database on the throwaway Postgres. [`Server::start`] runs it in-process
//! (`app::server::Server` on its own runtime, its log captured); [`Server::start_binary`]
//! spawns the real `sandlane serve`, for what only a process shows: signals, `kill -9`,
//! exit codes, the working directory, the process environment.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Which store the server runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// The `sandlane` binary built next to this test binary.
pub fn binary() -> PathBuf {
    built("sandlane", "cargo build -p app --bin sandlane")
}

/// The supervisor's program, `sandlane-supervisor`, built next to this test binary (the
/// real `sandlane` finds it there by itself; an in-process server is told).
pub fn supervisor_binary() -> PathBuf {
    built("sandlane-supervisor", "cargo build -p supervisor")
}

fn built(name: &str, how: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let bin = dir.join(name);
    assert!(bin.exists(), "{} is missing: build it with `{how}`", bin.display());
    bin
}

fn psql() -> PathBuf {
    let mut candidates = vec![PathBuf::from("/usr/local/bin/psql")];
    if let Ok(entries) = std::fs::read_dir("/usr/lib/postgresql") {
        for e in entries.flatten() {
            candidates.push(e.path().join("bin/psql"));
        }
    }
    candidates.into_iter().find(|p| p.exists()).expect("psql not found")
}

/// A fresh Postgres database URL. Without the test Postgres the test fails, unless the
/// developer skips `postgres` by name (then `None`, said loudly; see `tests::services`).
pub fn fresh_postgres_database() -> Option<String> {
    let admin = tests::services::postgres_admin_url()?;
    let mut bytes = [0u8; 6];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .unwrap();
    let name = format!("e2e_{}", bytes.iter().map(|b| format!("{b:02x}")).collect::<String>());
    let status = Command::new(psql())
        .arg(&admin)
        .args(["-v", "ON_ERROR_STOP=1", "-qc", &format!("CREATE DATABASE {name}")])
        .status()
        .expect("run psql");
    assert!(status.success(), "CREATE DATABASE {name} failed");
    let base = admin.rsplit_once('/').map(|(b, _)| b).unwrap_or(&admin);
    Some(format!("{base}/{name}"))
}

/// A container name prefix of this test's own (`t` and the temp dir's random suffix,
/// lower-cased to `a-z 0-9 -`, at most 32 characters).
fn container_prefix(dir: &std::path::Path) -> String {
    let name = dir.file_name().unwrap_or_default().to_string_lossy().to_ascii_lowercase();
    let suffix: String =
        name.trim_start_matches("sandlane-e2e-").chars().filter(char::is_ascii_alphanumeric).collect();
    format!("t{}-{}", std::process::id(), suffix).chars().take(32).collect()
}

/// The environment of a server and of the CLI run against its store.
pub struct Env {
    pub data: tempfile::TempDir,
    pub vars: Vec<(String, String)>,
}

impl Env {
    /// A data dir (traversable by sandbox uids) and the backend's database URL.
    pub fn new(backend: Backend) -> Option<Self> {
        let data = tempfile::Builder::new().prefix("sandlane-e2e-").tempdir().unwrap();
        std::fs::set_permissions(data.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let mut vars = vec![
            ("SANDLANE_DATA_DIR".to_owned(), data.path().join("data").display().to_string()),
            ("SANDLANE_LISTEN".to_owned(), "127.0.0.1:0".to_owned()),
            ("SANDLANE_LOG_FORMAT".to_owned(), "json".to_owned()),
            ("RUST_LOG".to_owned(), "info".to_owned()),
            // A host variable that must never reach a sandbox.
            ("DATABASE_URL".to_owned(), "postgres://host-secret@nowhere/db".to_owned()),
            // Each test's server is a deployment of its own: on the one engine the tests
            // share, its containers are found by its own prefix, so its reconcile pass never
            // removes another test's sandboxes as orphans (as two deployments would).
            ("SANDLANE_CONTAINER__NAME_PREFIX".to_owned(), container_prefix(data.path())),
        ];
        if backend == Backend::Postgres {
            vars.push(("SANDLANE_DATABASE_URL".to_owned(), fresh_postgres_database()?));
        }
        Some(Self { data, vars })
    }

    /// Removes a variable (so the server uses its default).
    pub fn unset(&mut self, key: &str) {
        self.vars.retain(|(k, _)| k != key);
    }

    pub fn set(&mut self, key: &str, value: &str) {
        self.vars.retain(|(k, _)| k != key);
        self.vars.push((key.to_owned(), value.to_owned()));
    }

    /// Runs the CLI with this environment; returns (exit code, stdout, stderr).
    pub fn cli(&self, args: &[&str]) -> (i32, String, String) {
        let out =
            Command::new(binary()).args(args).envs(self.vars.iter().cloned()).output().expect("run sandlane");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Runs the CLI with this environment and `stdin` as its standard input; returns (exit
    /// code, stdout, stderr).
    pub fn cli_with_stdin(&self, args: &[&str], stdin: &[u8]) -> (i32, String, String) {
        let mut child = Command::new(binary())
            .args(args)
            .envs(self.vars.iter().cloned())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run sandlane");
        let mut input = child.stdin.take().unwrap();
        // A child that stops reading early (a refusal) closes the pipe: not the test's failure.
        let _ = std::io::Write::write_all(&mut input, stdin);
        drop(input);
        let out = child.wait_with_output().expect("wait for sandlane");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Adds a caller and returns its key.
    pub fn add_caller(&self, id: &str, class: &str, orgs: &[&str]) -> String {
        let mut args = vec!["caller", "add", "--id", id, "--class", class];
        for o in orgs {
            args.extend(["--org", o]);
        }
        let (code, out, err) = self.cli(&args);
        assert_eq!(code, 0, "caller add failed: {err}");
        let key = out.trim().to_owned();
        assert_eq!(out.lines().count(), 1, "the key alone on one line: {out:?}");
        key
    }
}

/// A running server; stopped (and its sandboxes ended) on drop.
pub struct Server {
    process: Process,
    pub base: String,
    pub logs: Arc<Mutex<String>>,
    /// The server's data dir (its sandboxes' state is under `sandboxes/`).
    data_dir: Option<PathBuf>,
}

enum Process {
    /// `sandlane serve`.
    Binary(Child),
    /// `app::server::Server` on a runtime of its own.
    InProcess {
        runtime: Option<tokio::runtime::Runtime>,
        stop: Option<tokio::sync::oneshot::Sender<()>>,
        done: Mutex<std::sync::mpsc::Receiver<Result<(), String>>>,
    },
}

/// Log lines written by a server's threads, as JSON lines.
#[derive(Clone)]
struct LogSink(Arc<Mutex<String>>);

impl std::io::Write for LogSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().push_str(&String::from_utf8_lossy(buf));
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Server {
    /// The server in-process, configured by `env`'s variables exactly as the binary would
    /// be; its sandboxes run the real `sandlane-supervisor` program as their supervisor.
    pub fn start(env: &Env) -> Self {
        Self::start_with(env, app::compose::Overrides::default())
    }

    /// [`Server::start`] with `overrides` in place of production adapters.
    pub fn start_with(env: &Env, overrides: app::compose::Overrides) -> Self {
        let vars: std::collections::HashMap<String, String> = env
            .vars
            .iter()
            .filter(|(k, _)| k.starts_with("SANDLANE_"))
            .cloned()
            .chain([("SANDLANE_SUPERVISOR_PROGRAM".to_owned(), supervisor_binary().display().to_string())])
            .collect();
        let settings = app::config::Settings::load(None, &vars).expect("the test's settings");
        let filter = env.vars.iter().find(|(k, _)| k == "RUST_LOG").map_or("info", |(_, v)| v.as_str());
        let logs = Arc::new(Mutex::new(String::new()));
        let subscriber = tracing_subscriber::fmt()
            .json()
            .with_ansi(false)
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer({
                let sink = LogSink(logs.clone());
                move || sink.clone()
            })
            .finish();
        let dispatch = tracing::Dispatch::new(subscriber);
        // Every thread of this server's runtime logs into this server's sink.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .on_thread_start(move || std::mem::forget(tracing::dispatcher::set_default(&dispatch)))
            .build()
            .expect("a runtime for the server");
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let (done_tx, done) = std::sync::mpsc::channel();
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        runtime.spawn(async move {
            let server = match app::server::Server::build_with(settings, overrides).await {
                Ok(server) => server,
                Err(e) => {
                    let _ = started_tx.send(Err(format!("{e:#}")));
                    return;
                }
            };
            let _ = started_tx.send(Ok(server.local_addr()));
            let result = server.run_until(async move {
                let _ = stop_rx.await;
            });
            let _ = done_tx.send(result.await.map_err(|e| format!("{e:#}")));
        });
        let address = match started_rx.recv_timeout(Duration::from_secs(60)) {
            Ok(Ok(address)) => address,
            Ok(Err(e)) => panic!("the server did not start: {e}\nits log:\n{}", logs.lock().unwrap()),
            Err(_) => panic!("the server did not start in 60 s; its log:\n{}", logs.lock().unwrap()),
        };
        Self {
            process: Process::InProcess { runtime: Some(runtime), stop: Some(stop), done: Mutex::new(done) },
            base: format!("http://{address}"),
            logs,
            data_dir: Some(settings_data_dir(env)),
        }
    }

    /// The real binary, in the data dir's parent.
    pub fn start_binary(env: &Env) -> Self {
        Self::start_in(env, env.data.path())
    }

    /// The real binary with `cwd` as its working directory.
    pub fn start_in(env: &Env, cwd: &Path) -> Self {
        Self::start_program(env, &binary(), cwd)
    }

    /// The real binary started by a shell whose soft limit of open files is `soft`.
    pub fn start_binary_with_soft_nofile(env: &Env, soft: u64) -> Self {
        let mut command = Command::new("/bin/sh");
        command.args(["-c", &format!("ulimit -Sn {soft} && exec \"$0\" serve")]).arg(binary());
        Self::start_command(env, env.data.path(), command)
    }

    /// `program` (a `sandlane` binary, wherever it lies) with `cwd` as its working
    /// directory.
    pub fn start_program(env: &Env, program: &Path, cwd: &Path) -> Self {
        let mut command = Command::new(program);
        command.arg("serve");
        Self::start_command(env, cwd, command)
    }

    fn start_command(env: &Env, cwd: &Path, mut command: Command) -> Self {
        let mut child = command
            .current_dir(cwd)
            .envs(env.vars.iter().cloned())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn sandlane serve");
        let stderr = child.stderr.take().expect("stderr");
        let logs = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = logs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("sandlane listening")
                    && let Ok(v) = serde_json::from_str::<Value>(&line)
                    && let Some(a) = v["fields"]["address"].as_str()
                {
                    let _ = tx.send(a.to_owned());
                }
                let mut l = sink.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        let address = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(a) => a,
            Err(_) => {
                let _ = child.kill();
                panic!("the server did not start; its log:\n{}", logs.lock().unwrap());
            }
        };
        // Unset, the data dir is the default one in the working directory.
        let data_dir = env
            .vars
            .iter()
            .find(|(k, _)| k == "SANDLANE_DATA_DIR")
            .map_or_else(|| cwd.join("sandlane-data"), |(_, v)| PathBuf::from(v));
        Self {
            process: Process::Binary(child),
            base: format!("http://{address}"),
            logs,
            data_dir: Some(data_dir),
        }
    }

    /// The process id of a server started as the real binary ([`Server::start_binary`]).
    pub fn pid(&self) -> u32 {
        match &self.process {
            Process::Binary(child) => child.id(),
            Process::InProcess { .. } => panic!("a pid needs the server started with Server::start_binary"),
        }
    }

    /// Kills the server's process with SIGKILL (no shutdown of any kind) and reaps it.
    pub fn kill9(&mut self) {
        let Process::Binary(child) = &mut self.process else {
            panic!("kill -9 needs the server started with Server::start_binary");
        };
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Stops the server (SIGTERM for the binary; the shutdown future in-process) and
    /// waits; returns whether it stopped cleanly in time.
    pub fn stop(&mut self) -> bool {
        match &mut self.process {
            Process::Binary(child) => {
                let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
                let deadline = Instant::now() + Duration::from_secs(15);
                while Instant::now() < deadline {
                    if let Ok(Some(status)) = child.try_wait() {
                        return status.success();
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                let _ = child.kill();
                false
            }
            Process::InProcess { runtime, stop, done } => {
                let Some(stop) = stop.take() else { return true };
                let _ = stop.send(());
                let clean =
                    matches!(done.get_mut().unwrap().recv_timeout(Duration::from_secs(15)), Ok(Ok(())));
                if let Some(runtime) = runtime.take() {
                    runtime.shutdown_timeout(Duration::from_secs(5));
                }
                clean
            }
        }
    }

    fn running(&mut self) -> bool {
        match &mut self.process {
            Process::Binary(child) => matches!(child.try_wait(), Ok(None)),
            Process::InProcess { stop, .. } => stop.is_some(),
        }
    }

    pub fn log_text(&self) -> String {
        self.logs.lock().unwrap().clone()
    }

    /// `/bin/sh -c script` run in sandbox `sandbox` of org `acme` as `key` (buffered
    /// exec); returns (status, JSON body).
    pub fn exec_sh(&self, key: &str, sandbox: &str, script: &str) -> (u16, Value) {
        self.call(
            "POST",
            &format!("/v1/orgs/acme/sandboxes/{sandbox}/exec"),
            Some(key),
            Some(serde_json::json!({"argv": ["/bin/sh", "-c", script]})),
        )
    }

    /// A request; returns (status, JSON body or Null).
    pub fn call(&self, method: &str, path: &str, key: Option<&str>, body: Option<Value>) -> (u16, Value) {
        let agent = ureq::Agent::config_builder().http_status_as_error(false).build().new_agent();
        let url = format!("{}{path}", self.base);
        let auth = key.map(|k| format!("Bearer {k}"));
        let response = match (method, body) {
            ("GET", _) => with_auth(agent.get(&url), auth.as_deref()).call(),
            ("DELETE", _) => with_auth(agent.delete(&url), auth.as_deref()).call(),
            ("PUT", Some(b)) => with_auth(agent.put(&url), auth.as_deref()).send_json(b),
            ("PUT", None) => with_auth(agent.put(&url), auth.as_deref()).send_empty(),
            ("POST", Some(b)) => with_auth(agent.post(&url), auth.as_deref()).send_json(b),
            ("POST", None) => with_auth(agent.post(&url), auth.as_deref()).send_empty(),
            (m, _) => panic!("unsupported method {m}"),
        };
        read(response)
    }

    /// Sends a whole request, waits `timeout` for nothing, and goes away (closes the
    /// connection) before the answer: a client that leaves half-way.
    pub fn call_and_leave(&self, method: &str, path: &str, key: &str, body: Value, timeout: Duration) {
        use std::io::Write;
        let address = self.base.trim_start_matches("http://");
        let body = body.to_string();
        let mut stream = std::net::TcpStream::connect(address).expect("connect");
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nhost: {address}\r\nauthorization: Bearer {key}\r\n\
             content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .expect("send the request");
        stream.set_read_timeout(Some(timeout)).expect("timeout");
        let mut answer = [0u8; 1];
        let read = read_through_signals(&mut stream, &mut answer);
        assert!(
            matches!(&read, Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)),
            "the request was meant to outlast the client: {read:?}"
        );
        drop(stream);
    }

    /// A form POST (introspection).
    pub fn post_form(&self, path: &str, key: Option<&str>, form: &[(&str, &str)]) -> (u16, Value) {
        let agent = ureq::Agent::config_builder().http_status_as_error(false).build().new_agent();
        let auth = key.map(|k| format!("Bearer {k}"));
        read(
            with_auth(agent.post(&format!("{}{path}", self.base)), auth.as_deref())
                .send_form(form.iter().copied()),
        )
    }

    /// A raw request with an arbitrary body and content type.
    pub fn raw(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        content_type: &str,
        body: impl AsRef<[u8]>,
    ) -> (u16, Value) {
        let body = body.as_ref();
        let agent = ureq::Agent::config_builder().http_status_as_error(false).build().new_agent();
        let url = format!("{}{path}", self.base);
        let auth = key.map(|k| format!("Bearer {k}"));
        let response = match method {
            "PUT" => with_auth(agent.put(&url), auth.as_deref()).content_type(content_type).send(body),
            "POST" => with_auth(agent.post(&url), auth.as_deref()).content_type(content_type).send(body),
            m => panic!("unsupported raw method {m}"),
        };
        read(response)
    }

    /// The raw text of a GET.
    pub fn get_text(&self, path: &str) -> (u16, String) {
        self.get_text_as(path, None)
    }

    /// The raw text of a GET with `key`, if any.
    pub fn get_text_as(&self, path: &str, key: Option<&str>) -> (u16, String) {
        let agent = ureq::Agent::config_builder().http_status_as_error(false).build().new_agent();
        let auth = key.map(|k| format!("Bearer {k}"));
        let mut r =
            with_auth(agent.get(&format!("{}{path}", self.base)), auth.as_deref()).call().expect("GET");
        let status = r.status().as_u16();
        (status, r.body_mut().read_to_string().unwrap_or_default())
    }
}

fn with_auth<B>(req: ureq::RequestBuilder<B>, auth: Option<&str>) -> ureq::RequestBuilder<B> {
    match auth {
        Some(a) => req.header("authorization", a),
        None => req,
    }
}

fn read(response: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> (u16, Value) {
    let mut r = response.expect("HTTP request");
    let status = r.status().as_u16();
    let text = r.body_mut().read_to_string().unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

impl Drop for Server {
    fn drop(&mut self) {
        // Sandboxes outlive their server by design: end this test's first, while the
        // server is alive to reap them.
        if let Some(data) = &self.data_dir {
            end_sandboxes(data);
        }
        if self.running() {
            self.stop();
        }
        if let Some(data) = &self.data_dir {
            remove_cgroups(data);
            unmount_workspaces(data);
            // The token directories are in memory, outside the test's temp dir.
            let root = adapters::bwrap::default_sandbox_root(data);
            let _ = std::fs::remove_dir_all(adapters::bwrap::tokens_in_memory(&root));
        }
    }
}

/// Unmounts the workspace images (quota) left mounted beside `data` (in its sandbox root,
/// or under it) by the sandboxes a test left: their processes are gone by now.
pub fn unmount_workspaces(data: &Path) {
    let Some(root) = data.parent() else { return };
    let root = format!("{}/", root.display());
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut points: Vec<&str> =
        table.lines().filter_map(|l| l.split(' ').nth(4)).filter(|p| p.starts_with(&root)).collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for point in points {
        let _ = Command::new("umount").arg(point).status();
    }
}

/// The data dir `env` configures.
fn settings_data_dir(env: &Env) -> PathBuf {
    env.vars
        .iter()
        .find(|(k, _)| k == "SANDLANE_DATA_DIR")
        .map(|(_, v)| PathBuf::from(v))
        .expect("the test env names its data dir")
}

/// Asks every supervisor under `data` to end its sandbox (the protocol's hello, then
/// `shutdown`: the supervisor exits and its pid namespace goes with it).
pub fn end_sandboxes(data: &Path) {
    use std::io::{Read, Write};
    let frame = |json: &str| {
        let mut f = u32::try_from(json.len()).unwrap().to_be_bytes().to_vec();
        f.push(1);
        f.extend_from_slice(json.as_bytes());
        f
    };
    let Ok(entries) = std::fs::read_dir(data.join("sandboxes")) else { return };
    for entry in entries.flatten() {
        // Through the control directory's descriptor: the socket's own path may be longer
        // than a unix socket address holds.
        let Ok(control) = std::fs::File::open(entry.path().join("control")) else { continue };
        let short = format!("/proc/self/fd/{}/sock", std::os::fd::AsRawFd::as_raw_fd(&control));
        let Ok(mut s) = std::os::unix::net::UnixStream::connect(short) else {
            continue;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let mut bytes = frame(r#"{"type":"hello","version":1}"#);
        bytes.extend(frame(r#"{"type":"shutdown"}"#));
        if s.write_all(&bytes).is_ok() {
            let _ = s.read_to_end(&mut Vec::new());
        }
    }
}

/// Removes the (empty) cgroups of the sandboxes and prepared starts under `data`.
fn remove_cgroups(data: &Path) {
    std::thread::sleep(Duration::from_millis(100));
    for dir in ["sandboxes", "warm"] {
        let Ok(entries) = std::fs::read_dir(data.join(dir)) else { continue };
        for entry in entries.flatten() {
            for controller in ["memory", "pids", "cpu", "freezer"] {
                let _ = std::fs::remove_dir(
                    Path::new("/sys/fs/cgroup").join(controller).join("sandlane").join(entry.file_name()),
                );
            }
        }
    }
}

/// Asserts an error body of the contract's shape.
pub fn assert_error(got: &(u16, Value), status: u16, code: &str) {
    assert_eq!(got.0, status, "body: {}", got.1);
    assert_eq!(got.1["error"], code, "body: {}", got.1);
    assert!(got.1["message"].as_str().is_some_and(|m| !m.is_empty()), "body: {}", got.1);
}

/// `read`, taken up again when a signal interrupts it (the tests share one process under
/// `cargo test`, and another test's child or signal can interrupt a blocking read).
///
/// # Errors
/// The read's own, but never `Interrupted`.
pub fn read_through_signals(stream: &mut impl std::io::Read, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        match stream.read(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            read => return read,
        }
    }
}
