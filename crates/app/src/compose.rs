//! The composition root: the one place that turns settings into adapters. The server
//! ([`crate::server::Server`]), the CLI and the benches build through it; nothing else
//! constructs an adapter.

use std::sync::Arc;
use std::time::Duration;

use crate::config::{DatabaseUrl, DriverKind, Settings};
use crate::http::{AppState, Readiness};
use crate::metrics::Metrics;
use crate::usecase::egress::{EgressLimits, EgressService, PolicyAllowlists};
use crate::usecase::{ActivityTracker, CommandGate, LaneDeps, Policies, PolicyLane};
use adapters::bwrap::{BwrapConfig, BwrapDriver};
use adapters::container::{ContainerConfig, ContainerDriver};
use adapters::jwt::{JwtConfig, JwtMinter, KeyStore};
use adapters::kubernetes::{KubeConfig, KubeConnection, KubeDriver};
use adapters::sql::{Store, StoreOptions};
use anyhow::{Context, bail};
use async_trait::async_trait;
use ports::{Clock, SandboxDriver, SystemClock};

/// Everything `serve` and the CLI need, built from the settings.
pub struct Composition {
    /// The store (registry, audit log, callers).
    pub store: Store,
    /// The credential signing keys.
    pub keys: Arc<KeyStore>,
    /// What the handlers share.
    pub state: Arc<AppState>,
    /// The egress gate the proxy of every sandbox asks.
    pub egress: Arc<EgressService>,
}

/// What a test (or an embedding) puts in place of the production adapters.
#[derive(Default, Clone)]
pub struct Overrides {
    /// The egress proxy's resolver (default: the system's, [`adapters::egress::SystemResolver`]).
    pub resolver: Option<Arc<dyn ports::Resolver>>,
}

impl std::fmt::Debug for Overrides {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Overrides").field("resolver", &self.resolver.is_some()).finish()
    }
}

/// Opens the store (migrations applied). `create_audit_key: false` (for `audit verify`)
/// refuses to start without the existing audit key rather than making a new one.
///
/// # Errors
/// When the database cannot be opened or migrated.
pub async fn open_store(settings: &Settings, create_audit_key: bool) -> anyhow::Result<Store> {
    let mut options = StoreOptions::new(&settings.data_dir)
        .with_url(settings.database_url.as_ref().map(DatabaseUrl::expose));
    options.create_audit_key = create_audit_key;
    Store::open(options).await.context("cannot open the database")
}

/// The org policies over the store, with the settings' defaults.
///
/// # Errors
/// When the default policy settings are invalid (checked at start-up already).
pub fn open_policies(settings: &Settings, store: &Store) -> anyhow::Result<Policies> {
    Ok(Policies::new(store.policies(), settings.policy.policy()?))
}

/// The webhooks' ports over the store, with the settings' retries and receivers.
pub fn open_webhooks(settings: &Settings, store: &Store) -> crate::usecase::webhooks::WebhookDeps {
    let w = &settings.webhooks;
    crate::usecase::webhooks::WebhookDeps {
        store: store.webhooks(),
        audit: store.audit(),
        sender: Arc::new(adapters::webhook_sender::HttpWebhookSender::new(
            w.allow_private,
            Duration::from_millis(w.timeout_ms),
        )),
        clock: Arc::new(SystemClock),
        policy: crate::usecase::webhooks::DeliveryPolicy {
            backoff_initial: Duration::from_millis(w.backoff_initial_ms),
            backoff_max: Duration::from_millis(w.backoff_max_ms),
            max_attempts: w.max_attempts,
            lease: Duration::from_millis(w.lease_ms),
            retention: Duration::from_millis(w.retention_ms),
        },
        metrics: None,
        in_flight: Arc::default(),
    }
}

/// The store and the ports of the secret use cases, for the operator's CLI (no driver, no
/// keys).
///
/// # Errors
/// When the database cannot be opened or the default policy is invalid.
pub async fn open_operator(settings: &Settings) -> anyhow::Result<(Store, crate::usecase::SecretPorts)> {
    let store = open_store(settings, true).await?;
    let policies = Arc::new(open_policies(settings, &store)?);
    let ports = crate::usecase::SecretPorts {
        secrets: store.secrets(),
        audit: store.audit(),
        clock: Arc::new(SystemClock),
        directory: store.callers(),
        policies,
    };
    Ok((store, ports))
}

