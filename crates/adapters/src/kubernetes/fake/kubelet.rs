//! The fake kubelet: runs each pod's container as a local bubblewrap sandbox (the
//! bubblewrap driver's spawn code), reports its status to the store, ends it when the
//! pod is deleted, and keeps Secret volumes in step with their Secret.

use std::collections::HashMap;
use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

use super::store::{Kind, timestamp};
use super::{KubeletConfig, Shared};
use crate::bwrap::command::{SystemBind, resolve_binds};
use crate::bwrap::limits::CgroupMode;
use crate::bwrap::spawn::{DropTo, Launch, spawn};
use crate::bwrap::{DEFAULT_RO_BINDS, Limits};

/// The processes a pod may hold (a kubelet's `podPidsLimit`).
const POD_PIDS: u64 = 4096;

/// One running pod.
#[derive(Debug)]
struct Running {
    /// The host pid of the container's first process (the supervisor).
    init: i32,
    /// Resolved when bubblewrap has exited.
    exited: tokio::sync::watch::Receiver<bool>,
    /// Secret volumes: (secret name, the items to write, host directory).
    secrets: Vec<SecretVolume>,
    dir: PathBuf,
}

#[derive(Debug, Clone)]
struct SecretVolume {
    secret: String,
    items: Vec<(String, String, u32)>,
    dir: PathBuf,
    group: u32,
}

pub(super) struct Kubelet {
    config: KubeletConfig,
    root: PathBuf,
    binds: Vec<SystemBind>,
    cgroups: CgroupMode,
    pods: Mutex<HashMap<(String, String), Arc<Running>>>,
}

impl Kubelet {
    pub(super) fn new(config: KubeletConfig, root: PathBuf) -> Self {
        let cgroups = CgroupMode::detect(true, Path::new("/sys/fs/cgroup"), &config.cgroup_parent);
        let binds = resolve_binds(&DEFAULT_RO_BINDS.iter().map(PathBuf::from).collect::<Vec<_>>());
        Self { config, root, binds, cgroups, pods: Mutex::new(HashMap::new()) }
    }

    fn running(&self, namespace: &str, name: &str) -> Option<Arc<Running>> {
        self.pods.lock().ok()?.get(&(namespace.to_owned(), name.to_owned())).cloned()
    }

    /// Opens a TCP connection to `port` on the pod's loopback, inside its network
    /// namespace.
    pub(super) async fn connect(
        &self,
        namespace: &str,
        name: &str,
        port: u16,
    ) -> std::io::Result<tokio::net::TcpStream> {
        let running = self.running(namespace, name).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::NotFound, format!("pod {name} is not running"))
        })?;
        let netns = std::fs::File::open(format!("/proc/{}/ns/net", running.init))?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        // A thread of its own: it enters the pod's network namespace and is not reused.
        std::thread::spawn(move || {
            let _ = tx.send(connect_in(&netns, port));
        });
        let stream = rx.await.map_err(|_| std::io::Error::other("the connecting thread died"))??;
        stream.set_nonblocking(true)?;
        tokio::net::TcpStream::from_std(stream)
    }

    /// Rewrites the Secret volumes of every pod mounting `secret`.
    pub(super) fn secret_changed(&self, shared: &Shared, namespace: &str, secret: &str) {
        let Some(object) = shared.store().get(Kind::Secret, namespace, secret).cloned() else { return };
        let pods: Vec<Arc<Running>> = self
            .pods
            .lock()
            .map(|p| p.iter().filter(|((ns, _), _)| ns == namespace).map(|(_, r)| r.clone()).collect())
            .unwrap_or_default();
        for pod in pods {
            for volume in pod.secrets.iter().filter(|v| v.secret == secret) {
                if let Err(e) = write_secret_volume(volume, &object) {
                    tracing::warn!(error = %e, "fake kubelet: cannot refresh a secret volume");
                }
            }
        }
    }

    /// A claim was deleted: its data goes.
    pub(super) fn claim_removed(&self, claim: &Value) {
        if let Some(uid) = claim["metadata"]["uid"].as_str() {
            let _ = std::fs::remove_dir_all(self.root.join("volumes").join(uid));
        }
    }

    /// Kills a pod's container (as an OOM kill would).
    pub(super) async fn kill(&self, namespace: &str, name: &str) {
        if let Some(running) = self.running(namespace, name) {
            signal(running.init, libc::SIGKILL);
            let mut exited = running.exited.clone();
            let _ = tokio::time::timeout(Duration::from_secs(10), exited.wait_for(|e| *e)).await;
        }
    }
}

