//! The Kubernetes driver (`SANDLANE_DRIVER=kubernetes`): each sandbox is one pod in one
//! configured namespace, running the same supervisor as the other drivers as its process,
//! placed by the cluster's scheduler. Several sandlane replicas sharing one database
//! share the cluster too: every fact the driver needs lives in the API server.
//!
//! # Objects
//! All named from the sandbox id ([`objects::object_name`]: `<prefix>-<id body in
//! lowercase>`, which maps back exactly) and labelled with it:
//! - a **Pod** running `sandlane-supervisor --tcp 127.0.0.1:<port>` from the configured
//!   image, with no service-account token, no service links, a non-root uid of the
//!   workspace's own, a read-only root, no privilege escalation, every capability
//!   dropped, the `RuntimeDefault` seccomp profile, CPU, memory and ephemeral-storage
//!   limits, an in-memory `/tmp`, `restartPolicy: Never`, and the configured runtime
//!   class, node selector and tolerations;
//! - a **Secret** holding the token, mounted read-only as the directory `/run/sandlane`
//!   (no `subPath`, so a refresh, a patch of the Secret, reaches running commands), and
//!   the channel key, which only the supervisor's process gets (an environment variable
//!   from the Secret; commands never inherit it);
//! - the workspace: for a durable one a **PersistentVolumeClaim** `<prefix>-ws-<hash of
//!   the key>` with no owner, so it outlives deprovision and comes back for the same key;
//!   for an ephemeral one a generic ephemeral volume, whose claim Kubernetes creates owned
//!   by the pod and deletes with it;
//! - a deny-all **NetworkPolicy** selecting the sandbox (no ingress, no egress), created
//!   before the pod.
//!
//! The key, the durability, the workspace, the uid, the fencing epoch and the environment
//! of the latest ensure are labels and annotations, so a restarted server (or another
//! replica) finds everything again and [`SandboxDriver::list`] is one labelled list.
//!
//! # Creating and waiting
//! Every create that answers 409 Conflict reads the object back and goes on only if its
//! labels name this sandbox (or this workspace, for a claim). Readiness and deletion are
//! awaited with watches ([`kube::runtime::wait::await_condition`]), never by polling the
//! API; a watch that fails is opened again (the condition is checked on a fresh list),
//! and the watcher itself resumes a watch the server closed. A pod that cannot pull its
//! image, crash-loops or ends fails the provision at once with the reason in the message.
//!
//! # The channel
//! One port-forward per operation ([`PodChannel`]), carrying the supervisor's protocol
//! unchanged behind the sandbox's channel key.
//!
//! # Fencing
//! The pod's epoch label is the provision's claim epoch: an older provision is refused;
//! a newer one deletes the pod (the workspace stays) and creates it again.

mod channel;
mod config;
pub mod objects;
mod snapshot;

#[cfg(any(test, feature = "testing"))]
pub mod fake;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use domain::split::WORKSPACE_PATH;
use domain::{
    DriverEnvironment, Durability, ExecOutput, ExecRequest, ProcessCaps, ProcessInfo, ProcessRequest,
    SandboxId, SandboxPath, SandboxToken, Signal,
};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::{Condition, await_condition, conditions};
use kube::{Api, Client, Resource};
use ports::Cause;
use ports::driver::{
    ByteSource, ByteStream, DriverError, DriverHealth, OutputStream, ProvisionSpec, ReadOutcome,
    SandboxDriver, Unpacked,
};
use tokio::sync::OnceCell;

pub use channel::PodChannel;
pub use config::{KubeConfig, KubeConnection, KubeLimits, KubeSettings, PodIds};
/// A pod toleration (for [`KubeConfig::tolerations`]).
pub use k8s_openapi::api::core::v1::Toleration;

use crate::supervisor_link::client::{self, ClientError};
use crate::supervisor_link::ops::{self, Host};
use objects::{PodFacts, SandboxPlan};
use supervisor::gate::ChannelKey;
use supervisor::protocol::{ExecSpec, Rlimit};

/// How long a connection to a live supervisor may take to say hello.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long past a command's timeout the server waits for its supervisor's answer.
const EXEC_GRACE: Duration = Duration::from_secs(10);
/// How many times a failed watch is opened again within one wait.
const WATCH_RETRIES: u32 = 5;
/// Container waiting reasons that will not resolve by waiting.
const FATAL_WAITING: &[&str] = &[
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CrashLoopBackOff",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
];

/// What the driver remembers of a live sandbox (read back from the API after a restart).
#[derive(Debug, Clone)]
struct Known {
    facts: PodFacts,
    key: ChannelKey,
}

/// The Kubernetes driver. Build it once with [`KubeDriver::new`] and share it.
pub struct KubeDriver {
    config: KubeConfig,
    client: OnceCell<Client>,
    known: Mutex<HashMap<SandboxId, Arc<Known>>>,
    /// One provision or removal at a time per sandbox in this process.
    locks: Mutex<HashMap<SandboxId, Arc<tokio::sync::Mutex<()>>>>,
    /// How brokered upstreams are verified.
    upstream_tls: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for KubeDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeDriver").field("config", &self.config).finish_non_exhaustive()
    }
}

fn failed(message: impl Into<String>) -> DriverError {
    DriverError::Failed(Cause::msg(message))
}

/// A step that failed with `error`: `what: error`, the error kept whole as the source.
fn failed_by(what: impl Into<String>, error: impl std::error::Error + Send + Sync + 'static) -> DriverError {
    DriverError::Failed(Cause::context(what, error))
}

fn status_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

/// Where a starting pod stands.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Start {
    /// Its container runs.
    Running,
    /// Still on its way (the reason, if the cluster gave one).
    Pending(Option<String>),
    /// It will not run: the reason.
    Failed(String),
}