/// Loads (or creates) the signing keys in the data dir.
///
/// # Errors
/// When the key file cannot be read or created.
pub fn open_keys(settings: &Settings, clock: Arc<dyn Clock>) -> anyhow::Result<Arc<KeyStore>> {
    Ok(Arc::new(KeyStore::load_or_create(&settings.data_dir, clock).context("cannot load the signing keys")?))
}

/// The configured sandbox driver.
///
/// # Errors
/// When the driver cannot be set up (its message says why).
pub fn driver(settings: &Settings) -> anyhow::Result<Arc<dyn SandboxDriver>> {
    match settings.driver {
        DriverKind::Bubblewrap => {
            let mut config = BwrapConfig::from_settings(
                &settings.bwrap,
                &settings.data_dir,
                settings.supervisor_program.clone(),
            );
            config.upstream_ca_file.clone_from(&settings.egress.upstream_ca_file);
            Ok(BwrapDriver::new(config).context("cannot set up the bubblewrap driver")?)
        }
        DriverKind::Container => {
            // container.docker_host (SANDLANE_DOCKER_HOST), else DOCKER_HOST, else the default.
            let mut config = ContainerConfig::from_settings(
                &settings.container,
                std::env::var("DOCKER_HOST").ok(),
                settings.supervisor_program.clone(),
                settings.data_dir.join("containers"),
            )
            .map_err(anyhow::Error::msg)?;
            config.upstream_ca_file.clone_from(&settings.egress.upstream_ca_file);
            Ok(Arc::new(ContainerDriver::new(config).context("cannot set up the container driver")?))
        }
        DriverKind::Kubernetes => Ok(Arc::new(kube_driver(settings)?)),
    }
}

/// The in-cluster service account's token, present in a pod that mounts it.
const SERVICE_ACCOUNT_TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";

/// How the Kubernetes driver reaches its API server: the in-cluster service account when
/// this server runs in a pod, else `KUBECONFIG`, else `kube.api_url`.
fn kube_connection(settings: &Settings) -> anyhow::Result<KubeConnection> {
    let k = &settings.kube;
    let in_cluster = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some_and(|h| !h.is_empty())
        && std::path::Path::new(SERVICE_ACCOUNT_TOKEN).is_file();
    if in_cluster {
        return Ok(KubeConnection::InCluster);
    }
    if let Some(list) = std::env::var_os("KUBECONFIG").filter(|v| !v.is_empty()) {
        // A list of files: the first that exists.
        let path = std::env::split_paths(&list).find(|p| p.is_file());
        let Some(path) = path else {
            bail!("KUBECONFIG names no file that exists: {}", list.to_string_lossy());
        };
        return Ok(KubeConnection::Kubeconfig { path, context: k.context.clone() });
    }
    match k.api_url.clone().filter(|u| !u.trim().is_empty()) {
        Some(url) => {
            Ok(KubeConnection::Explicit { url, token_file: k.token_file.clone(), ca_file: k.ca_file.clone() })
        }
        None => bail!(
            "SANDLANE_DRIVER=kubernetes needs an API server: run the server in a pod (its service \
             account), set KUBECONFIG, or set SANDLANE_KUBE_API_URL (with SANDLANE_KUBE_TOKEN_FILE and \
             SANDLANE_KUBE_CA_FILE)"
        ),
    }
}

fn kube_driver(settings: &Settings) -> anyhow::Result<KubeDriver> {
    let mut config =
        KubeConfig::from_settings(&settings.kube, kube_connection(settings)?).map_err(anyhow::Error::msg)?;
    config.upstream_ca_file.clone_from(&settings.egress.upstream_ca_file);
    config.snapshot_dir = Some(settings.data_dir.join("snapshots"));
    KubeDriver::new(config).context("cannot set up the Kubernetes driver")
}

struct StoreReadiness(Store);

