//! The container driver: each sandbox is one long-lived container, driven through the
//! Docker Engine API (bollard, a unix socket, API version negotiated and capped at
//! v1.41), tested on podman 4.3's compatible service. Its init is the same supervisor as
//! under bubblewrap (`sandlane-supervisor`), and every command goes through it, never
//! through the engine's exec API (which needs a round trip per exec and waits for every
//! process holding the output, so `sh -c 'sleep 300 & echo hi'` hung until its timeout).
//!
//! # A sandbox
//! A container `<prefix>-<sandbox id>` of [`ContainerConfig::image`] with every
//! capability dropped but `SETUID`, `SETGID` and `KILL` (the supervisor's, to run commands
//! as [`ContainerConfig::user`] and end their process groups; commands lose them at
//! `setuid`), `no-new-privileges`, a read-only root, no network, a private `/tmp`, memory,
//! pids and CPU limits (cgroups) and rlimits. Its workspace is a named volume at
//! `/workspace`: for a durable workspace the name is derived from the key, so it survives
//! deprovision and comes back for the same key; an ephemeral one is named after the
//! sandbox and removed at deprovision.
//!
//! # The supervisor's program
//! The image needs nothing from us: the host's `sandlane-supervisor` program is bound
//! read-only under `/.sandlane/`, with the ELF loader and the shared libraries `ldd` names
//! when it is the default (dynamic) build, and alone when it is the static one
//! (`scripts/supervisor-static.sh`); the container's entrypoint runs it. So the engine
//! must run on this host, as a unix-socket engine does.
//!
//! # The channel and the token
//! Per sandbox, a host directory `<state dir>/<sandbox id>/` (root only) holds
//! `control/` (a tmpfs of 64 KiB and 16 entries of its own, so what the container writes
//! there never reaches the host's disk: see `control.rs`; bound at `/.sandlane/control`, 0700
//! root: the supervisor listens on
//! `sock` there; the sandbox's user cannot enter it, and the supervisor refuses peers
//! inside the container's pid namespace; the supervisor, root in its container, can
//! replace `sock`, so the server opens it without following a link and checks it is a
//! socket before connecting: `supervisor::client`), `run/token` (bound read-only at
//! `/run/sandlane`, replaced atomically on refresh, so a running command reads the new
//! one) and `env.json` (the environment of the latest ensure, given to each command). The
//! token is never in the container's environment, arguments or labels. The supervisor's
//! own messages go to the engine's log of the container, held to [`LOG_BYTES`].
//!
//! # State
//! Labels on the container (sandbox id, key, durability, volume, fencing epoch) and the
//! volume, plus the host directory above, so exec and deprovision work after a restart
//! and [`SandboxDriver::list`] lists containers by label. A container whose supervisor is
//! gone (it exited, or the engine restarted and left it stopped) is removed, and exec
//! and refresh answer [`DriverError::NotFound`].

mod config;
mod control;
mod quota;
mod snapshot;
mod spec;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bollard::errors::Error as EngineError;
use bollard::models::{ContainerCreateBody, HostConfig, ResourcesUlimits, VolumeCreateRequest};
use bollard::query_parameters::{
    CreateContainerOptions, InspectContainerOptions, ListContainersOptions, RemoveContainerOptions,
    RemoveVolumeOptions,
};
use bollard::{ClientVersion, Docker};
use domain::split::{TOKEN_FILE_PATH, WORKSPACE_PATH};
use domain::{
    DriverEnvironment, Durability, ExecOutput, ExecRequest, ProcessCaps, ProcessInfo, ProcessRequest,
    SandboxId, SandboxPath, SandboxToken, Signal,
};
use ports::Cause;
use ports::driver::{
    ByteSource, ByteStream, DriverError, DriverHealth, OutputStream, ProvisionSpec, ReadOutcome,
    SandboxDriver, Unpacked,
};
use tokio::sync::OnceCell;

pub use config::{ContainerConfig, ContainerLimits, ContainerSettings, DEFAULT_DOCKER_HOST};

use crate::supervisor_link::client::{self, ClientError};
use crate::supervisor_link::listener::{self, Parked, ProxyListener};
use crate::supervisor_link::ops::{self, Host};
use spec::{SandboxLabels, container_name, volume_name};
use supervisor::protocol::{ExecSpec, Rlimit};
use supervisor_files::SupervisorFiles;

mod supervisor_files;

/// How long a connection to a live supervisor may take to say hello.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long past a command's timeout the server waits for its supervisor's answer.
const EXEC_GRACE: Duration = Duration::from_secs(10);
/// Where the supervisor's program, loader, libraries and socket are inside.
const INSIDE: &str = "/.sandlane";

/// The newest Engine API version the driver speaks; an older engine's is negotiated.
pub const MAX_API_VERSION: ClientVersion = ClientVersion { major_version: 1, minor_version: 41 };

/// The container driver. Build it once with [`ContainerDriver::new`] and share it.
pub struct ContainerDriver {
    config: ContainerConfig,
    socket: String,
    /// The supervisor's program and what it needs, found at construction.
    files: Result<SupervisorFiles, String>,
    client: OnceCell<Docker>,
    /// Labels of sandboxes seen, so an exec needs no inspect.
    known: Mutex<HashMap<SandboxId, Arc<SandboxLabels>>>,
    /// One provision or removal at a time per sandbox in this process.
    locks: Mutex<HashMap<SandboxId, Arc<tokio::sync::Mutex<()>>>>,
    /// Egress proxy listeners opened as their containers started, until served.
    proxies: Parked,
    /// How brokered upstreams are verified.
    upstream_tls: Arc<rustls::ClientConfig>,
}

/// Whether the server opens each sandbox's egress proxy socket in the container's
/// network namespace itself (it must hold `CAP_SYS_ADMIN` over it: it runs as root);
/// otherwise the supervisor listens on the proxy's port and hands its clients over.
#[allow(unsafe_code)]
fn proxy_in_namespace() -> bool {
    // SAFETY: geteuid only reads this process's effective uid.
    unsafe { libc::geteuid() == 0 }
}

impl std::fmt::Debug for ContainerDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContainerDriver").field("config", &self.config).finish_non_exhaustive()
    }
}

