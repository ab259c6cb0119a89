//! The container driver's settings (the server's `[container]` table) and the
//! configuration built from them: engine endpoint, image, user, limits.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::settings::InvalidSetting;

/// The container driver's settings, as an operator gives them: the server's `[container]`
/// table (`SANDLANE_CONTAINER__*`), read as they are; [`ContainerConfig::from_settings`]
/// applies them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct ContainerSettings {
    /// The Docker Engine API endpoint (`unix:///…`); else `DOCKER_HOST`, else the default.
    pub docker_host: Option<String>,
    /// The image sandboxes run.
    pub image: Option<String>,
    /// The prefix of this deployment's container and volume names (and of the label it
    /// lists its containers by), so two deployments on one engine never touch each
    /// other's sandboxes. Default `sandlane`.
    pub name_prefix: Option<String>,
}

impl ContainerSettings {
    /// Checks what the types do not, naming the bad setting (`container.KEY`).
    ///
    /// # Errors
    /// [`InvalidSetting`].
    pub fn validate(&self) -> Result<(), InvalidSetting> {
        if let Some(prefix) = &self.name_prefix
            && (prefix.is_empty()
                || prefix.len() > 32
                || !prefix.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'))
        {
            return Err(InvalidSetting::new(
                "container.name_prefix",
                format!("must be 1-32 characters of a-z 0-9 -, got {prefix:?}"),
            ));
        }
        Ok(())
    }
}

/// Resource limits of one sandbox (its whole container, every command in it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContainerLimits {
    /// Most memory of the container in bytes (memory cgroup; swap is not added).
    pub memory_bytes: u64,
    /// Most processes in the container (pids cgroup).
    pub processes: u64,
    /// CPU share in thousandths of a CPU (`NanoCpus`; 1000 = one CPU).
    pub cpu_millis: u64,
    /// Most open files per process (`RLIMIT_NOFILE`).
    pub open_files: u64,
    /// Largest file a process may write in bytes (`RLIMIT_FSIZE`).
    pub file_size_bytes: u64,
    /// CPU seconds per process (`RLIMIT_CPU`).
    pub cpu_secs: u64,
    /// `RLIMIT_NPROC`: counted per uid across every sandbox of the engine's host (they
    /// share [`ContainerConfig::user`]), so it is a host-wide backstop, not the
    /// per-sandbox limit ([`ContainerLimits::processes`] is). It is always set: podman
    /// otherwise passes a default above its own hard limit, which runc cannot apply.
    pub user_processes: u64,
}

impl Default for ContainerLimits {
    /// 1 GiB memory, 256 processes, one CPU, 1024 files, 1 GiB files, 300 CPU seconds,
    /// 4096 processes of the sandbox user on the host.
    fn default() -> Self {
        Self {
            memory_bytes: 1 << 30,
            processes: 256,
            cpu_millis: 1000,
            open_files: 1024,
            file_size_bytes: 1 << 30,
            cpu_secs: 300,
            user_processes: 4096,
        }
    }
}