#[allow(unsafe_code)]
fn signal(pid: i32, sig: i32) {
    if pid > 1 {
        // SAFETY: kill has no memory effects; the pid is a pod's live init (reaped only by
        // its bubblewrap, which we wait for before forgetting it).
        unsafe { libc::kill(pid, sig) };
    }
}

#[allow(unsafe_code)]
fn connect_in(netns: &std::fs::File, port: u16) -> std::io::Result<std::net::TcpStream> {
    use std::os::fd::AsRawFd;
    // SAFETY: setns on a namespace descriptor this thread owns; it changes this thread's
    // network namespace only, and the thread ends right after.
    if unsafe { libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    std::net::TcpStream::connect(("127.0.0.1", port))
}

fn set_status(shared: &Shared, namespace: &str, name: &str, status: Value) {
    let _ = shared.store().update(Kind::Pod, namespace, name, |pod| pod["status"] = status);
}

fn waiting(reason: &str, message: &str) -> Value {
    json!({
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "True"}],
        "containerStatuses": [{
            "name": "sandbox", "ready": false, "restartCount": 0, "image": "", "imageID": "",
            "state": {"waiting": {"reason": reason, "message": message}},
        }],
    })
}

/// A new pod: the ephemeral-volume controller's claims, then the kubelet's start.
pub(super) fn pod_created(shared: &Arc<Shared>, pod: &Value) {
    let namespace = pod["metadata"]["namespace"].as_str().unwrap_or_default().to_owned();
    let name = pod["metadata"]["name"].as_str().unwrap_or_default().to_owned();
    let uid = pod["metadata"]["uid"].as_str().unwrap_or_default().to_owned();
    for volume in pod["spec"]["volumes"].as_array().into_iter().flatten() {
        let template = &volume["ephemeral"]["volumeClaimTemplate"];
        if template.is_object() {
            let claim_name = format!("{name}-{}", volume["name"].as_str().unwrap_or_default());
            let mut meta = template["metadata"].clone();
            if !meta.is_object() {
                meta = json!({});
            }
            meta["name"] = Value::String(claim_name);
            meta["ownerReferences"] = json!([{
                "apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid,
                "controller": true, "blockOwnerDeletion": true,
            }]);
            let claim = json!({"metadata": meta, "spec": template["spec"]});
            let _ = shared.store().create(Kind::Claim, &namespace, claim);
        }
    }
    let shared = shared.clone();
    tokio::spawn(async move {
        let started = Instant::now();
        if let Err(e) = start(&shared, &namespace, &name).await {
            tracing::debug!(pod = %name, error = %e, "fake kubelet: the pod did not start");
        }
        shared.add_busy(|b| b.pod_starts += started.elapsed());
    });
}

/// Parses a quantity (`1073741824`, `512Mi`, `1000m`, `2`) into base units times `scale`
/// (1000 for CPU millis, 1 for bytes).
fn quantity(q: &str, scale: u64) -> Option<u64> {
    let q = q.trim();
    if let Some(m) = q.strip_suffix('m') {
        return m.parse::<u64>().ok().map(|v| v * scale / 1000);
    }
    let units: [(&str, u64); 8] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ];
    for (suffix, mult) in units {
        if let Some(n) = q.strip_suffix(suffix) {
            return n.parse::<u64>().ok().map(|v| v * mult * scale);
        }
    }
    q.parse::<u64>().ok().map(|v| v * scale)
}

