//! Pure pieces of the Kubernetes driver: object names, labels and annotations, and the
//! objects themselves (Pod, Secret, PersistentVolumeClaim, NetworkPolicy). No I/O here,
//! so every object can be checked against the Kubernetes schemas in tests.

use std::collections::BTreeMap;

use domain::split::{TOKEN_FILE_PATH, WORKSPACE_PATH};
use domain::{DriverEnvironment, Durability, SandboxId, SandboxKey};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, EnvVar, EnvVarSource, EphemeralVolumeSource, KeyToPath,
    PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimTemplate,
    PersistentVolumeClaimVolumeSource, Pod, PodSecurityContext, PodSpec, ResourceRequirements,
    SeccompProfile, Secret, SecretKeySelector, SecretVolumeSource, SecurityContext, Volume, VolumeMount,
    VolumeResourceRequirements,
};
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicySpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use sha2::{Digest, Sha256};

use super::config::KubeConfig;
use supervisor::gate::{ChannelKey, KEY_VARIABLE};

/// Label on every object: who manages it.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// The value of [`LABEL_MANAGED_BY`].
pub const MANAGED_BY: &str = "sandlane";
/// Label: the deployment (its name prefix), which the driver lists by.
pub const LABEL_INSTANCE: &str = "sandlane.dev/instance";
/// Label: the sandbox id (pods, secrets, network policies).
pub const LABEL_SANDBOX: &str = "sandlane.dev/sandbox";
/// Label: `durable` or `ephemeral`.
pub const LABEL_DURABILITY: &str = "sandlane.dev/durability";
/// Label: the fencing epoch of the provision that created the pod.
pub const LABEL_EPOCH: &str = "sandlane.dev/epoch";
/// Label: the workspace (a hash of the key for a durable one; the sandbox for an
/// ephemeral one).
pub const LABEL_WORKSPACE: &str = "sandlane.dev/workspace";
/// Label: the uid the workspace's files and processes belong to.
pub const LABEL_UID: &str = "sandlane.dev/uid";
/// Annotation: the key the sandbox belongs to (`org/kind/key`; ids may hold characters a
/// label value may not).
pub const ANNOTATION_KEY: &str = "sandlane.dev/key";
/// Annotation on the pod: the environment of the latest ensure (JSON of
/// [`DriverEnvironment`]; no secret), patched on refresh.
pub const ANNOTATION_ENVIRONMENT: &str = "sandlane.dev/environment";

/// The Secret's key holding the token (mounted).
pub const SECRET_TOKEN: &str = "token";
/// The Secret's key holding the sandbox CA's certificate (mounted as `ca.pem`).
pub const SECRET_CA: &str = "ca.pem";
/// The Secret's key holding the bundle of the server's system roots and the CA (mounted
/// as `ca-bundle.pem`).
pub const SECRET_CA_BUNDLE: &str = "ca-bundle.pem";
/// The Secret's key holding the CA's key and certificate: the server's alone, never
/// mounted.
pub const SECRET_CA_KEY: &str = "ca.key";
/// The Secret's key holding the channel key (given to the supervisor's process alone).
pub const SECRET_CHANNEL: &str = "channel";
/// The container's name.
pub const CONTAINER: &str = "sandbox";
/// The name of the pod's workspace volume (the ephemeral claim is `<pod>-workspace`).
pub const WORKSPACE_VOLUME: &str = "workspace";

const SANDBOX_PREFIX: &str = "sbx_";

/// The object name of a sandbox (its pod, secret and network policy):
/// `<prefix>-<the id's body in lowercase>`. Sandbox ids are `sbx_` and 26 Crockford
/// base32 capitals, which has no `I`, `L`, `O` or `U`, so the lowercase form maps back
/// exactly ([`sandbox_of`]).
pub fn object_name(prefix: &str, sandbox: &SandboxId) -> String {
    let body = sandbox.as_str().strip_prefix(SANDBOX_PREFIX).unwrap_or(sandbox.as_str());
    format!("{prefix}-{}", body.to_ascii_lowercase())
}

