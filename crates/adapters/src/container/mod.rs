//! The container driver: each sandbox is one long-lived container, driven through the
//! Docker Engine API (bollard, a unix socket, API version negotiated and capped at
//! v1.41), tested on podman 4.3's compatible service.
//!
//! # A sandbox
//! A container `<prefix>-<sandbox id>` of [`ContainerConfig::image`], running `sleep`
//! under the engine's init, as [`ContainerConfig::user`], with every capability dropped,
//! `no-new-privileges`, a read-only root, no network (`NetworkMode=none`), private tmpfs
//! `/tmp` and `/run/sandlane`, memory, pids and CPU limits (cgroups) and rlimits. Its
//! workspace is a named volume at `/workspace`: for a durable workspace the name is
//! derived from the key, so it survives deprovision and comes back for the same key; an
//! ephemeral one is named after the sandbox and removed at deprovision.
//!
//! # The token
//! Uploaded with the archive endpoint (`PUT /containers/{id}/archive`) as a root-owned
//! 0444 file into the `/run/sandlane` tmpfs (root-owned 0755), so the sandbox user can
//! read but not change it; rewritten the same way on refresh. It is never in the
//! container's environment, arguments or labels, and never on disk.
//!
//! # Commands
//! Each command is an exec attached to its output stream: the stream ends when the
//! command exits, then one inspect gives the exit code. No endpoint is polled (the
//! Docker `/wait` endpoint polls at about 250 ms on podman, and a detached podman 4.3
//! exec never reports its end on inspect). The command runs under
//! `sh -c 'echo $$ >&2; exec "$@"' env -i VARS…`, so it sees exactly the sandbox
//! environment and its pid is known; at timeout its process tree is killed from inside.
//!
//! # State
//! Everything is in the engine: labels on the container (sandbox id, key, durability,
//! volume, environment) and the volume, so exec and deprovision work after a restart and
//! [`SandboxDriver::list`] lists containers by label.

mod config;
mod exec;
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
    RemoveVolumeOptions, UploadToContainerOptions,
};
use bollard::{ClientVersion, Docker};
use domain::split::{TOKEN_FILE_PATH, WORKSPACE_PATH};
use domain::{Durability, ExecOutput, ExecRequest, SandboxId, SandboxToken};
use ports::driver::{DriverError, DriverHealth, ProvisionSpec, SandboxDriver};
use tokio::sync::OnceCell;

pub use config::{ContainerConfig, ContainerLimits, DEFAULT_DOCKER_HOST};

use spec::{SandboxLabels, container_name, volume_name};

/// The newest Engine API version the driver speaks; an older engine's is negotiated.
pub const MAX_API_VERSION: ClientVersion = ClientVersion { major_version: 1, minor_version: 41 };

/// The container driver. Build it once with [`ContainerDriver::new`] and share it.
pub struct ContainerDriver {
    config: ContainerConfig,
    socket: String,
    client: OnceCell<Docker>,
    /// Labels of sandboxes seen, so an exec needs no inspect.
    known: Mutex<HashMap<SandboxId, Arc<SandboxLabels>>>,
}

impl std::fmt::Debug for ContainerDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContainerDriver").field("config", &self.config).finish_non_exhaustive()
    }
}

