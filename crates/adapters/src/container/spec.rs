//! Pure pieces of the container driver: names, labels, the command wrapper, the token
//! archive. No I/O here.

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
/// Label: the sandbox environment (JSON of [`DriverEnvironment`]; no secret).
pub const LABEL_ENVIRONMENT: &str = "io.sandlane.environment";

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
}

impl SandboxLabels {
    /// Reads the labels of a container; `None` when they are missing or malformed.
    pub fn parse(labels: &HashMap<String, String>) -> Option<Self> {
        let environment = serde_json::from_str(labels.get(LABEL_ENVIRONMENT)?).ok()?;
        let durability = Durability::parse(labels.get(LABEL_DURABILITY)?).ok()?;
        let key =
            format!("{}/{}/{}", labels.get(LABEL_ORG)?, labels.get(LABEL_KIND)?, labels.get(LABEL_KEY)?);
        Some(Self { environment, durability, volume: labels.get(LABEL_VOLUME)?.clone(), key })
    }

    /// Whether these labels describe `key` with `durability`.
    pub fn is_for(&self, key: &SandboxKey, durability: Durability) -> bool {
        self.key == key.to_string() && self.durability == durability
    }
}

/// The first line a wrapped command writes to stderr: its pid inside the container,
/// which the driver strips and uses to kill the command's process tree at timeout.
const WRAPPER: &str = "echo \"$$\" >&2; exec \"$@\"";

/// The argv that runs `argv` with exactly `environment`'s variables: a shell that
/// reports its pid and `exec`s `env -i VARS… argv…` (same pid), so nothing the engine
/// adds (`container=…`, `TERM`, `HOSTNAME`) reaches the command.
pub fn wrapped_command(environment: &DriverEnvironment, argv: &[String]) -> Vec<String> {
    let vars = environment.vars();
    let mut cmd = Vec::with_capacity(argv.len() + vars.len() + 6);
    cmd.extend(["/bin/sh", "-c", WRAPPER, "sandlane-exec", "env", "-i"].map(str::to_owned));
    cmd.extend(vars.iter().map(|(k, v)| format!("{k}={v}")));
    cmd.extend(argv.iter().cloned());
    cmd
}

/// Kills the process tree of the pid passed as `$1`: stop each process before listing
/// its children (so none can fork past the walk), then kill it.
pub const KILL_TREE: &str = "k() { kill -STOP \"$1\" 2>/dev/null; \
     for c in $(cat /proc/\"$1\"/task/*/children 2>/dev/null); do k \"$c\"; done; \
     kill -KILL \"$1\" 2>/dev/null; }; k \"$1\"";

/// A tar archive holding one regular file `name` with `contents`, owned by root, with
/// `mode` (ustar, as the archive upload endpoint takes it).
pub fn single_file_tar(name: &str, contents: &[u8], mode: u32, mtime: u64) -> Vec<u8> {
    let mut header = [0u8; 512];
    let put = |h: &mut [u8; 512], at: usize, len: usize, value: &[u8]| {
        let n = value.len().min(len);
        h[at..at + n].copy_from_slice(&value[..n]);
    };
    let octal = |value: u64, width: usize| format!("{value:0w$o}\0", w = width - 1).into_bytes();
    put(&mut header, 0, 100, name.as_bytes());
    put(&mut header, 100, 8, &octal(u64::from(mode), 8));
    put(&mut header, 108, 8, &octal(0, 8));
    put(&mut header, 116, 8, &octal(0, 8));
    put(&mut header, 124, 12, &octal(contents.len() as u64, 12));
    put(&mut header, 136, 12, &octal(mtime, 12));
    header[148..156].fill(b' ');
    header[156] = b'0';
    put(&mut header, 257, 6, b"ustar\0");
    put(&mut header, 263, 2, b"00");
    put(&mut header, 265, 32, b"root");
    put(&mut header, 297, 32, b"root");
    let sum: u32 = header.iter().map(|b| u32::from(*b)).sum();
    put(&mut header, 148, 8, format!("{sum:06o}\0 ").as_bytes());
    let padded = contents.len().div_ceil(512) * 512;
    let mut tar = Vec::with_capacity(512 + padded + 1024);
    tar.extend_from_slice(&header);
    tar.extend_from_slice(contents);
    tar.resize(512 + padded + 1024, 0);
    tar
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
        assert!(parsed.is_for(&s.key, Durability::Durable));
        assert!(!parsed.is_for(&s.key, Durability::Ephemeral));
        assert_eq!(SandboxLabels::parse(&HashMap::new()), None);
    }

    #[test]
    fn the_wrapper_sets_exactly_the_environment() {
        let s = spec("acme", "s1", Durability::Durable);
        let cmd = wrapped_command(&s.environment, &["cat".to_owned(), "x y".to_owned()]);
        assert_eq!(&cmd[..6], ["/bin/sh", "-c", WRAPPER, "sandlane-exec", "env", "-i"]);
        assert_eq!(&cmd[cmd.len() - 2..], ["cat", "x y"]);
        assert_eq!(cmd.len(), 8 + s.environment.vars().len());
        assert!(!cmd.iter().any(|a| a.contains(s.credential.expose())));
    }

    #[test]
    fn the_token_archive_is_a_valid_ustar() {
        let tar = single_file_tar("token", b"abc", 0o444, 7);
        assert_eq!(tar.len(), 512 + 512 + 1024);
        assert_eq!(&tar[0..5], b"token");
        assert_eq!(&tar[100..108], b"0000444\0");
        assert_eq!(&tar[124..136], b"00000000003\0");
        assert_eq!(&tar[512..515], b"abc");
        let mut blank = tar[..512].to_vec();
        blank[148..156].fill(b' ');
        let sum: u32 = blank.iter().map(|b| u32::from(*b)).sum();
        let stored = std::str::from_utf8(&tar[148..154]).unwrap();
        assert_eq!(u32::from_str_radix(stored, 8).unwrap(), sum);
    }
}