/// The engine did not answer.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot reach the container engine at unix://{socket}: {source} (start it, or set SANDLANE_DOCKER_HOST)"
)]
struct Unreachable {
    /// The engine's socket.
    socket: String,
    /// The client's error.
    source: EngineError,
}

fn failed(message: impl Into<String>) -> DriverError {
    DriverError::Failed(Cause::msg(message))
}

/// A step that failed with `error`: `what: error`, the error kept whole as the source.
fn failed_by(what: impl Into<String>, error: impl std::error::Error + Send + Sync + 'static) -> DriverError {
    DriverError::Failed(Cause::context(what, error))
}

/// The HTTP status of an engine error, if the engine answered.
fn status(e: &EngineError) -> Option<u16> {
    match e {
        EngineError::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

fn is_status(e: &EngineError, code: u16) -> bool {
    status(e) == Some(code)
}

/// podman's answer to a forced removal racing with the container's own stop.
fn is_stopping_race(e: &EngineError) -> bool {
    match e {
        EngineError::DockerResponseServerError { message, .. } => {
            message.contains("could not be stopped") || message.contains("state improper")
        }
        _ => false,
    }
}

/// "Already exists": Docker answers 409; podman 4.3 answers 500 "… is already in use".
fn is_conflict(e: &EngineError) -> bool {
    match e {
        EngineError::DockerResponseServerError { status_code, message } => {
            *status_code == 409 || message.contains("already in use") || message.contains("already exists")
        }
        _ => false,
    }
}

impl ContainerDriver {
    /// A driver over `config`. Connects lazily: an engine that is down is not an error
    /// here; [`SandboxDriver::health`] reports it and calls fail with
    /// [`DriverError::Unavailable`].
    ///
    /// # Errors
    /// [`DriverError::Unavailable`] when `docker_host` is not a unix socket endpoint.
    pub fn new(config: ContainerConfig) -> Result<Self, DriverError> {
        let host = config.docker_host.trim();
        let socket = if let Some(path) = host.strip_prefix("unix://") {
            path.to_owned()
        } else if host.starts_with('/') {
            host.to_owned()
        } else {
            return Err(DriverError::Unavailable(Cause::msg(format!(
                "docker host {host:?} is not supported: the container driver speaks to a unix \
                 socket (unix:///path/to/docker.sock)"
            ))));
        };
        if config.image.trim().is_empty() {
            return Err(DriverError::Unavailable(Cause::msg(
                "no container image: set SANDLANE_CONTAINER_IMAGE",
            )));
        }
        let files = SupervisorFiles::resolve(&config.supervisor);
        let upstream_tls = crate::egress::upstream_tls(config.upstream_ca_file.as_deref())
            .map_err(|e| DriverError::Unavailable(Cause::context("egress.upstream_ca_file", e)))?;
        workspace_dir(&config.state_dir)
            .map_err(|e| DriverError::Unavailable(Cause::context("cannot prepare the state dir", e)))?;
        Ok(Self {
            config,
            socket,
            files,
            client: OnceCell::new(),
            known: Mutex::new(HashMap::new()),
            locks: Mutex::new(HashMap::new()),
            proxies: Parked::default(),
            upstream_tls,
        })
    }

    /// A new CA for the sandbox (at every start of its container): its key in the
    /// sandbox's private state, its certificate and bundle in `run/` (bound at
    /// `/run/sandlane`).
    fn new_ca(&self, sandbox: &SandboxId) -> Result<(), DriverError> {
        let state = self.state(sandbox);
        let ca = crate::egress::ca::SandboxCa::generate(sandbox).map_err(|e| failed(e.to_string()))?;
        let owner = self.user_ids()?;
        ca.write(&state, &state.join("run"), Some(owner)).map_err(|e| failed(e.to_string()))
    }

    /// The configuration.
    pub fn config(&self) -> &ContainerConfig {
        &self.config
    }

    fn unavailable(&self, e: EngineError) -> DriverError {
        DriverError::Unavailable(Cause::new(Unreachable { socket: self.socket.clone(), source: e }))
    }

    /// Translates an engine error: no answer means the engine is unavailable.
    fn engine(&self, what: &str, e: EngineError) -> DriverError {
        if status(&e).is_some() { failed_by(what, e) } else { self.unavailable(e) }
    }

    /// The client, its API version negotiated once (at most [`MAX_API_VERSION`]).
    async fn docker(&self) -> Result<&Docker, DriverError> {
        self.client
            .get_or_try_init(|| async {
                let client =
                    Docker::connect_with_unix(&self.socket, self.config.api_timeout_secs, &MAX_API_VERSION)
                        .map_err(|e| self.unavailable(e))?;
                client.negotiate_version().await.map_err(|e| self.unavailable(e))
            })
            .await
    }

    fn name(&self, sandbox: &SandboxId) -> String {
        container_name(&self.config.name_prefix, sandbox)
    }

    fn remember(&self, sandbox: &SandboxId, labels: Arc<SandboxLabels>) {
        if let Ok(mut known) = self.known.lock() {
            known.insert(sandbox.clone(), labels);
        }
    }

    fn forget(&self, sandbox: &SandboxId) {
        if let Ok(mut known) = self.known.lock() {
            known.remove(sandbox);
        }
    }

    /// The sandbox's labels, from memory or the container; `None` when no container.
    async fn inspect(&self, sandbox: &SandboxId) -> Result<Option<(Arc<SandboxLabels>, bool)>, DriverError> {
        let docker = self.docker().await?;
        let info = match docker.inspect_container(&self.name(sandbox), None::<InspectContainerOptions>).await
        {
            Ok(info) => info,
            Err(e) if is_status(&e, 404) => return Ok(None),
            Err(e) => return Err(self.engine("cannot inspect the sandbox's container", e)),
        };
        let labels = info.config.and_then(|c| c.labels).unwrap_or_default();
        let labels = SandboxLabels::parse(&labels).ok_or_else(|| {
            failed(format!("container {} exists but is not a sandlane sandbox", self.name(sandbox)))
        })?;
        let running = info.state.and_then(|s| s.running).unwrap_or(false);
        let labels = Arc::new(labels);
        self.remember(sandbox, labels.clone());
        Ok(Some((labels, running)))
    }

    async fn labels(&self, sandbox: &SandboxId) -> Result<Arc<SandboxLabels>, DriverError> {
        if let Some(l) = self.known.lock().ok().and_then(|k| k.get(sandbox).cloned()) {
            return Ok(l);
        }
        match self.inspect(sandbox).await? {
            Some((labels, _)) => Ok(labels),
            None => Err(DriverError::NotFound(sandbox.clone())),
        }
    }

    fn lock(&self, sandbox: &SandboxId) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        locks.retain(|_, l| Arc::strong_count(l) > 1);
        locks.entry(sandbox.clone()).or_default().clone()
    }

    fn files(&self) -> Result<&SupervisorFiles, DriverError> {
        self.files.as_ref().map_err(|e| DriverError::Unavailable(Cause::msg(e.clone())))
    }

    fn state(&self, sandbox: &SandboxId) -> std::path::PathBuf {
        self.config.state_dir.join(sandbox.as_str())
    }

    fn control_socket(&self, sandbox: &SandboxId) -> std::path::PathBuf {
        self.state(sandbox).join("control/sock")
    }

    /// Unmounts the sandbox's control directory ([`control`]), once its container is gone.
    fn release_control(&self, sandbox: &SandboxId) -> Result<(), DriverError> {
        control::unmount(&self.state(sandbox).join("control"))
            .map_err(|e| failed_by(format!("cannot unmount the control directory of sandbox {sandbox}"), e))
    }

    /// The container's host config; `workspace` is the workspace volume's name, or the host
    /// directory its quota image is mounted on.
    fn host_config(&self, sandbox: &SandboxId, workspace: &str) -> Result<HostConfig, DriverError> {
        let l = &self.config.limits;
        let signed = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let ulimit = |name: &str, v: u64| ResourcesUlimits {
            name: Some(name.to_owned()),
            soft: Some(signed(v)),
            hard: Some(signed(v)),
        };
        let state = self.state(sandbox);
        let mut binds = vec![
            format!("{workspace}:{WORKSPACE_PATH}:rw"),
            format!("{}:{INSIDE}/control:rw", state.join("control").display()),
            format!("{}:{}:ro", state.join("run").display(), token_dir()),
        ];
        binds.extend(self.files()?.binds(INSIDE));
        Ok(HostConfig {
            binds: Some(binds),
            tmpfs: Some(HashMap::from([(
                "/tmp".to_owned(),
                format!("rw,nosuid,nodev,size={}", self.config.tmp_size_bytes),
            )])),
            network_mode: Some("none".to_owned()),
            readonly_rootfs: Some(true),
            cap_drop: Some(vec!["ALL".to_owned()]),
            cap_add: Some(vec!["SETUID".to_owned(), "SETGID".to_owned(), "KILL".to_owned()]),
            security_opt: Some(vec!["no-new-privileges".to_owned()]),
            init: Some(false),
            log_config: Some(log_config()),
            memory: Some(signed(l.memory_bytes)),
            memory_swap: Some(signed(l.memory_bytes)),
            pids_limit: Some(signed(l.processes)),
            nano_cpus: Some(signed(l.cpu_millis.saturating_mul(1_000_000))),
            ulimits: Some(vec![
                ulimit("nofile", l.open_files),
                ulimit("fsize", l.file_size_bytes),
                ulimit("nproc", l.user_processes),
                ulimit("core", 0),
            ]),
            ..Default::default()
        })
    }

    /// The rlimits the supervisor sets in each command.
    fn command_rlimits(&self) -> Vec<(Rlimit, u64)> {
        let l = &self.config.limits;
        vec![
            (Rlimit::OpenFiles, l.open_files),
            (Rlimit::FileSize, l.file_size_bytes),
            (Rlimit::CpuSecs, l.cpu_secs),
            (Rlimit::Core, 0),
        ]
    }

    /// Where the workspace comes from: with a quota, its image mounted on the host (a
    /// durable workspace made before quotas, a volume already holding the key's files, is
    /// kept as it is, without a quota); without one, the named volume. Also whether this
    /// call created it.
    async fn workspace_source(
        &self,
        spec: &ProvisionSpec,
        quota: Option<u64>,
        volume: &str,
    ) -> Result<(String, bool), DriverError> {
        // A workspace that has an image keeps it without a quota in the policy.
        let quota = quota.or_else(|| {
            let ws = self.workspace_image(volume);
            ws.quota().filter(|_| ws.image.exists())
        });
        if let Some(quota) = quota {
            let legacy = spec.durability == Durability::Durable
                && !self.workspace_image(volume).image.exists()
                && self.volume_exists(volume).await?;
            if !legacy {
                let durable = spec.durability == Durability::Durable;
                let (mountpoint, created) = self.mount_image(volume, quota, durable).await?;
                return Ok((mountpoint.display().to_string(), created));
            }
            tracing::warn!(
                volume,
                "a durable workspace made before quotas: it keeps working, without a quota"
            );
        }
        let created = self.ensure_volume(spec, volume).await?;
        Ok((volume.to_owned(), created))
    }

    async fn volume_exists(&self, volume: &str) -> Result<bool, DriverError> {
        match self.docker().await?.inspect_volume(volume).await {
            Ok(_) => Ok(true),
            Err(e) if is_status(&e, 404) => Ok(false),
            Err(e) => Err(self.engine("cannot inspect the workspace volume", e)),
        }
    }

    /// Creates the volume when missing; says whether it created it.
    async fn ensure_volume(&self, spec: &ProvisionSpec, volume: &str) -> Result<bool, DriverError> {
        let docker = self.docker().await?;
        match docker.inspect_volume(volume).await {
            Ok(_) => return Ok(false),
            Err(e) if is_status(&e, 404) => {}
            Err(e) => return Err(self.engine("cannot inspect the workspace volume", e)),
        }
        let request = VolumeCreateRequest {
            name: Some(volume.to_owned()),
            labels: Some(spec::volume_labels(&self.config.name_prefix, &spec.key, spec.durability)),
            ..Default::default()
        };
        match docker.create_volume(request).await {
            Ok(_) => Ok(true),
            // Another replica created it between the inspect and the create.
            Err(e) if is_conflict(&e) => Ok(false),
            Err(e) => Err(self.engine("cannot create the workspace volume", e)),
        }
    }

    /// Creates the sandbox's container with its workspace from `source` (the volume, or the
    /// mounted image's directory); `false` when it already existed.
    async fn create_container(
        &self,
        spec: &ProvisionSpec,
        volume: &str,
        source: &str,
    ) -> Result<bool, DriverError> {
        let docker = self.docker().await?;
        let prefix = &self.config.name_prefix;
        let mut labels = spec::labels(prefix, &spec.environment, &spec.key, spec.durability, volume)
            .map_err(|e| failed_by("cannot encode the sandbox labels", e))?;
        labels.insert(spec::LABEL_EPOCH.to_owned(), spec.epoch.to_string());
        let files = self.files()?;
        let body = ContainerCreateBody {
            image: Some(self.config.image.clone()),
            entrypoint: Some(files.entrypoint(INSIDE, &self.config.user, !proxy_in_namespace())),
            cmd: Some(Vec::new()),
            env: Some(Vec::new()),
            // The supervisor runs as root with only SETUID, SETGID and KILL, so the sandbox
            // user can neither end it nor reach its socket; commands run as the user.
            user: Some("0:0".to_owned()),
            working_dir: Some(WORKSPACE_PATH.to_owned()),
            network_disabled: Some(true),
            labels: Some(labels),
            host_config: Some(self.host_config(spec.sandbox_id(), source)?),
            ..Default::default()
        };
        let options =
            CreateContainerOptions { name: Some(self.name(spec.sandbox_id())), ..Default::default() };
        match docker.create_container(Some(options), body).await {
            Ok(_) => Ok(true),
            // "Already exists": a retried or concurrent provision of the same sandbox.
            Err(e) if is_conflict(&e) => Ok(false),
            Err(e) if is_status(&e, 404) => Err(failed(format!(
                "cannot create the sandbox's container: image {:?} is not present in the engine \
                 ({e}); build or pull it, or set SANDLANE_CONTAINER_IMAGE",
                self.config.image
            ))),
            Err(e) => Err(self.engine("cannot create the sandbox's container", e)),
        }
    }

    async fn start(&self, sandbox: &SandboxId) -> Result<(), DriverError> {
        let docker = self.docker().await?;
        match docker.start_container(&self.name(sandbox), None).await {
            Ok(()) => Ok(()),
            Err(e) if is_status(&e, 304) => Ok(()),
            Err(e) => Err(self.engine("cannot start the sandbox's container", e)),
        }
    }

    /// The host side of a sandbox: `control/` (root only), `run/token` (the sandbox
    /// user's, read-only inside) and `env.json`.
    fn prepare_state(&self, spec: &ProvisionSpec) -> Result<(), DriverError> {
        let id = spec.sandbox_id();
        let state = self.state(id);
        let io =
            |what: &str, e: std::io::Error| failed_by(format!("cannot {what} under {}", state.display()), e);
        mkdir_mode(&state, 0o700).map_err(|e| io("create the state", e))?;
        mkdir_mode(&state.join("control"), 0o700).map_err(|e| io("create control/", e))?;
        control::mount(&state.join("control"))
            .map_err(|e| io("mount the control directory's tmpfs on control/", e))?;
        let run = state.join("run");
        mkdir_mode(&run, 0o700).map_err(|e| io("create run/", e))?;
        let (uid, gid) = self.user_ids()?;
        std::os::unix::fs::chown(&run, Some(uid), Some(gid)).map_err(|e| io("chown run/", e))?;
        set_mode(&run, 0o500).map_err(|e| io("restrict run/", e))?;
        self.write_token(id, &spec.credential)?;
        self.write_environment(id, &spec.environment)
    }

    fn user_ids(&self) -> Result<(u32, u32), DriverError> {
        let (uid, gid) = self.config.user.split_once(':').unwrap_or((&self.config.user, &self.config.user));
        match (uid.parse(), gid.parse()) {
            (Ok(u), Ok(g)) => Ok((u, g)),
            _ => Err(DriverError::Unavailable(Cause::msg(format!(
                "container user {:?} is not numeric uid:gid",
                self.config.user
            )))),
        }
    }

    /// Replaces the token file atomically (a new file renamed over it).
    fn write_token(&self, sandbox: &SandboxId, token: &SandboxToken) -> Result<(), DriverError> {
        let (uid, gid) = self.user_ids()?;
        let run = self.state(sandbox).join("run");
        if !run.is_dir() {
            return Err(DriverError::NotFound(sandbox.clone()));
        }
        write_replace(&run, token_file_name(), token.expose().as_bytes(), 0o400, Some((uid, gid)))
            .map_err(|e| failed_by("cannot write the credential file", e))
    }

    fn write_environment(
        &self,
        sandbox: &SandboxId,
        environment: &DriverEnvironment,
    ) -> Result<(), DriverError> {
        let json =
            serde_json::to_vec(environment).map_err(|e| failed_by("cannot encode the environment", e))?;
        write_replace(&self.state(sandbox), "env.json", &json, 0o600, None)
            .map_err(|e| failed_by("cannot write the environment", e))
    }

    fn environment(&self, sandbox: &SandboxId, labels: &SandboxLabels) -> DriverEnvironment {
        std::fs::read(self.state(sandbox).join("env.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_else(|| labels.environment.clone())
    }

    /// Waits for the supervisor of a just-started container to answer, then opens the
    /// egress proxy's socket in its network namespace (where the server does).
    async fn hello(&self, sandbox: &SandboxId) -> Result<(), DriverError> {
        self.answered(sandbox).await?;
        if proxy_in_namespace() {
            let proxy = self.open_proxy(sandbox).await?.map_err(|e| {
                failed_by("cannot open the egress proxy's socket in the sandbox's container", e)
            })?;
            self.proxies.park(proxy);
        }
        Ok(())
    }

    /// The host pid of the container's init (its supervisor) as the engine reports it, if
    /// it runs.
    async fn init_pid(&self, sandbox: &SandboxId) -> Result<Option<i32>, DriverError> {
        let docker = self.docker().await?;
        match docker.inspect_container(&self.name(sandbox), None::<InspectContainerOptions>).await {
            Ok(info) => Ok(info
                .state
                .filter(|s| s.running == Some(true))
                .and_then(|s| s.pid)
                .and_then(|pid| i32::try_from(pid).ok())
                .filter(|pid| *pid > 1)),
            Err(e) if is_status(&e, 404) => Ok(None),
            Err(e) => Err(self.engine("cannot inspect the sandbox's container", e)),
        }
    }

    /// Opens the egress proxy's socket in the container's network namespace (see
    /// [`crate::supervisor_link::listener`]): the engine names the init, a pidfd holds it,
    /// and the engine must still name the same process once it is held (so the pid was
    /// not reused in between). The outer error: the container does not run.
    async fn open_proxy(&self, sandbox: &SandboxId) -> Result<std::io::Result<ProxyListener>, DriverError> {
        let Some(pid) = self.init_pid(sandbox).await? else {
            return Err(DriverError::NotFound(sandbox.clone()));
        };
        let Ok(init) = listener::Init::open(pid) else { return Err(DriverError::NotFound(sandbox.clone())) };
        if self.init_pid(sandbox).await? != Some(pid) {
            return Err(DriverError::NotFound(sandbox.clone()));
        }
        Ok(listener::open_in_namespace(init, domain::egress::PROXY_PORT).await)
    }

    /// Waits for the supervisor of a just-started container to answer.
    async fn answered(&self, sandbox: &SandboxId) -> Result<(), DriverError> {
        let socket = self.control_socket(sandbox);
        let deadline = tokio::time::Instant::now() + self.config.probe_timeout;
        loop {
            match client::connect(&socket, CONNECT_TIMEOUT).await {
                Ok((_stream, hello)) if hello.protections.seccomp || !self.config.seccomp => return Ok(()),
                Ok(_) => {
                    return Err(DriverError::Unavailable(Cause::msg(
                        "the sandbox's supervisor runs without the seccomp filter, which is required",
                    )));
                }
                Err(ClientError::Gone(e)) if tokio::time::Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err(e) => return Err(failed_by("the sandbox's supervisor did not answer", e)),
            }
        }
    }

    /// A sandbox whose supervisor is gone: remove what is left and say it is gone.
    async fn gone(&self, sandbox: &SandboxId, why: &ClientError) -> DriverError {
        let lock = self.lock(sandbox);
        let _held = lock.lock().await;
        // A supervisor that went because its sandbox was suspended (a connection that
        // raced the suspension) is not a broken sandbox: nothing is removed.
        if let Err(e) = self.refuse_suspended(sandbox) {
            return e;
        }
        tracing::warn!(sandbox = %sandbox, error = %why, "the sandbox's supervisor is gone; removing what is left");
        if let Err(e) = self.remove(sandbox).await {
            tracing::warn!(sandbox = %sandbox, error = %e, "could not clean up a broken sandbox");
        }
        DriverError::NotFound(sandbox.clone())
    }

    /// Ends the sandbox (its supervisor first, then the container), removes the
    /// container, the ephemeral volume and the host state.
    async fn remove(&self, sandbox: &SandboxId) -> Result<(), DriverError> {
        let labels = match self.inspect(sandbox).await {
            Ok(found) => found.map(|(l, _)| l),
            // A foreign container under our name is not ours to judge: remove it anyway.
            Err(DriverError::Failed(_)) => None,
            Err(e) => return Err(e),
        };
        self.forget(sandbox);
        let _ = client::shutdown(&self.control_socket(sandbox), Duration::from_millis(500)).await;
        self.remove_container(sandbox).await?;
        // The workspace: from the labels, else (a suspended sandbox has no container) from
        // the kept owner, else an ephemeral one by the sandbox's name.
        let (volume, durability) = match (labels, self.owner(sandbox)) {
            (Some(l), _) => (l.volume.clone(), l.durability),
            (None, Some(o)) => (o.volume, o.durability),
            (None, None) => {
                (spec::ephemeral_volume_name(&self.config.name_prefix, sandbox), Durability::Ephemeral)
            }
        };
        let ephemeral = durability == Durability::Ephemeral;
        self.release_image(&volume, ephemeral).await?;
        if ephemeral {
            self.remove_volume(&volume).await?;
        }
        self.release_control(sandbox)?;
        match std::fs::remove_dir_all(self.state(sandbox)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(failed_by("cannot remove the sandbox's state", e)),
        }
    }

    async fn remove_container(&self, sandbox: &SandboxId) -> Result<(), DriverError> {
        let docker = self.docker().await?;
        let options = RemoveContainerOptions { force: true, v: false, ..Default::default() };
        for attempt in 0..50 {
            match docker.remove_container(&self.name(sandbox), Some(options.clone())).await {
                Ok(()) => return Ok(()),
                Err(e) if is_status(&e, 404) => return Ok(()),
                // Removal already in progress (a concurrent deprovision): wait for it.
                Err(e) if is_status(&e, 409) && attempt < 49 => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                // podman 4.3, when the container stops (its supervisor exited) while it is
                // being removed: "could not be stopped … container state improper".
                Err(e) if is_stopping_race(&e) && attempt < 49 => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => return Err(self.engine("cannot remove the sandbox's container", e)),
            }
        }
        Ok(())
    }

    async fn remove_volume(&self, volume: &str) -> Result<(), DriverError> {
        let docker = self.docker().await?;
        match docker.remove_volume(volume, Some(RemoveVolumeOptions { force: true })).await {
            Ok(()) => Ok(()),
            Err(e) if is_status(&e, 404) => Ok(()),
            Err(e) => Err(self.engine("cannot remove the workspace volume", e)),
        }
    }

    /// Removes what a failed first provision left.
    async fn undo(&self, spec: &ProvisionSpec, volume: &str, created_volume: bool) {
        let id = spec.sandbox_id();
        self.forget(id);
        if let Err(e) = self.remove_container(id).await {
            tracing::warn!(sandbox = %id, error = %e, "could not remove a failed sandbox's container");
        }
        match self.release_control(id) {
            Ok(()) => {
                let _ = std::fs::remove_dir_all(self.state(id));
            }
            Err(e) => {
                tracing::warn!(sandbox = %id, error = %e, "could not release a failed sandbox's control directory")
            }
        }
        let delete = spec.durability == Durability::Ephemeral || created_volume;
        if let Err(e) = self.release_image(volume, delete).await {
            tracing::warn!(sandbox = %id, error = %e, "could not release a failed sandbox's workspace image");
        }
        if (spec.durability == Durability::Ephemeral || created_volume)
            && let Err(e) = self.remove_volume(volume).await
        {
            tracing::warn!(sandbox = %id, error = %e, "could not remove a failed sandbox's volume");
        }
    }

    /// Starts a container this attempt created and waits for its supervisor.
    async fn finish(&self, spec: &ProvisionSpec) -> Result<(), DriverError> {
        let id = spec.sandbox_id();
        self.start(id).await?;
        self.hello(id).await
    }

    /// A provision of a sandbox whose container exists (a retry, a concurrent provision,
    /// a restart): with the same epoch and a live supervisor, the sandbox stays as it is,
    /// with the new credential; a newer epoch replaces the container (the workspace
    /// stays); an older one is fenced. Nothing is removed on failure: the container may be
    /// another attempt's.
    async fn reprovision(&self, spec: &ProvisionSpec, labels: &SandboxLabels) -> Result<bool, DriverError> {
        let id = spec.sandbox_id();
        if !labels.admits(&spec.key, spec.durability) {
            return Err(failed(format!(
                "sandbox {id} is already provisioned for {} ({})",
                labels.key, labels.durability
            )));
        }
        if labels.epoch > spec.epoch {
            return Err(failed(format!(
                "sandbox {id} was provisioned by a newer claim (epoch {} > {}): this attempt is fenced",
                labels.epoch, spec.epoch
            )));
        }
        if labels.epoch == spec.epoch {
            self.prepare_state(spec)?;
            // The same attempt again: the CA stays (made afresh only if it is missing).
            if !self.state(id).join(crate::egress::ca::CA_KEY_FILE).is_file() {
                self.new_ca(id)?;
            }
            if client::ping(&self.control_socket(id), CONNECT_TIMEOUT).await.is_ok() {
                return Ok(true);
            }
            // Created by a concurrent attempt that has not started it yet, or stopped.
            self.start(id).await?;
            self.hello(id).await?;
            return Ok(true);
        }
        // A newer claim: the older attempt's container goes; the volume stays.
        self.forget(id);
        let _ = client::shutdown(&self.control_socket(id), Duration::from_millis(500)).await;
        self.remove_container(id).await?;
        Ok(false)
    }

    async fn engine_version(&self, docker: &Docker) -> Result<String, EngineError> {
        let v = docker.version().await?;
        let engine = v
            .components
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.name.contains("Engine"))
            .map(|c| format!("{} {}", c.name, c.version))
            .or(v.version.map(|ver| format!("engine {ver}")))
            .unwrap_or_else(|| "engine (version unknown)".to_owned());
        Ok(format!("{engine}, API {}", docker.client_version()))
    }
}

/// The most bytes of the supervisor's own messages (its standard output and error) the
/// engine keeps for a container: the `json-file` log driver (podman: `k8s-file`), rotated
/// at [`LOG_BYTES`], so a supervisor that writes without end costs the engine's disk that
/// much, not whatever it writes. Commands' output never goes there. (The server never
/// reads it; `docker logs` shows it.)
pub const LOG_BYTES: u64 = 64 << 10;

/// The engine's log of a sandbox's container, held to [`LOG_BYTES`].
fn log_config() -> bollard::models::HostConfigLogConfig {
    bollard::models::HostConfigLogConfig {
        typ: Some("json-file".to_owned()),
        config: Some(HashMap::from([("max-size".to_owned(), LOG_BYTES.to_string())])),
    }
}

/// The directory of the token file inside (`/run/sandlane`).
fn token_dir() -> &'static str {
    TOKEN_FILE_PATH.rsplit_once('/').map_or("/", |(dir, _)| dir)
}

fn mkdir_mode(path: &std::path::Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(mode).create(path) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
        _ => set_mode(path, mode),
    }
}

