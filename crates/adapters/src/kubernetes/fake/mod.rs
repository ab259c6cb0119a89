//! A loopback fake of the Kubernetes API server and a kubelet, for tests and benchmarks
//! (no cluster can be had where sandlane is built, and no `kube-apiserver` binary is in
//! a registry it reaches).
//!
//! The API server ([`FakeCluster::start`], axum on `127.0.0.1:0`, plain HTTP) serves what
//! the driver and `kubectl get` use: discovery (`/version`, `/api`, `/apis`, the resource
//! lists), and for pods, secrets, persistent volume claims and network policies create
//! (409 `AlreadyExists` on a taken name), get, list and watch with label selectors and
//! `metadata.name` field selectors (watches from a resource version replay a bounded
//! event log, and answer 410 Gone past it), JSON merge patch, and delete (a pod
//! gracefully: its deletion timestamp first, then, once the kubelet has ended it, gone,
//! with the objects it owns collected). Pods get the ephemeral-volume controller's claim
//! (`<pod>-<volume>`, owned by the pod). `portforward` upgrades to a websocket
//! (`v4.channel.k8s.io`) and relays one TCP connection to the pod's port.
//!
//! The kubelet runs each pod's one container as a local bubblewrap sandbox, started with
//! the bubblewrap driver's own spawn code: the "image" is the host's read-only system
//! directories plus the `sandlane-supervisor` program at the path the image declares; the pod's
//! network namespace is the sandbox's (loopback only), where the port-forward connects;
//! claims are host directories owned by the pod's `fsGroup`; the Secret volume is a
//! directory of the selected items, rewritten atomically when the Secret is patched;
//! the in-memory `emptyDir` is a tmpfs of its size limit; the memory and CPU limits are a
//! cgroup (where the host has writable controllers). An unknown image gives
//! `ErrImagePull`, a container that exits makes the pod `Failed`.
//!
//! Faults can be injected ([`Faults`]): a pod created by "another replica" just before
//! the driver's create (so it answers 409), watches cut or refused, and watches whose
//! version is expired (410). Every object the driver sent is kept as it was received
//! ([`FakeCluster::received`]) for checking against the real schemas.

mod api;
mod kubelet;
mod portforward;
pub mod store;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use store::{Kind, Store};

/// An image the fake kubelet can run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeImage {
    /// Where the image holds the `sandlane-supervisor` program.
    pub supervisor_at: String,
    /// The host file bound there (read-only).
    pub supervisor_host: PathBuf,
}

/// Faults to inject, each for the next N occurrences.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Faults {
    /// Pod creates that find the pod created just before by someone else (the same
    /// object, as a racing replica would): answered 409.
    pub race_pod_creates: u32,
    /// Watch streams cut (the connection closed) right after their first event.
    pub cut_watches: u32,
    /// Watch requests answered 500.
    pub fail_watches: u32,
    /// Watches from a resource version answered with a 410 Gone error event.
    pub expire_watches: u32,
}

/// How often each fault was actually injected (positive controls for tests).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Injected {
    /// Pod creates answered 409 after a racing create.
    pub raced_pod_creates: u32,
    /// Watch streams cut.
    pub cut_watches: u32,
    /// Watch requests answered 500.
    pub failed_watches: u32,
    /// Watches answered 410.
    pub expired_watches: u32,
}

/// Time the fake spent serving, for telling the driver's own share of a call apart.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Busy {
    /// Requests served (watches counted until their headers are out).
    pub requests: u64,
    /// Time spent in request handlers, not counting the wait of a watch for its events.
    pub handling: Duration,
    /// Time from a pod's creation to its container running (the kubelet's start).
    pub pod_starts: Duration,
    /// Time from a pod's graceful deletion to its removal (the kubelet's stop).
    pub pod_stops: Duration,
}

pub(crate) struct Shared {
    store: Mutex<Store>,
    faults: Mutex<(Faults, Injected)>,
    received: Mutex<Vec<Value>>,
    busy: Mutex<Busy>,
    kubelet: kubelet::Kubelet,
}

impl Shared {
    fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes one occurrence of a fault; `true` when it is to be injected.
    fn take_fault(&self, pick: impl FnOnce(&mut Faults, &mut Injected) -> bool) -> bool {
        let mut guard = self.faults.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (faults, injected) = &mut *guard;
        pick(faults, injected)
    }

    fn add_busy(&self, edit: impl FnOnce(&mut Busy)) {
        edit(&mut self.busy.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
    }
}

/// The fake API server and kubelet. Dropping it stops the server and ends every pod.
pub struct FakeCluster {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    _root: tempfile::TempDir,
}

impl std::fmt::Debug for FakeCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeCluster").field("addr", &self.addr).finish_non_exhaustive()
    }
}