/// Everything the container driver needs: its settings ([`ContainerConfig::from_settings`])
/// resolved over the defaults, and what is not a setting (the supervisor's program, the
/// state dir, the knobs tests and benches turn).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerConfig {
    /// The Docker Engine API endpoint: `unix:///path/to.sock` or a socket path
    /// (`SANDLANE_DOCKER_HOST`, else `DOCKER_HOST`, else [`DEFAULT_DOCKER_HOST`]).
    pub docker_host: String,
    /// The image every sandbox runs (`SANDLANE_CONTAINER_IMAGE`): anything with a
    /// `/workspace` directory owned by [`ContainerConfig::user`] (a new volume copies its
    /// owner from the image); nothing of sandlane's.
    pub image: String,
    /// The user commands run as inside, `uid:gid` (default `1000:1000`).
    pub user: String,
    /// Prefix of container and volume names and the value of the `io.sandlane.prefix`
    /// label [`list`](ports::SandboxDriver::list) filters by (default `sandlane`).
    pub name_prefix: String,
    /// Resource limits of every sandbox.
    pub limits: ContainerLimits,
    /// Per-stream cap of captured output in bytes; the rest is drained and dropped.
    pub output_cap_bytes: usize,
    /// Size of the private `/tmp` tmpfs in bytes.
    pub tmp_size_bytes: u64,
    /// How long a new container's supervisor may take to answer at provision.
    pub probe_timeout: Duration,
    /// The limit of one Engine API request (not of a command's run time), in seconds.
    pub api_timeout_secs: u64,
    /// The supervisor's program on this host (`sandlane-supervisor`): bound read-only
    /// into every container (with its loader and libraries, when it is not static) and
    /// run as its init.
    pub supervisor: PathBuf,
    /// Where each sandbox's host side lives (`<state_dir>/<sandbox id>/`: the supervisor's
    /// socket, the token, the environment); created root-only. The engine must see this
    /// host's paths (a local engine).
    pub state_dir: PathBuf,
    /// Whether the supervisor installs the seccomp filter, and provision requires it.
    pub seccomp: bool,
    /// The PEM file of the roots brokered upstreams are verified against
    /// (`egress.upstream_ca_file`); `None`: the system's roots.
    pub upstream_ca_file: Option<PathBuf>,
}

/// The endpoint used when neither `SANDLANE_DOCKER_HOST` nor `DOCKER_HOST` is set.
pub const DEFAULT_DOCKER_HOST: &str = "unix:///var/run/docker.sock";

impl ContainerConfig {
    /// The defaults for `docker_host` and `image`: user `1000:1000`, prefix `sandlane`,
    /// default [`ContainerLimits`], 1 MiB output per stream, 256 MiB `/tmp`, a 10 s
    /// start, 120 s per API request, `sandlane-supervisor` beside the running executable as
    /// the supervisor, state under
    /// `/var/lib/sandlane/containers`, seccomp on.
    pub fn new(docker_host: impl Into<String>, image: impl Into<String>) -> Self {
        Self {
            docker_host: docker_host.into(),
            image: image.into(),
            user: "1000:1000".to_owned(),
            name_prefix: "sandlane".to_owned(),
            limits: ContainerLimits::default(),
            output_cap_bytes: 1 << 20,
            tmp_size_bytes: 256 << 20,
            probe_timeout: Duration::from_secs(10),
            api_timeout_secs: 120,
            supervisor: crate::supervisor_link::beside_current_exe(),
            state_dir: PathBuf::from("/var/lib/sandlane/containers"),
            seccomp: true,
            upstream_ca_file: None,
        }
    }
}

impl ContainerConfig {
    /// The defaults ([`ContainerConfig::new`]) with `settings` over them, and what is not
    /// a setting: `docker_host_env` (the process's `DOCKER_HOST`, the endpoint when
    /// `container.docker_host` is unset; [`DEFAULT_DOCKER_HOST`] without either), the
    /// `supervisor`'s program (`None`: `sandlane-supervisor` beside the running
    /// executable) and the `state_dir` ([`ContainerConfig::state_dir`]).
    ///
    /// # Errors
    /// When `container.image` is unset: a message saying how to set it.
    pub fn from_settings(
        settings: &ContainerSettings,
        docker_host_env: Option<String>,
        supervisor: Option<PathBuf>,
        state_dir: PathBuf,
    ) -> Result<Self, String> {
        let non_empty = |v: &Option<String>| v.clone().filter(|v| !v.trim().is_empty());
        let docker_host = non_empty(&settings.docker_host)
            .or_else(|| non_empty(&docker_host_env))
            .unwrap_or_else(|| DEFAULT_DOCKER_HOST.to_owned());
        let Some(image) = non_empty(&settings.image) else {
            return Err("SANDLANE_DRIVER=container needs an image: set SANDLANE_CONTAINER_IMAGE (or \
                        container.image in the config file)"
                .to_owned());
        };
        let mut config = Self::new(docker_host, image);
        if let Some(program) = supervisor {
            config.supervisor = program;
        }
        config.state_dir = state_dir;
        if let Some(prefix) = &settings.name_prefix {
            config.name_prefix.clone_from(prefix);
        }
        Ok(config)
    }
}