fn set_mode(path: &std::path::Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// The state dir: created root-only when missing.
fn workspace_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

/// Writes `dir/name` by renaming a new file over it (a reader sees the old or the new
/// contents, never a mix), with `mode` and, when given, `owner`.
fn write_replace(
    dir: &std::path::Path,
    name: &str,
    bytes: &[u8],
    mode: u32,
    owner: Option<(u32, u32)>,
) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".{name}.new.{}.{n}", std::process::id()));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)?;
    file.write_all(bytes)?;
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::fchown(&file, Some(uid), Some(gid))?;
    }
    drop(file);
    std::fs::rename(&tmp, dir.join(name))
}

/// The token file's name inside its directory (`token`).
fn token_file_name() -> &'static str {
    TOKEN_FILE_PATH.rsplit_once('/').map_or(TOKEN_FILE_PATH, |(_, name)| name)
}

#[async_trait]
impl SandboxDriver for ContainerDriver {
    fn name(&self) -> &'static str {
        "container"
    }

    async fn provision(&self, spec: &ProvisionSpec) -> Result<(), DriverError> {
        let id = spec.sandbox_id();
        let lock = self.lock(id);
        let _held = lock.lock().await;
        self.files()?;
        // A suspended sandbox's kept state says whose workspace it is.
        self.claim_state(spec)?;
        if let Some((labels, _)) = self.inspect(id).await?
            && self.reprovision(spec, &labels).await?
        {
            return Ok(());
        }
        // Kept across a suspension: the workspace of the sandbox as it was provisioned
        // (a warm sandbox's, adopted under another key of its org).
        let volume = self
            .owner(id)
            .map(|o| o.volume)
            .unwrap_or_else(|| volume_name(&self.config.name_prefix, id, &spec.key, spec.durability));
        // A fork's workspace starts as its snapshot's image (a new workspace only).
        let quota = if self.owner(id).is_none() {
            match self.seed_fork(spec, &volume).await {
                Ok(quota) => quota,
                Err(e) => {
                    self.undo(spec, &volume, false).await;
                    return Err(e);
                }
            }
        } else {
            spec.workspace_bytes
        };
        let (source, created_volume) = match self.workspace_source(spec, quota, &volume).await {
            Ok(found) => found,
            Err(e) => {
                self.undo(spec, &volume, false).await;
                return Err(e);
            }
        };
        if spec.from_snapshot.is_some()
            && self.owner(id).is_none()
            && let Err(e) = self.give_to_owner(self.workspace_image(&volume).mountpoint).await
        {
            self.undo(spec, &volume, created_volume).await;
            return Err(e);
        }
        if let Err(e) = self
            .prepare_state(spec)
            .and_then(|()| self.new_ca(id))
            .and_then(|()| self.record_state(spec, &volume))
        {
            self.undo(spec, &volume, created_volume).await;
            return Err(e);
        }
        let created = match self.create_container(spec, &volume, &source).await {
            Ok(created) => created,
            Err(e) => {
                self.undo(spec, &volume, created_volume).await;
                return Err(e);
            }
        };
        if !created {
            // Another attempt created it between the inspect and the create.
            let Some((labels, _)) = self.inspect(id).await? else {
                return Err(failed("the sandbox's container vanished while it was being provisioned"));
            };
            return if self.reprovision(spec, &labels).await? {
                Ok(())
            } else {
                Err(failed("the sandbox's container was replaced while it was being provisioned"))
            };
        }
        if let Err(e) = self.finish(spec).await {
            self.undo(spec, &volume, created_volume).await;
            return Err(e);
        }
        tracing::debug!(sandbox = %id, durability = %spec.durability, "container sandbox ready");
        Ok(())
    }

    async fn refresh_credential(
        &self,
        sandbox: &SandboxId,
        credential: &SandboxToken,
        environment: &DriverEnvironment,
    ) -> Result<(), DriverError> {
        self.refuse_suspended(sandbox)?;
        self.labels(sandbox).await?;
        if let Err(e @ ClientError::Gone(_)) =
            client::ping(&self.control_socket(sandbox), CONNECT_TIMEOUT).await
        {
            return Err(self.gone(sandbox, &e).await);
        }
        self.write_token(sandbox, credential)?;
        self.write_environment(sandbox, environment)
    }

    async fn exec(&self, sandbox: &SandboxId, request: &ExecRequest) -> Result<ExecOutput, DriverError> {
        let spec =
            self.command(sandbox, request.argv(), request.timeout_ms(), !request.stdin().is_empty()).await?;
        match client::exec(&self.control_socket(sandbox), &spec, request.stdin(), CONNECT_TIMEOUT, EXEC_GRACE)
            .await
        {
            Ok(out) => Ok(out),
            Err(e @ ClientError::Gone(_)) => Err(self.gone(sandbox, &e).await),
            Err(ClientError::Refused { code, message }) if code == "spawn" => Ok(ExecOutput {
                exit_code: 127,
                stdout: Vec::new(),
                stderr: message.into_bytes(),
                timed_out: false,
                truncated: false,
            }),
            Err(e) => Err(failed_by(format!("cannot run the command in sandbox {sandbox}"), e)),
        }
    }

    async fn deprovision(&self, sandbox: &SandboxId) -> Result<(), DriverError> {
        let lock = self.lock(sandbox);
        let _held = lock.lock().await;
        self.remove(sandbox).await
    }

    async fn suspend(&self, sandbox: &SandboxId) -> Result<(), DriverError> {
        let lock = self.lock(sandbox);
        let _held = lock.lock().await;
        if !self.state(sandbox).is_dir() {
            return Err(DriverError::NotFound(sandbox.clone()));
        }
        // Recorded first: an exec from now on is refused, not taken for a dead sandbox.
        self.mark_suspended(sandbox)?;
        let labels = self.inspect(sandbox).await?.map(|(l, _)| l);
        self.forget(sandbox);
        // The supervisor's exit ends every process (it is the container's init); the
        // container goes, the workspace and the host state stay.
        let _ = client::shutdown(&self.control_socket(sandbox), Duration::from_millis(500)).await;
        self.remove_container(sandbox).await?;
        self.release_control(sandbox)?;
        let volume = labels.map(|l| l.volume.clone()).or_else(|| self.owner(sandbox).map(|o| o.volume));
        if let Some(volume) = volume {
            self.release_image(&volume, false).await?;
        }
        Ok(())
    }

    async fn workspace_usage(&self, sandbox: &SandboxId) -> Option<u64> {
        let volume = self.owner(sandbox)?.volume;
        self.image_usage(&volume)
    }

    async fn snapshot(
        &self,
        sandbox: &SandboxId,
        target: &ports::SnapshotRef,
        budget: ports::SnapshotBudget,
    ) -> Result<u64, DriverError> {
        let lock = self.lock(sandbox);
        let _held = lock.lock().await;
        self.snapshot_locked(sandbox, target, budget.quota_left).await
    }

    async fn delete_snapshot(&self, snapshot: &ports::SnapshotRef) -> Result<(), DriverError> {
        self.delete_snapshot_files(snapshot).await
    }

    async fn restore(&self, sandbox: &SandboxId, snapshot: &ports::SnapshotRef) -> Result<(), DriverError> {
        let lock = self.lock(sandbox);
        let _held = lock.lock().await;
        self.restore_locked(sandbox, snapshot).await
    }

    async fn list(&self) -> Result<Vec<SandboxId>, DriverError> {
        let docker = self.docker().await?;
        let filter = format!("{}={}", spec::LABEL_PREFIX, self.config.name_prefix);
        let options = ListContainersOptions {
            all: true,
            filters: Some(HashMap::from([("label".to_owned(), vec![filter])])),
            ..Default::default()
        };
        let containers = docker
            .list_containers(Some(options))
            .await
            .map_err(|e| self.engine("cannot list containers", e))?;
        let mut ids: Vec<SandboxId> = containers
            .into_iter()
            .filter_map(|c| c.labels?.get(spec::LABEL_SANDBOX).and_then(|s| SandboxId::parse(s).ok()))
            .chain(self.suspended())
            .collect();
        ids.sort();
        ids.dedup();
        Ok(ids)
    }

    async fn health(&self) -> DriverHealth {
        let docker = match self.docker().await {
            Ok(d) => d,
            Err(e) => return DriverHealth { usable: false, detail: e.to_string() },
        };
        if let Err(e) = docker.ping().await {
            return DriverHealth { usable: false, detail: self.unavailable(e).to_string() };
        }
        let version = self.engine_version(docker).await.unwrap_or_else(|e| format!("engine (version: {e})"));
        let files = match &self.files {
            Ok(f) => f,
            Err(e) => return DriverHealth { usable: false, detail: format!("{version}; {e}") },
        };
        if let Err(e) = docker.inspect_image(&self.config.image).await {
            return DriverHealth {
                usable: false,
                detail: format!("{version}; image {:?} is not available: {e}", self.config.image),
            };
        }
        DriverHealth {
            usable: true,
            detail: format!(
                "{version}; image {}; supervisor {} ({} files bound); limits: cgroups (memory, pids, \
                 cpu) + rlimits (nofile, fsize, cpu); network: none; protections: seccomp {}",
                self.config.image,
                self.config.supervisor.display(),
                files.count(),
                if self.config.seccomp && supervisor::seccomp::available() { "on" } else { "off" }
            ),
        }
    }

    async fn exec_stream(
        &self,
        sandbox: &SandboxId,
        request: &ExecRequest,
    ) -> Result<Box<dyn OutputStream>, DriverError> {
        ops::exec_stream(self, sandbox, request).await
    }

    async fn start_process(
        &self,
        sandbox: &SandboxId,
        request: &ProcessRequest,
        caps: &ProcessCaps,
    ) -> Result<ProcessInfo, DriverError> {
        ops::start_process(self, sandbox, request, caps).await
    }

    async fn list_processes(&self, sandbox: &SandboxId) -> Result<Vec<ProcessInfo>, DriverError> {
        ops::list_processes(self, sandbox).await
    }

    async fn process(&self, sandbox: &SandboxId, pid: u32) -> Result<ProcessInfo, DriverError> {
        ops::process(self, sandbox, pid).await
    }

    async fn process_output(
        &self,
        sandbox: &SandboxId,
        pid: u32,
        follow: bool,
    ) -> Result<Box<dyn OutputStream>, DriverError> {
        ops::process_output(self, sandbox, pid, follow).await
    }

    async fn write_stdin(
        &self,
        sandbox: &SandboxId,
        pid: u32,
        bytes: &[u8],
        close: bool,
    ) -> Result<(), DriverError> {
        ops::write_stdin(self, sandbox, pid, bytes, close).await
    }

    async fn signal_process(&self, sandbox: &SandboxId, pid: u32, signal: Signal) -> Result<(), DriverError> {
        ops::signal_process(self, sandbox, pid, signal).await
    }

    async fn process_input(
        &self,
        sandbox: &SandboxId,
        pid: u32,
    ) -> Result<Box<dyn ports::ProcessInput>, DriverError> {
        ops::process_input(self, sandbox, pid).await
    }

    async fn read_path(&self, sandbox: &SandboxId, path: &SandboxPath) -> Result<ReadOutcome, DriverError> {
        ops::read_path(self, sandbox, path).await
    }

    async fn write_file(
        &self,
        sandbox: &SandboxId,
        path: &SandboxPath,
        contents: Box<dyn ByteSource>,
    ) -> Result<u64, DriverError> {
        ops::write_file(self, sandbox, path, contents).await
    }

    async fn delete_path(
        &self,
        sandbox: &SandboxId,
        path: &SandboxPath,
        recursive: bool,
    ) -> Result<(), DriverError> {
        ops::delete_path(self, sandbox, path, recursive).await
    }

    async fn archive_out(
        &self,
        sandbox: &SandboxId,
        path: &SandboxPath,
    ) -> Result<Box<dyn ByteStream>, DriverError> {
        ops::archive_out(self, sandbox, path).await
    }

    async fn archive_in(
        &self,
        sandbox: &SandboxId,
        path: &SandboxPath,
        archive: Box<dyn ByteSource>,
    ) -> Result<Unpacked, DriverError> {
        ops::archive_in(self, sandbox, path, archive).await
    }

    async fn open_port(
        &self,
        sandbox: &SandboxId,
        port: u16,
    ) -> Result<Box<dyn ports::PortStream>, DriverError> {
        ops::open_port(self, sandbox, port).await
    }

    async fn serve_egress(
        &self,
        sandbox: &SandboxId,
        gate: std::sync::Arc<dyn ports::EgressGate>,
    ) -> Result<(), DriverError> {
        ops::serve_egress(self, sandbox, gate).await
    }
}

