//! Settings: defaults, then a TOML file (`--config`), then `SANDLANE_*` environment
//! variables, layered by the `config` crate and validated at start-up with an error that
//! names the bad setting and where its value came from.
//!
//! Every setting has a variable: its dotted key upper-cased, `__` between levels
//! (`http.request_timeout_ms` is `SANDLANE_HTTP__REQUEST_TIMEOUT_MS`, `listen` is
//! `SANDLANE_LISTEN`). Four short names stay for settings inside a table:
//! `SANDLANE_BWRAP` (`bwrap.program`), `SANDLANE_DOCKER_HOST` (`container.docker_host`),
//! `SANDLANE_CONTAINER_IMAGE` (`container.image`) and `SANDLANE_CONTAINER_PREFIX`
//! (`container.name_prefix`), and `SANDLANE_KUBE_API_URL`, `SANDLANE_KUBE_TOKEN_FILE`,
//! `SANDLANE_KUBE_CA_FILE`, `SANDLANE_KUBE_NAMESPACE` and `SANDLANE_KUBE_IMAGE` for the
//! `kube` table's. Other `SANDLANE_*` variables (the
//! sandbox environment's, the test harness's) are not settings and are ignored, except a
//! nested name (with `__`) that names no setting, which is an error. An empty variable
//! counts as unset.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use adapters::settings::InvalidSetting;
use config::{Config, Environment, File, FileFormat, Source};
use domain::{Durability, DurabilityPolicy};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The drivers' settings, defined by their drivers and read here as they are (the
/// `[bwrap]`, `[container]` and `[kube]` tables).
pub use adapters::{bwrap::BwrapSettings, container::ContainerSettings, kubernetes::KubeSettings};

/// Why the settings were refused. Each names the setting or file at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read or parsed.
    #[error("config file {path}: {message}")]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong (the TOML error, naming the line).
        message: String,
    },
    /// A setting has an invalid value.
    #[error("setting {name}: {message}")]
    Invalid {
        /// The setting and where its value came from (`listen (SANDLANE_LISTEN)`,
        /// `token.ttl_secs (file /etc/sandlane.toml)`).
        name: String,
        /// What is wrong.
        message: String,
    },
}

/// The longest credential lifetime the contract allows (`exp` at most 900 s after `iat`).
pub const MAX_TOKEN_TTL_SECS: u64 = 900;

/// The prefix of every settings variable.
const ENV_PREFIX: &str = "SANDLANE_";
/// Between levels of a nested key in a variable's name.
const ENV_SEPARATOR: &str = "__";
/// Short variable names for settings inside a table, kept from earlier releases.
pub const ENV_ALIASES: [(&str, &str); 10] = [
    ("SANDLANE_OTLP_ENDPOINT", "otlp.endpoint"),
    ("SANDLANE_BWRAP", "bwrap.program"),
    ("SANDLANE_DOCKER_HOST", "container.docker_host"),
    ("SANDLANE_CONTAINER_IMAGE", "container.image"),
    ("SANDLANE_CONTAINER_PREFIX", "container.name_prefix"),
    ("SANDLANE_KUBE_API_URL", "kube.api_url"),
    ("SANDLANE_KUBE_TOKEN_FILE", "kube.token_file"),
    ("SANDLANE_KUBE_CA_FILE", "kube.ca_file"),
    ("SANDLANE_KUBE_NAMESPACE", "kube.namespace"),
    ("SANDLANE_KUBE_IMAGE", "kube.image"),
];

/// The variable that sets `key` (a dotted settings key).
pub fn env_var(key: &str) -> String {
    format!("{ENV_PREFIX}{}", key.to_ascii_uppercase().replace('.', ENV_SEPARATOR))
}

/// Where a setting's value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SettingSource {
    /// The built-in default.
    Default,
    /// The config file.
    File(PathBuf),
    /// An environment variable.
    Env(String),
}

impl fmt::Display for SettingSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Default => f.write_str("default"),
            Self::File(path) => write!(f, "file {}", path.display()),
            Self::Env(name) => write!(f, "env {name}"),
        }
    }
}

/// A database URL. Its `Debug`, `Display` and `Serialize` hide the password (in the
/// user info and in a `password=` query parameter); [`expose`](Self::expose) gives the URL.
#[derive(Clone, PartialEq, Eq)]
pub struct DatabaseUrl(String);

impl DatabaseUrl {
    /// Accepts `postgres://`, `postgresql://` and `sqlite:` URLs.
    ///
    /// # Errors
    /// A message naming the accepted schemes (never the URL: it may hold a password).
    pub fn parse(url: impl Into<String>) -> Result<Self, String> {
        let url = url.into();
        if ["postgres://", "postgresql://", "sqlite:"].iter().any(|p| url.starts_with(p)) {
            Ok(Self(url))
        } else {
            Err("must start with postgres://, postgresql:// or sqlite:".to_owned())
        }
    }

