//! The Kubernetes driver's settings (the server's `[kube]` table) and the configuration
//! built from them: how the API server is reached, the namespace, the image, the pods'
//! limits and placement.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::Toleration;
use serde::{Deserialize, Serialize};

use crate::settings::InvalidSetting;

/// The Kubernetes driver's settings, as an operator gives them: the server's `[kube]` table
/// (`SANDLANE_KUBE__*`), read as they are; [`KubeConfig::from_settings`] applies them. The
/// API server is the in-cluster service account's when the server runs in a pod, else
/// `KUBECONFIG`'s, else [`KubeSettings::api_url`] (the composition root picks the
/// [`KubeConnection`]). Unset limits keep the driver's defaults.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KubeSettings {
    /// The API server (`https://host:port`), used outside a cluster without `KUBECONFIG`.
    pub api_url: Option<String>,
    /// A file holding the bearer token for `api_url` (re-read, so rotation works).
    pub token_file: Option<PathBuf>,
    /// A PEM file of the CA that signed `api_url`'s certificate.
    pub ca_file: Option<PathBuf>,
    /// The kubeconfig context (default: its current context).
    pub context: Option<String>,
    /// The one namespace every sandbox object lives in.
    pub namespace: String,
    /// The image of every sandbox pod: the tools commands use plus the `sandlane-supervisor` program at
    /// `supervisor_path`.
    pub image: Option<String>,
    /// `IfNotPresent`, `Always` or `Never`.
    pub image_pull_policy: String,
    /// Where the `sandlane-supervisor` program is inside the image.
    pub supervisor_path: String,
    /// The loopback port the supervisor listens on inside the pod.
    pub supervisor_port: u16,
    /// Prefix of the object names and the value of the label the driver lists by.
    pub name_prefix: String,
    /// CPU limit of a pod in thousandths of a CPU.
    pub cpu_millis: Option<u64>,
    /// Memory limit of a pod in bytes.
    pub memory_bytes: Option<u64>,
    /// Ephemeral-storage limit of a pod in bytes.
    pub ephemeral_storage_bytes: Option<u64>,
    /// `RLIMIT_NPROC` of each command (each workspace has a uid of its own).
    pub max_processes: Option<u64>,
    /// `RLIMIT_NOFILE` of each command.
    pub max_open_files: Option<u64>,
    /// `RLIMIT_FSIZE` of each command, bytes.
    pub max_file_size_bytes: Option<u64>,
    /// `RLIMIT_CPU` of each command, seconds.
    pub max_cpu_secs: Option<u64>,
    /// The size a workspace claim asks for, bytes.
    pub workspace_bytes: Option<u64>,
    /// The workspace claims' storage class (default: the cluster's default class).
    pub storage_class: Option<String>,
    /// The size of the pod's in-memory `/tmp`, bytes.
    pub tmp_size_bytes: Option<u64>,
    /// The pods' `runtimeClassName` (gVisor, Kata).
    pub runtime_class: Option<String>,
    /// The pods' node selector, `key=value` pairs separated by commas.
    pub node_selector: Option<String>,
    /// The pods' tolerations, a JSON list of Kubernetes tolerations.
    pub tolerations: Option<String>,
    /// The first uid pods run as.
    pub uid_base: Option<u32>,
    /// How many uids from `uid_base` on may be handed out.
    pub uid_span: Option<u32>,
    /// How long a new pod may take to run (scheduling and image pull included), in ms.
    pub start_timeout_ms: Option<u64>,
    /// Whether the supervisor installs its seccomp filter on top of `RuntimeDefault`.
    pub seccomp: Option<bool>,
}

impl Default for KubeSettings {
    fn default() -> Self {
        Self {
            api_url: None,
            token_file: None,
            ca_file: None,
            context: None,
            namespace: "sandlane-sandboxes".to_owned(),
            image: None,
            image_pull_policy: "IfNotPresent".to_owned(),
            supervisor_path: "/usr/local/bin/sandlane-supervisor".to_owned(),
            supervisor_port: 7070,
            name_prefix: "sandlane".to_owned(),
            cpu_millis: None,
            memory_bytes: None,
            ephemeral_storage_bytes: None,
            max_processes: None,
            max_open_files: None,
            max_file_size_bytes: None,
            max_cpu_secs: None,
            workspace_bytes: None,
            storage_class: None,
            tmp_size_bytes: None,
            runtime_class: None,
            node_selector: None,
            tolerations: None,
            uid_base: None,
            uid_span: None,
            start_timeout_ms: None,
            seccomp: None,
        }
    }
}

