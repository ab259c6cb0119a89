//! Settings: defaults, then a TOML file, then `SANDLANE_*` environment variables,
//! validated at start-up with an error that names the bad setting.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use domain::{Durability, DurabilityPolicy};
use serde::Deserialize;

/// Why the settings were refused. Each names the setting.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The config file is not valid TOML for these settings.
    #[error("config file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The TOML error, naming the key.
        message: String,
    },
    /// A setting has an invalid value.
    #[error("setting {name}: {message}")]
    Invalid {
        /// The setting (`SANDLANE_LISTEN`, `http.request_timeout_ms`, …).
        name: String,
        /// What is wrong.
        message: String,
    },
}

fn invalid(name: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { name: name.to_owned(), message: message.into() }
}

/// Which sandbox driver to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DriverKind {
    /// bubblewrap (the embedded default).
    Bubblewrap,
    /// Containers through the Docker Engine API.
    Container,
}

/// Credential settings.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TokenSettings {
    /// `iss`.
    pub issuer: String,
    /// `aud`.
    pub audience: String,
    /// Lifetime in seconds (1–3600).
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
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
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
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self { request_timeout_ms: 60_000, body_limit_bytes: 1 << 20, ensure_deadline_ms: 30_000 }
    }
}

/// Background work settings.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
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
}

impl Default for BackgroundSettings {
    fn default() -> Self {
        Self {
            seal_interval_ms: 500,
            refresh_interval_ms: 60_000,
            reconcile_interval_ms: 60_000,
            lease_ms: 60_000,
        }
    }
}

/// bubblewrap driver settings. Unset limits keep the driver's defaults.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BwrapSettings {
    /// The bubblewrap program.
    pub program: PathBuf,
    /// Process limit per sandbox.
    pub max_processes: Option<u64>,
    /// Open file limit.
    pub max_open_files: Option<u64>,
    /// Address space limit in bytes.
    pub max_address_space_bytes: Option<u64>,
    /// File size limit in bytes.
    pub max_file_size_bytes: Option<u64>,
    /// CPU time limit in seconds.
    pub max_cpu_secs: Option<u64>,
    /// Memory limit in bytes (enforced where a memory cgroup is writable).
    pub max_memory_bytes: Option<u64>,
    /// Output cap per stream, in bytes.
    pub output_cap_bytes: Option<usize>,
    /// CPU share of a sandbox in thousandths of a CPU (the `cpu` cgroup, where writable).
    pub max_cpu_millis: Option<u64>,
    /// Whether the supervisor installs the seccomp filter (default: yes, where the kernel
    /// has seccomp).
    pub seccomp: Option<bool>,
    /// The protections provision requires (`userns`, `cgroup-memory`, `cgroup-pids`,
    /// `cgroup-cpu`, `seccomp`); default: every one this host gives.
    pub required_protections: Option<Vec<String>>,
}

impl Default for BwrapSettings {
    fn default() -> Self {
        Self {
            program: PathBuf::from("bwrap"),
            max_processes: None,
            max_open_files: None,
            max_address_space_bytes: None,
            max_file_size_bytes: None,
            max_cpu_secs: None,
            max_memory_bytes: None,
            output_cap_bytes: None,
            max_cpu_millis: None,
            seccomp: None,
            required_protections: None,
        }
    }
}

/// Container driver settings.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct ContainerSettings {
    /// The Docker Engine API endpoint (`unix:///…`); else `DOCKER_HOST`, else the default.
    pub docker_host: Option<String>,
    /// The image sandboxes run.
    pub image: Option<String>,
    /// The prefix of this deployment's container and volume names (and of the label it
    /// lists its containers by), so two deployments on one engine never touch each
    /// other's sandboxes. Default `sandlane`.
    pub name_prefix: Option<String>,
}

/// The durability policy as configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// Where keys, the SQLite database and workspaces live.
    pub data_dir: PathBuf,
    /// The address to listen on.
    pub listen: String,
    /// `sqlite://…` or `postgres://…`; default: SQLite in the data dir.
    pub database_url: Option<String>,
    /// The driver.
    pub driver: DriverKind,
    /// Whether sandboxes are provisioned at all.
    pub lane_enabled: bool,
    /// `human` or `json`.
    pub log_format: String,
    /// Credentials.
    pub token: TokenSettings,
    /// HTTP.
    pub http: HttpSettings,
    /// Background work.
    pub background: BackgroundSettings,
    /// Durability by caller class.
    pub durability: DurabilitySettings,
    /// bubblewrap.
    pub bwrap: BwrapSettings,
    /// Containers.
    pub container: ContainerSettings,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("sandlane-data"),
            listen: "127.0.0.1:7878".into(),
            database_url: None,
            driver: DriverKind::Bubblewrap,
            lane_enabled: true,
            log_format: "human".into(),
            token: TokenSettings::default(),
            http: HttpSettings::default(),
            background: BackgroundSettings::default(),
            durability: DurabilitySettings::default(),
            bwrap: BwrapSettings::default(),
            container: ContainerSettings::default(),
        }
    }
}