    /// The URL itself, for the store to connect with. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The URL with its password replaced by `***`.
    pub fn redacted(&self) -> String {
        let url = &self.0;
        let (head, query) = url.split_once('?').map_or((url.as_str(), None), |(h, q)| (h, Some(q)));
        let mut out = match head.split_once("://") {
            Some((scheme, rest)) => {
                let authority_end = rest.find('/').unwrap_or(rest.len());
                let (authority, path) = rest.split_at(authority_end);
                let authority = match authority.rsplit_once('@') {
                    Some((user_info, host)) => match user_info.split_once(':') {
                        Some((user, _password)) => format!("{user}:***@{host}"),
                        None => format!("{user_info}@{host}"),
                    },
                    None => authority.to_owned(),
                };
                format!("{scheme}://{authority}{path}")
            }
            None => head.to_owned(),
        };
        if let Some(query) = query {
            let params: Vec<String> = query
                .split('&')
                .map(|p| match p.split_once('=') {
                    Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
                    _ => p.to_owned(),
                })
                .collect();
            out = format!("{out}?{}", params.join("&"));
        }
        out
    }
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DatabaseUrl({:?})", self.redacted())
    }
}

impl fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl Serialize for DatabaseUrl {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.redacted())
    }
}

impl<'de> Deserialize<'de> for DatabaseUrl {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Self::parse(String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

/// How log lines look.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Text for people (the default).
    Human,
    /// One JSON object a line.
    Json,
}

/// Which sandbox driver to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DriverKind {
    /// bubblewrap (the embedded default; `bwrap` is accepted too).
    #[serde(alias = "bwrap")]
    Bubblewrap,
    /// Containers through the Docker Engine API.
    Container,
    /// Pods in a Kubernetes cluster.
    Kubernetes,
}

/// Credential settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TokenSettings {
    /// `iss`.
    pub issuer: String,
    /// `aud`.
    pub audience: String,
    /// Lifetime in seconds (1–900).
    pub ttl_secs: u64,
    /// Re-mint a ready sandbox's credential when it expires within this many seconds.
    pub refresh_margin_secs: u64,
}

impl Default for TokenSettings {
    fn default() -> Self {
        Self {
            issuer: "sandlane".into(),
            audience: "sandlane-sandbox".into(),
            ttl_secs: 900,
            refresh_margin_secs: 300,
        }
    }
}

/// HTTP settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpSettings {
    /// Limit on each request but exec, in milliseconds.
    pub request_timeout_ms: u64,
    /// Largest request body, in bytes.
    pub body_limit_bytes: usize,
    /// How long an ensure or recovery request waits for provisioning before it answers
    /// with the posture's failure (session: 200 `failed`; workflow: 503), in ms. The
    /// provisioning goes on and audits its outcome. Below `request_timeout_ms`.
    pub ensure_deadline_ms: u64,
    /// How long a client may take to send a request's head (request line and headers),
    /// in ms: from the connection's accept for its first request, from the first byte for
    /// a later one. Past it, the connection is closed.
    pub header_timeout_ms: u64,
    /// How long a kept-alive connection may wait for its next request, in ms (a response
    /// in progress, however silent, is never idle). Past it, the connection is closed.
    pub idle_timeout_ms: u64,
    /// Most connections open at once; one more waits in the kernel's accept queue until
    /// one closes. Unset: a quarter of the process's open-file limit (`RLIMIT_NOFILE`)
    /// at start, at least 64 (see [`HttpSettings::effective_max_connections`]).
    pub max_connections: Option<u32>,
    /// The domain under which a sandbox's ports are served on this listener:
    /// `{port}-{sandbox label}.{preview_domain}` (`docs/api.md`, Preview ports). Every
    /// name under it must resolve to the server (`*.localhost` does on most systems).
    pub preview_domain: String,
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            request_timeout_ms: 60_000,
            body_limit_bytes: 1 << 20,
            ensure_deadline_ms: 30_000,
            header_timeout_ms: 10_000,
            idle_timeout_ms: 60_000,
            max_connections: None,
            preview_domain: "preview.localhost".into(),
        }
    }
}

impl HttpSettings {
    /// The fewest connections the default cap allows.
    pub const MIN_DEFAULT_CONNECTIONS: u32 = 64;