impl KubeSettings {
    /// The node selector as pairs.
    ///
    /// # Errors
    /// A message naming the pair that is not `key=value`.
    pub fn node_selector_pairs(&self) -> Result<BTreeMap<String, String>, String> {
        let mut out = BTreeMap::new();
        for pair in
            self.node_selector.iter().flat_map(|s| s.split(',')).map(str::trim).filter(|p| !p.is_empty())
        {
            let (k, v) = pair.split_once('=').ok_or_else(|| format!("{pair:?} is not key=value"))?;
            out.insert(k.trim().to_owned(), v.trim().to_owned());
        }
        Ok(out)
    }

    /// The tolerations as Kubernetes objects.
    ///
    /// # Errors
    /// The JSON error.
    pub fn toleration_list(&self) -> Result<Vec<Toleration>, String> {
        match self.tolerations.as_deref().map(str::trim).filter(|t| !t.is_empty()) {
            None => Ok(Vec::new()),
            Some(text) => {
                serde_json::from_str(text).map_err(|e| format!("not a JSON list of tolerations: {e}"))
            }
        }
    }

    /// Checks what the types do not, naming the first bad setting (`kube.KEY`). What the
    /// API server would refuse later is checked when the driver is built
    /// ([`KubeConfig::validate`]).
    ///
    /// # Errors
    /// [`InvalidSetting`].
    pub fn validate(&self) -> Result<(), InvalidSetting> {
        self.node_selector_pairs().map_err(|e| InvalidSetting::new("kube.node_selector", e))?;
        self.toleration_list().map_err(|e| InvalidSetting::new("kube.tolerations", e))?;
        InvalidSetting::check_positive([
            ("kube.cpu_millis", self.cpu_millis),
            ("kube.memory_bytes", self.memory_bytes),
            ("kube.ephemeral_storage_bytes", self.ephemeral_storage_bytes),
            ("kube.max_processes", self.max_processes),
            ("kube.max_open_files", self.max_open_files),
            ("kube.max_file_size_bytes", self.max_file_size_bytes),
            ("kube.max_cpu_secs", self.max_cpu_secs),
            ("kube.workspace_bytes", self.workspace_bytes),
            ("kube.tmp_size_bytes", self.tmp_size_bytes),
            ("kube.start_timeout_ms", self.start_timeout_ms),
        ])
    }
}

/// How the driver reaches the API server. The composition root picks one: the in-cluster
/// service account when the server runs in a pod, else `KUBECONFIG`, else the
/// `SANDLANE_KUBE_*` settings.
#[derive(Debug, Clone, PartialEq)]
pub enum KubeConnection {
    /// The pod's service account (`/var/run/secrets/kubernetes.io/serviceaccount`) and
    /// the `KUBERNETES_SERVICE_HOST`/`_PORT` the kubelet sets.
    InCluster,
    /// A kubeconfig file, with its current context unless one is named.
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// The context to use (`None`: the file's current context).
        context: Option<String>,
    },
    /// An API server named directly.
    Explicit {
        /// `https://host:port` (or `http://` for a local proxy or a test server).
        url: String,
        /// A file holding a bearer token (read at each request, so a rotated token is
        /// picked up); `None`: no authentication header.
        token_file: Option<PathBuf>,
        /// A PEM file of the certificate authority that signed the server's certificate
        /// (`None`: the platform's roots).
        ca_file: Option<PathBuf>,
    },
}

/// Resource limits of one sandbox pod and of each command in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KubeLimits {
    /// The pod's CPU limit (and request) in thousandths of a CPU.
    pub cpu_millis: u64,
    /// The pod's memory limit (and request) in bytes.
    pub memory_bytes: u64,
    /// The pod's ephemeral-storage limit (and request) in bytes: its `/tmp`, logs and
    /// writable layers.
    pub ephemeral_storage_bytes: u64,
    /// `RLIMIT_NPROC` of each command. Each workspace runs as a uid of its own
    /// ([`KubeConfig::pod_ids`]), so it bounds the sandbox's processes on its node.
    pub processes: u64,
    /// `RLIMIT_NOFILE` of each command.
    pub open_files: u64,
    /// `RLIMIT_FSIZE` of each command, bytes.
    pub file_size_bytes: u64,
    /// `RLIMIT_CPU` of each command, seconds.
    pub cpu_secs: u64,
}

impl Default for KubeLimits {
    /// One CPU, 1 GiB memory, 2 GiB ephemeral storage, 256 processes, 1024 files, 1 GiB
    /// files, 300 CPU seconds.
    fn default() -> Self {
        Self {
            cpu_millis: 1000,
            memory_bytes: 1 << 30,
            ephemeral_storage_bytes: 2 << 30,
            processes: 256,
            open_files: 1024,
            file_size_bytes: 1 << 30,
            cpu_secs: 300,
        }
    }
}