/// The sandbox an object name of this prefix belongs to; `None` for other names.
pub fn sandbox_of(prefix: &str, name: &str) -> Option<SandboxId> {
    let body = name.strip_prefix(prefix)?.strip_prefix('-')?;
    if body.bytes().any(|b| b.is_ascii_uppercase()) {
        return None;
    }
    SandboxId::parse(format!("{SANDBOX_PREFIX}{}", body.to_ascii_uppercase())).ok()
}

/// The workspace label of a sandbox: 40 hex digits of SHA-256 over the key for a durable
/// workspace (so the same key finds its claim again), the object name for an ephemeral
/// one.
pub fn workspace_id(prefix: &str, sandbox: &SandboxId, key: &SandboxKey, durability: Durability) -> String {
    match durability {
        Durability::Ephemeral => object_name(prefix, sandbox),
        Durability::Durable => {
            let mut h = Sha256::new();
            for part in [key.org().as_str(), key.kind().as_str(), key.key()] {
                h.update(part.as_bytes());
                h.update([0u8]);
            }
            h.finalize().iter().take(20).map(|b| format!("{b:02x}")).collect()
        }
    }
}

/// The claim of a durable workspace: `<prefix>-ws-<workspace id>`.
pub fn durable_claim_name(prefix: &str, workspace: &str) -> String {
    format!("{prefix}-ws-{workspace}")
}

/// The claim Kubernetes creates for an ephemeral workspace (`<pod>-<volume>`), owned by
/// the pod.
pub fn ephemeral_claim_name(pod: &str) -> String {
    format!("{pod}-{WORKSPACE_VOLUME}")
}

/// The uid a workspace runs as, before stepping past taken ones: `base + hash % span`.
pub fn preferred_uid(config: &KubeConfig, workspace: &str) -> u32 {
    let digest = Sha256::digest(workspace.as_bytes());
    let n = u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]);
    config.pod_ids.base + n % config.pod_ids.span.max(1)
}

/// The `i`-th uid after `uid` in the configured range, wrapping.
pub fn next_uid(config: &KubeConfig, uid: u32, i: u32) -> u32 {
    let span = config.pod_ids.span.max(1);
    config.pod_ids.base + (uid.wrapping_sub(config.pod_ids.base).wrapping_add(i)) % span
}

/// The selector of every object of this deployment.
pub fn instance_selector(prefix: &str) -> String {
    format!("{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_INSTANCE}={prefix},{LABEL_SANDBOX}")
}

/// What one sandbox is made of, decided at provision.
#[derive(Debug, Clone)]
pub struct SandboxPlan<'a> {
    /// The sandbox.
    pub sandbox: &'a SandboxId,
    /// Its key.
    pub key: &'a SandboxKey,
    /// Its workspace's durability.
    pub durability: Durability,
    /// The environment of the ensure.
    pub environment: &'a DriverEnvironment,
    /// The provision's fencing epoch.
    pub epoch: i64,
    /// The workspace label ([`workspace_id`]).
    pub workspace: String,
    /// The uid and gid the pod runs as.
    pub uid: u32,
    /// The org policy's workspace quota, bytes: the size of the workspace claim (else
    /// `workspace_size_bytes` of the settings). The volume's own filesystem enforces it.
    pub workspace_bytes: Option<u64>,
}

fn common_labels(prefix: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_MANAGED_BY.to_owned(), MANAGED_BY.to_owned()),
        (LABEL_INSTANCE.to_owned(), prefix.to_owned()),
    ])
}

/// The labels of a sandbox's pod, secret and network policy.
pub fn sandbox_labels(prefix: &str, plan: &SandboxPlan<'_>) -> BTreeMap<String, String> {
    let mut labels = common_labels(prefix);
    labels.insert(LABEL_SANDBOX.to_owned(), plan.sandbox.to_string());
    labels.insert(LABEL_DURABILITY.to_owned(), plan.durability.as_str().to_owned());
    labels.insert(LABEL_WORKSPACE.to_owned(), plan.workspace.clone());
    labels.insert(LABEL_UID.to_owned(), plan.uid.to_string());
    labels.insert(LABEL_EPOCH.to_owned(), plan.epoch.to_string());
    labels
}

fn quantity(bytes_or_units: u64) -> Quantity {
    Quantity(bytes_or_units.to_string())
}

