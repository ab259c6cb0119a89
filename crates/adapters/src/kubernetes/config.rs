//! The Kubernetes driver's configuration: how the API server is reached, the namespace,
//! the image, the pods' limits and placement.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::Toleration;

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

/// Everything the Kubernetes driver needs. The app fills it from its settings.
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
        }
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