/// The uids (and gids) sandbox pods run as: each workspace gets `base + hash % span`,
/// stepped past one a live sandbox of another workspace holds, and keeps it (a durable
/// workspace's claim records it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodIds {
    /// The first uid handed out (above 0: pods never run as root).
    pub base: u32,
    /// How many uids from `base` on may be handed out (at least 1).
    pub span: u32,
}

impl Default for PodIds {
    /// 200 000 000 ids from 1 900 000 000, as the bubblewrap driver's host ids.
    fn default() -> Self {
        Self { base: 1_900_000_000, span: 200_000_000 }
    }
}

/// Everything the Kubernetes driver needs: its settings ([`KubeConfig::from_settings`])
/// resolved over the defaults, how the API server is reached, and the knobs tests and
/// benches turn.
#[derive(Debug, Clone, PartialEq)]
pub struct KubeConfig {
    /// How the API server is reached.
    pub connection: KubeConnection,
    /// The one namespace every sandbox object lives in.
    pub namespace: String,
    /// The image of every sandbox pod: the tools commands use, plus the `sandlane-supervisor` program
    /// at [`KubeConfig::supervisor_path`] (see the deployment docs for a two-line
    /// Dockerfile). Nothing else of sandlane's.
    pub image: String,
    /// The image pull policy (`IfNotPresent`, `Always`, `Never`).
    pub image_pull_policy: String,
    /// Where the `sandlane-supervisor` program is inside the image; run as the pod's process.
    pub supervisor_path: String,
    /// The loopback port the supervisor listens on inside the pod (reached through the
    /// API server's port-forward).
    pub supervisor_port: u16,
    /// Prefix of every object name and the value of the `sandlane.dev/instance` label the
    /// driver lists by, so two deployments in one namespace never touch each other's
    /// sandboxes. A DNS label of at most 20 characters.
    pub name_prefix: String,
    /// Limits of every pod and command.
    pub limits: KubeLimits,
    /// The uids pods run as.
    pub pod_ids: PodIds,
    /// The size a workspace claim asks for, bytes.
    pub workspace_size_bytes: u64,
    /// The storage class of workspace claims (`None`: the cluster's default).
    pub storage_class: Option<String>,
    /// The size of the pod's private `/tmp` (an in-memory `emptyDir`, counted in its
    /// memory), bytes.
    pub tmp_size_bytes: u64,
    /// The pods' `runtimeClassName` (gVisor, Kata), `None`: the cluster's default.
    pub runtime_class: Option<String>,
    /// The pods' node selector.
    pub node_selector: BTreeMap<String, String>,
    /// The pods' tolerations.
    pub tolerations: Vec<Toleration>,
    /// Per-stream cap of captured output in bytes.
    pub output_cap_bytes: usize,
    /// How long a new pod may take to run and its supervisor to answer (scheduling, the
    /// claim's binding and the image pull included).
    pub start_timeout: Duration,
    /// How long a deleted pod may take to be gone.
    pub delete_timeout: Duration,
    /// Whether the supervisor installs its seccomp filter (on top of the pod's
    /// `RuntimeDefault` profile).
    pub seccomp: bool,
    /// The PEM file of the roots brokered upstreams are verified against
    /// (`egress.upstream_ca_file`); `None`: the system's roots.
    pub upstream_ca_file: Option<std::path::PathBuf>,
    /// Where the server keeps snapshots of workspaces, copied out through the supervisor
    /// (`<data_dir>/snapshots`; several replicas need it shared); `None`: no snapshots.
    pub snapshot_dir: Option<std::path::PathBuf>,
    /// How long a snapshot's copy may take, at most a little less than the supervisor
    /// keeps the pod's processes stopped (`MAX_FREEZE_MS`, two minutes): a longer copy
    /// would not be of one instant, so it fails.
    pub snapshot_copy_timeout: Duration,
}

impl KubeConfig {
    /// The defaults for `connection`, `namespace` and `image`: pull `IfNotPresent`, the
    /// supervisor at `/usr/local/bin/sandlane-supervisor` on port 7070, prefix `sandlane`, default
    /// [`KubeLimits`] and [`PodIds`], 1 GiB workspaces of the default storage class, a
    /// 256 MiB `/tmp`, the default runtime class, no node selector or tolerations, 1 MiB
    /// of output per stream, 120 s to start, 60 s to delete, seccomp on.
    pub fn new(connection: KubeConnection, namespace: impl Into<String>, image: impl Into<String>) -> Self {
        Self {
            connection,
            namespace: namespace.into(),
            image: image.into(),
            image_pull_policy: "IfNotPresent".to_owned(),
            supervisor_path: "/usr/local/bin/sandlane-supervisor".to_owned(),
            supervisor_port: 7070,
            name_prefix: "sandlane".to_owned(),
            limits: KubeLimits::default(),
            pod_ids: PodIds::default(),
            workspace_size_bytes: 1 << 30,
            storage_class: None,
            tmp_size_bytes: 256 << 20,
            runtime_class: None,
            node_selector: BTreeMap::new(),
            tolerations: Vec::new(),
            output_cap_bytes: 1 << 20,
            start_timeout: Duration::from_secs(120),
            delete_timeout: Duration::from_secs(60),
            seccomp: true,
            upstream_ca_file: None,
            snapshot_dir: None,
            snapshot_copy_timeout: super::snapshot::FREEZE_HELD,
        }
    }

