//! The services tests run against: a throwaway PostgreSQL (`scripts/pg-throwaway.sh`), a
//! podman API service (`scripts/podman-throwaway.sh`), `kubernetes-validate` in a throwaway
//! virtualenv (`scripts/kube-validate.sh`), `kubectl`, and a headless Chromium with
//! playwright-core (`scripts/browser.sh`). The test command sets up all of
//! them and exports their variables.
//!
//! When a service's variables are not set (plain `cargo test --workspace`, or an IDE
//! running one test), the first test of the process that needs it starts it with the same
//! script, once per test process, and a reaper stops it when the process ends (it waits for
//! the end of a pipe only the test process holds, so it also runs after a crash or a
//! `kill -9`); `kubectl` is taken from `PATH`. A service that cannot start FAILS the test,
//! naming the script, unless the developer opted out of that service by name with
//! `SANDLANE_TEST_SKIP` (a comma list of `postgres`, `podman`, `kubernetes-validate`,
//! `kubectl`, `browser`; the test command never sets it). A test skipped that way says so
//! on stderr and on the terminal.
//!
//! When `SANDLANE_TEST_MARKS` names a directory, each test handed a service appends a line
//! naming itself to `<dir>/<service>`, so the test command counts the tests that really ran
//! against each service.

use std::io::Write as _;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};

/// The variable holding the services a developer chose to skip.
pub const SKIP_VAR: &str = "SANDLANE_TEST_SKIP";
/// The variable naming the directory where tests record the services they used.
pub const MARKS_VAR: &str = "SANDLANE_TEST_MARKS";

/// A service some tests need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// PostgreSQL: `SANDLANE_TEST_POSTGRES_URL`, an admin URL that may create databases.
    Postgres,
    /// A Docker Engine API (podman): `SANDLANE_TEST_DOCKER_HOST` and
    /// `SANDLANE_TEST_CONTAINER_IMAGE`.
    Podman,
    /// `kubernetes-validate` (PyPI): `SANDLANE_KUBERNETES_VALIDATE`, its program.
    KubernetesValidate,
    /// `kubectl`: `SANDLANE_KUBECTL`, its program.
    Kubectl,
    /// A headless browser: `SANDLANE_TEST_CHROMIUM` (Debian's `chromium`) and
    /// `SANDLANE_TEST_PLAYWRIGHT` (a directory whose `node_modules` holds playwright-core).
    Browser,
}

impl Service {
    /// Every service, in the order the test command names them.
    pub const ALL: [Self; 5] =
        [Self::Postgres, Self::Podman, Self::KubernetesValidate, Self::Kubectl, Self::Browser];

    /// The service's name in `SANDLANE_TEST_SKIP` and in the marks directory.
    pub fn name(self) -> &'static str {
        match self {
            Self::Postgres => "postgres",
            Self::Podman => "podman",
            Self::KubernetesValidate => "kubernetes-validate",
            Self::Kubectl => "kubectl",
            Self::Browser => "browser",
        }
    }

    fn vars(self) -> &'static [&'static str] {
        match self {
            Self::Postgres => &["SANDLANE_TEST_POSTGRES_URL"],
            Self::Podman => &["SANDLANE_TEST_DOCKER_HOST", "SANDLANE_TEST_CONTAINER_IMAGE"],
            Self::KubernetesValidate => &["SANDLANE_KUBERNETES_VALIDATE"],
            Self::Kubectl => &["SANDLANE_KUBECTL"],
            Self::Browser => &["SANDLANE_TEST_CHROMIUM", "SANDLANE_TEST_PLAYWRIGHT"],
        }
    }

    /// The variable naming the service's temp dir, which its script's `stop` takes.
    fn dir_var(self) -> &'static str {
        match self {
            Self::Postgres => "SANDLANE_TEST_PG_DIR",
            Self::Podman => "SANDLANE_TEST_PODMAN_DIR",
            Self::KubernetesValidate => "SANDLANE_KUBE_VALIDATE_DIR",
            Self::Kubectl => "",
            Self::Browser => "SANDLANE_TEST_BROWSER_DIR",
        }
    }

    /// The script that starts it (`kubectl` has none: it is installed, not started).
    fn script(self) -> &'static str {
        match self {
            Self::Postgres => "scripts/pg-throwaway.sh",
            Self::Podman => "scripts/podman-throwaway.sh",
            Self::KubernetesValidate => "scripts/kube-validate.sh",
            Self::Kubectl => "",
            Self::Browser => "scripts/browser.sh",
        }
    }

    /// How a developer sets it up by hand.
    fn how(self) -> String {
        match self {
            Self::Kubectl => {
                "Install it (`apt-get install kubernetes-client`) and `export SANDLANE_KUBECTL=$(command -v kubectl)`"
                    .to_owned()
            }
            _ => format!("Start it with `eval \"$(bash {} start)\"`", self.script()),
        }
    }
}