fn start_state(pod: &Pod) -> Start {
    let Some(status) = &pod.status else { return Start::Pending(None) };
    let phase = status.phase.as_deref().unwrap_or("Pending");
    let container =
        status.container_statuses.as_ref().and_then(|all| all.iter().find(|c| c.name == objects::CONTAINER));
    let state = container.and_then(|c| c.state.as_ref());
    if let Some(t) = state.and_then(|s| s.terminated.as_ref()) {
        return Start::Failed(format!(
            "its container ended (exit code {}{}{})",
            t.exit_code,
            t.reason.as_deref().map(|r| format!(", {r}")).unwrap_or_default(),
            t.message.as_deref().map(|m| format!(": {}", m.trim())).unwrap_or_default()
        ));
    }
    if matches!(phase, "Failed" | "Succeeded") {
        return Start::Failed(format!(
            "the pod is {phase}{}{}",
            status.reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default(),
            status.message.as_deref().map(|m| format!(": {m}")).unwrap_or_default()
        ));
    }
    if let Some(w) = state.and_then(|s| s.waiting.as_ref()) {
        let reason = w.reason.clone().unwrap_or_default();
        let text = format!("{reason}{}", w.message.as_deref().map(|m| format!(": {m}")).unwrap_or_default());
        if FATAL_WAITING.contains(&reason.as_str()) {
            return Start::Failed(text);
        }
        return Start::Pending(Some(text));
    }
    if state.is_some_and(|s| s.running.is_some()) {
        return Start::Running;
    }
    let unscheduled = status.conditions.as_ref().and_then(|c| {
        c.iter().find(|c| c.type_ == "PodScheduled" && c.status == "False").map(|c| {
            format!(
                "not scheduled: {}{}",
                c.reason.as_deref().unwrap_or("unknown"),
                c.message.as_deref().map(|m| format!(" ({m})")).unwrap_or_default()
            )
        })
    });
    Start::Pending(unscheduled)
}

/// Settled: running, failed, or gone (a pending pod keeps the wait going).
fn settled() -> impl Condition<Pod> {
    |pod: Option<&Pod>| pod.is_none_or(|p| !matches!(start_state(p), Start::Pending(_)))
}

impl KubeDriver {
    /// A driver over `config`. Connects lazily: an API server that is down is not an
    /// error here; [`SandboxDriver::health`] reports it and calls fail with
    /// [`DriverError::Unavailable`].
    ///
    /// # Errors
    /// [`DriverError::Unavailable`] when a setting is invalid.
    pub fn new(config: KubeConfig) -> Result<Self, DriverError> {
        config.validate().map_err(|why| DriverError::Unavailable(Cause::msg(why)))?;
        let upstream_tls = crate::egress::upstream_tls(config.upstream_ca_file.as_deref())
            .map_err(|e| DriverError::Unavailable(Cause::context("egress.upstream_ca_file", e)))?;
        Ok(Self {
            config,
            client: OnceCell::new(),
            known: Mutex::new(HashMap::new()),
            locks: Mutex::new(HashMap::new()),
            upstream_tls,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &KubeConfig {
        &self.config
    }

    async fn client(&self) -> Result<&Client, DriverError> {
        self.client
            .get_or_try_init(|| async {
                let config = kube_config(&self.config)
                    .await
                    .map_err(|why| DriverError::Unavailable(Cause::msg(why)))?;
                Client::try_from(config).map_err(|e| {
                    DriverError::Unavailable(Cause::context("cannot build the Kubernetes client", e))
                })
            })
            .await
    }

    async fn api<K>(&self) -> Result<Api<K>, DriverError>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as Resource>::DynamicType: Default,
    {
        Ok(Api::namespaced(self.client().await?.clone(), &self.config.namespace))
    }

    /// Translates an API error: no answer means the API server is unavailable.
    fn api_error(&self, what: &str, e: kube::Error) -> DriverError {
        match e {
            // The API server's answer, in its words (its own fields are the whole story).
            kube::Error::Api(status) => failed(format!(
                "{what}: the API server answered {} {}: {}",
                status.code, status.reason, status.message
            )),
            other => DriverError::Unavailable(Cause::context(
                format!("{what}: cannot reach the Kubernetes API server"),
                other,
            )),
        }
    }

    fn name(&self, sandbox: &SandboxId) -> String {
        objects::object_name(&self.config.name_prefix, sandbox)
    }

    fn lock(&self, sandbox: &SandboxId) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        locks.retain(|_, l| Arc::strong_count(l) > 1);
        locks.entry(sandbox.clone()).or_default().clone()
    }

    fn remember(&self, sandbox: &SandboxId, known: Known) -> Arc<Known> {
        let known = Arc::new(known);
        if let Ok(mut all) = self.known.lock() {
            all.insert(sandbox.clone(), known.clone());
        }
        known
    }

    fn forget(&self, sandbox: &SandboxId) {
        if let Ok(mut all) = self.known.lock() {
            all.remove(sandbox);
        }
    }

    /// What the driver knows of a sandbox: from memory, else from its pod and secret.
    async fn known(&self, sandbox: &SandboxId) -> Result<Arc<Known>, DriverError> {
        if let Some(k) = self.known.lock().ok().and_then(|all| all.get(sandbox).cloned()) {
            return Ok(k);
        }
        let name = self.name(sandbox);
        let pods: Api<Pod> = self.api().await?;
        let pod =
            pods.get_opt(&name).await.map_err(|e| self.api_error("cannot read the sandbox's pod", e))?;
        let Some(pod) = pod else { return Err(DriverError::NotFound(sandbox.clone())) };
        if objects::labelled_sandbox(&pod.metadata) != Some(sandbox.as_str()) {
            return Err(failed(format!("pod {name} exists but is not sandbox {sandbox}")));
        }
        let facts = PodFacts::parse(&pod.metadata)
            .ok_or_else(|| failed(format!("pod {name} is missing the sandbox's labels")))?;
        let key = self.channel_key(sandbox).await?.ok_or(DriverError::NotFound(sandbox.clone()))?;
        Ok(self.remember(sandbox, Known { facts, key }))
    }

    /// The channel key in the sandbox's Secret; `None` when there is no Secret.
    async fn channel_key(&self, sandbox: &SandboxId) -> Result<Option<ChannelKey>, DriverError> {
        let secrets: Api<Secret> = self.api().await?;
        let name = self.name(sandbox);
        let Some(secret) = secrets
            .get_opt(&name)
            .await
            .map_err(|e| self.api_error("cannot read the sandbox's secret", e))?
        else {
            return Ok(None);
        };
        if objects::labelled_sandbox(&secret.metadata) != Some(sandbox.as_str()) {
            return Err(failed(format!("secret {name} exists but is not sandbox {sandbox}'s")));
        }
        let text = secret
            .data
            .as_ref()
            .and_then(|d| d.get(objects::SECRET_CHANNEL))
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
            .ok_or_else(|| failed(format!("secret {name} holds no channel key")))?;
        ChannelKey::parse(&text).map(Some).map_err(|e| failed_by(format!("secret {name}"), e))
    }

    async fn channel(&self, sandbox: &SandboxId, key: &ChannelKey) -> Result<PodChannel, DriverError> {
        Ok(PodChannel {
            pods: self.api().await?,
            name: self.name(sandbox),
            port: self.config.supervisor_port,
            key: key.clone(),
        })
    }

    /// Waits (with watches) until the pod runs, fails or is gone.
    async fn await_start(&self, name: &str, deadline: Instant) -> Result<(), DriverError> {
        let pods: Api<Pod> = self.api().await?;
        let mut attempts = 0;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, await_condition(pods.clone(), name, settled())).await {
                Ok(Ok(Some(pod))) => {
                    return match start_state(&pod) {
                        Start::Running => Ok(()),
                        Start::Failed(why) => Err(failed(format!("pod {name} did not start: {why}"))),
                        Start::Pending(_) => Err(failed(format!("pod {name} did not start"))),
                    };
                }
                Ok(Ok(None)) => return Err(failed(format!("pod {name} was deleted while it was starting"))),
                Ok(Err(e)) if attempts < WATCH_RETRIES => {
                    attempts += 1;
                    tracing::debug!(pod = name, error = %e, attempts, "the watch on a starting pod failed; watching again");
                    tokio::time::sleep(Duration::from_millis(50 * u64::from(attempts))).await;
                }
                Ok(Err(e)) => return Err(failed_by(format!("cannot watch pod {name}"), e)),
                Err(_) => {
                    let why = match pods.get_opt(name).await {
                        Ok(Some(pod)) => match start_state(&pod) {
                            Start::Pending(Some(why)) => format!(": {why}"),
                            _ => String::new(),
                        },
                        _ => String::new(),
                    };
                    return Err(failed(format!(
                        "pod {name} did not start within {} s{why}",
                        self.config.start_timeout.as_secs()
                    )));
                }
            }
        }
    }