fn failed(message: impl Into<String>) -> DriverError {
    DriverError::Failed(message.into())
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

/// An exec refused because the container is not running (Docker: 409 "is not running";
/// podman 4.3: 500 "… container state improper").
fn is_not_running(e: &EngineError) -> bool {
    match e {
        EngineError::DockerResponseServerError { message, .. } => {
            message.contains("is not running") || message.contains("state improper")
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
            return Err(DriverError::Unavailable(format!(
                "docker host {host:?} is not supported: the container driver speaks to a unix \
                 socket (unix:///path/to/docker.sock)"
            )));
        };
        if config.image.trim().is_empty() {
            return Err(DriverError::Unavailable(
                "no container image: set SANDLANE_CONTAINER_IMAGE".to_owned(),
            ));
        }
        Ok(Self { config, socket, client: OnceCell::new(), known: Mutex::new(HashMap::new()) })
    }

    /// The configuration.
    pub fn config(&self) -> &ContainerConfig {
        &self.config
    }

    fn unavailable(&self, e: &EngineError) -> DriverError {
        DriverError::Unavailable(format!(
            "cannot reach the container engine at unix://{}: {e} (start it, or set \
             SANDLANE_DOCKER_HOST)",
            self.socket
        ))
    }

    /// Translates an engine error: no answer means the engine is unavailable.
    fn engine(&self, what: &str, e: &EngineError) -> DriverError {
        if status(e).is_some() { failed(format!("{what}: {e}")) } else { self.unavailable(e) }
    }

    /// The client, its API version negotiated once (at most [`MAX_API_VERSION`]).
    async fn docker(&self) -> Result<&Docker, DriverError> {
        self.client
            .get_or_try_init(|| async {
                let client =
                    Docker::connect_with_unix(&self.socket, self.config.api_timeout_secs, &MAX_API_VERSION)
                        .map_err(|e| self.unavailable(&e))?;
                client.negotiate_version().await.map_err(|e| self.unavailable(&e))
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
            Err(e) => return Err(self.engine("cannot inspect the sandbox's container", &e)),
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

    fn host_config(&self, volume: &str) -> HostConfig {
        let l = &self.config.limits;
        let signed = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let ulimit = |name: &str, v: u64| ResourcesUlimits {
            name: Some(name.to_owned()),
            soft: Some(signed(v)),
            hard: Some(signed(v)),
        };
        HostConfig {
            binds: Some(vec![format!("{volume}:{WORKSPACE_PATH}:rw")]),
            tmpfs: Some(HashMap::from([
                ("/tmp".to_owned(), format!("rw,nosuid,nodev,size={}", self.config.tmp_size_bytes)),
                (token_dir().to_owned(), "rw,nosuid,nodev,noexec,size=65536,mode=0755".to_owned()),
            ])),
            network_mode: Some("none".to_owned()),
            readonly_rootfs: Some(true),
            cap_drop: Some(vec!["ALL".to_owned()]),
            security_opt: Some(vec!["no-new-privileges".to_owned()]),
            init: Some(true),
            memory: Some(signed(l.memory_bytes)),
            memory_swap: Some(signed(l.memory_bytes)),
            pids_limit: Some(signed(l.processes)),
            nano_cpus: Some(signed(l.cpu_millis.saturating_mul(1_000_000))),
            ulimits: Some(vec![
                ulimit("nofile", l.open_files),
                ulimit("fsize", l.file_size_bytes),
                ulimit("cpu", l.cpu_secs),
                ulimit("nproc", l.user_processes),
                ulimit("core", 0),
            ]),
            ..Default::default()
        }
    }

    /// Creates the volume when missing; says whether it created it.
    async fn ensure_volume(&self, spec: &ProvisionSpec, volume: &str) -> Result<bool, DriverError> {
        let docker = self.docker().await?;
        match docker.inspect_volume(volume).await {
            Ok(_) => return Ok(false),
            Err(e) if is_status(&e, 404) => {}
            Err(e) => return Err(self.engine("cannot inspect the workspace volume", &e)),
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
            Err(e) => Err(self.engine("cannot create the workspace volume", &e)),
        }
    }

    /// Creates the sandbox's container; `false` when it already existed.
    async fn create_container(&self, spec: &ProvisionSpec, volume: &str) -> Result<bool, DriverError> {
        let docker = self.docker().await?;
        let prefix = &self.config.name_prefix;
        let labels = spec::labels(prefix, &spec.environment, &spec.key, spec.durability, volume)
            .map_err(|e| failed(format!("cannot encode the sandbox labels: {e}")))?;
        let body = ContainerCreateBody {
            image: Some(self.config.image.clone()),
            entrypoint: Some(vec!["sleep".to_owned()]),
            cmd: Some(vec!["2147483647".to_owned()]),
            env: Some(spec.environment.vars().iter().map(|(k, v)| format!("{k}={v}")).collect()),
            // The init and its `sleep` run as root (without capabilities), so the sandbox
            // user cannot end them; commands run as the configured user.
            user: Some("0:0".to_owned()),
            working_dir: Some(WORKSPACE_PATH.to_owned()),
            network_disabled: Some(true),
            labels: Some(labels),
            host_config: Some(self.host_config(volume)),
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
            Err(e) => Err(self.engine("cannot create the sandbox's container", &e)),
        }
    }

    async fn start(&self, sandbox: &SandboxId) -> Result<(), DriverError> {
        let docker = self.docker().await?;
        match docker.start_container(&self.name(sandbox), None).await {
            Ok(()) => Ok(()),
            Err(e) if is_status(&e, 304) => Ok(()),
            Err(e) => Err(self.engine("cannot start the sandbox's container", &e)),
        }
    }

    async fn write_token(&self, sandbox: &SandboxId, token: &SandboxToken) -> Result<(), DriverError> {
        let docker = self.docker().await?;
        let mtime = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default();
        let tar = spec::single_file_tar(token_file_name(), token.expose().as_bytes(), 0o444, mtime);
        let options = UploadToContainerOptions { path: token_dir().to_owned(), ..Default::default() };
        match docker
            .upload_to_container(&self.name(sandbox), Some(options), bollard::body_full(tar.into()))
            .await
        {
            Ok(()) => Ok(()),
            Err(e) if is_status(&e, 404) => Err(DriverError::NotFound(sandbox.clone())),
            // Docker (unlike podman) refuses an upload under a read-only root and does not
            // reach into a tmpfs: write the file from inside instead.
            Err(e) if status(&e).is_some() => {
                tracing::debug!(sandbox = %sandbox, error = %e, "archive upload refused; writing the token by exec");
                self.write_token_by_exec(sandbox, token).await
            }
            Err(e) => Err(self.unavailable(&e)),
        }
    }

    /// Writes the token file with a root command inside that reads it from its standard
    /// input (never from its arguments or environment) and renames it into place, 0444.
    async fn write_token_by_exec(
        &self,
        sandbox: &SandboxId,
        token: &SandboxToken,
    ) -> Result<(), DriverError> {
        let docker = self.docker().await?;
        let container = self.name(sandbox);
        let dir = token_dir();
        let script = format!(
            "echo \"$$\" >&2; umask 0222 && cat > {dir}/.token.new && mv -f {dir}/.token.new {TOKEN_FILE_PATH}"
        );
        let launch = exec::Launch {
            container: &container,
            cmd: vec!["/bin/sh".to_owned(), "-c".to_owned(), script],
            user: "0:0",
            stdin: token.expose().as_bytes(),
            timeout: self.config.probe_timeout,
            output_cap: 4096,
        };
        match exec::run(docker, launch).await {
            Ok(out) if out.exit_code == 0 && !out.timed_out => Ok(()),
            Ok(out) => Err(failed(format!(
                "cannot write the credential file (exit {}): {}",
                out.exit_code,
                String::from_utf8_lossy(&out.stderr).trim()
            ))),
            Err(e) if is_status(&e, 404) => Err(DriverError::NotFound(sandbox.clone())),
            Err(e) => Err(self.engine("cannot write the credential file", &e)),
        }
    }

    async fn run(
        &self,
        sandbox: &SandboxId,
        labels: &SandboxLabels,
        argv: &[String],
        stdin: &[u8],
        timeout: Duration,
    ) -> Result<ExecOutput, DriverError> {
        let docker = self.docker().await?;
        let container = self.name(sandbox);
        let launch = || exec::Launch {
            container: &container,
            cmd: spec::wrapped_command(&labels.environment, argv),
            user: &self.config.user,
            stdin,
            timeout,
            output_cap: self.config.output_cap_bytes,
        };
        let mut result = exec::run(docker, launch()).await;
        if let Err(e) = &result
            && is_not_running(e)
        {
            // The engine restarted and left the container stopped: start it and retry once.
            // Its tmpfs is new, so the credential file is back only at the next refresh.
            tracing::warn!(sandbox = %sandbox, "the sandbox's container was stopped; starting it");
            self.start(sandbox).await?;
            result = exec::run(docker, launch()).await;
        }
        match result {
            Ok(out) => Ok(out),
            Err(e) if is_status(&e, 404) => {
                self.forget(sandbox);
                Err(DriverError::NotFound(sandbox.clone()))
            }
            Err(e) => Err(self.engine("cannot run the command in the sandbox's container", &e)),
        }
    }

    async fn probe(&self, sandbox: &SandboxId, labels: &SandboxLabels) -> Result<(), DriverError> {
        let out = self.run(sandbox, labels, &["true".to_owned()], &[], self.config.probe_timeout).await?;
        if out.exit_code == 0 && !out.timed_out {
            return Ok(());
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        let why = if out.timed_out { "timed out".to_owned() } else { format!("exit {}", out.exit_code) };
        Err(failed(format!("sandbox readiness probe failed ({why}): {}", stderr.trim())))
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
                Err(e) => return Err(self.engine("cannot remove the sandbox's container", &e)),
            }
        }
        Ok(())
    }

    async fn remove_volume(&self, volume: &str) -> Result<(), DriverError> {
        let docker = self.docker().await?;
        match docker.remove_volume(volume, Some(RemoveVolumeOptions { force: true })).await {
            Ok(()) => Ok(()),
            Err(e) if is_status(&e, 404) => Ok(()),
            Err(e) => Err(self.engine("cannot remove the workspace volume", &e)),
        }
    }

    /// Removes what a failed first provision left.
    async fn undo(&self, spec: &ProvisionSpec, volume: &str, created_volume: bool) {
        let id = spec.sandbox_id();
        self.forget(id);
        if let Err(e) = self.remove_container(id).await {
            tracing::warn!(sandbox = %id, error = %e, "could not remove a failed sandbox's container");
        }
        if (spec.durability == Durability::Ephemeral || created_volume)
            && let Err(e) = self.remove_volume(volume).await
        {
            tracing::warn!(sandbox = %id, error = %e, "could not remove a failed sandbox's volume");
        }
    }

    /// Starts (if needed), writes the token and probes a container this attempt created.
    async fn finish(&self, spec: &ProvisionSpec) -> Result<(), DriverError> {
        let id = spec.sandbox_id();
        let Some((labels, _)) = self.inspect(id).await? else {
            return Err(failed("the sandbox's container vanished right after its creation"));
        };
        self.start(id).await?;
        self.token_and_probe(spec, &labels).await
    }

    /// Writes the credential file and runs the readiness probe side by side (the probe
    /// does not read the file); both must succeed.
    async fn token_and_probe(&self, spec: &ProvisionSpec, labels: &SandboxLabels) -> Result<(), DriverError> {
        let id = spec.sandbox_id();
        let (written, probed) = tokio::join!(self.write_token(id, &spec.credential), self.probe(id, labels));
        written.and(probed)
    }

    /// A provision of a sandbox whose container exists (a retry, a concurrent provision,
    /// a restart): the live sandbox stays as it is, with the new credential. Nothing is
    /// removed on failure: the container may be another attempt's.
    async fn reprovision(
        &self,
        spec: &ProvisionSpec,
        labels: &SandboxLabels,
        running: bool,
    ) -> Result<(), DriverError> {
        let id = spec.sandbox_id();
        if !labels.is_for(&spec.key, spec.durability) {
            return Err(failed(format!(
                "sandbox {id} is already provisioned for {} ({})",
                labels.key, labels.durability
            )));
        }
        if !running {
            self.start(id).await?;
        }
        self.token_and_probe(spec, labels).await
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

/// The directory of the token file inside (`/run/sandlane`).
fn token_dir() -> &'static str {
    TOKEN_FILE_PATH.rsplit_once('/').map_or("/", |(dir, _)| dir)
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
        if let Some((labels, running)) = self.inspect(id).await? {
            return self.reprovision(spec, &labels, running).await;
        }
        let volume = volume_name(&self.config.name_prefix, id, &spec.key, spec.durability);
        let created_volume = self.ensure_volume(spec, &volume).await?;
        let created = match self.create_container(spec, &volume).await {
            Ok(created) => created,
            Err(e) => {
                self.undo(spec, &volume, created_volume).await;
                return Err(e);
            }
        };
        if !created {
            // Another attempt created it between the inspect and the create.
            let Some((labels, running)) = self.inspect(id).await? else {
                return Err(failed("the sandbox's container vanished while it was being provisioned"));
            };
            return self.reprovision(spec, &labels, running).await;
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
        _environment: &domain::DriverEnvironment,
    ) -> Result<(), DriverError> {
        self.write_token(sandbox, credential).await
    }

    async fn exec(&self, sandbox: &SandboxId, request: &ExecRequest) -> Result<ExecOutput, DriverError> {
        let labels = self.labels(sandbox).await?;
        let timeout = Duration::from_millis(request.timeout_ms());
        self.run(sandbox, &labels, request.argv(), request.stdin(), timeout).await
    }

    async fn deprovision(&self, sandbox: &SandboxId) -> Result<(), DriverError> {
        let labels = match self.inspect(sandbox).await {
            Ok(found) => found.map(|(l, _)| l),
            // A foreign container under our name is not ours to judge: remove it anyway.
            Err(DriverError::Failed(_)) => None,
            Err(e) => return Err(e),
        };
        self.forget(sandbox);
        self.remove_container(sandbox).await?;
        match labels {
            Some(l) if l.durability == Durability::Ephemeral => self.remove_volume(&l.volume).await,
            Some(_) => Ok(()),
            None => self.remove_volume(&spec::ephemeral_volume_name(&self.config.name_prefix, sandbox)).await,
        }
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
            .map_err(|e| self.engine("cannot list containers", &e))?;
        let mut ids: Vec<SandboxId> = containers
            .into_iter()
            .filter_map(|c| c.labels?.get(spec::LABEL_SANDBOX).and_then(|s| SandboxId::parse(s).ok()))
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
            return DriverHealth { usable: false, detail: self.unavailable(&e).to_string() };
        }
        let version = self.engine_version(docker).await.unwrap_or_else(|e| format!("engine (version: {e})"));
        if let Err(e) = docker.inspect_image(&self.config.image).await {
            return DriverHealth {
                usable: false,
                detail: format!("{version}; image {:?} is not available: {e}", self.config.image),
            };
        }
        DriverHealth {
            usable: true,
            detail: format!(
                "{version}; image {}; limits: cgroups (memory, pids, cpu) + rlimits (nofile, fsize, \
                 cpu); network: none",
                self.config.image
            ),
        }
    }
}