/// The admin URL of the test PostgreSQL, or `None` when the developer skips `postgres`.
///
/// # Panics
/// When `SANDLANE_TEST_POSTGRES_URL` is unset, `postgres` is not skipped by name and the
/// throwaway cluster cannot be started.
#[must_use]
pub fn postgres_admin_url() -> Option<String> {
    let mut values = require(Service::Postgres)?;
    Some(values.remove(0))
}

/// The engine and image of the container tests.
#[derive(Debug, Clone)]
pub struct Engine {
    /// The Docker Engine API endpoint (`unix://…`).
    pub docker_host: String,
    /// The image the sandboxes run.
    pub image: String,
}

impl Engine {
    /// The service's image with the clients a real agent uses (bash, curl, git, openssl,
    /// Python, Node: `podman-throwaway.sh tools-image`), built from this host's programs the
    /// first time a test asks.
    ///
    /// # Panics
    /// When the endpoint is not a throwaway service's socket or the image cannot be built
    /// (the script says why on stderr).
    #[must_use]
    pub fn tools_image(&self) -> String {
        let socket = self.docker_host.strip_prefix("unix://").expect("a unix:// engine endpoint");
        let dir = std::path::Path::new(socket).parent().expect("the socket lies in the service's dir");
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the repository");
        let out = Command::new("bash")
            .arg(root.join(Service::Podman.script()))
            .arg("tools-image")
            .arg(dir)
            .current_dir(root)
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .expect("run podman-throwaway.sh tools-image");
        assert!(
            out.status.success(),
            "podman-throwaway.sh tools-image {} failed: {}",
            dir.display(),
            out.status
        );
        String::from_utf8(out.stdout).expect("an image name").trim().to_owned()
    }
}

/// The test podman service, or `None` when the developer skips `podman`.
///
/// # Panics
/// When its variables are unset, `podman` is not skipped by name and the throwaway service
/// cannot be started.
#[must_use]
pub fn podman_engine() -> Option<Engine> {
    let mut values = require(Service::Podman)?.into_iter();
    let (docker_host, image) = (values.next()?, values.next()?);
    Some(Engine { docker_host, image })
}

/// The values of `service`'s variables (recording that this test used it): from the
/// environment when the test command set them, else from the service this process started;
/// `None` with a loud notice when the developer skips it by name.
///
/// # Panics
/// When the service is not skipped and cannot be started, or when `SANDLANE_TEST_SKIP`
/// names an unknown service.
#[must_use]
pub fn require(service: Service) -> Option<Vec<String>> {
    let values: Vec<Option<String>> =
        service.vars().iter().map(|v| std::env::var(v).ok().filter(|s| !s.is_empty())).collect();
    if values.iter().all(Option::is_some) {
        mark(service);
        return Some(values.into_iter().flatten().collect());
    }
    if skipped().contains(&service) {
        let missing: Vec<&str> =
            service.vars().iter().zip(&values).filter(|(_, v)| v.is_none()).map(|(n, _)| *n).collect();
        let notice = format!(
            "\n!!!!!!!! SKIPPED: {} (a {} test; {} unset and {SKIP_VAR} names {}) !!!!!!!!\n",
            test_name(),
            service.name(),
            missing.join(", "),
            service.name(),
        );
        eprintln!("{notice}");
        // The runners hide a passing test's output; the terminal, when there is one, does not.
        if let Ok(mut tty) = std::fs::OpenOptions::new().write(true).open("/dev/tty") {
            let _ = tty.write_all(notice.as_bytes());
        }
        return None;
    }
    match started(service) {
        Ok(values) => {
            mark(service);
            Some(values)
        }
        Err(why) => panic!(
            "this test needs {}, whose variables ({}) are unset, and starting it failed: {why}. \
             {} or run scripts/test.sh; to skip the {} tests on purpose, set {SKIP_VAR}={}",
            service.name(),
            service.vars().join(", "),
            service.how(),
            service.name(),
            service.name(),
        ),
    }
}