fn meta(name: &str, config: &KubeConfig, labels: BTreeMap<String, String>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(config.namespace.clone()),
        labels: Some(labels),
        ..Default::default()
    }
}

/// The directory of the token file inside (`/run/sandlane`).
pub fn token_dir() -> &'static str {
    TOKEN_FILE_PATH.rsplit_once('/').map_or("/", |(dir, _)| dir)
}

/// The token file's name in its directory (`token`).
fn token_file_name() -> &'static str {
    TOKEN_FILE_PATH.rsplit_once('/').map_or(TOKEN_FILE_PATH, |(_, name)| name)
}

/// The sandbox's Secret: the token (mounted) and the channel key (given to the
/// supervisor's process only).
pub fn secret(config: &KubeConfig, plan: &SandboxPlan<'_>, token: &str, channel: &ChannelKey) -> Secret {
    let name = object_name(&config.name_prefix, plan.sandbox);
    Secret {
        metadata: meta(&name, config, sandbox_labels(&config.name_prefix, plan)),
        type_: Some("Opaque".to_owned()),
        data: Some(BTreeMap::from([
            (SECRET_TOKEN.to_owned(), ByteString(token.as_bytes().to_vec())),
            (SECRET_CHANNEL.to_owned(), ByteString(channel.expose().as_bytes().to_vec())),
        ])),
        ..Default::default()
    }
}

/// The sandbox CA's entries of its Secret (certificate, bundle, and the key file kept for
/// the server), as they are created or patched.
pub fn ca_data(ca: &crate::egress::ca::SandboxCa) -> BTreeMap<String, ByteString> {
    BTreeMap::from([
        (SECRET_CA.to_owned(), ByteString(ca.cert_pem().as_bytes().to_vec())),
        (SECRET_CA_BUNDLE.to_owned(), ByteString(ca.bundle().into_bytes())),
        (SECRET_CA_KEY.to_owned(), ByteString(ca.key_file().into_bytes())),
    ])
}

/// A durable workspace's claim: no owner (it outlives every pod of its key).
pub fn durable_claim(config: &KubeConfig, plan: &SandboxPlan<'_>) -> PersistentVolumeClaim {
    let mut labels = common_labels(&config.name_prefix);
    labels.insert(LABEL_DURABILITY.to_owned(), Durability::Durable.as_str().to_owned());
    labels.insert(LABEL_WORKSPACE.to_owned(), plan.workspace.clone());
    labels.insert(LABEL_UID.to_owned(), plan.uid.to_string());
    let mut metadata = meta(&durable_claim_name(&config.name_prefix, &plan.workspace), config, labels);
    metadata.annotations = Some(BTreeMap::from([(ANNOTATION_KEY.to_owned(), plan.key.to_string())]));
    PersistentVolumeClaim { metadata, spec: Some(claim_spec(config, plan)), ..Default::default() }
}

fn claim_spec(config: &KubeConfig, plan: &SandboxPlan<'_>) -> PersistentVolumeClaimSpec {
    let size = plan.workspace_bytes.unwrap_or(config.workspace_size_bytes);
    PersistentVolumeClaimSpec {
        access_modes: Some(vec!["ReadWriteOnce".to_owned()]),
        resources: Some(VolumeResourceRequirements {
            requests: Some(BTreeMap::from([("storage".to_owned(), quantity(size))])),
            ..Default::default()
        }),
        storage_class_name: config.storage_class.clone(),
        ..Default::default()
    }
}

/// The deny-all network policy of a sandbox: no ingress, no egress. The server reaches
/// the supervisor through the API server's port-forward, which no policy governs.
pub fn network_policy(config: &KubeConfig, plan: &SandboxPlan<'_>) -> NetworkPolicy {
    let name = object_name(&config.name_prefix, plan.sandbox);
    NetworkPolicy {
        metadata: meta(&name, config, sandbox_labels(&config.name_prefix, plan)),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([
                    (LABEL_INSTANCE.to_owned(), config.name_prefix.clone()),
                    (LABEL_SANDBOX.to_owned(), plan.sandbox.to_string()),
                ])),
                ..Default::default()
            }),
            policy_types: Some(vec!["Ingress".to_owned(), "Egress".to_owned()]),
            ingress: None,
            egress: None,
        }),
    }
}