    /// The cap on open connections: [`HttpSettings::max_connections`], else a quarter of
    /// `open_files` (the soft `RLIMIT_NOFILE`), at least
    /// [`HttpSettings::MIN_DEFAULT_CONNECTIONS`]. A quarter because each connection may
    /// hold a second descriptor while it is served (the supervisor connection of an exec,
    /// a file transfer), and the other half is the rest of the server's: the database
    /// pool, each sandbox's standing descriptors and its egress connections, logs, the
    /// processes it starts.
    pub fn effective_max_connections(&self, open_files: u64) -> u32 {
        self.max_connections.unwrap_or_else(|| {
            u32::try_from(open_files / 4).unwrap_or(u32::MAX).max(Self::MIN_DEFAULT_CONNECTIONS)
        })
    }
}

/// Background work settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BackgroundSettings {
    /// How often the audit sealer runs (rows are sealed within this), in ms.
    pub seal_interval_ms: u64,
    /// How often the credential refresher runs, in ms.
    pub refresh_interval_ms: u64,
    /// How often the reconciler runs, in ms.
    pub reconcile_interval_ms: u64,
    /// How long a provisioning lease lasts, in ms.
    pub lease_ms: u64,
    /// How often the idle, lifetime and warm-pool passes run, in ms.
    pub policy_interval_ms: u64,
    /// How often each replica reports its sandboxes' activity, in ms (at most one write
    /// per active sandbox each time).
    pub activity_interval_ms: u64,
}

impl Default for BackgroundSettings {
    fn default() -> Self {
        Self {
            seal_interval_ms: 500,
            refresh_interval_ms: 60_000,
            reconcile_interval_ms: 60_000,
            lease_ms: 60_000,
            policy_interval_ms: 1_000,
            activity_interval_ms: 250,
        }
    }
}

/// The default org policy: what every org gets for a field `sandlane org set` never set.
/// Values as the CLI takes them (`64MiB`, `15m`, `unlimited`, `off`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicySettings {
    /// Whether session sandboxes are provisioned.
    pub lane_session: bool,
    /// Whether workflow sandboxes are provisioned.
    pub lane_workflow: bool,
    /// Running sandboxes per org: a count or `unlimited`.
    pub max_sandboxes: String,
    /// Concurrent commands per org: a count or `unlimited`.
    pub max_commands: String,
    /// Concurrent commands per sandbox: a count or `unlimited`.
    pub max_commands_per_sandbox: String,
    /// Workspace bytes per sandbox: a SIZE or `unlimited`.
    pub workspace_bytes: String,
    /// Idle time before a sandbox is suspended: a DUR or `off`.
    pub idle_timeout: String,
    /// Age at which a sandbox is deprovisioned: a DUR or `off`.
    pub max_lifetime: String,
    /// Warm ephemeral sandboxes kept per org.
    pub warm_pool: u32,
    /// Hosts sandboxes may reach through the egress proxy, comma-separated `HOST[:PORT]`.
    pub egress_allow: String,
    /// Snapshots per org: a count or `unlimited`.
    pub max_snapshots: String,
    /// Bytes of snapshots per org: a SIZE or `unlimited`.
    pub snapshot_bytes: String,
}

impl Default for PolicySettings {
    fn default() -> Self {
        Self {
            lane_session: true,
            lane_workflow: true,
            max_sandboxes: "unlimited".into(),
            max_commands: "unlimited".into(),
            max_commands_per_sandbox: "unlimited".into(),
            workspace_bytes: "1GiB".into(),
            idle_timeout: "off".into(),
            max_lifetime: "off".into(),
            warm_pool: 0,
            egress_allow: String::new(),
            max_snapshots: "unlimited".into(),
            snapshot_bytes: "unlimited".into(),
        }
    }
}

impl PolicySettings {
    /// The default policy these settings describe.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the setting (`policy.FIELD`).
    pub fn policy(&self) -> Result<domain::OrgPolicy, ConfigError> {
        use domain::policy::{parse_duration, parse_egress, parse_limit, parse_size};
        use domain::{OrgPolicy, PolicyField as F, PolicyPatch};
        let invalid = |e: domain::PolicyError| ConfigError::Invalid {
            name: format!("policy.{}", e.field),
            message: format!("{} (got {:?})", e.reason, e.input),
        };
        let egress: Vec<String> = self
            .egress_allow
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        let patch = PolicyPatch {
            lane_session: Some(self.lane_session),
            lane_workflow: Some(self.lane_workflow),
            max_sandboxes: Some(parse_limit(F::MaxSandboxes, &self.max_sandboxes).map_err(invalid)?),
            max_commands: Some(parse_limit(F::MaxCommands, &self.max_commands).map_err(invalid)?),
            max_commands_per_sandbox: Some(
                parse_limit(F::MaxCommandsPerSandbox, &self.max_commands_per_sandbox).map_err(invalid)?,
            ),
            workspace_bytes: Some(parse_size(F::WorkspaceBytes, &self.workspace_bytes).map_err(invalid)?),
            idle_timeout_ms: Some(parse_duration(F::IdleTimeout, &self.idle_timeout).map_err(invalid)?),
            max_lifetime_ms: Some(parse_duration(F::MaxLifetime, &self.max_lifetime).map_err(invalid)?),
            warm_pool: Some(self.warm_pool),
            egress_allow: Some(parse_egress(&egress).map_err(invalid)?),
            max_snapshots: Some(parse_limit(F::MaxSnapshots, &self.max_snapshots).map_err(invalid)?),
            snapshot_bytes: Some(parse_size(F::SnapshotBytes, &self.snapshot_bytes).map_err(invalid)?),
        };
        OrgPolicy::builtin().apply(&patch).map_err(invalid)
    }
}