#[async_trait]
impl Host for ContainerDriver {
    type Target = std::path::PathBuf;

    async fn socket(&self, sandbox: &SandboxId) -> Result<std::path::PathBuf, DriverError> {
        // A suspended sandbox has no supervisor: refused, not taken for a dead one.
        self.refuse_suspended(sandbox)?;
        self.labels(sandbox).await?;
        Ok(self.control_socket(sandbox))
    }

    async fn command(
        &self,
        sandbox: &SandboxId,
        argv: &[String],
        timeout_ms: u64,
        stdin: bool,
    ) -> Result<ExecSpec, DriverError> {
        self.refuse_suspended(sandbox)?;
        let labels = self.labels(sandbox).await?;
        let environment = self.environment(sandbox, &labels);
        Ok(ExecSpec {
            argv: argv.to_vec(),
            env: environment.vars().into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
            cwd: WORKSPACE_PATH.to_owned(),
            timeout_ms,
            output_cap: self.config.output_cap_bytes as u64,
            stdin,
            rlimits: self.command_rlimits(),
        })
    }

    async fn supervisor_gone(&self, sandbox: &SandboxId, why: &ClientError) -> DriverError {
        self.gone(sandbox, why).await
    }

    async fn proxy_listener(&self, sandbox: &SandboxId) -> Result<Option<ProxyListener>, DriverError> {
        self.refuse_suspended(sandbox)?;
        self.labels(sandbox).await?;
        if !proxy_in_namespace() {
            return Ok(None);
        }
        let Some(pid) = self.init_pid(sandbox).await? else {
            return Err(DriverError::NotFound(sandbox.clone()));
        };
        if let Some(proxy) = self.proxies.take(pid) {
            return Ok(Some(proxy));
        }
        // Not opened by this server (a restart): opened again.
        match self.open_proxy(sandbox).await? {
            Ok(proxy) => Ok(Some(proxy)),
            // Created by an earlier version: its supervisor listens on the port itself.
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Ok(None),
            Err(e) => Err(failed_by(
                format!("cannot open the egress proxy's socket in sandbox {sandbox}'s container"),
                e,
            )),
        }
    }

    async fn broker_tls(&self, sandbox: &SandboxId) -> crate::egress::BrokerTls {
        let ca = crate::egress::ca::CaFile::new(sandbox, &self.state(sandbox));
        crate::egress::BrokerTls::new(Some(Arc::new(ca)), self.upstream_tls.clone())
    }

    fn connect_timeout(&self) -> Duration {
        CONNECT_TIMEOUT
    }

    fn grace(&self) -> Duration {
        EXEC_GRACE
    }
}
