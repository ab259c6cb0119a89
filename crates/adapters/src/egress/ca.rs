//! Each sandbox's own certificate authority, for brokered TLS: made at every provision
//! (and resume) with `rcgen`, ECDSA P-256. Its certificate goes into the sandbox
//! (`/run/sandlane/ca.pem`, and a bundle of the host's system roots plus it); its key
//! stays on the server's side, where the driver keeps the sandbox's other server-side
//! state, so a restarted server that adopts the sandbox still issues leaves under it.
//!
//! Leaves are issued per host on demand, valid for [`LEAF_VALIDITY`], and cached per CA
//! (at most [`MAX_LEAVES`] hosts; the oldest goes first), each as the rustls server
//! configuration that serves it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use domain::SandboxId;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyPair, KeyUsagePurpose,
};
use rustls::ServerConfig;
use rustls_pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

/// The CA's certificate in the sandbox's `/run/sandlane` directory.
pub const CA_FILE: &str = "ca.pem";
/// The bundle (the host's system roots, then the CA) in the same directory.
pub const CA_BUNDLE_FILE: &str = "ca-bundle.pem";
/// The CA's key (PKCS#8 PEM, mode 0600) in the driver's server-side state.
pub const CA_KEY_FILE: &str = "ca.key";

/// How long a leaf is valid (from an hour before it is issued, for clocks a little off).
pub const LEAF_VALIDITY: Duration = Duration::from_secs(24 * 3600);
/// How long a leaf is served from the cache before a new one is issued.
const LEAF_REUSE: Duration = Duration::from_secs(12 * 3600);
/// Most hosts whose leaf one sandbox's CA keeps.
pub const MAX_LEAVES: usize = 256;
/// How long the CA's certificate is valid: it is replaced at every provision anyway.
const CA_VALIDITY: Duration = Duration::from_secs(10 * 366 * 24 * 3600);
/// Clock skew allowed at both ends.
const SKEW: Duration = Duration::from_secs(3600);

/// Where the host keeps its system roots, the first that exists (Debian and Ubuntu,
/// Fedora and RHEL, Alpine and others).
const SYSTEM_ROOTS: [&str; 4] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
];

/// Why a CA or a leaf could not be made, loaded or written.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct CaError(String);

impl CaError {
    pub(crate) fn new(why: String) -> Self {
        Self(why)
    }
}

impl From<rcgen::Error> for CaError {
    fn from(e: rcgen::Error) -> Self {
        Self(format!("certificate: {e}"))
    }
}

/// One sandbox's CA: its certificate and the issuer (with its key) of its leaves.
pub struct SandboxCa {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    key_pem: String,
    leaves: Mutex<HashMap<String, Leaf>>,
}

#[derive(Clone)]
struct Leaf {
    config: Arc<ServerConfig>,
    issued: Instant,
}

impl std::fmt::Debug for SandboxCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxCa").finish_non_exhaustive()
    }
}

/// The CA's name: the sandbox's, so a certificate seen in a client's error says whose.
fn ca_params(sandbox: &SandboxId) -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, "sandlane sandbox CA");
    name.push(DnType::OrganizationName, sandbox.to_string());
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params
}

fn random_serial() -> Result<rcgen::SerialNumber, CaError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| CaError(format!("no randomness: {e}")))?;
    // Positive and without a leading zero byte.
    bytes[0] = (bytes[0] & 0x7f) | 0x01;
    Ok(rcgen::SerialNumber::from_slice(&bytes))
}