    /// Deletes a pod (if there) and waits (with a watch) until it is gone: its processes
    /// have ended by then (the kubelet confirms termination before the API forgets it).
    async fn delete_pod(&self, name: &str) -> Result<(), DriverError> {
        let pods: Api<Pod> = self.api().await?;
        let uid = match pods.delete(name, &DeleteParams::background()).await {
            Ok(either) => either.left().and_then(|pod| pod.metadata.uid),
            Err(e) if status_code(&e) == Some(404) => return Ok(()),
            Err(e) => return Err(self.api_error("cannot delete the sandbox's pod", e)),
        };
        let Some(uid) = uid else { return Ok(()) };
        let deadline = Instant::now() + self.config.delete_timeout;
        let mut attempts = 0;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(
                left,
                await_condition(pods.clone(), name, conditions::is_deleted(&uid)),
            )
            .await
            {
                Ok(Ok(_)) => return Ok(()),
                Ok(Err(e)) if attempts < WATCH_RETRIES => {
                    attempts += 1;
                    tracing::debug!(pod = name, error = %e, attempts, "the watch on a deleted pod failed; watching again");
                    tokio::time::sleep(Duration::from_millis(50 * u64::from(attempts))).await;
                }
                Ok(Err(e)) => return Err(failed_by(format!("cannot watch pod {name} go"), e)),
                Err(_) => {
                    return Err(failed(format!(
                        "pod {name} was not gone within {} s of its deletion",
                        self.config.delete_timeout.as_secs()
                    )));
                }
            }
        }
    }

    async fn delete_named<K>(&self, name: &str, what: &str) -> Result<(), DriverError>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
        <K as Resource>::DynamicType: Default,
    {
        let api: Api<K> = self.api().await?;
        match api.delete(name, &DeleteParams::background()).await {
            Ok(_) => Ok(()),
            Err(e) if status_code(&e) == Some(404) => Ok(()),
            Err(e) => Err(self.api_error(&format!("cannot delete the sandbox's {what}"), e)),
        }
    }

    /// Ends the sandbox and removes its objects (a durable claim stays).
    async fn remove(&self, sandbox: &SandboxId) -> Result<(), DriverError> {
        let name = self.name(sandbox);
        let known = self.known.lock().ok().and_then(|all| all.get(sandbox).cloned());
        self.forget(sandbox);
        // The supervisor's end takes every process with it at once; the pod's deletion
        // then confirms it (and covers a supervisor that does not answer).
        if let Some(k) = known
            && let Ok(channel) = self.channel(sandbox, &k.key).await
        {
            let _ = client::shutdown(&channel, Duration::from_secs(2)).await;
        }
        self.delete_pod(&name).await?;
        self.delete_named::<Secret>(&name, "secret").await?;
        self.delete_named::<NetworkPolicy>(&name, "network policy").await?;
        // An ephemeral claim is the pod's (garbage-collected with it); delete it anyway
        // so a deprovision leaves nothing even where the collector lags.
        self.delete_named::<PersistentVolumeClaim>(&objects::ephemeral_claim_name(&name), "workspace claim")
            .await
    }

    /// A sandbox whose supervisor is gone: remove what is left and say it is gone.
    async fn gone(&self, sandbox: &SandboxId, why: &ClientError) -> DriverError {
        tracing::warn!(sandbox = %sandbox, error = %why, "the sandbox's pod is gone; removing what is left");
        let lock = self.lock(sandbox);
        let _held = lock.lock().await;
        if let Err(e) = self.remove(sandbox).await {
            tracing::warn!(sandbox = %sandbox, error = %e, "could not clean up a broken sandbox");
        }
        DriverError::NotFound(sandbox.clone())
    }

    /// Whether the sandbox's pod is gone or will never run again.
    async fn pod_is_gone(&self, sandbox: &SandboxId) -> bool {
        let Ok(pods) = self.api::<Pod>().await else { return false };
        match pods.get_opt(&self.name(sandbox)).await {
            Ok(None) => true,
            Ok(Some(pod)) => {
                pod.metadata.deletion_timestamp.is_some() || matches!(start_state(&pod), Start::Failed(_))
            }
            Err(_) => false,
        }
    }

    /// Says hello until the supervisor answers (it binds its port a moment after the
    /// container starts) or the deadline passes.
    async fn hello(
        &self,
        sandbox: &SandboxId,
        key: &ChannelKey,
        deadline: Instant,
    ) -> Result<(), DriverError> {
        let channel = self.channel(sandbox, key).await?;
        let answered = async {
            // The supervisor listens a few milliseconds after its container starts.
            let mut pause = Duration::from_millis(2);
            loop {
                let last = match client::connect(&channel, CONNECT_TIMEOUT).await {
                    Ok(_) => return Ok(()),
                    // A supervisor that refuses (a version mismatch) will not change its mind.
                    Err(e @ ClientError::Refused { .. }) => {
                        return Err(failed_by("the sandbox's supervisor refused", e));
                    }
                    Err(e) => e,
                };
                if Instant::now() + pause >= deadline {
                    return Err(failed(format!("the sandbox's supervisor did not answer: {last}")));
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(100));
            }
        };
        // Meanwhile a watch: a container that ends before its supervisor answers fails
        // the wait at once, with its reason.
        let name = self.name(sandbox);
        let ended = self.await_end(&name);
        tokio::select! {
            r = answered => r,
            why = ended => Err(failed(format!("pod {name} did not start: {why}"))),
        }
    }

    /// Resolves (with the reason) when the pod ends or is gone, watching; pends forever
    /// while it runs, or when it cannot be watched (the caller's own deadline holds).
    async fn await_end(&self, name: &str) -> String {
        let Ok(pods) = self.api::<Pod>().await else { return std::future::pending().await };
        let ended = |pod: Option<&Pod>| pod.is_none_or(|p| matches!(start_state(p), Start::Failed(_)));
        for attempt in 0..=WATCH_RETRIES {
            match await_condition(pods.clone(), name, ended).await {
                Ok(Some(pod)) => match start_state(&pod) {
                    Start::Failed(why) => return why,
                    _ => return "it ended".to_owned(),
                },
                Ok(None) => return "it was deleted".to_owned(),
                Err(e) => {
                    tracing::debug!(pod = name, error = %e, attempt, "the watch on a starting pod failed; watching again");
                    tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt + 1))).await;
                }
            }
        }
        std::future::pending().await
    }

    /// The uid for a new workspace: its preferred one, stepped past uids that a pod or a
    /// claim of another workspace holds.
    async fn choose_uid(&self, workspace: &str) -> Result<u32, DriverError> {
        let pods: Api<Pod> = self.api().await?;
        let claims: Api<PersistentVolumeClaim> = self.api().await?;
        let preferred = objects::preferred_uid(&self.config, workspace);
        for i in 0..64 {
            let uid = objects::next_uid(&self.config, preferred, i);
            let selector = format!(
                "{}={},{}={uid}",
                objects::LABEL_INSTANCE,
                self.config.name_prefix,
                objects::LABEL_UID
            );
            let lp = ListParams::default().labels(&selector);
            let holders_pods =
                pods.list_metadata(&lp).await.map_err(|e| self.api_error("cannot list pods by uid", e))?;
            let holders_claims = claims
                .list_metadata(&lp)
                .await
                .map_err(|e| self.api_error("cannot list claims by uid", e))?;
            let other = holders_pods
                .items
                .iter()
                .map(|m| &m.metadata)
                .chain(holders_claims.items.iter().map(|m| &m.metadata))
                .any(|m| {
                    m.labels
                        .as_ref()
                        .and_then(|l| l.get(objects::LABEL_WORKSPACE))
                        .is_none_or(|w| w != workspace)
                });
            if !other {
                return Ok(uid);
            }
        }
        Err(failed("no free uid for the workspace: widen the pod id range"))
    }

    /// The durable workspace's claim: created, or found (409 read back: it must be this
    /// workspace's). Returns its uid and whether this call created it.
    async fn ensure_claim(
        &self,
        plan_workspace: &str,
        spec: &ProvisionSpec,
    ) -> Result<(u32, bool), DriverError> {
        let claims: Api<PersistentVolumeClaim> = self.api().await?;
        let name = objects::durable_claim_name(&self.config.name_prefix, plan_workspace);
        let existing_uid = |claim: &PersistentVolumeClaim| -> Result<u32, DriverError> {
            let labels = claim.metadata.labels.clone().unwrap_or_default();
            if labels.get(objects::LABEL_WORKSPACE).map(String::as_str) != Some(plan_workspace) {
                return Err(failed(format!("claim {name} exists but is not this workspace's")));
            }
            labels
                .get(objects::LABEL_UID)
                .and_then(|u| u.parse().ok())
                .ok_or_else(|| failed(format!("claim {name} does not record its uid")))
        };
        if let Some(claim) =
            claims.get_opt(&name).await.map_err(|e| self.api_error("cannot read the workspace claim", e))?
        {
            return Ok((existing_uid(&claim)?, false));
        }
        let uid = self.choose_uid(plan_workspace).await?;
        let plan = SandboxPlan {
            sandbox: spec.sandbox_id(),
            key: &spec.key,
            durability: spec.durability,
            environment: &spec.environment,
            epoch: spec.epoch,
            workspace: plan_workspace.to_owned(),
            uid,
            workspace_bytes: spec.workspace_bytes,
        };
        match claims.create(&PostParams::default(), &objects::durable_claim(&self.config, &plan)).await {
            Ok(_) => Ok((uid, true)),
            Err(e) if status_code(&e) == Some(409) => {
                // Another replica created it first: use it if it is this workspace's.
                let claim = claims
                    .get(&name)
                    .await
                    .map_err(|e| self.api_error("cannot read the workspace claim", e))?;
                Ok((existing_uid(&claim)?, false))
            }
            Err(e) => Err(self.api_error("cannot create the workspace claim", e)),
        }
    }

    /// Creates `object`, or on 409 reads it back and checks it is this sandbox's.
    async fn create_owned<K>(&self, object: &K, sandbox: &SandboxId, what: &str) -> Result<bool, DriverError>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + serde::Serialize
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
        <K as Resource>::DynamicType: Default,
    {
        let api: Api<K> = self.api().await?;
        match api.create(&PostParams::default(), object).await {
            Ok(_) => Ok(true),
            Err(e) if status_code(&e) == Some(409) => {
                let name = object.meta().name.clone().unwrap_or_default();
                let found = api
                    .get(&name)
                    .await
                    .map_err(|e| self.api_error(&format!("cannot read the sandbox's {what}"), e))?;
                if objects::labelled_sandbox(found.meta()) == Some(sandbox.as_str()) {
                    Ok(false)
                } else {
                    Err(failed(format!("{what} {name} exists but is not sandbox {sandbox}'s")))
                }
            }
            Err(e) => Err(self.api_error(&format!("cannot create the sandbox's {what}"), e)),
        }
    }

    /// Writes the token into the sandbox's Secret (the kubelet brings it to the pod's
    /// token directory).
    async fn patch_secret(&self, sandbox: &SandboxId, token: &SandboxToken) -> Result<(), DriverError> {
        use base64::Engine as _;
        let mut data = serde_json::Map::new();
        data.insert(
            objects::SECRET_TOKEN.to_owned(),
            base64::engine::general_purpose::STANDARD.encode(token.expose().as_bytes()).into(),
        );
        let patch = serde_json::json!({ "data": data });
        let secrets: Api<Secret> = self.api().await?;
        match secrets.patch(&self.name(sandbox), &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => Ok(()),
            Err(e) if status_code(&e) == Some(404) => Err(DriverError::NotFound(sandbox.clone())),
            Err(e) => Err(self.api_error("cannot write the sandbox's token", e)),
        }
    }

    /// Writes a new CA into the sandbox's Secret.
    async fn patch_ca(
        &self,
        sandbox: &SandboxId,
        ca: &crate::egress::ca::SandboxCa,
    ) -> Result<(), DriverError> {
        let patch = serde_json::json!({ "data": objects::ca_data(ca) });
        let secrets: Api<Secret> = self.api().await?;
        match secrets.patch(&self.name(sandbox), &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => Ok(()),
            Err(e) if status_code(&e) == Some(404) => Err(DriverError::NotFound(sandbox.clone())),
            Err(e) => Err(self.api_error("cannot write the sandbox's CA", e)),
        }
    }

    /// The sandbox's CA from its Secret; `None` when it has none.
    async fn sandbox_ca(&self, sandbox: &SandboxId) -> Option<crate::egress::ca::SandboxCa> {
        let secrets: Api<Secret> = self.api().await.ok()?;
        let secret = secrets.get_opt(&self.name(sandbox)).await.ok()??;
        if objects::labelled_sandbox(&secret.metadata) != Some(sandbox.as_str()) {
            return None;
        }
        let file = secret.data?.remove(objects::SECRET_CA_KEY)?;
        let text = String::from_utf8(file.0).ok()?;
        crate::egress::ca::SandboxCa::from_key_file(sandbox, &text).ok()
    }

    async fn patch_environment(
        &self,
        sandbox: &SandboxId,
        environment: &DriverEnvironment,
    ) -> Result<(), DriverError> {
        let text =
            serde_json::to_string(environment).map_err(|e| failed_by("cannot encode the environment", e))?;
        let patch =
            serde_json::json!({ "metadata": { "annotations": { objects::ANNOTATION_ENVIRONMENT: text } } });
        let pods: Api<Pod> = self.api().await?;
        match pods.patch(&self.name(sandbox), &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => Ok(()),
            Err(e) if status_code(&e) == Some(404) => Err(DriverError::NotFound(sandbox.clone())),
            Err(e) => Err(self.api_error("cannot record the sandbox's environment", e)),
        }
    }

    /// A provision of a sandbox whose pod exists (a retry, a concurrent provision, a
    /// restart): the same epoch keeps a live pod, with the new credential; a newer epoch
    /// replaces the pod (the workspace stays); an older one is fenced. `Ok(true)`: done.
    async fn reprovision(&self, spec: &ProvisionSpec, pod: &Pod) -> Result<bool, DriverError> {
        let id = spec.sandbox_id();
        let name = self.name(id);
        if objects::labelled_sandbox(&pod.metadata) != Some(id.as_str()) {
            return Err(failed(format!("pod {name} exists but is not sandbox {id}")));
        }
        let facts = PodFacts::parse(&pod.metadata)
            .ok_or_else(|| failed(format!("pod {name} is missing the sandbox's labels")))?;
        if !facts.is_for(&spec.key, spec.durability) {
            return Err(failed(format!(
                "sandbox {id} is already provisioned for {} ({})",
                facts.key, facts.durability
            )));
        }
        if facts.epoch > spec.epoch {
            return Err(failed(format!(
                "sandbox {id} was provisioned by a newer claim (epoch {} > {}): this attempt is fenced",
                facts.epoch, spec.epoch
            )));
        }
        let broken =
            pod.metadata.deletion_timestamp.is_some() || matches!(start_state(pod), Start::Failed(_));
        if facts.epoch == spec.epoch && !broken {
            let deadline = Instant::now() + self.config.start_timeout;
            let key = self
                .channel_key(id)
                .await?
                .ok_or_else(|| failed(format!("sandbox {id} has a pod but no secret")))?;
            self.await_start(&name, deadline).await?;
            self.hello(id, &key, deadline).await?;
            self.patch_secret(id, &spec.credential).await?;
            if facts.environment != spec.environment {
                self.patch_environment(id, &spec.environment).await?;
            }
            let facts = PodFacts { environment: spec.environment.clone(), ..facts };
            self.remember(id, Known { facts, key });
            return Ok(true);
        }
        // A newer claim (or a pod that will not run again): the pod goes, the workspace stays.
        self.forget(id);
        self.delete_pod(&name).await?;
        Ok(false)
    }

    async fn provision_locked(&self, spec: &ProvisionSpec) -> Result<(), DriverError> {
        let id = spec.sandbox_id();
        let name = self.name(id);
        let pods: Api<Pod> = self.api().await?;
        if let Some(pod) =
            pods.get_opt(&name).await.map_err(|e| self.api_error("cannot read the sandbox's pod", e))?
            && self.reprovision(spec, &pod).await?
        {
            return Ok(());
        }
        let deadline = Instant::now() + self.config.start_timeout;
        let workspace = objects::workspace_id(&self.config.name_prefix, id, &spec.key, spec.durability);
        let (uid, created_claim) = match spec.durability {
            Durability::Durable => self.ensure_claim(&workspace, spec).await?,
            Durability::Ephemeral => (self.choose_uid(&workspace).await?, false),
        };
        if spec.from_snapshot.is_some() && spec.durability == Durability::Durable && !created_claim {
            return Err(DriverError::Conflict(format!(
                "{} already has a workspace; a fork starts a new one (restore replaces an existing one)",
                spec.key
            )));
        }
        let plan = SandboxPlan {
            sandbox: id,
            key: &spec.key,
            durability: spec.durability,
            environment: &spec.environment,
            epoch: spec.epoch,
            workspace,
            uid,
            workspace_bytes: spec.workspace_bytes,
        };
        let key = ChannelKey::generate().map_err(|e| failed_by("no entropy for the channel key", e))?;
        let result = self.create_and_start(spec, &plan, key, deadline).await;
        match result {
            Ok(Some(key)) => {
                let facts = PodFacts {
                    environment: spec.environment.clone(),
                    durability: spec.durability,
                    key: spec.key.to_string(),
                    epoch: spec.epoch,
                    workspace: plan.workspace.clone(),
                    uid,
                };
                self.remember(id, Known { facts, key });
                // A fork's snapshot, or a restore waiting for this pod, before anyone uses it.
                if let Err(e) = self.seed(spec).await {
                    self.undo(id, &plan.workspace, created_claim).await;
                    return Err(e);
                }
                tracing::debug!(sandbox = %id, durability = %spec.durability, "kubernetes sandbox ready");
                Ok(())
            }
            // Another attempt created the pod between the read and the create.
            Ok(None) => {
                let pod =
                    pods.get(&name).await.map_err(|e| self.api_error("cannot read the sandbox's pod", e))?;
                if self.reprovision(spec, &pod).await? {
                    Ok(())
                } else {
                    Err(failed("the sandbox's pod was replaced while it was being provisioned"))
                }
            }
            Err(e) => {
                self.undo(id, &plan.workspace, created_claim).await;
                Err(e)
            }
        }
    }

    /// Creates the secret, the network policy and the pod, and waits for the supervisor;
    /// returns the channel key the pod was given. `Ok(None)`: the pod already existed
    /// (another attempt's).
    async fn create_and_start(
        &self,
        spec: &ProvisionSpec,
        plan: &SandboxPlan<'_>,
        key: ChannelKey,
        deadline: Instant,
    ) -> Result<Option<ChannelKey>, DriverError> {
        let id = spec.sandbox_id();
        // A new CA for every pod.
        let ca = crate::egress::ca::SandboxCa::generate(id).map_err(|e| failed(e.to_string()))?;
        let mut secret = objects::secret(&self.config, plan, spec.credential.expose(), &key);
        secret.data.get_or_insert_with(Default::default).extend(objects::ca_data(&ca));
        let key = if self.create_owned(&secret, id, "secret").await? {
            key
        } else {
            // Left by an earlier attempt (this sandbox's, as its label says): its channel
            // key stays (a pod of that attempt may hold it), the token and CA are this attempt's.
            self.patch_secret(id, &spec.credential).await?;
            self.patch_ca(id, &ca).await?;
            self.channel_key(id).await?.ok_or_else(|| failed(format!("sandbox {id}'s secret vanished")))?
        };
        // Before the pod, so it never runs without it.
        self.create_owned(&objects::network_policy(&self.config, plan), id, "network policy").await?;
        let pod = objects::pod(&self.config, plan).map_err(|e| failed_by("cannot encode the pod", e))?;
        if !self.create_owned(&pod, id, "pod").await? {
            return Ok(None);
        }
        let name = self.name(id);
        self.await_start(&name, deadline).await?;
        self.hello(id, &key, deadline).await?;
        Ok(Some(key))
    }

    /// Removes what a failed first provision left.
    async fn undo(&self, sandbox: &SandboxId, workspace: &str, created_claim: bool) {
        self.forget(sandbox);
        if let Err(e) = self.remove(sandbox).await {
            tracing::warn!(sandbox = %sandbox, error = %e, "could not remove a failed sandbox's objects");
        }
        if created_claim
            && let Err(e) = self
                .delete_named::<PersistentVolumeClaim>(
                    &objects::durable_claim_name(&self.config.name_prefix, workspace),
                    "workspace claim",
                )
                .await
        {
            tracing::warn!(sandbox = %sandbox, error = %e, "could not remove a failed sandbox's claim");
        }
    }

    /// The rlimits the supervisor sets in each command.
    fn command_rlimits(&self) -> Vec<(Rlimit, u64)> {
        let l = &self.config.limits;
        vec![
            (Rlimit::OpenFiles, l.open_files),
            (Rlimit::FileSize, l.file_size_bytes),
            (Rlimit::CpuSecs, l.cpu_secs),
            (Rlimit::Processes, l.processes),
            (Rlimit::Core, 0),
        ]
    }
}