/// The caps of what an agent does inside its sandbox: files, archives, background
/// processes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StreamsSettings {
    /// The largest file written or read through the files API, in bytes.
    pub max_file_bytes: u64,
    /// The largest tar archive sent into or out of a sandbox, in bytes.
    pub max_archive_bytes: u64,
    /// Most background processes a sandbox keeps (running, or ended and not yet forgotten).
    pub max_processes: u32,
    /// The output buffer of each background process, in bytes.
    pub process_buffer_bytes: u64,
    /// Most output buffer bytes of a sandbox's background processes together.
    pub max_buffered_bytes: u64,
    /// Most file operations (reads, listings, writes, deletes, archives) of one sandbox
    /// under way at once on this replica; one more is refused (429).
    pub max_file_ops_per_sandbox: u32,
    /// Most connections to one sandbox's ports through the preview host (requests being
    /// answered, WebSockets) open at once on this replica; one more is refused (429).
    pub max_preview_connections_per_sandbox: u32,
}

impl Default for StreamsSettings {
    fn default() -> Self {
        let limits = crate::usecase::StreamLimits::default();
        Self {
            max_file_bytes: limits.max_file_bytes,
            max_archive_bytes: limits.max_archive_bytes,
            max_processes: limits.processes.max_processes,
            process_buffer_bytes: limits.processes.buffer_bytes,
            max_buffered_bytes: limits.processes.max_buffered_bytes,
            max_file_ops_per_sandbox: limits.max_file_ops_per_sandbox,
            max_preview_connections_per_sandbox: limits.max_preview_connections_per_sandbox,
        }
    }
}

impl StreamsSettings {
    /// The caps the use cases hold sandboxes to.
    pub fn limits(&self) -> crate::usecase::StreamLimits {
        crate::usecase::StreamLimits {
            max_file_bytes: self.max_file_bytes,
            max_archive_bytes: self.max_archive_bytes,
            processes: domain::ProcessCaps {
                max_processes: self.max_processes,
                buffer_bytes: self.process_buffer_bytes,
                max_buffered_bytes: self.max_buffered_bytes,
            },
            max_file_ops_per_sandbox: self.max_file_ops_per_sandbox,
            max_preview_connections_per_sandbox: self.max_preview_connections_per_sandbox,
        }
    }
}

/// The largest `egress.audit_sandbox_cap`: the decisions of one sandbox audited one by one
/// per window, and so what the throttle may hold for it.
pub const MAX_AUDIT_SANDBOX_CAP: u32 = 10_000;

/// The egress proxy's limits and its audit throttle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EgressSettings {
    /// Most connections one sandbox holds open through the proxy at once.
    pub max_connections_per_sandbox: u32,
    /// Most bytes (both ways) one sandbox moves through the proxy while the server runs.
    pub max_bytes_per_sandbox: u64,
    /// Per window, how many decisions of one sandbox for one destination are audited one
    /// by one (the rest are counted in a summary).
    pub audit_burst: u32,
    /// Per window, how many decisions of one sandbox in all are audited one by one.
    pub audit_sandbox_cap: u32,
    /// The audit throttle's window, in milliseconds.
    pub audit_window_ms: u64,
    /// How often the server looks for sandboxes whose proxy it does not serve yet, in ms.
    pub scan_interval_ms: u64,
    /// A PEM file of the roots the proxy verifies brokered upstreams against; unset: the
    /// system's roots.
    pub upstream_ca_file: Option<PathBuf>,
}

impl Default for EgressSettings {
    fn default() -> Self {
        Self {
            max_connections_per_sandbox: 64,
            max_bytes_per_sandbox: 1 << 30,
            audit_burst: 10,
            audit_sandbox_cap: 100,
            audit_window_ms: 60_000,
            scan_interval_ms: 250,
            upstream_ca_file: None,
        }
    }
}

/// The durability policy as configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DurabilitySettings {
    /// For `user` callers.
    pub user: Durability,
    /// For `service` callers.
    pub service: Durability,
    /// For `internal` calls.
    pub internal: Durability,
}