/// The sandbox's pod: the supervisor as its one process, hardened.
///
/// # Errors
/// When the environment cannot be encoded.
pub fn pod(config: &KubeConfig, plan: &SandboxPlan<'_>) -> Result<Pod, serde_json::Error> {
    let name = object_name(&config.name_prefix, plan.sandbox);
    let mut metadata = meta(&name, config, sandbox_labels(&config.name_prefix, plan));
    metadata.annotations = Some(BTreeMap::from([
        (ANNOTATION_KEY.to_owned(), plan.key.to_string()),
        (ANNOTATION_ENVIRONMENT.to_owned(), serde_json::to_string(plan.environment)?),
    ]));
    let uid = i64::from(plan.uid);
    let limits = &config.limits;
    let resources = BTreeMap::from([
        ("cpu".to_owned(), Quantity(format!("{}m", limits.cpu_millis))),
        ("memory".to_owned(), quantity(limits.memory_bytes)),
        ("ephemeral-storage".to_owned(), quantity(limits.ephemeral_storage_bytes)),
    ]);
    let mut command = vec![
        config.supervisor_path.clone(),
        "--tcp".to_owned(),
        format!("127.0.0.1:{}", config.supervisor_port),
        // A pod has no rlimits: the supervisor sets the file size limit on itself, so the
        // files API's writes are held to it as on the other drivers.
        "--file-size-limit".to_owned(),
        limits.file_size_bytes.to_string(),
        // The egress proxy on the pod's own loopback (the deny-all policy keeps the rest
        // of the pod's network shut).
        "--egress-port".to_owned(),
        domain::egress::PROXY_PORT.to_string(),
    ];
    if config.seccomp {
        command.push("--seccomp".to_owned());
    }
    let workspace = match plan.durability {
        Durability::Durable => Volume {
            name: WORKSPACE_VOLUME.to_owned(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: durable_claim_name(&config.name_prefix, &plan.workspace),
                read_only: Some(false),
            }),
            ..Default::default()
        },
        // A generic ephemeral volume: Kubernetes creates the claim `<pod>-workspace`
        // owned by the pod, and deletes it with the pod.
        Durability::Ephemeral => {
            let mut labels = common_labels(&config.name_prefix);
            labels.insert(LABEL_DURABILITY.to_owned(), Durability::Ephemeral.as_str().to_owned());
            labels.insert(LABEL_WORKSPACE.to_owned(), plan.workspace.clone());
            Volume {
                name: WORKSPACE_VOLUME.to_owned(),
                ephemeral: Some(EphemeralVolumeSource {
                    volume_claim_template: Some(PersistentVolumeClaimTemplate {
                        metadata: Some(ObjectMeta { labels: Some(labels), ..Default::default() }),
                        spec: claim_spec(config, plan),
                    }),
                }),
                ..Default::default()
            }
        }
    };
    let volumes = vec![
        workspace,
        Volume {
            name: "token".to_owned(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(name.clone()),
                // Only the token and the CA's certificates: the channel key is the
                // supervisor's alone, the CA's key the server's. A directory mount (no
                // subPath), so a patched Secret reaches running commands.
                items: Some(vec![
                    KeyToPath {
                        key: SECRET_TOKEN.to_owned(),
                        path: token_file_name().to_owned(),
                        mode: Some(0o440),
                    },
                    KeyToPath {
                        key: SECRET_CA.to_owned(),
                        path: crate::egress::ca::CA_FILE.to_owned(),
                        mode: Some(0o444),
                    },
                    KeyToPath {
                        key: SECRET_CA_BUNDLE.to_owned(),
                        path: crate::egress::ca::CA_BUNDLE_FILE.to_owned(),
                        mode: Some(0o444),
                    },
                ]),
                default_mode: Some(0o440),
                optional: Some(false),
            }),
            ..Default::default()
        },
        Volume {
            name: "tmp".to_owned(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some("Memory".to_owned()),
                size_limit: Some(quantity(config.tmp_size_bytes)),
            }),
            ..Default::default()
        },
    ];
    let container = Container {
        name: CONTAINER.to_owned(),
        image: Some(config.image.clone()),
        image_pull_policy: Some(config.image_pull_policy.clone()),
        command: Some(command),
        env: Some(vec![EnvVar {
            name: KEY_VARIABLE.to_owned(),
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: name.clone(),
                    key: SECRET_CHANNEL.to_owned(),
                    optional: Some(false),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }]),
        working_dir: Some(WORKSPACE_PATH.to_owned()),
        resources: Some(ResourceRequirements {
            limits: Some(resources.clone()),
            requests: Some(resources),
            ..Default::default()
        }),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            privileged: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            run_as_user: Some(uid),
            run_as_group: Some(uid),
            capabilities: Some(Capabilities { drop: Some(vec!["ALL".to_owned()]), add: None }),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".to_owned(),
                localhost_profile: None,
            }),
            ..Default::default()
        }),
        volume_mounts: Some(vec![
            VolumeMount {
                name: WORKSPACE_VOLUME.to_owned(),
                mount_path: WORKSPACE_PATH.to_owned(),
                ..Default::default()
            },
            VolumeMount {
                name: "token".to_owned(),
                mount_path: token_dir().to_owned(),
                read_only: Some(true),
                ..Default::default()
            },
            VolumeMount { name: "tmp".to_owned(), mount_path: "/tmp".to_owned(), ..Default::default() },
        ]),
        termination_message_policy: Some("FallbackToLogsOnError".to_owned()),
        ..Default::default()
    };
    Ok(Pod {
        metadata,
        spec: Some(PodSpec {
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            // A sandbox's processes live in its supervisor: one that ends is not
            // restarted (the sandbox is gone and is provisioned afresh).
            restart_policy: Some("Never".to_owned()),
            termination_grace_period_seconds: Some(2),
            host_network: Some(false),
            host_pid: Some(false),
            host_ipc: Some(false),
            share_process_namespace: Some(false),
            runtime_class_name: config.runtime_class.clone(),
            node_selector: (!config.node_selector.is_empty()).then(|| config.node_selector.clone()),
            tolerations: (!config.tolerations.is_empty()).then(|| config.tolerations.clone()),
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                run_as_user: Some(uid),
                run_as_group: Some(uid),
                fs_group: Some(uid),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".to_owned(),
                    localhost_profile: None,
                }),
                ..Default::default()
            }),
            containers: vec![container],
            volumes: Some(volumes),
            ..Default::default()
        }),
        status: None,
    })
}