/// Builds the client configuration for `config`'s connection.
async fn kube_config(config: &KubeConfig) -> Result<kube::Config, String> {
    let mut built = match &config.connection {
        KubeConnection::InCluster => kube::Config::incluster()
            .map_err(|e| format!("cannot use the in-cluster service account: {e}"))?,
        KubeConnection::Kubeconfig { path, context } => {
            let file = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| format!("cannot read the kubeconfig {}: {e}", path.display()))?;
            let options = kube::config::KubeConfigOptions { context: context.clone(), ..Default::default() };
            kube::Config::from_custom_kubeconfig(file, &options)
                .await
                .map_err(|e| format!("cannot use the kubeconfig {}: {e}", path.display()))?
        }
        KubeConnection::Explicit { url, token_file, ca_file } => {
            let uri = url.parse().map_err(|e| format!("kube.api_url {url:?} is not a URL: {e}"))?;
            let mut c = kube::Config::new(uri);
            c.auth_info.token_file = token_file.as_ref().map(|p| p.display().to_string());
            if let Some(ca) = ca_file {
                let pem = std::fs::read(ca)
                    .map_err(|e| format!("cannot read kube.ca_file {}: {e}", ca.display()))?;
                c.root_cert =
                    Some(pem_certificates(&pem).map_err(|e| format!("kube.ca_file {}: {e}", ca.display()))?);
            }
            c
        }
    };
    built.default_namespace.clone_from(&config.namespace);
    Ok(built)
}

