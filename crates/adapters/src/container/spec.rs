//! Pure pieces of the container driver: names and labels. No I/O here.

use std::collections::HashMap;

use domain::{DriverEnvironment, Durability, SandboxId, SandboxKey};
use sha2::{Digest, Sha256};

/// Label: the sandbox id a container or volume belongs to.
pub const LABEL_SANDBOX: &str = "io.sandlane.sandbox";
/// Label: the driver instance (its name prefix), for listing.
pub const LABEL_PREFIX: &str = "io.sandlane.prefix";
/// Label: `durable` or `ephemeral`.
pub const LABEL_DURABILITY: &str = "io.sandlane.durability";
/// Label: the key's org.
pub const LABEL_ORG: &str = "io.sandlane.org";
/// Label: the key's kind.
pub const LABEL_KIND: &str = "io.sandlane.kind";
/// Label: the key within org and kind.
pub const LABEL_KEY: &str = "io.sandlane.key";
/// Label: the workspace volume's name.
pub const LABEL_VOLUME: &str = "io.sandlane.volume";
/// Label: the sandbox environment at provision (JSON of [`DriverEnvironment`]; no
/// secret). The environment of the latest ensure is in the sandbox's host state.
pub const LABEL_ENVIRONMENT: &str = "io.sandlane.environment";
/// Label: the fencing epoch of the provision that created the container.
pub const LABEL_EPOCH: &str = "io.sandlane.epoch";

/// The container of a sandbox: `<prefix>-<sandbox id>`.
pub fn container_name(prefix: &str, sandbox: &SandboxId) -> String {
    format!("{prefix}-{sandbox}")
}

/// The workspace volume: for a durable workspace derived from the key (so it comes back
/// for the same key), for an ephemeral one from the sandbox id.
pub fn volume_name(prefix: &str, sandbox: &SandboxId, key: &SandboxKey, durability: Durability) -> String {
    match durability {
        Durability::Ephemeral => ephemeral_volume_name(prefix, sandbox),
        Durability::Durable => {
            let mut h = Sha256::new();
            for part in [key.org().as_str(), key.kind().as_str(), key.key()] {
                h.update(part.as_bytes());
                h.update([0u8]);
            }
            let digest = h.finalize();
            let hex: String = digest.iter().take(20).map(|b| format!("{b:02x}")).collect();
            format!("{prefix}-ws-{hex}")
        }
    }
}

/// The ephemeral workspace volume of a sandbox.
pub fn ephemeral_volume_name(prefix: &str, sandbox: &SandboxId) -> String {
    format!("{prefix}-ws-{sandbox}")
}

/// The labels of a sandbox's container (and, without the environment, its volume).
pub fn labels(
    prefix: &str,
    environment: &DriverEnvironment,
    key: &SandboxKey,
    durability: Durability,
    volume: &str,
) -> Result<HashMap<String, String>, serde_json::Error> {
    let mut l = volume_labels(prefix, key, durability);
    l.insert(LABEL_SANDBOX.into(), environment.sandbox_id().to_string());
    l.insert(LABEL_VOLUME.into(), volume.to_owned());
    l.insert(LABEL_ENVIRONMENT.into(), serde_json::to_string(environment)?);
    Ok(l)
}

/// The labels of a workspace volume: who it belongs to.
pub fn volume_labels(prefix: &str, key: &SandboxKey, durability: Durability) -> HashMap<String, String> {
    HashMap::from([
        (LABEL_PREFIX.to_owned(), prefix.to_owned()),
        (LABEL_DURABILITY.to_owned(), durability.as_str().to_owned()),
        (LABEL_ORG.to_owned(), key.org().to_string()),
        (LABEL_KIND.to_owned(), key.kind().to_string()),
        (LABEL_KEY.to_owned(), key.key().to_owned()),
    ])
}

/// What a container's labels say about its sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxLabels {
    /// The environment commands run with.
    pub environment: DriverEnvironment,
    /// The workspace's durability.
    pub durability: Durability,
    /// The workspace volume.
    pub volume: String,
    /// `org/kind/key`.
    pub key: String,
    /// The fencing epoch of the provision that created it (0 when unlabelled).
    pub epoch: i64,
}

impl SandboxLabels {
    /// Reads the labels of a container; `None` when they are missing or malformed.
    pub fn parse(labels: &HashMap<String, String>) -> Option<Self> {
        let environment = serde_json::from_str(labels.get(LABEL_ENVIRONMENT)?).ok()?;
        let durability = Durability::parse(labels.get(LABEL_DURABILITY)?).ok()?;
        let key =
            format!("{}/{}/{}", labels.get(LABEL_ORG)?, labels.get(LABEL_KIND)?, labels.get(LABEL_KEY)?);
        let epoch = labels.get(LABEL_EPOCH).and_then(|e| e.parse().ok()).unwrap_or(0);
        Some(Self { environment, durability, volume: labels.get(LABEL_VOLUME)?.clone(), key, epoch })
    }

    /// Whether a provision of `key` with `durability` may take this sandbox over: its own
    /// key; or, for a warm sandbox (provisioned under its org's pool key, then adopted by a
    /// claim), any key of its org.
    pub fn admits(&self, key: &SandboxKey, durability: Durability) -> bool {
        let warm = domain::policy::warm_key(key.org()).to_string();
        self.durability == durability && (self.key == key.to_string() || (self.key == warm))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver_contract::spec_for;
    use domain::CallerClass;
    use ports::driver::ProvisionSpec;

    fn spec(org: &str, session: &str, durability: Durability) -> ProvisionSpec {
        spec_for(org, session, "user-1", CallerClass::User, durability, "tok-secret")
    }

    #[test]
    fn names_follow_the_id_and_the_key() {
        let a = spec("acme", "s1", Durability::Durable);
        let b = spec("acme", "s1", Durability::Durable);
        let c = spec("acme", "s2", Durability::Durable);
        let va = volume_name("p", a.sandbox_id(), &a.key, a.durability);
        assert_eq!(va, volume_name("p", b.sandbox_id(), &b.key, b.durability), "same key, same volume");
        assert_ne!(va, volume_name("p", c.sandbox_id(), &c.key, c.durability));
        let e = spec("acme", "s1", Durability::Ephemeral);
        let ve = volume_name("p", e.sandbox_id(), &e.key, e.durability);
        assert_eq!(ve, format!("p-ws-{}", e.sandbox_id()));
        assert_eq!(container_name("p", a.sandbox_id()), format!("p-{}", a.sandbox_id()));
        let valid = |n: &str| n.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
        assert!(valid(&va) && valid(&ve));
    }

    #[test]
    fn labels_round_trip_and_carry_no_token() {
        let s = spec("acme", "s1", Durability::Durable);
        let l = labels("p", &s.environment, &s.key, s.durability, "vol").unwrap();
        assert!(!l.values().any(|v| v.contains(s.credential.expose())));
        let parsed = SandboxLabels::parse(&l).unwrap();
        assert_eq!(parsed.environment, s.environment);
        assert!(parsed.admits(&s.key, Durability::Durable));
        assert!(!parsed.admits(&s.key, Durability::Ephemeral));
        assert_eq!(SandboxLabels::parse(&HashMap::new()), None);
    }
}