/// What a sandbox's pod says about it (its labels and annotations).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodFacts {
    /// The environment of the latest ensure.
    pub environment: DriverEnvironment,
    /// The workspace's durability.
    pub durability: Durability,
    /// `org/kind/key`.
    pub key: String,
    /// The fencing epoch of the provision that created the pod.
    pub epoch: i64,
    /// The workspace label.
    pub workspace: String,
    /// The pod's uid (its uid and gid inside).
    pub uid: u32,
}

impl PodFacts {
    /// Reads a pod's labels and annotations; `None` when they are missing or malformed.
    pub fn parse(pod: &ObjectMeta) -> Option<Self> {
        let labels = pod.labels.as_ref()?;
        let annotations = pod.annotations.as_ref()?;
        Some(Self {
            environment: serde_json::from_str(annotations.get(ANNOTATION_ENVIRONMENT)?).ok()?,
            durability: Durability::parse(labels.get(LABEL_DURABILITY)?).ok()?,
            key: annotations.get(ANNOTATION_KEY)?.clone(),
            epoch: labels.get(LABEL_EPOCH)?.parse().ok()?,
            workspace: labels.get(LABEL_WORKSPACE)?.clone(),
            uid: labels.get(LABEL_UID)?.parse().ok()?,
        })
    }

    /// Whether the pod was built for `key` with `durability`.
    pub fn is_for(&self, key: &SandboxKey, durability: Durability) -> bool {
        self.key == key.to_string() && self.durability == durability
    }
}

/// The sandbox id an object's labels name.
pub fn labelled_sandbox(meta: &ObjectMeta) -> Option<&str> {
    meta.labels.as_ref()?.get(LABEL_SANDBOX).map(String::as_str)
}