/// The DER certificates of a PEM bundle.
fn pem_certificates(pem: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    use base64::Engine as _;
    let text = std::str::from_utf8(pem).map_err(|_| "not PEM text".to_owned())?;
    let mut out = Vec::new();
    let mut body: Option<String> = None;
    for line in text.lines() {
        let line = line.trim();
        if line == "-----BEGIN CERTIFICATE-----" {
            body = Some(String::new());
        } else if line == "-----END CERTIFICATE-----" {
            let b = body.take().ok_or("END without BEGIN")?;
            out.push(
                base64::engine::general_purpose::STANDARD
                    .decode(b)
                    .map_err(|e| format!("bad base64: {e}"))?,
            );
        } else if let Some(b) = body.as_mut() {
            b.push_str(line);
        }
    }
    if out.is_empty() {
        return Err("no certificate in it".to_owned());
    }
    Ok(out)
}

#[async_trait]
impl SandboxDriver for KubeDriver {
    fn name(&self) -> &'static str {
        "kubernetes"
    }

    async fn provision(&self, spec: &ProvisionSpec) -> Result<(), DriverError> {
        let lock = self.lock(spec.sandbox_id());
        let _held = lock.lock().await;
        self.provision_locked(spec).await
    }

    async fn refresh_credential(
        &self,
        sandbox: &SandboxId,
        credential: &SandboxToken,
        environment: &DriverEnvironment,
    ) -> Result<(), DriverError> {
        let known = self.known(sandbox).await?;
        if self.pod_is_gone(sandbox).await {
            let why = ClientError::Gone(std::io::Error::new(std::io::ErrorKind::NotFound, "the pod is gone"));
            return Err(self.gone(sandbox, &why).await);
        }
        if let Err(e) = self.patch_secret(sandbox, credential).await {
            if matches!(e, DriverError::NotFound(_)) {
                self.forget(sandbox);
            }
            return Err(e);
        }
        if &known.facts.environment != environment {
            self.patch_environment(sandbox, environment).await?;
            let facts = PodFacts { environment: environment.clone(), ..known.facts.clone() };
            self.remember(sandbox, Known { facts, key: known.key.clone() });
        }
        Ok(())
    }

    async fn exec(&self, sandbox: &SandboxId, request: &ExecRequest) -> Result<ExecOutput, DriverError> {
        let spec =
            self.command(sandbox, request.argv(), request.timeout_ms(), !request.stdin().is_empty()).await?;
        let channel = self.socket(sandbox).await?;
        match client::exec(&channel, &spec, request.stdin(), CONNECT_TIMEOUT, EXEC_GRACE).await {
            Ok(out) => Ok(out),
            Err(ClientError::Refused { code, message }) if code == "spawn" => Ok(ExecOutput {
                exit_code: 127,
                stdout: Vec::new(),
                stderr: message.into_bytes(),
                timed_out: false,
                truncated: false,
            }),
            Err(e) => Err(self.failure(sandbox, None, e).await),
        }
    }

    async fn deprovision(&self, sandbox: &SandboxId) -> Result<(), DriverError> {
        let lock = self.lock(sandbox);
        let _held = lock.lock().await;
        self.remove(sandbox).await
    }

    async fn list(&self) -> Result<Vec<SandboxId>, DriverError> {
        let lp = ListParams::default().labels(&objects::instance_selector(&self.config.name_prefix));
        let pods: Api<Pod> = self.api().await?;
        let secrets: Api<Secret> = self.api().await?;
        let from_pods = pods.list_metadata(&lp).await.map_err(|e| self.api_error("cannot list pods", e))?;
        let from_secrets =
            secrets.list_metadata(&lp).await.map_err(|e| self.api_error("cannot list secrets", e))?;
        let mut ids: Vec<SandboxId> = from_pods
            .items
            .iter()
            .map(|m| &m.metadata)
            .chain(from_secrets.items.iter().map(|m| &m.metadata))
            .filter_map(|m| objects::labelled_sandbox(m).and_then(|s| SandboxId::parse(s).ok()))
            .collect();
        ids.sort();
        ids.dedup();
        Ok(ids)
    }

    async fn health(&self) -> DriverHealth {
        let client = match self.client().await {
            Ok(c) => c,
            Err(e) => return DriverHealth { usable: false, detail: e.to_string() },
        };
        let version = match client.apiserver_version().await {
            Ok(v) => format!("Kubernetes {}", v.git_version),
            Err(e) => {
                return DriverHealth { usable: false, detail: self.api_error("health", e).to_string() };
            }
        };
        let pods: Api<Pod> = Api::namespaced(client.clone(), &self.config.namespace);
        if let Err(e) = pods.list_metadata(&ListParams::default().limit(1)).await {
            return DriverHealth {
                usable: false,
                detail: format!("{version}; cannot list pods in namespace {}: {e}", self.config.namespace),
            };
        }
        let l = &self.config.limits;
        DriverHealth {
            usable: true,
            detail: format!(
                "{version}; namespace {}; image {}; runtime class {}; limits: pod cpu {}m, memory {} B, \
                 ephemeral storage {} B + rlimits (nproc {}, nofile, fsize, cpu); network: deny-all policy; \
                 channel: port-forward",
                self.config.namespace,
                self.config.image,
                self.config.runtime_class.as_deref().unwrap_or("default"),
                l.cpu_millis,
                l.memory_bytes,
                l.ephemeral_storage_bytes,
                l.processes
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

    async fn snapshot(
        &self,
        sandbox: &SandboxId,
        target: &ports::SnapshotRef,
        budget: ports::SnapshotBudget,
    ) -> Result<u64, DriverError> {
        let lock = self.lock(sandbox);
        let _held = lock.lock().await;
        self.snapshot_locked(sandbox, target, budget).await
    }

    async fn delete_snapshot(&self, snapshot: &ports::SnapshotRef) -> Result<(), DriverError> {
        self.delete_snapshot_files(snapshot).await
    }

    async fn restore(&self, sandbox: &SandboxId, snapshot: &ports::SnapshotRef) -> Result<(), DriverError> {
        let lock = self.lock(sandbox);
        let _held = lock.lock().await;
        self.restore_locked(sandbox, snapshot).await
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

/// The streams, processes and files of the driver port ([`ops`]) run over the port-forward
/// unchanged.
#[async_trait]
impl Host for KubeDriver {
    type Target = PodChannel;

    async fn socket(&self, sandbox: &SandboxId) -> Result<PodChannel, DriverError> {
        let known = self.known(sandbox).await?;
        self.channel(sandbox, &known.key).await
    }

    async fn command(
        &self,
        sandbox: &SandboxId,
        argv: &[String],
        timeout_ms: u64,
        stdin: bool,
    ) -> Result<ExecSpec, DriverError> {
        let known = self.known(sandbox).await?;
        Ok(ExecSpec {
            argv: argv.to_vec(),
            env: known.facts.environment.vars().into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
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

    /// A port-forward that cannot reach the supervisor says so as a connection failure,
    /// not as [`ClientError::Gone`] (the API server answers while the pod ends): the pod is
    /// read, and a pod that is gone or will not run again is cleaned up after.
    async fn failure(&self, sandbox: &SandboxId, pid: Option<u32>, e: ClientError) -> DriverError {
        if matches!(e, ClientError::Gone(_))
            || (matches!(e, ClientError::Protocol(_)) && self.pod_is_gone(sandbox).await)
        {
            return self.gone(sandbox, &e).await;
        }
        client::driver_error(e, sandbox, pid)
    }

    async fn broker_tls(&self, sandbox: &SandboxId) -> crate::egress::BrokerTls {
        // Read once per serving: a new pod (with a new CA) is served anew.
        let ca = self.sandbox_ca(sandbox).await.map(|ca| {
            let source: Arc<dyn crate::egress::ca::CaSource> = Arc::new(Arc::new(ca));
            source
        });
        crate::egress::BrokerTls::new(ca, self.upstream_tls.clone())
    }

    fn connect_timeout(&self) -> Duration {
        CONNECT_TIMEOUT
    }

    fn grace(&self) -> Duration {
        EXEC_GRACE
    }
}