impl Default for DurabilitySettings {
    fn default() -> Self {
        let p = DurabilityPolicy::default();
        Self { user: p.user, service: p.service, internal: p.internal }
    }
}

/// Every setting of the server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// Where keys, the SQLite database and workspaces live.
    pub data_dir: PathBuf,
    /// The address to listen on (`host:port`; port 0 picks a free one).
    pub listen: SocketAddr,
    /// `sqlite:…` or `postgres://…`; default: SQLite in the data dir. Its password never
    /// shows in logs or `config show`.
    pub database_url: Option<DatabaseUrl>,
    /// The driver.
    pub driver: DriverKind,
    /// Whether sandboxes are provisioned at all.
    pub lane_enabled: bool,
    /// How log lines look.
    pub log_format: LogFormat,
    /// Credentials.
    pub token: TokenSettings,
    /// HTTP.
    pub http: HttpSettings,
    /// Background work.
    pub background: BackgroundSettings,
    /// Durability by caller class.
    pub durability: DurabilitySettings,
    /// The default org policy.
    pub policy: PolicySettings,
    /// bubblewrap.
    pub bwrap: BwrapSettings,
    /// Containers.
    pub container: ContainerSettings,
    /// Kubernetes.
    pub kube: KubeSettings,
    /// What an agent does inside its sandbox: the caps.
    pub streams: StreamsSettings,
    /// The egress proxy.
    pub egress: EgressSettings,
    /// The `sandlane-supervisor` program the sandboxes run as their supervisor (bound read-only into
    /// each); default: `sandlane-supervisor` beside this executable.
    pub supervisor_program: Option<PathBuf>,
    /// Traces exported over OTLP.
    pub otlp: crate::telemetry::OtlpSettings,
    /// Webhook deliveries.
    pub webhooks: WebhookSettings,
}

/// The webhooks' delivery: retries, leases, and which receivers may be named.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WebhookSettings {
    /// Whether a receiver's URL may name a loopback, private, link-local or otherwise
    /// non-public address (off: refused when set and when delivering, against SSRF).
    pub allow_private: bool,
    /// How often each replica looks for deliveries due, in milliseconds.
    pub interval_ms: u64,
    /// The wait after a first failed attempt, in milliseconds; doubled at each failure.
    pub backoff_initial_ms: u64,
    /// The longest wait between two attempts, in milliseconds.
    pub backoff_max_ms: u64,
    /// Attempts before a delivery is given up (`failed`).
    pub max_attempts: u32,
    /// The longest one attempt may take (connect, send, answer), in milliseconds.
    pub timeout_ms: u64,
    /// How long a replica holds a delivery it attempts before another may take it, in
    /// milliseconds (more than `timeout_ms`).
    pub lease_ms: u64,
    /// How long a delivery that ended (delivered, or given up) is kept for the list of
    /// deliveries, in milliseconds; then it is deleted. Pending deliveries are kept until
    /// they end.
    pub retention_ms: u64,
}

impl Default for WebhookSettings {
    fn default() -> Self {
        Self {
            allow_private: false,
            interval_ms: 1000,
            backoff_initial_ms: 5000,
            backoff_max_ms: 600_000,
            max_attempts: 12,
            timeout_ms: 10_000,
            lease_ms: 30_000,
            retention_ms: 30 * 24 * 3600 * 1000,
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("sandlane-data"),
            listen: SocketAddr::from(([127, 0, 0, 1], 7878)),
            database_url: None,
            driver: DriverKind::Bubblewrap,
            lane_enabled: true,
            log_format: LogFormat::Human,
            token: TokenSettings::default(),
            http: HttpSettings::default(),
            background: BackgroundSettings::default(),
            durability: DurabilitySettings::default(),
            policy: PolicySettings::default(),
            bwrap: BwrapSettings::default(),
            container: ContainerSettings::default(),
            kube: KubeSettings::default(),
            streams: StreamsSettings::default(),
            egress: EgressSettings::default(),
            supervisor_program: None,
            otlp: crate::telemetry::OtlpSettings::default(),
            webhooks: WebhookSettings::default(),
        }
    }
}

impl Settings {
    /// Defaults, then `file` (if any), then the `SANDLANE_*` variables in `env`; validated.
    ///
    /// # Errors
    /// [`ConfigError`] naming the file or setting at fault.
    pub fn load(file: Option<&Path>, env: &HashMap<String, String>) -> Result<Self, ConfigError> {
        Ok(Self::load_with_sources(file, env)?.0)
    }