impl SandboxCa {
    /// A new CA for `sandbox`, with a new key.
    ///
    /// # Errors
    /// [`CaError`] when the key or the certificate cannot be made.
    pub fn generate(sandbox: &SandboxId) -> Result<Self, CaError> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let mut params = ca_params(sandbox);
        let now = SystemTime::now();
        params.not_before = (now - SKEW).into();
        params.not_after = (now + CA_VALIDITY).into();
        params.serial_number = Some(random_serial()?);
        let cert = params.self_signed(&key)?;
        let key_pem = key.serialize_pem();
        Ok(Self {
            issuer: Issuer::new(ca_params(sandbox), key),
            cert_pem: cert.pem(),
            key_pem,
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// The CA of `sandbox` from its key and certificate as [`SandboxCa::write`] wrote them.
    ///
    /// # Errors
    /// [`CaError`] when the key does not parse.
    pub fn from_pem(sandbox: &SandboxId, key_pem: &str, cert_pem: &str) -> Result<Self, CaError> {
        let key = KeyPair::from_pem(key_pem)?;
        Ok(Self {
            issuer: Issuer::new(ca_params(sandbox), key),
            cert_pem: cert_pem.to_owned(),
            key_pem: key_pem.to_owned(),
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// The CA's certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA's key, PKCS#8 PEM: for the server's side only.
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// The key file's contents: the key, then the certificate (so one file restores both).
    pub fn key_file(&self) -> String {
        format!("{}{}", self.key_pem, self.cert_pem)
    }

    /// The CA from a key file as [`SandboxCa::key_file`] wrote it.
    ///
    /// # Errors
    /// [`CaError`] when it holds no key or no certificate.
    pub fn from_key_file(sandbox: &SandboxId, text: &str) -> Result<Self, CaError> {
        let start =
            text.find("-----BEGIN CERTIFICATE-----").ok_or_else(|| CaError("no certificate".into()))?;
        Self::from_pem(sandbox, &text[..start], &text[start..])
    }

    /// The bundle the sandbox trusts: the host's system roots, then this CA.
    pub fn bundle(&self) -> String {
        let mut bundle = system_roots().to_owned();
        if !bundle.is_empty() && !bundle.ends_with('\n') {
            bundle.push('\n');
        }
        bundle.push_str(&self.cert_pem);
        bundle
    }

    /// Writes the key file into `key_dir` (mode 0600: the server's side, never bound into
    /// the sandbox) and the certificate and bundle into `run_dir` (the directory bound at
    /// `/run/sandlane`: mode 0400, owned by `owner`, the sandbox's uid and gid, as its
    /// token is; nothing under a data dir is readable by others), each atomically (a new
    /// file renamed over the old).
    ///
    /// # Errors
    /// [`CaError`] naming the file that could not be written.
    pub fn write(&self, key_dir: &Path, run_dir: &Path, owner: Option<(u32, u32)>) -> Result<(), CaError> {
        write_atomic(&key_dir.join(CA_KEY_FILE), self.key_file().as_bytes(), 0o600, None)?;
        write_atomic(&run_dir.join(CA_FILE), self.cert_pem.as_bytes(), 0o400, owner)?;
        write_atomic(&run_dir.join(CA_BUNDLE_FILE), self.bundle().as_bytes(), 0o400, owner)
    }

    /// The TLS configuration serving `host` (a leaf for it, issued now or cached), with
    /// ALPN `h2` and `http/1.1`.
    ///
    /// # Errors
    /// [`CaError`] when the leaf cannot be made.
    pub fn server_config(&self, host: &str) -> Result<Arc<ServerConfig>, CaError> {
        let now = Instant::now();
        if let Some(leaf) = self.leaves().get(host)
            && now.duration_since(leaf.issued) < LEAF_REUSE
        {
            return Ok(leaf.config.clone());
        }
        let config = Arc::new(self.issue(host)?);
        let mut leaves = self.leaves();
        leaves.retain(|_, leaf| now.duration_since(leaf.issued) < LEAF_REUSE);
        if leaves.len() >= MAX_LEAVES
            && let Some(oldest) = leaves.iter().min_by_key(|(_, leaf)| leaf.issued).map(|(h, _)| h.clone())
        {
            leaves.remove(&oldest);
        }
        leaves.insert(host.to_owned(), Leaf { config: config.clone(), issued: now });
        Ok(config)
    }

    /// How many leaves are cached (for tests).
    pub fn cached_leaves(&self) -> usize {
        self.leaves().len()
    }

    fn leaves(&self) -> std::sync::MutexGuard<'_, HashMap<String, Leaf>> {
        self.leaves.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn issue(&self, host: &str) -> Result<ServerConfig, CaError> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let mut params = CertificateParams::new(vec![host.to_owned()])?;
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, host);
        params.distinguished_name = name;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let now = SystemTime::now();
        params.not_before = (now - SKEW).into();
        params.not_after = (now + LEAF_VALIDITY).into();
        params.serial_number = Some(random_serial()?);
        let cert = params.signed_by(&key, &self.issuer)?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut config =
            ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .map_err(|e| CaError(format!("tls: {e}")))?
                .with_no_client_auth()
                .with_single_cert(vec![cert.der().clone()], key)
                .map_err(|e| CaError(format!("tls: {e}")))?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(config)
    }
}

/// The host's system roots as PEM (read once), empty when none is found.
fn system_roots() -> &'static str {
    static ROOTS: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ROOTS.get_or_init(|| {
        SYSTEM_ROOTS.iter().find_map(|path| std::fs::read_to_string(path).ok()).unwrap_or_default()
    })
}

/// Writes `bytes` to `path` through a new file renamed over it, with `mode`.
fn write_atomic(path: &Path, bytes: &[u8], mode: u32, owner: Option<(u32, u32)>) -> Result<(), CaError> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let fail = |what: &str, e: std::io::Error| CaError(format!("cannot {what} {}: {e}", path.display()));
    // A name of its own per writer, hidden.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.new.{}.{n}", std::process::id()));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .map_err(|e| fail("create", e))?;
    // The owner and mode exactly (the server runs with umask 077, which `mode` alone is
    // masked by): the certificate must be readable by the sandbox's uid.
    let written = owner
        .map_or(Ok(()), |(uid, gid)| std::os::unix::fs::fchown(&file, Some(uid), Some(gid)))
        .and_then(|()| file.set_permissions(std::fs::Permissions::from_mode(mode)))
        .and_then(|()| file.write_all(bytes))
        .map_err(|e| fail("write", e));
    drop(file);
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, path).map_err(|e| fail("replace", e))
}