/// The service this process started (once, whichever test asked first), or why it could
/// not start. A failed start is not retried: every test that needs it fails with the reason.
fn started(service: Service) -> Result<Vec<String>, String> {
    static STARTED: [OnceLock<Result<Vec<String>, String>>; Service::ALL.len()] =
        [const { OnceLock::new() }; Service::ALL.len()];
    let index = Service::ALL.iter().position(|s| *s == service).expect("every service is in Service::ALL");
    STARTED[index].get_or_init(|| start(service)).clone()
}

/// The reapers' pipes: held open for the life of the process, so each reaper's read ends
/// (and it stops its service) exactly when the process does.
static REAPERS: Mutex<Vec<Child>> = Mutex::new(Vec::new());

fn start(service: Service) -> Result<Vec<String>, String> {
    if service == Service::Kubectl {
        return on_path("kubectl").map(|p| vec![p]).ok_or_else(|| "kubectl is not on PATH".to_owned());
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .ok_or("the tests crate has no parent directory")?;
    let script = root.join(service.script());
    eprintln!("tests: {} variables unset; starting it with {}", service.name(), script.display());
    let out = Command::new("bash")
        .arg(&script)
        .arg("start")
        .current_dir(root)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let exported: Vec<(&str, &str)> =
        stdout.lines().filter_map(|l| l.strip_prefix("export ")?.split_once('=')).collect();
    let value = |name: &str| exported.iter().find(|(k, _)| *k == name).map(|(_, v)| (*v).to_owned());
    // Whatever it printed, a dir means something to stop, even when the start failed later.
    if let Some(dir) = value(service.dir_var()) {
        let reaper = Command::new("bash")
            .args(["-c", "cat >/dev/null; exec bash \"$0\" stop \"$1\""])
            .arg(&script)
            .arg(&dir)
            .current_dir(root)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start the reaper of {dir}: {e}"))?;
        REAPERS.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(reaper);
    }
    if !out.status.success() {
        return Err(format!("{} start exited with {}", script.display(), out.status));
    }
    service
        .vars()
        .iter()
        .map(|name| value(name).ok_or_else(|| format!("{} start printed no {name}", script.display())))
        .collect()
}

/// The services named in `SANDLANE_TEST_SKIP`.
fn skipped() -> Vec<Service> {
    let Ok(list) = std::env::var(SKIP_VAR) else { return Vec::new() };
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|name| {
            Service::ALL.into_iter().find(|s| s.name().eq_ignore_ascii_case(name)).unwrap_or_else(|| {
                let known: Vec<&str> = Service::ALL.iter().map(|s| s.name()).collect();
                panic!("{SKIP_VAR} names `{name}`; the services are: {}", known.join(", "))
            })
        })
        .collect()
}

/// The running test, as the harness names its thread (each test runs on a thread named
/// after it, and nextest runs each in a process of its own).
fn test_name() -> String {
    let name = std::thread::current().name().unwrap_or("unnamed").to_owned();
    format!("{name} (pid {})", std::process::id())
}

fn mark(service: Service) {
    let Some(dir) = std::env::var_os(MARKS_VAR) else { return };
    let path = std::path::Path::new(&dir).join(service.name());
    let line = format!("{}\n", test_name());
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = written {
        panic!("cannot record a {} test in {}: {e}", service.name(), path.display());
    }
}

/// The headless browser: `(chromium, playwright dir)`, or `None` when the developer skips
/// `browser`.
///
/// # Panics
/// When its variables are unset, `browser` is not skipped by name and
/// `scripts/browser.sh start` fails.
#[must_use]
pub fn browser() -> Option<(String, String)> {
    let mut values = require(Service::Browser)?.into_iter();
    Some((values.next()?, values.next()?))
}

/// The first `program` on `PATH`.
fn on_path(program: &str) -> Option<String> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
        .map(|p| p.display().to_string())
}