    /// The defaults ([`KubeConfig::new`]) with `settings` over them, reaching the API
    /// server by `connection`.
    ///
    /// # Errors
    /// When `kube.image` is unset, or the node selector or tolerations do not parse: a
    /// message saying what to set.
    pub fn from_settings(settings: &KubeSettings, connection: KubeConnection) -> Result<Self, String> {
        let k = settings;
        let Some(image) = k.image.clone().filter(|i| !i.trim().is_empty()) else {
            return Err(
                "SANDLANE_DRIVER=kubernetes needs an image holding the sandlane-supervisor program: set \
                        SANDLANE_KUBE_IMAGE (or kube.image in the config file)"
                    .to_owned(),
            );
        };
        let mut config = Self::new(connection, k.namespace.clone(), image);
        config.image_pull_policy.clone_from(&k.image_pull_policy);
        config.supervisor_path.clone_from(&k.supervisor_path);
        config.supervisor_port = k.supervisor_port;
        config.name_prefix.clone_from(&k.name_prefix);
        let l = &mut config.limits;
        l.cpu_millis = k.cpu_millis.unwrap_or(l.cpu_millis);
        l.memory_bytes = k.memory_bytes.unwrap_or(l.memory_bytes);
        l.ephemeral_storage_bytes = k.ephemeral_storage_bytes.unwrap_or(l.ephemeral_storage_bytes);
        l.processes = k.max_processes.unwrap_or(l.processes);
        l.open_files = k.max_open_files.unwrap_or(l.open_files);
        l.file_size_bytes = k.max_file_size_bytes.unwrap_or(l.file_size_bytes);
        l.cpu_secs = k.max_cpu_secs.unwrap_or(l.cpu_secs);
        config.workspace_size_bytes = k.workspace_bytes.unwrap_or(config.workspace_size_bytes);
        config.storage_class.clone_from(&k.storage_class);
        config.tmp_size_bytes = k.tmp_size_bytes.unwrap_or(config.tmp_size_bytes);
        config.runtime_class.clone_from(&k.runtime_class);
        config.node_selector = k.node_selector_pairs()?;
        config.tolerations = k.toleration_list()?;
        config.pod_ids.base = k.uid_base.unwrap_or(config.pod_ids.base);
        config.pod_ids.span = k.uid_span.unwrap_or(config.pod_ids.span);
        if let Some(ms) = k.start_timeout_ms {
            config.start_timeout = Duration::from_millis(ms);
        }
        config.seccomp = k.seccomp.unwrap_or(config.seccomp);
        Ok(config)
    }

    /// Checks what the API server would refuse later, naming the bad setting.
    ///
    /// # Errors
    /// A message naming the setting and the rule.
    pub fn validate(&self) -> Result<(), String> {
        let dns_label = |s: &str, max: usize| {
            !s.is_empty()
                && s.len() <= max
                && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !s.starts_with('-')
                && !s.ends_with('-')
        };
        if !dns_label(&self.namespace, 63) {
            return Err(format!("kube.namespace {:?} is not a DNS label (a-z, 0-9, '-')", self.namespace));
        }
        if !dns_label(&self.name_prefix, 20) {
            return Err(format!(
                "kube.name_prefix {:?} must be a DNS label of at most 20 characters",
                self.name_prefix
            ));
        }
        if self.image.trim().is_empty() {
            return Err(
                "kube.image is empty: name an image holding the sandlane-supervisor program".to_owned()
            );
        }
        if !self.supervisor_path.starts_with('/') {
            return Err(format!("kube.supervisor_path {:?} must be absolute", self.supervisor_path));
        }
        if !["IfNotPresent", "Always", "Never"].contains(&self.image_pull_policy.as_str()) {
            return Err(format!(
                "kube.image_pull_policy {:?} must be IfNotPresent, Always or Never",
                self.image_pull_policy
            ));
        }
        if self.supervisor_port == 0 {
            return Err("kube.supervisor_port must not be 0".to_owned());
        }
        let ids = self.pod_ids;
        if ids.base == 0
            || ids.span == 0
            || ids.base.checked_add(ids.span).is_none_or(|end| end > i32::MAX as u32)
        {
            return Err("kube pod ids must start above 0, span at least one id and end below 2^31".to_owned());
        }
        Ok(())
    }
}