#[async_trait]
impl Readiness for StoreReadiness {
    async fn database(&self) -> Result<(), String> {
        self.0.ping().await.map_err(|e| e.to_string())
    }
}

/// A replica id for provisioning leases: host name, process id and random bits.
fn replica_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let mut bytes = [0u8; 4];
    let _ = getrandom::fill(&mut bytes);
    format!("{}-{}-{:08x}", host.trim(), std::process::id(), u32::from_le_bytes(bytes))
}

/// Builds the server's state from the settings.
///
/// # Errors
/// When the store, the keys or the driver cannot be opened.
pub async fn compose(settings: &Settings) -> anyhow::Result<Composition> {
    compose_with(settings, Overrides::default()).await
}

/// [`compose`] with `overrides` in place of production adapters.
///
/// # Errors
/// As [`compose`].
pub async fn compose_with(settings: &Settings, overrides: Overrides) -> anyhow::Result<Composition> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let store = open_store(settings, true).await?;
    let keys = open_keys(settings, clock.clone())?;
    let registry = store.registry();
    let jwt = JwtConfig {
        issuer: settings.token.issuer.clone(),
        audience: settings.token.audience.clone(),
        ttl_secs: settings.token.ttl_secs,
    };
    let directory = store.callers();
    let minter =
        Arc::new(JwtMinter::new(jwt, keys.clone(), registry.clone(), directory.clone(), clock.clone())?);
    let policies = Arc::new(Policies::new(store.policies(), settings.policy.policy()?));
    let replica = replica_id();
    let deps = LaneDeps {
        lane: Arc::new(PolicyLane { enabled: settings.lane_enabled, policies: policies.clone() }),
        minter: minter.clone(),
        driver: driver(settings)?,
        registry,
        audit: store.audit(),
        clock: clock.clone(),
        policy: settings.policy(),
        replica_id: replica.clone(),
        lease_ms: i64::try_from(settings.background.lease_ms).unwrap_or(i64::MAX),
        wait_poll_ms: 5,
        ensure_deadline: Duration::from_millis(settings.http.ensure_deadline_ms),
        directory: directory.clone(),
        policies,
        activity: Arc::new(ActivityTracker::default()),
        commands: Arc::new(CommandGate::new(store.leases(), clock.clone(), replica)),
        streams: settings.streams.limits(),
        file_ops: Arc::default(),
        previews: Arc::default(),
        pool_demand: Arc::default(),
        secrets: store.secrets(),
        snapshots: store.snapshots(),
        tickets: store.terminal_tickets(),
        preview_links: store.preview_links(),
    };
    let metrics = Arc::new(Metrics::default());
    let e = &settings.egress;
    let egress = Arc::new(
        EgressService::new(
            deps.registry.clone(),
            deps.audit.clone(),
            deps.clock.clone(),
            overrides.resolver.unwrap_or_else(|| Arc::new(adapters::egress::SystemResolver)),
            Arc::new(PolicyAllowlists(deps.policies.clone())),
            EgressLimits {
                max_connections: e.max_connections_per_sandbox,
                max_bytes: e.max_bytes_per_sandbox,
                audit_burst: e.audit_burst,
                audit_sandbox_cap: e.audit_sandbox_cap,
                audit_window_ms: e.audit_window_ms,
            },
            metrics.clone(),
        )
        .with_secrets(deps.secrets.clone(), deps.directory.clone()),
    );
    let webhooks = crate::usecase::webhooks::WebhookDeps {
        metrics: Some(metrics.clone()),
        ..open_webhooks(settings, &store)
    };
    let state = Arc::new(AppState {
        deps: Arc::new(deps),
        directory,
        verifier: minter,
        metrics,
        readiness: Arc::new(StoreReadiness(store.clone())),
        driver_health: Default::default(),
        scrape: Default::default(),
        audit_verdict: Default::default(),
        request_timeout: Duration::from_millis(settings.http.request_timeout_ms),
        body_limit: settings.http.body_limit_bytes,
        shutdown: Default::default(),
        webhooks: Some(Arc::new(webhooks)),
        preview_domain: settings.http.preview_domain.clone(),
    });
    Ok(Composition { store, keys, state, egress })
}