    /// As [`load`](Self::load), with where each setting's value came from, by dotted key.
    ///
    /// # Errors
    /// [`ConfigError`] naming the file or setting at fault.
    pub fn load_with_sources(
        file: Option<&Path>,
        env: &HashMap<String, String>,
    ) -> Result<(Self, BTreeMap<String, SettingSource>), ConfigError> {
        let defaults = Config::try_from(&Settings::default())
            .map_err(|e| ConfigError::Invalid { name: "defaults".into(), message: e.to_string() })?;
        let known = leaf_keys(&defaults);
        let vars = settings_variables(env, &known)?;
        let mut builder = Config::builder().add_source(defaults);
        if let Some(path) = file {
            if !path.is_file() {
                return Err(ConfigError::File { path: path.to_owned(), message: "no such file".into() });
            }
            builder = builder.add_source(File::from(path).format(FileFormat::Toml).required(true));
        }
        // The settings' variables under their canonical names (aliases resolved).
        let by_variable: HashMap<String, String> =
            vars.iter().map(|(key, (_, value))| (env_var(key), value.clone())).collect();
        builder = builder.add_source(
            Environment::with_prefix(ENV_PREFIX.trim_end_matches('_'))
                .prefix_separator("_")
                .separator(ENV_SEPARATOR)
                .source(Some(by_variable.into_iter().collect())),
        );
        let merged = builder.build().map_err(|e| match file {
            Some(path) => ConfigError::File { path: path.to_owned(), message: e.to_string() },
            None => ConfigError::Invalid { name: "settings".into(), message: e.to_string() },
        })?;
        let sources: BTreeMap<String, SettingSource> = leaf_origins(&merged)
            .into_iter()
            .map(|(key, origin)| {
                let source = match origin {
                    None => SettingSource::Default,
                    Some(_) if vars.contains_key(&key) => SettingSource::Env(vars[&key].0.clone()),
                    Some(_) => SettingSource::File(file.map(Path::to_owned).unwrap_or_default()),
                };
                (key, source)
            })
            .collect();
        let name_of = |key: &str| match sources.get(key) {
            Some(SettingSource::Env(var)) => format!("{key} ({var})"),
            Some(SettingSource::File(path)) => format!("{key} (file {})", path.display()),
            _ => key.to_owned(),
        };
        let settings: Settings = merged.try_deserialize().map_err(|e| {
            let key = error_key(&e);
            match (key, file) {
                (Some(key), _) => ConfigError::Invalid { name: name_of(&key), message: e.to_string() },
                (None, Some(path)) => ConfigError::File { path: path.to_owned(), message: e.to_string() },
                (None, None) => ConfigError::Invalid { name: "settings".into(), message: e.to_string() },
            }
        })?;
        settings.validate().map_err(|e| match e {
            ConfigError::Invalid { name, message } => ConfigError::Invalid { name: name_of(&name), message },
            other => other,
        })?;
        Ok((settings, sources))
    }

