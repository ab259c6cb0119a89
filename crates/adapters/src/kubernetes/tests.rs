//! The Kubernetes driver against the fake API server and kubelet
//! ([`super::fake`]): the shared driver contracts, a restarted server finding its pods
//! again, 409s read back, dropped and expired watches resumed, fast failure on image
//! pulls, the objects against the real Kubernetes schemas (`kubernetes-validate`), and
//! `kubectl` listing them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use domain::{CallerClass, Durability, SandboxToken};
use ports::driver::{DriverError, ProvisionSpec, SandboxDriver};
use serde_json::Value;

use super::fake::store::Kind;
use super::fake::{FakeCluster, FakeImage, Faults, KubeletConfig};
use super::{KubeConfig, KubeConnection, KubeDriver, KubeLimits, PodChannel, objects};
use crate::driver_contract::{self, run, shown, spec_for};

const NAMESPACE: &str = "sandboxes";
const IMAGE: &str = "registry.example/sandlane-tools:1";
const SUPERVISOR_AT: &str = "/opt/sandlane/sandlane-supervisor";

fn limits() -> KubeLimits {
    KubeLimits {
        cpu_millis: 1000,
        memory_bytes: 256 << 20,
        ephemeral_storage_bytes: 1 << 30,
        processes: 64,
        open_files: 256,
        file_size_bytes: 16 << 20,
        cpu_secs: 10,
    }
}

async fn cluster() -> FakeCluster {
    let supervisor = crate::supervisor_link::locate_for_tests().expect("the sandlane-supervisor program");
    let images = HashMap::from([(
        IMAGE.to_owned(),
        FakeImage { supervisor_at: SUPERVISOR_AT.to_owned(), supervisor_host: supervisor },
    )]);
    FakeCluster::start(KubeletConfig {
        images,
        bwrap: PathBuf::from("bwrap"),
        cgroup_parent: "sandlane-fake-kubelet".to_owned(),
    })
    .await
    .expect("the fake API server starts")
}

fn config(fake: &FakeCluster) -> KubeConfig {
    let connection = KubeConnection::Explicit { url: fake.url(), token_file: None, ca_file: None };
    let mut config = KubeConfig::new(connection, NAMESPACE, IMAGE);
    config.supervisor_path = SUPERVISOR_AT.to_owned();
    config.limits = limits();
    config.tmp_size_bytes = 32 << 20;
    config.start_timeout = Duration::from_secs(30);
    config.delete_timeout = Duration::from_secs(30);
    config.runtime_class = Some("gvisor".to_owned());
    config.node_selector = [("sandlane.dev/pool".to_owned(), "sandboxes".to_owned())].into();
    config.tolerations = vec![k8s_openapi::api::core::v1::Toleration {
        key: Some("sandlane.dev/sandboxes".to_owned()),
        operator: Some("Exists".to_owned()),
        effect: Some("NoSchedule".to_owned()),
        ..Default::default()
    }];
    config
}

fn driver(fake: &FakeCluster) -> KubeDriver {
    KubeDriver::new(config(fake)).expect("valid settings")
}