/// How the fake kubelet runs pods.
#[derive(Debug, Clone)]
pub struct KubeletConfig {
    /// The images it can run, by name.
    pub images: HashMap<String, FakeImage>,
    /// The bubblewrap program.
    pub bwrap: PathBuf,
    /// The cgroup (below each controller) holding one cgroup per pod.
    pub cgroup_parent: String,
}

impl FakeCluster {
    /// Starts the API server on a loopback port and the kubelet behind it.
    ///
    /// # Errors
    /// When the port or the kubelet's directory cannot be set up.
    pub async fn start(kubelet: KubeletConfig) -> std::io::Result<Self> {
        let root = tempfile::Builder::new().prefix("sandlane-fake-kubelet").tempdir()?;
        // The pods' unprivileged uids must reach their volumes below it.
        set_mode(root.path(), 0o711)?;
        let shared = Arc::new(Shared {
            store: Mutex::new(Store::new()),
            faults: Mutex::new((Faults::default(), Injected::default())),
            received: Mutex::new(Vec::new()),
            busy: Mutex::new(Busy::default()),
            kubelet: kubelet::Kubelet::new(kubelet, root.path().to_owned()),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        // As a real API server (Go sets TCP_NODELAY on every connection): a small frame is
        // sent at once, not held for the peer's delayed acknowledgement.
        let listener = axum::serve::ListenerExt::tap_io(listener, |tcp: &mut tokio::net::TcpStream| {
            let _ = tcp.set_nodelay(true);
        });
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let app = api::router(shared.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await;
        });
        Ok(Self { addr, shared, stop: Some(stop), _root: root })
    }

    /// The kubelet's directory on this host (every pod's volumes are below it).
    pub fn root(&self) -> &std::path::Path {
        self._root.path()
    }

    /// The API server's URL (`http://127.0.0.1:<port>`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Injects `faults` (replacing those not yet used).
    pub fn inject(&self, faults: Faults) {
        let mut guard = self.shared.faults.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        guard.0 = faults;
    }

    /// How often each fault was injected so far.
    pub fn injected(&self) -> Injected {
        self.shared.faults.lock().unwrap_or_else(std::sync::PoisonError::into_inner).1.clone()
    }

    /// Every object the driver created, as received (before the server filled anything
    /// in).
    pub fn received(&self) -> Vec<Value> {
        self.shared.received.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// The stored objects of a kind (every namespace).
    pub fn objects(&self, kind: Kind) -> Vec<Value> {
        self.shared.store().all(kind)
    }

    /// The time the fake spent serving so far.
    pub fn busy(&self) -> Busy {
        self.shared.busy.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Kills a running pod's container as an OOM kill or a node failure would (its
    /// supervisor and everything in it), leaving the pod `Failed`.
    pub async fn kill_pod(&self, namespace: &str, name: &str) {
        self.shared.kubelet.kill(namespace, name).await;
    }

    /// A TCP connection to `port` on a running pod's loopback, as the kubelet makes for a
    /// port-forward, but without the API server in between (benches compare the two).
    ///
    /// # Errors
    /// When the pod does not run or nothing listens.
    pub async fn connect_pod(
        &self,
        namespace: &str,
        name: &str,
        port: u16,
    ) -> std::io::Result<tokio::net::TcpStream> {
        self.shared.kubelet.connect(namespace, name, port).await
    }

    /// Ends every pod (as deleting them would) and waits for them to be gone.
    pub async fn shutdown(mut self) {
        self.end_all().await;
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    async fn end_all(&self) {
        let pods = self.shared.store().all(Kind::Pod);
        for pod in pods {
            let ns = pod["metadata"]["namespace"].as_str().unwrap_or_default().to_owned();
            let name = pod["metadata"]["name"].as_str().unwrap_or_default().to_owned();
            kubelet::delete_pod(&self.shared, &ns, &name, 0).await;
        }
    }
}

impl Drop for FakeCluster {
    fn drop(&mut self) {
        // Pods outlive their API server otherwise: end them on a thread of its own.
        let shared = self.shared.clone();
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
                    return;
                };
                rt.block_on(async {
                    let pods = shared.store().all(Kind::Pod);
                    for pod in pods {
                        let ns = pod["metadata"]["namespace"].as_str().unwrap_or_default().to_owned();
                        let name = pod["metadata"]["name"].as_str().unwrap_or_default().to_owned();
                        kubelet::delete_pod(&shared, &ns, &name, 0).await;
                    }
                });
            });
        });
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}