    /// Checks what the types do not: ranges and relations. The error names the first bad
    /// setting by its dotted key.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |name: &str, message: String| ConfigError::Invalid { name: name.to_owned(), message };
        if self.data_dir.as_os_str().is_empty() {
            return Err(invalid("data_dir", "must not be empty".into()));
        }
        if self.token.ttl_secs == 0 || self.token.ttl_secs > MAX_TOKEN_TTL_SECS {
            return Err(invalid(
                "token.ttl_secs",
                format!(
                    "must be between 1 and {MAX_TOKEN_TTL_SECS} (a credential lives at most 15 minutes), got {}",
                    self.token.ttl_secs
                ),
            ));
        }
        if self.token.refresh_margin_secs >= self.token.ttl_secs {
            return Err(invalid("token.refresh_margin_secs", "must be less than token.ttl_secs".into()));
        }
        for (name, value) in [
            ("http.request_timeout_ms", self.http.request_timeout_ms),
            ("http.header_timeout_ms", self.http.header_timeout_ms),
            ("http.idle_timeout_ms", self.http.idle_timeout_ms),
            ("http.max_connections", self.http.max_connections.map_or(1, u64::from)),
            ("background.seal_interval_ms", self.background.seal_interval_ms),
            ("background.refresh_interval_ms", self.background.refresh_interval_ms),
            ("background.reconcile_interval_ms", self.background.reconcile_interval_ms),
            ("background.lease_ms", self.background.lease_ms),
            ("background.policy_interval_ms", self.background.policy_interval_ms),
            ("background.activity_interval_ms", self.background.activity_interval_ms),
            ("streams.max_file_bytes", self.streams.max_file_bytes),
            ("streams.max_archive_bytes", self.streams.max_archive_bytes),
            ("streams.max_processes", u64::from(self.streams.max_processes)),
            ("streams.process_buffer_bytes", self.streams.process_buffer_bytes),
            ("streams.max_file_ops_per_sandbox", u64::from(self.streams.max_file_ops_per_sandbox)),
            (
                "streams.max_preview_connections_per_sandbox",
                u64::from(self.streams.max_preview_connections_per_sandbox),
            ),
            ("egress.max_connections_per_sandbox", u64::from(self.egress.max_connections_per_sandbox)),
            ("egress.max_bytes_per_sandbox", self.egress.max_bytes_per_sandbox),
            ("egress.audit_burst", u64::from(self.egress.audit_burst)),
            ("egress.audit_sandbox_cap", u64::from(self.egress.audit_sandbox_cap)),
            ("egress.audit_window_ms", self.egress.audit_window_ms),
            ("egress.scan_interval_ms", self.egress.scan_interval_ms),
            ("otlp.timeout_ms", self.otlp.timeout_ms),
            ("webhooks.interval_ms", self.webhooks.interval_ms),
            ("webhooks.backoff_initial_ms", self.webhooks.backoff_initial_ms),
            ("webhooks.max_attempts", u64::from(self.webhooks.max_attempts)),
            ("webhooks.timeout_ms", self.webhooks.timeout_ms),
            ("webhooks.retention_ms", self.webhooks.retention_ms),
        ] {
            if value == 0 {
                return Err(invalid(name, "must be greater than 0".into()));
            }
        }
        if self.webhooks.lease_ms <= self.webhooks.timeout_ms {
            return Err(invalid("webhooks.lease_ms", "must be greater than webhooks.timeout_ms".into()));
        }
        if self.webhooks.backoff_max_ms < self.webhooks.backoff_initial_ms {
            return Err(invalid(
                "webhooks.backoff_max_ms",
                "must be at least webhooks.backoff_initial_ms".into(),
            ));
        }
        if let Some(url) = self.otlp.traces_url()
            && !url.starts_with("http://")
        {
            return Err(invalid(
                "otlp.endpoint",
                format!("must be an http:// URL (a collector beside the server), got {url}"),
            ));
        }
        if self.http.ensure_deadline_ms == 0 || self.http.ensure_deadline_ms >= self.http.request_timeout_ms {
            return Err(invalid(
                "http.ensure_deadline_ms",
                format!(
                    "must be greater than 0 and less than http.request_timeout_ms ({}), got {}",
                    self.http.request_timeout_ms, self.http.ensure_deadline_ms
                ),
            ));
        }
        if self.streams.max_buffered_bytes < self.streams.process_buffer_bytes {
            return Err(invalid(
                "streams.max_buffered_bytes",
                format!(
                    "must be at least streams.process_buffer_bytes ({}), got {}",
                    self.streams.process_buffer_bytes, self.streams.max_buffered_bytes
                ),
            ));
        }
        // What the audit throttle holds per sandbox is bounded by its cap (twice the cap per
        // kind of decision, one small entry each, per live sandbox): an unbounded cap is an
        // unbounded table, and a burst past the cap is never reached.
        if self.egress.audit_sandbox_cap > MAX_AUDIT_SANDBOX_CAP {
            return Err(invalid(
                "egress.audit_sandbox_cap",
                format!("must be at most {MAX_AUDIT_SANDBOX_CAP}, got {}", self.egress.audit_sandbox_cap),
            ));
        }
        if self.egress.audit_burst > self.egress.audit_sandbox_cap {
            return Err(invalid(
                "egress.audit_burst",
                format!(
                    "must be at most egress.audit_sandbox_cap ({}), got {}",
                    self.egress.audit_sandbox_cap, self.egress.audit_burst
                ),
            ));
        }
        if self.http.body_limit_bytes < 1024 {
            return Err(invalid("http.body_limit_bytes", "must be at least 1024".into()));
        }
        if !is_domain(&self.http.preview_domain) {
            return Err(invalid(
                "http.preview_domain",
                format!(
                    "must be a lower-case DNS name (labels of a-z, 0-9 and -, joined by dots), got {:?}",
                    self.http.preview_domain
                ),
            ));
        }
        // The drivers' own settings, checked by their drivers.
        let driver = |e: InvalidSetting| invalid(&e.key, e.message);
        self.bwrap.validate().map_err(driver)?;
        self.container.validate().map_err(driver)?;
        self.kube.validate().map_err(driver)?;
        self.policy.policy()?;
        Ok(())
    }

    /// The durability policy.
    pub fn policy(&self) -> DurabilityPolicy {
        DurabilityPolicy {
            user: self.durability.user,
            service: self.durability.service,
            internal: self.durability.internal,
        }
    }

    /// Every setting by dotted key, as JSON values (the database URL redacted); unset
    /// optional settings are `null`.
    pub fn flattened(&self) -> BTreeMap<String, serde_json::Value> {
        let mut out = BTreeMap::new();
        flatten("", &serde_json::to_value(self).unwrap_or_default(), &mut out);
        out
    }

    /// The effective settings as TOML, each line followed by its source as a comment
    /// (`sandlane config show`). The database URL's password is redacted; unset optional
    /// settings are commented out.
    pub fn to_annotated_toml(&self, sources: &BTreeMap<String, SettingSource>) -> String {
        let mut by_table: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
        for (key, value) in self.flattened() {
            let (table, leaf) =
                key.rsplit_once('.').map_or((String::new(), key.clone()), |(t, l)| (t.into(), l.into()));
            let source = sources.get(&key).map_or_else(|| "default".to_owned(), ToString::to_string);
            let line = if value.is_null() {
                format!("# {leaf} = (unset)  # {source}; {}", env_var(&key))
            } else {
                format!("{leaf} = {value}  # {source}")
            };
            by_table.entry(table).or_default().push((leaf, line));
        }
        let mut out = String::new();
        for (table, lines) in by_table {
            if !table.is_empty() {
                out.push_str(&format!("\n[{table}]\n"));
            }
            for (_, line) in lines {
                out.push_str(&line);
                out.push('\n');
            }
        }
        out
    }

    /// The effective settings as JSON: `{"settings": {...}, "sources": {"key": "…"}}`.
    pub fn to_json_with_sources(&self, sources: &BTreeMap<String, SettingSource>) -> serde_json::Value {
        let sources: BTreeMap<String, String> = self
            .flattened()
            .into_keys()
            .map(|key| {
                let source = sources.get(&key).map_or_else(|| "default".to_owned(), ToString::to_string);
                (key, source)
            })
            .collect();
        serde_json::json!({ "settings": self, "sources": sources })
    }
}