fn org() -> String {
    let id = driver_contract::new_sandbox_id();
    format!("org-{}", id.as_str()[4..12].to_ascii_lowercase())
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_driver_contract() {
    let fake = cluster().await;
    let driver = driver(&fake);
    let l = limits();
    let expected = driver_contract::ExpectedLimits {
        open_files: l.open_files,
        processes: l.processes,
        file_size_bytes: l.file_size_bytes,
    };
    driver_contract::driver_contract(&driver, expected).await;
    assert!(fake.objects(Kind::Pod).is_empty(), "every pod is gone");
    assert!(fake.objects(Kind::Secret).is_empty(), "every secret is gone");
    assert!(fake.objects(Kind::NetworkPolicy).is_empty(), "every network policy is gone");
    let claims: Vec<Value> = fake.objects(Kind::Claim);
    assert!(
        claims.iter().all(|c| c["metadata"]["labels"][objects::LABEL_DURABILITY] == "durable"),
        "only durable claims stay: {claims:?}"
    );
    assert_eq!(claims.len(), 1, "the durable workspace's claim stays: {claims:?}");
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_resident_contract() {
    let fake = cluster().await;
    let driver: Arc<dyn SandboxDriver> = Arc::new(driver(&fake));
    let limits = driver_contract::ContractLimits { processes: 64, memory_mib: 256 };
    driver_contract::resident_contract(driver, limits).await;
    fake.shutdown().await;
}

/// The egress proxy through the port-forward: the same contract as bubblewrap and
/// containers (the fake kubelet's pods are bubblewrap sandboxes, with the host's curl).
/// Brokered secrets in a pod: its CA reaches it through the Secret (as the token does,
/// the key not mounted), and curl with nothing but the pod's environment reaches a TLS
/// server on the host's loopback that sees the injected header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_brokered_contract() {
    let upstream = driver_contract::BrokeredUpstream::start().await;
    let fake = cluster().await;
    let mut config = config(&fake);
    config.upstream_ca_file = Some(upstream.ca_file.path().to_path_buf());
    let driver = Arc::new(KubeDriver::new(config).expect("valid settings"));
    let spec = spec_for(&org(), "brokered", "user-1", CallerClass::User, Durability::Ephemeral, "tok-b");
    let clients = driver_contract::BrokeredClients { curl: true, python: true, git: true };
    driver_contract::brokered_contract(driver.clone(), spec, &upstream, clients).await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_egress_contract() {
    let fake = cluster().await;
    let driver = Arc::new(driver(&fake));
    let spec = spec_for(&org(), "egress", "user-1", CallerClass::User, Durability::Ephemeral, "tok-e");
    let fetch = "curl -sS --max-time 10";
    let direct = "direct() { curl -sS --noproxy '*' --max-time 10 http://127.0.0.1:$1/direct; }; direct";
    // A port-forward carries no descriptor: every proxy connection was relayed in frames.
    let path = async |id: &domain::SandboxId| {
        let socket = crate::supervisor_link::ops::Host::socket(driver.as_ref(), id).await.unwrap();
        let counts =
            crate::supervisor_link::client::egress_counts(&socket, std::time::Duration::from_secs(5))
                .await
                .unwrap();
        assert!(counts.taken == 0 && counts.tunnelled >= 4, "{counts:?}");
    };
    driver_contract::egress_contract(driver.clone(), spec, fetch, direct, true, path).await;
    fake.shutdown().await;
}

/// Streaming exec, background processes, files and archives through the port-forward,
/// unchanged: the same contract as bubblewrap and containers. No path may reach the
/// node's pod directories (the fake kubelet's, on this host).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_streams_contract() {
    let fake = cluster().await;
    let driver = driver(&fake);
    let limits = driver_contract::StreamsLimits {
        output_cap: driver.config().output_cap_bytes as u64,
        file_size_bytes: driver.config().limits.file_size_bytes,
        host_dir: fake.root().to_owned(),
    };
    driver_contract::streams_contract(Arc::new(driver), limits).await;
    assert!(fake.objects(Kind::Pod).is_empty(), "the sandbox's pod is gone");
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_finds_its_live_pods_again() {
    let fake = cluster().await;
    let spec = spec_for(&org(), "restart", "user-1", CallerClass::User, Durability::Durable, "tok-1");
    let id = spec.sandbox_id().clone();
    {
        let first = driver(&fake);
        first.provision(&spec).await.expect("provision");
        let out = run(&first, &id, &["sh", "-c", "echo before > /tmp/alive; sleep 600 &"], b"", 10_000).await;
        assert_eq!(out.exit_code, 0, "{}", shown(&out));
        // The first server goes away with everything it remembered.
    }
    let second = driver(&fake);
    assert!(second.list().await.unwrap().contains(&id), "the pod is listed by its labels");
    let out =
        run(&second, &id, &["sh", "-c", "cat /tmp/alive; echo $SANDLANE_SANDBOX_ID"], b"", 10_000).await;
    assert_eq!(text(&out.stdout), format!("before\n{id}\n"), "the same live sandbox: {}", shown(&out));
    second.refresh_credential(&id, &SandboxToken::new("tok-2"), &spec.environment).await.expect("refresh");
    let out = run(&second, &id, &["cat", "/run/sandlane/token"], b"", 10_000).await;
    assert_eq!(text(&out.stdout), "tok-2");
    // The same provision again (a retried ensure after the restart) keeps the pod.
    second.provision(&spec).await.expect("provision again");
    let out = run(&second, &id, &["cat", "/tmp/alive"], b"", 10_000).await;
    assert_eq!(text(&out.stdout), "before\n", "the pod was kept");
    second.deprovision(&id).await.expect("deprovision");
    assert!(!second.list().await.unwrap().contains(&id));
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflict_is_read_back_and_checked() {
    let fake = cluster().await;
    let driver = driver(&fake);
    let o = org();

    // A pod created by another replica between our read and our create: 409, read back,
    // same sandbox and epoch, so it is used.
    fake.inject(Faults { race_pod_creates: 1, ..Faults::default() });
    let spec = spec_for(&o, "race", "svc-1", CallerClass::Service, Durability::Ephemeral, "tok-r");
    driver.provision(&spec).await.expect("provision through a 409");
    assert_eq!(fake.injected().raced_pod_creates, 1, "positive control: the 409 happened");
    let out = run(&driver, spec.sandbox_id(), &["cat", "/run/sandlane/token"], b"", 10_000).await;
    assert_eq!(text(&out.stdout), "tok-r");
    driver.deprovision(spec.sandbox_id()).await.unwrap();

    // A secret an earlier, crashed attempt left under the sandbox's name: 409, read back,
    // it is this sandbox's, so it is taken over: this attempt's token, the key it holds.
    let spec = spec_for(&o, "left", "svc-1", CallerClass::Service, Durability::Ephemeral, "tok-new");
    let crashed = KubeDriver::new(config(&fake)).unwrap();
    let plan = objects::SandboxPlan {
        sandbox: spec.sandbox_id(),
        key: &spec.key,
        durability: spec.durability,
        environment: &spec.environment,
        epoch: spec.epoch,
        workspace: objects::workspace_id("sandlane", spec.sandbox_id(), &spec.key, spec.durability),
        uid: 1_900_000_001,
        workspace_bytes: None,
    };
    let old_key = supervisor::gate::ChannelKey::generate().unwrap();
    let left = objects::secret(crashed.config(), &plan, "tok-old", &old_key);
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> = crashed.api().await.unwrap();
    secrets.create(&kube::api::PostParams::default(), &left).await.unwrap();
    driver.provision(&spec).await.expect("provision over a left secret");
    let out = run(&driver, spec.sandbox_id(), &["cat", "/run/sandlane/token"], b"", 10_000).await;
    assert_eq!(text(&out.stdout), "tok-new");
    driver.deprovision(spec.sandbox_id()).await.unwrap();

    // A secret of another sandbox under the name: 409, read back, not ours: refused,
    // and nothing of the attempt is left running.
    let spec = spec_for(&o, "foreign", "svc-1", CallerClass::Service, Durability::Ephemeral, "tok-f");
    let other = driver_contract::new_sandbox_id();
    let mut foreign = objects::secret(
        crashed.config(),
        &objects::SandboxPlan { sandbox: &other, ..plan.clone() },
        "x",
        &old_key,
    );
    foreign.metadata.name = Some(objects::object_name("sandlane", spec.sandbox_id()));
    secrets.create(&kube::api::PostParams::default(), &foreign).await.unwrap();
    let err = driver.provision(&spec).await.expect_err("a foreign secret is not taken over");
    assert!(err.to_string().contains("is not sandbox"), "{err}");
    assert!(
        fake.objects(Kind::Pod)
            .iter()
            .all(|p| p["metadata"]["labels"][objects::LABEL_SANDBOX] != spec.sandbox_id().as_str()),
        "no pod was made for it"
    );
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_refused_and_expired_watches_are_resumed() {
    let fake = cluster().await;
    let driver = driver(&fake);
    fake.inject(Faults { cut_watches: 3, fail_watches: 1, expire_watches: 2, ..Faults::default() });
    // How many watches a provision and a deprovision open depends on timing (a pod already
    // running, or already gone, at the watcher's first list needs none; a loaded machine
    // makes that likelier), so sandboxes come and go until every fault has been met, at
    // most eight; each must come and go through whatever faults it meets.
    for round in 0..8 {
        let session = format!("watch-{round}");
        let spec = spec_for(&org(), &session, "svc-1", CallerClass::Service, Durability::Ephemeral, "tok-w");
        driver.provision(&spec).await.expect("provision through dropped watches");
        let out = run(&driver, spec.sandbox_id(), &["echo", "up"], b"", 10_000).await;
        assert_eq!(text(&out.stdout), "up\n");
        driver.deprovision(spec.sandbox_id()).await.expect("deprovision through dropped watches");
        let i = fake.injected();
        if i.cut_watches >= 1 && i.failed_watches == 1 && i.expired_watches >= 1 {
            break;
        }
    }
    let injected = fake.injected();
    assert!(injected.cut_watches >= 1, "positive control: a watch was cut: {injected:?}");
    assert_eq!(injected.failed_watches, 1, "positive control: a watch was refused: {injected:?}");
    assert!(injected.expired_watches >= 1, "positive control: a watch was answered 410: {injected:?}");
    assert!(fake.objects(Kind::Pod).is_empty(), "the pod is gone");
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_that_cannot_be_pulled_fails_at_once_with_the_reason() {
    let fake = cluster().await;
    let mut config = config(&fake);
    config.image = "registry.example/missing:404".to_owned();
    config.start_timeout = Duration::from_secs(60);
    let driver = KubeDriver::new(config).unwrap();
    let spec = spec_for(&org(), "pull", "svc-1", CallerClass::Service, Durability::Ephemeral, "tok-p");
    let started = Instant::now();
    let err = driver.provision(&spec).await.expect_err("no image, no sandbox");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "failed fast, not at the timeout: {:?}",
        started.elapsed()
    );
    assert!(matches!(err, DriverError::Failed(_)), "{err:?}");
    assert!(err.to_string().contains("ErrImagePull"), "the reason is in the message: {err}");
    assert!(driver.list().await.unwrap().is_empty(), "nothing is left");
    assert!(fake.objects(Kind::Claim).is_empty(), "nor a claim");
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_that_exits_at_start_fails_at_once_with_its_reason() {
    let fake = cluster().await;
    let mut config = config(&fake);
    // The image has no program there: the container ends at once.
    config.supervisor_path = "/opt/sandlane/not-there".to_owned();
    config.start_timeout = Duration::from_secs(60);
    let driver = KubeDriver::new(config).unwrap();
    let spec = spec_for(&org(), "crash", "svc-1", CallerClass::Service, Durability::Ephemeral, "tok-c");
    let started = Instant::now();
    let err = driver.provision(&spec).await.expect_err("a container that ends is no sandbox");
    assert!(started.elapsed() < Duration::from_secs(20), "failed fast: {:?}", started.elapsed());
    let text = err.to_string();
    assert!(
        text.contains("ended (exit code") && text.contains("not-there"),
        "the reason is in the message: {text}"
    );
    assert!(driver.list().await.unwrap().is_empty(), "nothing is left");
    fake.shutdown().await;
}

/// The channel carries the protocol, not a list of operations: a request this
/// supervisor does not know still reaches it and is answered `unsupported`, and one it
/// serves (a file read, added to the protocol after the channel was written) is
/// answered by the supervisor itself, so the operations the protocol grows reach pods
/// unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_protocol_operation_passes_through_the_port_forward() {
    use supervisor::protocol::{Frame, FrameType, Reply, read_frame, write_frame};
    let fake = cluster().await;
    let driver = driver(&fake);
    let spec = spec_for(&org(), "ops", "svc-1", CallerClass::Service, Durability::Ephemeral, "tok-o");
    let id = spec.sandbox_id().clone();
    driver.provision(&spec).await.unwrap();
    let known = driver.known(&id).await.unwrap();
    let channel = driver.channel(&id, &known.key).await.unwrap();
    let (hello, running) =
        crate::supervisor_link::client::ping(&channel, Duration::from_secs(10)).await.unwrap();
    assert!(hello.features.iter().any(|f| f == "exec"), "{hello:?}");
    assert_eq!(running, 0);
    let raw = |json: &[u8]| Frame { kind: FrameType::Control, payload: json.to_vec() };
    let (mut stream, _) =
        crate::supervisor_link::client::connect(&channel, Duration::from_secs(10)).await.unwrap();
    write_frame(&mut stream, &raw(br#"{"type":"no_such_operation_yet","x":1}"#)).await.unwrap();
    let reply = read_frame(&mut stream).await.unwrap().expect("an answer").parse::<Reply>().unwrap();
    assert!(matches!(&reply, Reply::Error { code, .. } if code == "unsupported"), "{reply:?}");
    let (mut stream, _) =
        crate::supervisor_link::client::connect(&channel, Duration::from_secs(10)).await.unwrap();
    write_frame(&mut stream, &raw(br#"{"type":"file_read","path":"/workspace/x"}"#)).await.unwrap();
    let reply = read_frame(&mut stream).await.unwrap().expect("an answer").parse::<Reply>().unwrap();
    assert!(
        matches!(&reply, Reply::Error { code, message } if code == "not_found" && message.contains("/workspace/x")),
        "the supervisor in the pod looked for the file: {reply:?}"
    );
    // A wrong channel key gets no hello at all.
    let wrong = PodChannel { key: supervisor::gate::ChannelKey::generate().unwrap(), ..channel };
    assert!(crate::supervisor_link::client::connect(&wrong, Duration::from_secs(5)).await.is_err());
    driver.deprovision(&id).await.unwrap();
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_died_is_not_found_and_cleaned_up() {
    let fake = cluster().await;
    let driver = driver(&fake);
    let spec = spec_for(&org(), "dies", "svc-1", CallerClass::Service, Durability::Ephemeral, "tok-d");
    let id = spec.sandbox_id().clone();
    driver.provision(&spec).await.unwrap();
    assert_eq!(
        text(&run(&driver, &id, &["echo", "ok"], b"", 10_000).await.stdout),
        "ok\n",
        "positive control"
    );
    fake.kill_pod(NAMESPACE, &objects::object_name("sandlane", &id)).await;
    let request = domain::ExecRequest::new(vec!["true".into()], vec![], None).unwrap();
    let err = driver.exec(&id, &request).await.expect_err("the sandbox is gone");
    assert!(matches!(err, DriverError::NotFound(_)), "{err:?}");
    assert!(!driver.list().await.unwrap().contains(&id), "what was left is removed");
    // A provision of a new sandbox for the key works (the ensure's repair).
    let again =
        spec_for(spec.key.org().as_str(), "dies", "svc-1", CallerClass::Service, Durability::Ephemeral, "t");
    driver.provision(&again).await.expect("provision afresh");
    driver.deprovision(again.sandbox_id()).await.unwrap();
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_cannot_reach_the_supervisor_or_its_key() {
    let fake = cluster().await;
    let driver = driver(&fake);
    let spec = spec_for(&org(), "gate", "svc-1", CallerClass::Service, Durability::Ephemeral, "tok-g");
    let id = spec.sandbox_id().clone();
    driver.provision(&spec).await.unwrap();
    // The port is reachable from inside (positive control), but a connection without the
    // key gets no answer to a hello and is closed.
    let probe = r#"
import socket, struct, json
s = socket.create_connection(("127.0.0.1", 7070), timeout=15)
hello = json.dumps({"type": "hello", "version": 1}).encode()
s.sendall(b"0" * 64 + struct.pack(">IB", len(hello), 1) + hello)
print("connected")
try:
    n = len(s.recv(100))
except ConnectionResetError:
    n = 0
print("answer", n)
"#;
    let out = run(&driver, &id, &["python3", "-c", probe], b"", 20_000).await;
    assert_eq!(text(&out.stdout), "connected\nanswer 0\n", "{}", shown(&out));
    // The key is in no command's environment, and the supervisor's is unreadable.
    let out = run(&driver, &id, &["sh", "-c", "cat /proc/1/environ; env"], b"", 10_000).await;
    assert!(!text(&out.stdout).contains("SANDLANE_CHANNEL_KEY"), "{}", shown(&out));
    assert!(text(&out.stderr).contains("Permission denied"), "{}", shown(&out));
    // The token directory holds the token and the CA's certificates (not the channel key,
    // not the CA's key).
    let out = run(&driver, &id, &["ls", "-A", "/run/sandlane"], b"", 10_000).await;
    assert_eq!(text(&out.stdout), "ca-bundle.pem\nca.pem\ntoken\n");
    driver.deprovision(&id).await.unwrap();
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_epoch_is_fenced_and_a_newer_one_replaces_the_pod() {
    let fake = cluster().await;
    let driver = driver(&fake);
    let mut spec = spec_for(&org(), "fence", "user-1", CallerClass::User, Durability::Durable, "tok-e");
    spec.epoch = 5;
    let id = spec.sandbox_id().clone();
    driver.provision(&spec).await.unwrap();
    run(&driver, &id, &["sh", "-c", "echo kept > /workspace/f; echo gone > /tmp/f"], b"", 10_000).await;
    let older = ProvisionSpec { epoch: 4, ..spec.clone() };
    let err = driver.provision(&older).await.expect_err("fenced");
    assert!(err.to_string().contains("fenced"), "{err}");
    let newer = ProvisionSpec { epoch: 6, ..spec.clone() };
    driver.provision(&newer).await.expect("a newer claim replaces the pod");
    let out =
        run(&driver, &id, &["sh", "-c", "cat /workspace/f; cat /tmp/f 2>/dev/null || echo new"], b"", 10_000)
            .await;
    assert_eq!(
        text(&out.stdout),
        "kept\nnew\n",
        "the workspace stays, the processes are new: {}",
        shown(&out)
    );
    driver.deprovision(&id).await.unwrap();
    fake.shutdown().await;
}

/// The pod carries every protection the driver promises.
#[test]
fn the_pod_is_hardened() {
    let connection =
        KubeConnection::Explicit { url: "http://127.0.0.1:1".into(), token_file: None, ca_file: None };
    let mut config = KubeConfig::new(connection, NAMESPACE, IMAGE);
    config.runtime_class = Some("kata".into());
    let spec = spec_for("acme", "s1", "user-1", CallerClass::User, Durability::Durable, "tok-secret");
    let plan = objects::SandboxPlan {
        sandbox: spec.sandbox_id(),
        key: &spec.key,
        durability: spec.durability,
        environment: &spec.environment,
        epoch: 3,
        workspace: objects::workspace_id("sandlane", spec.sandbox_id(), &spec.key, spec.durability),
        uid: 1_900_000_123,
        workspace_bytes: Some(64 << 20),
    };
    let pod = serde_json::to_value(objects::pod(&config, &plan).unwrap()).unwrap();
    let s = &pod["spec"];
    assert_eq!(s["automountServiceAccountToken"], false);
    assert_eq!(s["enableServiceLinks"], false);
    assert_eq!(s["runtimeClassName"], "kata");
    assert_eq!(s["securityContext"]["runAsNonRoot"], true);
    assert_eq!(s["securityContext"]["runAsUser"], 1_900_000_123);
    assert_eq!(s["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
    let c = &s["containers"][0];
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(c["securityContext"]["capabilities"]["drop"], serde_json::json!(["ALL"]));
    for r in ["cpu", "memory", "ephemeral-storage"] {
        assert!(c["resources"]["limits"][r].is_string(), "limit {r}");
    }
    let token = s["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "token").unwrap();
    assert_eq!(
        token["secret"]["items"],
        serde_json::json!([
            {"key": "token", "path": "token", "mode": 0o440},
            {"key": "ca.pem", "path": "ca.pem", "mode": 0o444},
            {"key": "ca-bundle.pem", "path": "ca-bundle.pem", "mode": 0o444},
        ])
    );
    let mounts = c["volumeMounts"].as_array().unwrap();
    assert!(mounts.iter().all(|m| m["subPath"].is_null()), "no subPath: refreshes arrive");
    assert!(mounts.iter().any(|m| m["mountPath"] == "/run/sandlane" && m["readOnly"] == true));
    let text = pod.to_string();
    assert!(!text.contains("tok-secret") && !text.contains("user-1"), "no token, no identity in the pod");

    // The org's workspace quota sizes the workspace claim; without one, the setting does.
    let storage = |plan: &objects::SandboxPlan<'_>| {
        let claim = serde_json::to_value(objects::durable_claim(&config, plan)).unwrap();
        claim["spec"]["resources"]["requests"]["storage"].clone()
    };
    assert_eq!(storage(&plan), serde_json::json!((64u64 << 20).to_string()));
    let unlimited = objects::SandboxPlan { workspace_bytes: None, ..plan.clone() };
    assert_eq!(storage(&unlimited), serde_json::json!(config.workspace_size_bytes.to_string()));
}

#[test]
fn object_names_map_back_to_sandbox_ids() {
    for _ in 0..200 {
        let id = driver_contract::new_sandbox_id();
        let name = objects::object_name("sandlane", &id);
        assert!(
            name.len() <= 63
                && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        );
        assert_eq!(objects::sandbox_of("sandlane", &name), Some(id.clone()));
        assert_eq!(objects::sandbox_of("other", &name), None);
    }
    assert_eq!(objects::sandbox_of("sandlane", "sandlane-NOTLOWER"), None);
    assert_eq!(objects::sandbox_of("sandlane", "sandlane-abc"), None);
}

/// The `kubernetes-validate` program (`None`: skipped by name).
fn validator() -> Option<PathBuf> {
    let mut values = tests::services::require(tests::services::Service::KubernetesValidate)?;
    Some(PathBuf::from(values.remove(0)))
}

fn validate(program: &std::path::Path, dir: &std::path::Path, files: &[PathBuf]) -> std::process::Output {
    std::process::Command::new(program)
        .args(["--kubernetes-version", "1.33.0", "--strict"])
        .args(files)
        .current_dir(dir)
        .output()
        .expect("kubernetes-validate runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_object_the_driver_builds_passes_the_kubernetes_schemas() {
    let Some(program) = validator() else { return };
    let fake = cluster().await;
    let driver = driver(&fake);
    let o = org();
    let durable = spec_for(&o, "schemas", "user-1", CallerClass::User, Durability::Durable, "tok-1");
    let ephemeral = spec_for(&o, "schemas-e", "svc-1", CallerClass::Service, Durability::Ephemeral, "tok-2");
    driver.provision(&durable).await.unwrap();
    driver.provision(&ephemeral).await.unwrap();
    driver.deprovision(durable.sandbox_id()).await.unwrap();
    driver.deprovision(ephemeral.sandbox_id()).await.unwrap();
    let received = fake.received();
    let kinds: std::collections::BTreeSet<String> =
        received.iter().map(|o| o["kind"].as_str().unwrap_or_default().to_owned()).collect();
    assert_eq!(
        kinds.into_iter().collect::<Vec<_>>(),
        ["NetworkPolicy", "PersistentVolumeClaim", "Pod", "Secret"],
        "every kind the driver creates"
    );
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for (i, object) in received.iter().enumerate() {
        let path = dir.path().join(format!("{i:02}-{}.json", object["kind"].as_str().unwrap_or("x")));
        std::fs::write(&path, serde_json::to_vec_pretty(object).unwrap()).unwrap();
        files.push(path);
    }
    let out = validate(&program, dir.path(), &files);
    assert!(
        out.status.success(),
        "kubernetes-validate refused an object:\n{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    // Positive control: the same validator refuses a pod with a field the schema lacks.
    let mut bad = received.iter().find(|o| o["kind"] == "Pod").unwrap().clone();
    bad["spec"]["containers"][0]["securityContext"]["runAsRoot"] = Value::Bool(false);
    let bad_path = dir.path().join("bad-pod.json");
    std::fs::write(&bad_path, serde_json::to_vec(&bad).unwrap()).unwrap();
    let out = validate(&program, dir.path(), &[bad_path]);
    assert!(!out.status.success(), "the validator refuses an unknown field: {}", text(&out.stdout));
    fake.shutdown().await;
}

/// `kubectl` where it is installed (the test command installs it), pointed at the fake,
/// lists the driver's objects by the driver's labels.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_lists_the_drivers_objects() {
    let Some(mut values) = tests::services::require(tests::services::Service::Kubectl) else { return };
    let kubectl = PathBuf::from(values.remove(0));
    let fake = cluster().await;
    let driver = driver(&fake);
    let spec = spec_for(&org(), "kubectl", "svc-1", CallerClass::Service, Durability::Ephemeral, "tok-k");
    driver.provision(&spec).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("config");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\ncontexts:\n- name: fake\n  \
             context:\n    cluster: fake\n    user: nobody\n    namespace: {NAMESPACE}\ncurrent-context: fake\nusers:\n- name: \
             nobody\n  user: {{}}\n",
            fake.url()
        ),
    )
    .unwrap();
    let name = objects::object_name("sandlane", spec.sandbox_id());
    let selector = format!("{}={}", objects::LABEL_SANDBOX, spec.sandbox_id());
    let kubectl_out = |args: &[&str]| {
        let out = std::process::Command::new(&kubectl)
            .env("KUBECONFIG", &kubeconfig)
            .env("HOME", dir.path())
            .args(args)
            .output()
            .expect("kubectl runs");
        assert!(out.status.success(), "kubectl {args:?}: {}", text(&out.stderr));
        text(&out.stdout)
    };
    let listed = kubectl_out(&["get", "pods,secrets,networkpolicies,pvc", "-l", &selector, "-o", "name"]);
    let mut lines: Vec<&str> = listed.lines().collect();
    lines.sort_unstable();
    assert_eq!(
        lines,
        [format!("networkpolicy.networking.k8s.io/{name}"), format!("pod/{name}"), format!("secret/{name}"),],
        "kubectl sees the driver's objects: {listed}"
    );
    let phase = kubectl_out(&["get", "pod", &name, "-o", "jsonpath={.status.phase}"]);
    assert_eq!(phase, "Running");
    driver.deprovision(spec.sandbox_id()).await.unwrap();
    let after = kubectl_out(&["get", "pods", "-l", &selector, "-o", "name"]);
    assert_eq!(after.trim(), "", "and sees them gone");
    fake.shutdown().await;
}

/// A fake cluster and a driver keeping its snapshots in a temporary directory.
async fn snapshotting_cluster() -> (FakeCluster, tempfile::TempDir, KubeDriver) {
    let fake = cluster().await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(&fake);
    config.snapshot_dir = Some(dir.path().to_path_buf());
    let driver = KubeDriver::new(config).expect("valid settings");
    (fake, dir, driver)
}

/// An archive comes from inside the sandbox and holds apparent sizes, so the server counts
/// it as it comes: a sparse file linked four times (48 MiB of archive for a workspace that
/// uses almost nothing) is refused at what the org's quota leaves (429's error) and at
/// what the workspace can hold (413's), and a copy that outlasts the freeze fails; nothing
/// is left on the server's disk each time, and the sandbox goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_archive_is_cut_at_its_budget() {
    let (fake, dir, driver) = snapshotting_cluster().await;
    let org = org();
    let spec = spec_for(&org, "snap-holes", "user-1", CallerClass::User, Durability::Ephemeral, "tok-h");
    let id = spec.sandbox_id().clone();
    driver.provision(&spec).await.unwrap();
    let out = run(
        &driver,
        &id,
        &["sh", "-c", "cd /workspace && truncate -s 12M holes && ln holes l1 && ln holes l2 && ln holes l3 && echo small > a"],
        b"",
        10_000,
    )
    .await;
    assert_eq!(out.exit_code, 0, "{}", shown(&out));
    let snap = |n| ports::SnapshotRef {
        org: domain::OrgId::parse(&org).unwrap(),
        id: domain::SnapshotId::generate(6, n),
    };
    let org_dir = dir.path().join(&org);
    let left = || std::fs::read_dir(&org_dir).map(|d| d.count()).unwrap_or(0);

    let by_quota = ports::SnapshotBudget { quota_left: Some(8 << 20), workspace_bytes: None };
    let err = driver.snapshot(&id, &snap(1), by_quota).await.expect_err("past what the quota leaves");
    assert!(matches!(&err, DriverError::ResourceExhausted(m) if m.contains("quota")), "{err}");
    assert_eq!(left(), 0, "nothing of it is left on the server");

    let by_workspace = ports::SnapshotBudget { quota_left: None, workspace_bytes: Some(16 << 20) };
    let err = driver.snapshot(&id, &snap(2), by_workspace).await.expect_err("past what the workspace holds");
    assert!(matches!(&err, DriverError::TooLarge(m) if m.contains("apparent size")), "{err}");
    assert_eq!(left(), 0, "nothing of it is left on the server");

    // The sandbox's processes go on (the freeze ended), and a workspace within the budget
    // is taken.
    let out =
        run(&driver, &id, &["sh", "-c", "cd /workspace && rm holes l1 l2 l3 && cat a"], b"", 10_000).await;
    assert_eq!(text(&out.stdout), "small\n", "{}", shown(&out));
    let bytes = driver.snapshot(&id, &snap(3), by_quota).await.expect("within the budget");
    assert!(bytes > 0 && bytes < 8 << 20, "{bytes}");
    driver.delete_snapshot(&snap(3)).await.unwrap();

    // A copy that outlasts the freeze would not be of one instant: it fails, and nothing
    // of it is left.
    let mut config = config(&fake);
    config.snapshot_dir = Some(dir.path().to_path_buf());
    config.snapshot_copy_timeout = Duration::ZERO;
    let hurried = KubeDriver::new(config).expect("valid settings");
    let err = hurried.snapshot(&id, &snap(4), by_quota).await.expect_err("no time to copy");
    assert!(
        matches!(&err, DriverError::Failed(m) if m.to_string().contains("could not be copied within")),
        "{err}"
    );
    assert_eq!(left(), 0, "nothing of it is left on the server");
    let out = run(&driver, &id, &["cat", "/workspace/a"], b"", 10_000).await;
    assert_eq!(text(&out.stdout), "small\n", "the processes go on: {}", shown(&out));

    driver.deprovision(&id).await.unwrap();
    fake.shutdown().await;
}

/// Snapshots through the supervisor: taken while a background writer is stopped (its
/// file does not grow during the copy), forked into a new pod (ephemeral, another key),
/// restored into the source after its pod is replaced; a fork of a key that has a durable
/// workspace is refused; without a snapshot directory, snapshots are unsupported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_are_copied_through_the_supervisor() {
    let (fake, dir, driver) = snapshotting_cluster().await;
    let org = org();
    let mut spec = spec_for(&org, "snap-src", "user-1", CallerClass::User, Durability::Durable, "tok-s");
    spec.epoch = 1;
    let id = spec.sandbox_id().clone();
    driver.provision(&spec).await.unwrap();
    let out = run(
        &driver,
        &id,
        &["sh", "-c", "echo one > /workspace/a; mkdir /workspace/d; echo deep > /workspace/d/b"],
        b"",
        10_000,
    )
    .await;
    assert_eq!(out.exit_code, 0, "{}", shown(&out));
    let writer = domain::ProcessRequest::new(
        vec!["sh".into(), "-c".into(), "while true; do echo x >> /workspace/log; sleep 0.01; done".into()],
        Vec::new(),
        None,
    )
    .unwrap();
    driver.start_process(&id, &writer, &domain::ProcessCaps::default()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let size = |out: &domain::ExecOutput| text(&out.stdout).trim().parse::<u64>().unwrap();
    let log_size =
        || async { size(&run(&driver, &id, &["sh", "-c", "wc -c < /workspace/log"], b"", 10_000).await) };

    // The freeze a snapshot takes: the writer stops while it is held, and goes on after.
    let socket = crate::supervisor_link::ops::Host::socket(&driver, &id).await.unwrap();
    let frozen =
        crate::supervisor_link::client::freeze(&socket, Duration::from_secs(10)).await.expect("frozen");
    let (held, _) = (log_size().await, tokio::time::sleep(Duration::from_millis(300)).await);
    assert_eq!(log_size().await, held, "nothing is written while frozen");
    drop(frozen);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(log_size().await > held, "the writer goes on once the freeze ends");

    let snap = ports::SnapshotRef {
        org: domain::OrgId::parse(&org).unwrap(),
        id: domain::SnapshotId::generate(5, 1),
    };
    let bytes = driver.snapshot(&id, &snap, ports::SnapshotBudget::default()).await.expect("a snapshot");
    assert!(bytes > 0);
    let archive = dir.path().join(&org).join(snap.id.as_str()).join("workspace.tar");
    assert!(archive.is_file(), "the archive is on the server");
    // The writer goes on after the snapshot.
    let before = log_size().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = log_size().await;
    assert!(after > before, "the writer runs again after the snapshot ({before} → {after})");
    run(&driver, &id, &["sh", "-c", "echo two > /workspace/a"], b"", 10_000).await;

    // A fork: a new pod whose workspace is the snapshot's.
    let mut fork = spec_for(&org, "snap-fork", "svc-1", CallerClass::Service, Durability::Ephemeral, "tok-f");
    fork.from_snapshot = Some(snap.clone());
    let fork_id = fork.sandbox_id().clone();
    driver.provision(&fork).await.expect("a fork");
    let out = run(
        &driver,
        &fork_id,
        &["sh", "-c", "cat /workspace/a /workspace/d/b; touch /workspace/mine"],
        b"",
        10_000,
    )
    .await;
    assert_eq!(text(&out.stdout), "one\ndeep\n", "{}", shown(&out));

    // A fork onto a key whose durable workspace exists is refused.
    let mut onto_new = spec_for(&org, "snap-src", "user-1", CallerClass::User, Durability::Durable, "tok-o");
    onto_new.from_snapshot = Some(snap.clone());
    let err = driver.provision(&onto_new).await.expect_err("a fork never replaces a workspace");
    assert!(matches!(err, DriverError::Conflict(_)), "{err}");

    // A restore: the pod goes; the next provision (the resume) unpacks the snapshot.
    driver.restore(&id, &snap).await.expect("a restore");
    let newer = ProvisionSpec { epoch: 2, ..spec.clone() };
    driver.provision(&newer).await.expect("the resume");
    let out = run(&driver, &id, &["sh", "-c", "cat /workspace/a; ls /workspace"], b"", 10_000).await;
    assert_eq!(text(&out.stdout), "one\na\nd\nlog\n", "{}", shown(&out));

    driver.delete_snapshot(&snap).await.unwrap();
    assert!(!archive.exists());
    driver.deprovision(&fork_id).await.unwrap();
    driver.deprovision(&id).await.unwrap();
    let plain = super::KubeDriver::new(self::config(&fake)).unwrap();
    let other = spec_for(&org, "snap-none", "user-1", CallerClass::User, Durability::Ephemeral, "tok-n");
    plain.provision(&other).await.unwrap();
    let err = plain
        .snapshot(other.sandbox_id(), &snap, ports::SnapshotBudget::default())
        .await
        .expect_err("no snapshot directory");
    assert!(matches!(err, DriverError::Unsupported(_)), "{err}");
    plain.deprovision(other.sandbox_id()).await.unwrap();
    fake.shutdown().await;
}