fn secret_value(shared: &Shared, namespace: &str, secret: &str, key: &str) -> Option<Vec<u8>> {
    let store = shared.store();
    let encoded = store.get(Kind::Secret, namespace, secret)?["data"][key].as_str()?.to_owned();
    base64::engine::general_purpose::STANDARD.decode(encoded).ok()
}

fn write_secret_volume(volume: &SecretVolume, secret: &Value) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    for (key, path, mode) in &volume.items {
        let Some(encoded) = secret["data"][key].as_str() else { continue };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map_err(|e| std::io::Error::other(format!("secret data {key}: {e}")))?;
        let tmp = volume.dir.join(format!(".{path}.new"));
        let mut file =
            std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(*mode).open(&tmp)?;
        file.write_all(&bytes)?;
        std::os::unix::fs::fchown(&file, Some(0), Some(volume.group))?;
        file.set_permissions(std::fs::Permissions::from_mode(*mode))?;
        drop(file);
        std::fs::rename(&tmp, volume.dir.join(path))?;
    }
    Ok(())
}

/// Starts a pod's container; the pod's status says how it went.
async fn start(shared: &Arc<Shared>, namespace: &str, name: &str) -> Result<(), String> {
    let kubelet = &shared.kubelet;
    let Some(pod) = shared.store().get(Kind::Pod, namespace, name).cloned() else {
        return Err("gone before it started".to_owned());
    };
    let spec = &pod["spec"];
    let container = &spec["containers"][0];
    let image_name = container["image"].as_str().unwrap_or_default();
    let Some(image) = kubelet.config.images.get(image_name).cloned() else {
        let message = format!("failed to pull image {image_name:?}: not found in the fake kubelet's images");
        set_status(shared, namespace, name, waiting("ErrImagePull", &message));
        return Err(message);
    };
    let id = |field: &str| {
        container["securityContext"][field].as_i64().or_else(|| spec["securityContext"][field].as_i64())
    };
    let uid = id("runAsUser").and_then(|u| u32::try_from(u).ok()).unwrap_or(65_534);
    let gid = id("runAsGroup").and_then(|u| u32::try_from(u).ok()).unwrap_or(uid);
    let fs_group =
        spec["securityContext"]["fsGroup"].as_i64().and_then(|u| u32::try_from(u).ok()).unwrap_or(gid);
    if uid == 0 && container["securityContext"]["runAsNonRoot"].as_bool() == Some(true) {
        let message = "container has runAsNonRoot and image will run as root";
        set_status(shared, namespace, name, waiting("CreateContainerConfigError", message));
        return Err(message.to_owned());
    }
    let pod_uid = pod["metadata"]["uid"].as_str().unwrap_or_default().to_owned();
    let dir = kubelet.root.join("pods").join(&pod_uid);
    std::fs::create_dir_all(&dir).map_err(|e| format!("pod dir: {e}"))?;
    // Searchable by the pod's uid whatever the process's umask (a server sets 077).
    super::set_mode(&kubelet.root.join("pods"), 0o711).map_err(|e| e.to_string())?;
    super::set_mode(&dir, 0o711).map_err(|e| e.to_string())?;
    let limits = &container["resources"]["limits"];
    let memory = limits["memory"].as_str().and_then(|q| quantity(q, 1)).unwrap_or(1 << 30);
    let cpu = limits["cpu"].as_str().and_then(|q| quantity(q, 1000)).unwrap_or(1000);

    // Volumes.
    let mut mounts: Vec<(String, PathBuf, bool)> = Vec::new();
    let mut tmpfs: Vec<(String, u64)> = Vec::new();
    let mut secrets = Vec::new();
    for mount in container["volumeMounts"].as_array().into_iter().flatten() {
        let vol_name = mount["name"].as_str().unwrap_or_default();
        let at = mount["mountPath"].as_str().unwrap_or_default().to_owned();
        let read_only = mount["readOnly"].as_bool().unwrap_or(false);
        let Some(volume) = spec["volumes"].as_array().into_iter().flatten().find(|v| v["name"] == vol_name)
        else {
            let message = format!("volume {vol_name:?} is not defined");
            set_status(shared, namespace, name, waiting("CreateContainerConfigError", &message));
            return Err(message);
        };
        let claim_name = if let Some(c) = volume["persistentVolumeClaim"]["claimName"].as_str() {
            Some(c.to_owned())
        } else if volume["ephemeral"].is_object() {
            Some(format!("{name}-{vol_name}"))
        } else {
            None
        };
        if let Some(claim_name) = claim_name {
            let claim = wait_for(shared, Kind::Claim, namespace, &claim_name).await?;
            let claim_uid = claim["metadata"]["uid"].as_str().unwrap_or_default();
            let host = kubelet.root.join("volumes").join(claim_uid);
            if !host.exists() {
                std::fs::create_dir_all(&host).map_err(|e| format!("volume: {e}"))?;
                std::os::unix::fs::chown(&host, Some(uid), Some(fs_group))
                    .map_err(|e| format!("volume: {e}"))?;
                super::set_mode(&host, 0o2770).map_err(|e| e.to_string())?;
                super::set_mode(&kubelet.root.join("volumes"), 0o711).map_err(|e| e.to_string())?;
            }
            mounts.push((at, host, read_only));
        } else if let Some(secret) = volume["secret"]["secretName"].as_str() {
            let object = wait_for(shared, Kind::Secret, namespace, secret).await?;
            let default_mode =
                volume["secret"]["defaultMode"].as_u64().and_then(|m| u32::try_from(m).ok()).unwrap_or(0o644);
            let items: Vec<(String, String, u32)> = match volume["secret"]["items"].as_array() {
                Some(items) => items
                    .iter()
                    .map(|i| {
                        let mode =
                            i["mode"].as_u64().and_then(|m| u32::try_from(m).ok()).unwrap_or(default_mode);
                        (
                            i["key"].as_str().unwrap_or_default().to_owned(),
                            i["path"].as_str().unwrap_or_default().to_owned(),
                            mode,
                        )
                    })
                    .collect(),
                None => object["data"]
                    .as_object()
                    .map(|d| d.keys().map(|k| (k.clone(), k.clone(), default_mode)).collect())
                    .unwrap_or_default(),
            };
            let host = dir.join("volumes").join(vol_name);
            std::fs::create_dir_all(&host).map_err(|e| format!("secret volume: {e}"))?;
            super::set_mode(&dir.join("volumes"), 0o711).map_err(|e| e.to_string())?;
            std::os::unix::fs::chown(&host, Some(0), Some(fs_group)).map_err(|e| e.to_string())?;
            super::set_mode(&host, 0o750).map_err(|e| e.to_string())?;
            let volume =
                SecretVolume { secret: secret.to_owned(), items, dir: host.clone(), group: fs_group };
            write_secret_volume(&volume, &object).map_err(|e| format!("secret volume: {e}"))?;
            secrets.push(volume);
            mounts.push((at, host, true));
        } else if volume["emptyDir"].is_object() {
            let size =
                volume["emptyDir"]["sizeLimit"].as_str().and_then(|q| quantity(q, 1)).unwrap_or(64 << 20);
            tmpfs.push((at, size));
        } else {
            let message = format!("volume {vol_name:?}: the fake kubelet does not serve its type");
            set_status(shared, namespace, name, waiting("CreateContainerConfigError", &message));
            return Err(message);
        }
    }

    // Environment.
    let mut env: Vec<(String, String)> = Vec::new();
    for var in container["env"].as_array().into_iter().flatten() {
        let key = var["name"].as_str().unwrap_or_default().to_owned();
        if let Some(v) = var["value"].as_str() {
            env.push((key, v.to_owned()));
        } else if let Some(r) = var["valueFrom"]["secretKeyRef"].as_object() {
            let secret = r.get("name").and_then(Value::as_str).unwrap_or_default();
            let item = r.get("key").and_then(Value::as_str).unwrap_or_default();
            let Some(value) = secret_value(shared, namespace, secret, item) else {
                let message = format!("couldn't find key {item} in Secret {namespace}/{secret}");
                set_status(shared, namespace, name, waiting("CreateContainerConfigError", &message));
                return Err(message);
            };
            env.push((key, String::from_utf8_lossy(&value).into_owned()));
        }
    }

    // The sandbox.
    let command: Vec<String> = container["command"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c.as_str().map(str::to_owned))
        .collect();
    let mut args: Vec<OsString> = Vec::new();
    let mut push = |items: &[&str]| args.extend(items.iter().map(OsString::from));
    let (uid_s, gid_s) = (uid.to_string(), gid.to_string());
    push(&[
        "--unshare-all",
        "--unshare-user",
        "--uid",
        &uid_s,
        "--gid",
        &gid_s,
        "--cap-drop",
        "ALL",
        "--new-session",
        "--as-pid-1",
        "--hostname",
        name,
        "--clearenv",
        "--disable-userns",
    ]);
    for bind in &kubelet.binds {
        match bind {
            SystemBind::ReadOnly(p) => args.extend(["--ro-bind".into(), p.into(), p.into()]),
            SystemBind::Symlink { target, at } => args.extend(["--symlink".into(), target.into(), at.into()]),
        }
    }
    args.extend([
        "--ro-bind".into(),
        image.supervisor_host.clone().into(),
        image.supervisor_at.clone().into(),
    ]);
    args.extend(["--proc", "/proc", "--dev", "/dev"].map(OsString::from));
    for (at, size) in &tmpfs {
        args.extend(["--size".into(), size.to_string().into(), "--tmpfs".into(), at.into()]);
    }
    for (at, host, read_only) in &mounts {
        args.extend([if *read_only { "--ro-bind" } else { "--bind" }.into(), host.into(), at.into()]);
    }
    for (k, v) in &env {
        args.extend(["--setenv".into(), k.into(), v.into()]);
    }
    if let Some(wd) = container["workingDir"].as_str() {
        args.extend(["--chdir".into(), wd.into()]);
    }
    args.extend(["--remount-ro", "/dev", "--remount-ro", "/", "--"].map(OsString::from));
    args.extend(command.iter().map(OsString::from));

    let log_path = dir.join("log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| format!("log: {e}"))?;
    let cgroup_limits =
        Limits { memory_bytes: memory, cpu_millis: cpu, processes: POD_PIDS, ..Limits::default() };
    let cgroup = kubelet.cgroups.create(&pod_uid, &cgroup_limits).map_err(|e| format!("cgroup: {e}"))?;
    let launch = Launch {
        program: &kubelet.config.bwrap,
        args,
        listener: None,
        log,
        rlimits: Vec::new(),
        drop_to: DropTo::Now(Some(uid)),
        cgroup,
        workspace: None,
    };
    let mut child = match spawn(launch) {
        Ok(c) => c,
        Err(e) => {
            let message = format!("cannot start the container: {e}");
            set_status(shared, namespace, name, waiting("RunContainerError", &message));
            return Err(message);
        }
    };
    let bwrap_pid = child.id().and_then(|p| i32::try_from(p).ok()).unwrap_or(0);
    // The container's first process is bubblewrap's child.
    let mut init = 0;
    for _ in 0..400 {
        if let Some(pid) = first_child(bwrap_pid) {
            init = pid;
            break;
        }
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (exited_tx, exited) = tokio::sync::watch::channel(false);
    let running = Arc::new(Running { init, exited, secrets, dir: dir.clone() });
    if let Ok(mut pods) = kubelet.pods.lock() {
        pods.insert((namespace.to_owned(), name.to_owned()), running);
    }
    let started_at = timestamp();
    if init != 0 {
        set_status(
            shared,
            namespace,
            name,
            json!({
                "phase": "Running",
                "hostIP": "127.0.0.1", "podIP": "127.0.0.1", "startTime": started_at,
                "conditions": [
                    {"type": "PodScheduled", "status": "True"},
                    {"type": "Initialized", "status": "True"},
                    {"type": "ContainersReady", "status": "True"},
                    {"type": "Ready", "status": "True"},
                ],
                "containerStatuses": [{
                    "name": "sandbox", "ready": true, "started": true, "restartCount": 0,
                    "image": image_name, "imageID": format!("fake://{image_name}"),
                    "state": {"running": {"startedAt": started_at}},
                }],
            }),
        );
    }
    let (shared2, ns, n) = (shared.clone(), namespace.to_owned(), name.to_owned());
    tokio::spawn(async move {
        let status = child.wait().await;
        let code = status.as_ref().ok().and_then(std::process::ExitStatus::code).unwrap_or(137);
        let _ = exited_tx.send(true);
        // A pod being deleted is removed by its deletion; others are Failed or Succeeded.
        let deleting = shared2
            .store()
            .get(Kind::Pod, &ns, &n)
            .is_none_or(|p| !p["metadata"]["deletionTimestamp"].is_null());
        if !deleting {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            let tail: String = log
                .lines()
                .rev()
                .take(5)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n");
            set_status(
                &shared2,
                &ns,
                &n,
                json!({
                    "phase": if code == 0 { "Succeeded" } else { "Failed" },
                    "conditions": [{"type": "Ready", "status": "False"}],
                    "containerStatuses": [{
                        "name": "sandbox", "ready": false, "started": false, "restartCount": 0,
                        "image": "", "imageID": "",
                        "state": {"terminated": {
                            "exitCode": code, "reason": if code == 0 { "Completed" } else { "Error" },
                            "message": tail, "startedAt": started_at, "finishedAt": timestamp(),
                        }},
                    }],
                }),
            );
            shared2.kubelet.cgroups.kill_and_remove(&pod_uid).await;
        }
    });
    if init == 0 {
        return Err("the container exited at once".to_owned());
    }
    Ok(())
}

/// The first child of `pid`, if it has one.
fn first_child(pid: i32) -> Option<i32> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// Waits (briefly, as a kubelet retries a mount) for an object the pod needs.
async fn wait_for(shared: &Shared, kind: Kind, namespace: &str, name: &str) -> Result<Value, String> {
    for _ in 0..600 {
        if let Some(o) = shared.store().get(kind, namespace, name).cloned() {
            return Ok(o);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!("{} {name} never appeared", kind.kind()))
}

/// Ends a pod (TERM to its first process, then after `grace` seconds its whole cgroup)
/// and removes it with what it owns.
pub(super) async fn delete_pod(shared: &Arc<Shared>, namespace: &str, name: &str, grace: i64) {
    let started = Instant::now();
    let running =
        shared.kubelet.pods.lock().ok().and_then(|mut p| p.remove(&(namespace.to_owned(), name.to_owned())));
    let uid = shared
        .store()
        .get(Kind::Pod, namespace, name)
        .and_then(|p| p["metadata"]["uid"].as_str().map(str::to_owned));
    if let Some(running) = &running {
        signal(running.init, libc::SIGTERM);
        let mut exited = running.exited.clone();
        let grace = Duration::from_secs(u64::try_from(grace).unwrap_or(0));
        if tokio::time::timeout(grace, exited.wait_for(|e| *e)).await.is_err() {
            signal(running.init, libc::SIGKILL);
        }
        let _ = tokio::time::timeout(Duration::from_secs(10), exited.wait_for(|e| *e)).await;
    }
    if let Some(uid) = &uid {
        shared.kubelet.cgroups.kill_and_remove(uid).await;
        let _ = std::fs::remove_dir_all(shared.kubelet.root.join("pods").join(uid));
    }
    if let Some(running) = running {
        let _ = std::fs::remove_dir_all(&running.dir);
    }
    let removed = shared.store().remove(Kind::Pod, namespace, name);
    if let (Ok(_), Some(uid)) = (removed, uid) {
        // The garbage collector: what the pod owned goes with it.
        let owned = shared.store().owned_by(&uid);
        for (kind, ns, n) in owned {
            let gone = shared.store().remove(kind, &ns, &n);
            if let (Ok(claim), Kind::Claim) = (gone, kind) {
                shared.kubelet.claim_removed(&claim);
            }
        }
    }
    shared.add_busy(|b| b.pod_stops += started.elapsed());
}