fn flatten(prefix: &str, value: &serde_json::Value, out: &mut BTreeMap<String, serde_json::Value>) {
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                flatten(&key, v, out);
            }
        }
        other => {
            out.insert(prefix.to_owned(), other.clone());
        }
    }
}

/// Every leaf key of `config` (dotted) with its value's origin (`None` for a default).
fn leaf_origins(config: &Config) -> BTreeMap<String, Option<String>> {
    fn walk(
        prefix: &str,
        map: &config::Map<String, config::Value>,
        out: &mut BTreeMap<String, Option<String>>,
    ) {
        for (k, v) in map {
            let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
            match v.clone().into_table() {
                Ok(table) => walk(&key, &table, out),
                Err(_) => {
                    out.insert(key, v.origin().map(str::to_owned));
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    if let Ok(map) = config.collect() {
        walk("", &map, &mut out);
    }
    out
}

fn leaf_keys(config: &Config) -> Vec<String> {
    leaf_origins(config).into_keys().collect()
}

/// The settings among `env`'s variables: dotted key → (variable, value). Aliases first, so
/// a variable's own name wins over an alias of the same setting.
fn settings_variables(
    env: &HashMap<String, String>,
    known: &[String],
) -> Result<BTreeMap<String, (String, String)>, ConfigError> {
    let mut out = BTreeMap::new();
    for (alias, key) in ENV_ALIASES {
        if let Some(value) = env.get(alias).filter(|v| !v.trim().is_empty()) {
            out.insert(key.to_owned(), (alias.to_owned(), value.trim().to_owned()));
        }
    }
    let mut names: Vec<&String> = env.keys().filter(|k| k.starts_with(ENV_PREFIX)).collect();
    names.sort();
    for name in names {
        let value = env[name].trim();
        let rest = &name[ENV_PREFIX.len()..];
        let key = rest.to_ascii_lowercase().replace(ENV_SEPARATOR, ".");
        let is_setting = known.contains(&key);
        if !is_setting {
            if rest.contains(ENV_SEPARATOR) {
                return Err(ConfigError::Invalid {
                    name: name.clone(),
                    message: format!("names no setting ({key}); see `sandlane config show`"),
                });
            }
            continue; // not a setting: the sandbox's or a tool's own variable
        }
        if !value.is_empty() {
            out.insert(key, (name.clone(), value.to_owned()));
        }
    }
    Ok(out)
}

/// The dotted key a `config` error is about, when it says.
fn error_key(e: &config::ConfigError) -> Option<String> {
    match e {
        config::ConfigError::Type { key, .. } | config::ConfigError::At { key, .. } => key.clone(),
        _ => None,
    }
}

#[cfg(test)]
mod tests;

/// Whether `name` is a lower-case DNS name: labels of `a-z`, `0-9` and `-` (not at either
/// end), 1 to 63 characters each, joined by dots, 253 characters at most.
fn is_domain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
}
