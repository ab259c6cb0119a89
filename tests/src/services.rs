//! The services tests run against: a throwaway PostgreSQL (`scripts/pg-throwaway.sh`), a
//! podman API service (`scripts/podman-throwaway.sh`), `kubernetes-validate` in a throwaway
//! virtualenv (`scripts/kube-validate.sh`) and `kubectl`. The test command sets up all of
//! them and exports their variables.
//!
//! A test that needs a service which is not set up FAILS, naming the script that starts
//! it, unless the developer opted out of that service by name with
//! `SANDLANE_TEST_SKIP` (a comma list of `postgres`, `podman`, `kubernetes-validate`,
//! `kubectl`; the test command never sets
//! it). A test skipped that way says so on stderr and on the terminal.
//!
//! When `SANDLANE_TEST_MARKS` names a directory, each test handed a service appends a line
//! naming itself to `<dir>/<service>`, so the test command counts the tests that really ran
//! against each service.

use std::io::Write as _;

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
}

impl Service {
    /// Every service, in the order the test command names them.
    pub const ALL: [Self; 4] = [Self::Postgres, Self::Podman, Self::KubernetesValidate, Self::Kubectl];

    /// The service's name in `SANDLANE_TEST_SKIP` and in the marks directory.
    pub fn name(self) -> &'static str {
        match self {
            Self::Postgres => "postgres",
            Self::Podman => "podman",
            Self::KubernetesValidate => "kubernetes-validate",
            Self::Kubectl => "kubectl",
        }
    }

    fn vars(self) -> &'static [&'static str] {
        match self {
            Self::Postgres => &["SANDLANE_TEST_POSTGRES_URL"],
            Self::Podman => &["SANDLANE_TEST_DOCKER_HOST", "SANDLANE_TEST_CONTAINER_IMAGE"],
            Self::KubernetesValidate => &["SANDLANE_KUBERNETES_VALIDATE"],
            Self::Kubectl => &["SANDLANE_KUBECTL"],
        }
    }

    /// How to set the service up.
    fn how(self) -> &'static str {
        match self {
            Self::Postgres => "Start it with `eval \"$(bash scripts/pg-throwaway.sh start)\"`",
            Self::Podman => "Start it with `eval \"$(bash scripts/podman-throwaway.sh start)\"`",
            Self::KubernetesValidate => "Install it with `eval \"$(bash scripts/kube-validate.sh start)\"`",
            Self::Kubectl => {
                "Install it (`apt-get install kubernetes-client`) and `export SANDLANE_KUBECTL=$(command -v kubectl)`"
            }
        }
    }
}

/// The admin URL of the test PostgreSQL, or `None` when the developer skips `postgres`.
///
/// # Panics
/// When `SANDLANE_TEST_POSTGRES_URL` is unset and `postgres` is not skipped by name.
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

/// The test podman service, or `None` when the developer skips `podman`.
///
/// # Panics
/// When its variables are unset and `podman` is not skipped by name.
#[must_use]
pub fn podman_engine() -> Option<Engine> {
    let mut values = require(Service::Podman)?.into_iter();
    let (docker_host, image) = (values.next()?, values.next()?);
    Some(Engine { docker_host, image })
}

/// The values of `service`'s variables (recording that this test used it); `None` with a
/// loud notice when the developer skips it by name; otherwise a panic saying how to
/// start it.
///
/// # Panics
/// When a variable is unset and the service is not skipped, or when
/// `SANDLANE_TEST_SKIP` names an unknown service.
#[must_use]
pub fn require(service: Service) -> Option<Vec<String>> {
    let values: Vec<Option<String>> =
        service.vars().iter().map(|v| std::env::var(v).ok().filter(|s| !s.is_empty())).collect();
    if values.iter().all(Option::is_some) {
        mark(service);
        return Some(values.into_iter().flatten().collect());
    }
    let missing: Vec<&str> =
        service.vars().iter().zip(&values).filter(|(_, v)| v.is_none()).map(|(n, _)| *n).collect();
    if skipped().contains(&service) {
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
    panic!(
        "{} unset: this test needs {}. {} or run scripts/test.sh; to skip the {} tests on \
         purpose, set {SKIP_VAR}={}",
        missing.join(", "),
        service.name(),
        service.how(),
        service.name(),
        service.name(),
    );
}

/// The services named in `SANDLANE_TEST_SKIP`.
fn skipped() -> Vec<Service> {
    let Ok(list) = std::env::var(SKIP_VAR) else { return Vec::new() };
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|name| {
            Service::ALL
                .into_iter()
                .find(|s| s.name().eq_ignore_ascii_case(name))
                .unwrap_or_else(|| panic!("{SKIP_VAR} names `{name}`; the services are: postgres, podman, kubernetes-validate, kubectl"))
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