impl Settings {
    /// Defaults, then `file` (if any), then the `SANDLANE_*` variables in `env`; validated.
    ///
    /// # Errors
    /// [`ConfigError`] naming the file or setting at fault.
    pub fn load(file: Option<&Path>, env: &HashMap<String, String>) -> Result<Self, ConfigError> {
        let mut settings = match file {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
                toml::from_str::<Settings>(&text)
                    .map_err(|e| ConfigError::Parse { path: path.to_owned(), message: e.to_string() })?
            }
            None => Settings::default(),
        };
        settings.apply_env(env)?;
        settings.validate()?;
        Ok(settings)
    }

    fn apply_env(&mut self, env: &HashMap<String, String>) -> Result<(), ConfigError> {
        let get = |name: &str| env.get(name).map(|v| v.trim().to_owned());
        if let Some(v) = get("SANDLANE_DATA_DIR") {
            self.data_dir = PathBuf::from(v);
        }
        if let Some(v) = get("SANDLANE_LISTEN") {
            self.listen = v;
        }
        if let Some(v) = get("SANDLANE_DATABASE_URL") {
            self.database_url = Some(v);
        }
        if let Some(v) = get("SANDLANE_DRIVER") {
            self.driver = match v.as_str() {
                "bubblewrap" | "bwrap" => DriverKind::Bubblewrap,
                "container" => DriverKind::Container,
                other => {
                    return Err(invalid(
                        "SANDLANE_DRIVER",
                        format!("expected \"bubblewrap\" or \"container\", got {other:?}"),
                    ));
                }
            };
        }
        if let Some(v) = get("SANDLANE_LANE_ENABLED") {
            self.lane_enabled = match v.to_ascii_lowercase().as_str() {
                "true" | "1" | "yes" | "on" => true,
                "false" | "0" | "no" | "off" => false,
                _ => {
                    return Err(invalid(
                        "SANDLANE_LANE_ENABLED",
                        format!("expected true or false, got {v:?}"),
                    ));
                }
            };
        }
        if let Some(v) = get("SANDLANE_BWRAP") {
            self.bwrap.program = PathBuf::from(v);
        }
        if let Some(v) = get("SANDLANE_LOG_FORMAT") {
            self.log_format = v;
        }
        if let Some(v) = get("SANDLANE_DOCKER_HOST") {
            self.container.docker_host = Some(v);
        }
        if let Some(v) = get("SANDLANE_CONTAINER_IMAGE") {
            self.container.image = Some(v);
        }
        if let Some(v) = get("SANDLANE_CONTAINER_PREFIX") {
            self.container.name_prefix = Some(v);
        }
        Ok(())
    }

    /// Checks every setting; the error names the first bad one.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.data_dir.as_os_str().is_empty() {
            return Err(invalid("data_dir (SANDLANE_DATA_DIR)", "must not be empty"));
        }
        self.listen.parse::<SocketAddr>().map_err(|e| {
            invalid("listen (SANDLANE_LISTEN)", format!("{:?} is not host:port: {e}", self.listen))
        })?;
        if let Some(url) = &self.database_url
            && !(url.starts_with("postgres://")
                || url.starts_with("postgresql://")
                || url.starts_with("sqlite:"))
        {
            return Err(invalid(
                "database_url (SANDLANE_DATABASE_URL)",
                "must start with postgres://, postgresql:// or sqlite:",
            ));
        }
        if !matches!(self.log_format.as_str(), "human" | "json") {
            return Err(invalid(
                "log_format (SANDLANE_LOG_FORMAT)",
                format!("expected human or json, got {:?}", self.log_format),
            ));
        }
        if self.token.ttl_secs == 0 || self.token.ttl_secs > 3600 {
            return Err(invalid(
                "token.ttl_secs",
                format!("must be between 1 and 3600, got {}", self.token.ttl_secs),
            ));
        }
        if self.token.refresh_margin_secs >= self.token.ttl_secs {
            return Err(invalid("token.refresh_margin_secs", "must be less than token.ttl_secs"));
        }
        for (name, value) in [
            ("http.request_timeout_ms", self.http.request_timeout_ms),
            ("background.seal_interval_ms", self.background.seal_interval_ms),
            ("background.refresh_interval_ms", self.background.refresh_interval_ms),
            ("background.reconcile_interval_ms", self.background.reconcile_interval_ms),
            ("background.lease_ms", self.background.lease_ms),
            ("bwrap.max_processes", self.bwrap.max_processes.unwrap_or(1)),
            ("bwrap.max_open_files", self.bwrap.max_open_files.unwrap_or(1)),
            ("bwrap.max_address_space_bytes", self.bwrap.max_address_space_bytes.unwrap_or(1)),
            ("bwrap.max_file_size_bytes", self.bwrap.max_file_size_bytes.unwrap_or(1)),
            ("bwrap.max_cpu_secs", self.bwrap.max_cpu_secs.unwrap_or(1)),
            ("bwrap.max_memory_bytes", self.bwrap.max_memory_bytes.unwrap_or(1)),
            ("bwrap.output_cap_bytes", self.bwrap.output_cap_bytes.map_or(1, |v| v as u64)),
            ("bwrap.max_cpu_millis", self.bwrap.max_cpu_millis.unwrap_or(1)),
        ] {
            if value == 0 {
                return Err(invalid(name, "must be greater than 0"));
            }
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
        if let Some(prefix) = &self.container.name_prefix
            && (prefix.is_empty()
                || prefix.len() > 32
                || !prefix.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'))
        {
            return Err(invalid(
                "container.name_prefix (SANDLANE_CONTAINER_PREFIX)",
                format!("must be 1-32 characters of a-z 0-9 -, got {prefix:?}"),
            ));
        }
        if self.http.body_limit_bytes < 1024 {
            return Err(invalid("http.body_limit_bytes", "must be at least 1024"));
        }
        for name in self.bwrap.required_protections.iter().flatten() {
            if adapters::bwrap::Protection::parse(name).is_none() {
                return Err(invalid(
                    "bwrap.required_protections",
                    format!(
                        "unknown protection {name:?}; expected userns, cgroup-memory, cgroup-pids, cgroup-cpu or seccomp"
                    ),
                ));
            }
        }
        if self.bwrap.program.as_os_str().is_empty() {
            return Err(invalid("bwrap.program (SANDLANE_BWRAP)", "must not be empty"));
        }
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn defaults_are_the_embedded_setup() {
        let s = Settings::load(None, &HashMap::new()).unwrap();
        assert_eq!(s.driver, DriverKind::Bubblewrap);
        assert!(s.lane_enabled);
        assert_eq!(s.listen, "127.0.0.1:7878");
        assert_eq!(s.database_url, None, "SQLite in the data dir");
        assert_eq!(s.policy(), DurabilityPolicy::default());
    }

    #[test]
    fn file_then_env_override() {
        let dir = std::env::temp_dir().join(format!("sandlane-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("sandlane.toml");
        std::fs::write(
            &path,
            "listen = \"127.0.0.1:9000\"\nlane_enabled = false\n[token]\nttl_secs = 600\n[durability]\nservice = \"durable\"\n",
        )
        .unwrap();
        let s = Settings::load(Some(&path), &env(&[("SANDLANE_LISTEN", "127.0.0.1:9001")])).unwrap();
        assert_eq!(s.listen, "127.0.0.1:9001", "env beats the file");
        assert!(!s.lane_enabled, "the file beats the default");
        assert_eq!(s.token.ttl_secs, 600);
        assert_eq!(s.policy().service, Durability::Durable);
        let s = Settings::load(Some(&path), &env(&[("SANDLANE_LANE_ENABLED", "true")])).unwrap();
        assert!(s.lane_enabled);
        std::fs::write(&path, "[token]\nttl_secs = 7200\n").unwrap();
        let err = Settings::load(Some(&path), &HashMap::new()).unwrap_err();
        assert!(err.to_string().contains("token.ttl_secs"), "{err}");
        std::fs::write(&path, "listen_on = \"x\"\n").unwrap();
        let err = Settings::load(Some(&path), &HashMap::new()).unwrap_err();
        assert!(err.to_string().contains("listen_on"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_env_values_name_the_variable() {
        for (name, value) in [
            ("SANDLANE_LANE_ENABLED", "maybe"),
            ("SANDLANE_LISTEN", "localhost"),
            ("SANDLANE_DRIVER", "firecracker"),
            ("SANDLANE_DATABASE_URL", "mysql://x"),
            ("SANDLANE_LOG_FORMAT", "xml"),
            ("SANDLANE_CONTAINER_PREFIX", "Bad_Prefix"),
        ] {
            let err = Settings::load(None, &env(&[(name, value)])).unwrap_err();
            assert!(err.to_string().contains(name), "{name}: {err}");
        }
        let err = Settings::load(Some(Path::new("/nonexistent/sandlane.toml")), &HashMap::new()).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/sandlane.toml"), "{err}");
    }
}