/// Where the proxy finds the CA of the sandbox it serves.
#[async_trait]
pub trait CaSource: Send + Sync {
    /// The sandbox's current CA; `None` when it has none (then a brokered `CONNECT` is
    /// refused).
    async fn current(&self) -> Option<Arc<SandboxCa>>;
}

/// One CA for the whole life of the serving (Kubernetes: read from the pod's Secret when
/// its serving starts; a new pod is served anew).
#[async_trait]
impl CaSource for Arc<SandboxCa> {
    async fn current(&self) -> Option<Arc<SandboxCa>> {
        Some(self.clone())
    }
}

/// The CA in a key file the driver keeps (bubblewrap, containers): read again whenever
/// the file was replaced (a provision of the same sandbox makes a new CA).
pub struct CaFile {
    sandbox: SandboxId,
    path: PathBuf,
    cached: Mutex<Option<(Stamp, Arc<SandboxCa>)>>,
}

type Stamp = (u64, u64, i64, i64);

impl CaFile {
    /// The CA of `sandbox` kept in `key_dir` ([`CA_KEY_FILE`]).
    pub fn new(sandbox: &SandboxId, key_dir: &Path) -> Self {
        Self { sandbox: sandbox.clone(), path: key_dir.join(CA_KEY_FILE), cached: Mutex::new(None) }
    }
}

#[async_trait]
impl CaSource for CaFile {
    async fn current(&self) -> Option<Arc<SandboxCa>> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(&self.path).ok()?;
        let stamp = (meta.dev(), meta.ino(), meta.mtime(), meta.mtime_nsec());
        let mut cached = self.cached.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((seen, ca)) = cached.as_ref()
            && *seen == stamp
        {
            return Some(ca.clone());
        }
        let text = std::fs::read_to_string(&self.path).ok()?;
        match SandboxCa::from_key_file(&self.sandbox, &text) {
            Ok(ca) => {
                let ca = Arc::new(ca);
                *cached = Some((stamp, ca.clone()));
                Some(ca)
            }
            Err(e) => {
                tracing::warn!(sandbox = %self.sandbox, error = %e, "egress: the sandbox's CA does not load");
                None
            }
        }
    }
}
