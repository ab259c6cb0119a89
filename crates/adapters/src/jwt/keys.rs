//! The Ed25519 signing keys: generated on first start, persisted in the data dir with mode
//! 0600, rotated with an overlap during which the previous key still verifies, and
//! published as a JWKS document (RFC 7517) with RFC 7638 thumbprints as key ids.

use std::fmt;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use domain::Timestamp;
use ed25519_dalek::{SigningKey, VerifyingKey};
use jsonwebtoken::{DecodingKey, EncodingKey};
use ports::Clock;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use zeroize::{Zeroize, Zeroizing};

use super::KEY_OVERLAP_SECS;

/// The key file's name inside the data dir.
pub const KEYS_FILE: &str = "signing-keys.json";
const FORMAT: &str = "sandlane-signing-keys/1";

/// Why the signing keys could not be loaded, created or written. Never holds key bytes.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// Reading or writing the key file (or its directory) failed.
    #[error("key file {path}: {reason}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        reason: String,
    },
    /// The key file does not hold what the lane writes.
    #[error("key file {path} is corrupt: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong (never the key material).
        reason: String,
    },
    /// The key file is readable or writable by group or others.
    #[error("key file {path} has mode {mode:03o}; it must be 0600 (owner only)")]
    Permissions {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The operating system's random source failed.
    #[error("no entropy for a new signing key: {0}")]
    Entropy(String),
}

/// The PKCS#8 v1 DER prefix of an Ed25519 private key (RFC 8410), before the 32-byte seed.
const PKCS8_ED25519_PREFIX: [u8; 16] =
    [0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20];

/// The PKCS#8 DER that jsonwebtoken's `EncodingKey::from_ed_der` wants, zeroized on drop.
pub(crate) fn pkcs8_der(seed: &[u8; 32]) -> Zeroizing<Vec<u8>> {
    let mut der = Zeroizing::new(Vec::with_capacity(48));
    der.extend_from_slice(&PKCS8_ED25519_PREFIX);
    der.extend_from_slice(seed);
    der
}

/// The RFC 7638 JWK thumbprint (SHA-256, base64url) of an Ed25519 public key.
pub(crate) fn thumbprint(x_b64: &str) -> String {
    // Required members in lexicographic order, no whitespace (RFC 7638 §3.2, RFC 8037 §2).
    let canonical = format!(r#"{{"crv":"Ed25519","kty":"OKP","x":"{x_b64}"}}"#);
    URL_SAFE_NO_PAD.encode(Sha256::digest(canonical.as_bytes()))
}

/// A key that verifies: its id, public key, and jsonwebtoken's decoding key.
#[derive(Clone)]
pub(crate) struct PublicKey {
    pub(crate) kid: String,
    pub(crate) x: String,
    pub(crate) decoding: DecodingKey,
}

impl PublicKey {
    fn new(verifying: VerifyingKey) -> Self {
        let x = URL_SAFE_NO_PAD.encode(verifying.as_bytes());
        Self { kid: thumbprint(&x), decoding: DecodingKey::from_ed_der(verifying.as_bytes()), x }
    }

    fn jwk(&self) -> serde_json::Value {
        serde_json::json!({
            "kty": "OKP",
            "crv": "Ed25519",
            "x": self.x,
            "kid": self.kid,
            "alg": "EdDSA",
            "use": "sig",
        })
    }
}

/// The key that signs (its secret half zeroized on drop by ed25519-dalek / jsonwebtoken).
struct CurrentKey {
    signing: SigningKey,
    encoding: EncodingKey,
    public: PublicKey,
    created_at: Timestamp,
}

impl CurrentKey {
    fn from_seed(seed: &[u8; 32], created_at: Timestamp) -> Self {
        let signing = SigningKey::from_bytes(seed);
        let public = PublicKey::new(signing.verifying_key());
        Self { encoding: EncodingKey::from_ed_der(&pkcs8_der(seed)), signing, public, created_at }
    }

    fn generate(now: Timestamp) -> Result<Self, KeyError> {
        let mut seed = Zeroizing::new([0u8; 32]);
        getrandom::fill(seed.as_mut()).map_err(|e| KeyError::Entropy(e.to_string()))?;
        Ok(Self::from_seed(&seed, now))
    }
}

/// A previous key, kept for verification until `retired_at + KEY_OVERLAP_SECS`.
struct RetiredKey {
    public: PublicKey,
    created_at: Timestamp,
    retired_at: Timestamp,
}

impl RetiredKey {
    fn verifies_at(&self, now: Timestamp) -> bool {
        now < self.retired_at.plus_secs(overlap_secs())
    }
}

fn overlap_secs() -> i64 {
    i64::try_from(KEY_OVERLAP_SECS).unwrap_or(i64::MAX)
}

struct Ring {
    current: CurrentKey,
    retired: Vec<RetiredKey>,
}

/// The signing keys: one current key that signs, and the retired keys that still verify.
///
/// Backed by `<dir>/signing-keys.json` (mode 0600; the current key's Ed25519 seed and
/// each key's public half, base64url, with created/retired times). Shared as
/// `Arc<KeyStore>`; [`rotate`](Self::rotate) and [`reload`](Self::reload) swap the keys
/// in place. Replicas that verify each other's tokens must share this file.
pub struct KeyStore {
    path: PathBuf,
    clock: Arc<dyn Clock>,
    ring: RwLock<Ring>,
}

impl fmt::Debug for KeyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ring = self.read();
        f.debug_struct("KeyStore")
            .field("path", &self.path)
            .field("current_kid", &ring.current.public.kid)
            .field("retired_kids", &ring.retired.iter().map(|k| k.public.kid.as_str()).collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl KeyStore {
    /// Loads the keys from `dir/signing-keys.json`, or, when the file does not exist,
    /// generates a first key and writes it there (mode 0600; `dir` is created with mode
    /// 0700 if missing). Two processes starting at once end up with the same key.
    ///
    /// # Errors
    /// [`KeyError::Io`], [`KeyError::Corrupt`], [`KeyError::Permissions`] (the file is
    /// accessible to group or others), [`KeyError::Entropy`].
    pub fn load_or_create(dir: &Path, clock: Arc<dyn Clock>) -> Result<Self, KeyError> {
        if !dir.exists() {
            fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(|e| io_error(dir, &e))?;
        }
        let path = dir.join(KEYS_FILE);
        let ring = match read_ring(&path)? {
            Some(ring) => ring,
            None => {
                let ring = Ring { current: CurrentKey::generate(clock.now())?, retired: Vec::new() };
                if write_ring(&path, &ring, WriteMode::CreateNew)? {
                    ring
                } else {
                    // Another process created the file first: use its key.
                    read_ring(&path)?.ok_or_else(|| KeyError::Corrupt {
                        path: path.clone(),
                        reason: "vanished right after it was created".to_owned(),
                    })?
                }
            }
        };
        Ok(Self { path, clock, ring: RwLock::new(ring) })
    }

    /// Makes a new current key; the previous one keeps verifying for the longest TTL plus
    /// the leeway, and keys retired longer ago than that are dropped. Persisted before it
    /// takes effect. Returns the new key's id.
    ///
    /// # Errors
    /// [`KeyError::Io`] or [`KeyError::Entropy`]; the keys are then unchanged.
    pub fn rotate(&self) -> Result<String, KeyError> {
        let now = self.clock.now();
        let fresh = CurrentKey::generate(now)?;
        let mut ring = self.ring.write().unwrap_or_else(PoisonError::into_inner);
        let mut retired: Vec<RetiredKey> = ring
            .retired
            .iter()
            .filter(|k| k.verifies_at(now))
            .map(|k| RetiredKey {
                public: k.public.clone(),
                created_at: k.created_at,
                retired_at: k.retired_at,
            })
            .collect();
        retired.insert(
            0,
            RetiredKey {
                public: ring.current.public.clone(),
                created_at: ring.current.created_at,
                retired_at: now,
            },
        );
        let next = Ring { current: fresh, retired };
        write_ring(&self.path, &next, WriteMode::Replace)?;
        let kid = next.current.public.kid.clone();
        *ring = next;
        Ok(kid)
    }

    /// Re-reads the key file (after `sandlane keys rotate` ran in another process).
    ///
    /// # Errors
    /// As [`KeyStore::load_or_create`]; a missing file is [`KeyError::Corrupt`]. The keys
    /// in memory are then unchanged.
    pub fn reload(&self) -> Result<(), KeyError> {
        let ring = read_ring(&self.path)?
            .ok_or_else(|| KeyError::Corrupt { path: self.path.clone(), reason: "missing".to_owned() })?;
        *self.ring.write().unwrap_or_else(PoisonError::into_inner) = ring;
        Ok(())
    }

    /// The key file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The id (RFC 7638 thumbprint) of the key that signs.
    pub fn current_kid(&self) -> String {
        self.read().current.public.kid.clone()
    }

    /// The ids of every key that verifies now, the current one first.
    pub fn verifying_kids(&self) -> Vec<String> {
        self.verifying_keys().into_iter().map(|k| k.kid).collect()
    }

    /// The JWKS document (RFC 7517) of every key that verifies now, the current one first.
    pub fn jwks(&self) -> serde_json::Value {
        let keys: Vec<_> = self.verifying_keys().iter().map(PublicKey::jwk).collect();
        serde_json::json!({ "keys": keys })
    }

    fn verifying_keys(&self) -> Vec<PublicKey> {
        let now = self.clock.now();
        let ring = self.read();
        std::iter::once(ring.current.public.clone())
            .chain(ring.retired.iter().filter(|k| k.verifies_at(now)).map(|k| k.public.clone()))
            .collect()
    }

    /// The key with this id, if it verifies at `now`.
    pub(crate) fn verifying_key(&self, kid: &str, now: Timestamp) -> Option<PublicKey> {
        let ring = self.read();
        if ring.current.public.kid == kid {
            return Some(ring.current.public.clone());
        }
        ring.retired.iter().find(|k| k.public.kid == kid && k.verifies_at(now)).map(|k| k.public.clone())
    }

    /// Runs `sign` with the current key's id and jsonwebtoken encoding key.
    pub(crate) fn with_signer<T>(&self, sign: impl FnOnce(&str, &EncodingKey) -> T) -> T {
        let ring = self.read();
        sign(&ring.current.public.kid, &ring.current.encoding)
    }

    /// The current signing key, for tests that forge tokens with the real key.
    #[cfg(test)]
    pub(crate) fn current_signing_key(&self) -> SigningKey {
        self.read().current.signing.clone()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Ring> {
        self.ring.read().unwrap_or_else(PoisonError::into_inner)
    }
}

fn io_error(path: &Path, e: &io::Error) -> KeyError {
    KeyError::Io { path: path.to_owned(), reason: e.to_string() }
}

/// The key file on disk.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyFile {
    format: String,
    keys: Vec<StoredKey>,
}

/// One key on disk: `d` (the seed) only for the current key.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoredKey {
    kid: String,
    x: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    d: Option<String>,
    created_at: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    retired_at: Option<i64>,
}

impl Drop for StoredKey {
    fn drop(&mut self) {
        if let Some(d) = self.d.as_mut() {
            d.zeroize();
        }
    }
}

fn read_ring(path: &Path) -> Result<Option<Ring>, KeyError> {
    let meta = match fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_error(path, &e)),
    };
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(KeyError::Permissions { path: path.to_owned(), mode });
    }
    let text = Zeroizing::new(fs::read_to_string(path).map_err(|e| io_error(path, &e))?);
    let corrupt = |reason: String| KeyError::Corrupt { path: path.to_owned(), reason };
    // Never show serde's message: it may quote a value, and values include the seed.
    let file: KeyFile = serde_json::from_str(&text)
        .map_err(|e| corrupt(format!("not the expected JSON (line {}, column {})", e.line(), e.column())))?;
    if file.format != FORMAT {
        return Err(corrupt(format!("format is not {FORMAT}")));
    }
    let mut current = None;
    let mut retired = Vec::new();
    for stored in &file.keys {
        let public = parse_public(&stored.x)
            .ok_or_else(|| corrupt(format!("key {} has no valid Ed25519 public key", stored.kid)))?;
        if public.kid != stored.kid {
            return Err(corrupt(format!("key {} does not match its thumbprint", stored.kid)));
        }
        match (stored.retired_at, stored.d.as_deref()) {
            (None, Some(d)) => {
                if current.is_some() {
                    return Err(corrupt("more than one current key".to_owned()));
                }
                let mut seed = Zeroizing::new([0u8; 32]);
                let decoded = Zeroizing::new(URL_SAFE_NO_PAD.decode(d).unwrap_or_default());
                if decoded.len() != 32 {
                    return Err(corrupt(format!("key {} has a malformed seed", stored.kid)));
                }
                seed.copy_from_slice(&decoded);
                let key = CurrentKey::from_seed(&seed, Timestamp::from_unix_millis(stored.created_at));
                if key.public.kid != stored.kid {
                    return Err(corrupt(format!("key {}'s seed does not match it", stored.kid)));
                }
                current = Some(key);
            }
            (Some(retired_at), None) => retired.push(RetiredKey {
                public,
                created_at: Timestamp::from_unix_millis(stored.created_at),
                retired_at: Timestamp::from_unix_millis(retired_at),
            }),
            (None, None) => {
                return Err(corrupt(format!("current key {} has no seed", stored.kid)));
            }
            (Some(_), Some(_)) => {
                return Err(corrupt(format!("retired key {} still holds its seed", stored.kid)));
            }
        }
    }
    let current = current.ok_or_else(|| corrupt("no current key".to_owned()))?;
    Ok(Some(Ring { current, retired }))
}

fn parse_public(x: &str) -> Option<PublicKey> {
    let bytes: [u8; 32] = URL_SAFE_NO_PAD.decode(x).ok()?.try_into().ok()?;
    VerifyingKey::from_bytes(&bytes).ok().map(PublicKey::new)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum WriteMode {
    /// Create the file only if it does not exist (first start).
    CreateNew,
    /// Atomically replace it (rotation).
    Replace,
}

/// Writes the ring through a temporary file (mode 0600, fsynced) moved into place.
/// With [`WriteMode::CreateNew`] returns `false` when the file already existed.
fn write_ring(path: &Path, ring: &Ring, mode: WriteMode) -> Result<bool, KeyError> {
    let mut keys = vec![StoredKey {
        kid: ring.current.public.kid.clone(),
        x: ring.current.public.x.clone(),
        d: Some(URL_SAFE_NO_PAD.encode(ring.current.signing.as_bytes())),
        created_at: ring.current.created_at.unix_millis(),
        retired_at: None,
    }];
    keys.extend(ring.retired.iter().map(|k| StoredKey {
        kid: k.public.kid.clone(),
        x: k.public.x.clone(),
        d: None,
        created_at: k.created_at.unix_millis(),
        retired_at: Some(k.retired_at.unix_millis()),
    }));
    let file = KeyFile { format: FORMAT.to_owned(), keys };
    // Sized up front so the buffer holding the seed is never reallocated (and left behind
    // unzeroized); a file holds one current key and at most an hour of retired ones.
    let mut text = Zeroizing::new(Vec::with_capacity(64 * 1024));
    serde_json::to_writer_pretty(&mut *text, &file).map_err(|_| KeyError::Corrupt {
        path: path.to_owned(),
        reason: "could not be encoded".to_owned(),
    })?;
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    let mut random = [0u8; 8];
    getrandom::fill(&mut random).map_err(|e| KeyError::Entropy(e.to_string()))?;
    let tmp = dir.join(format!(".{KEYS_FILE}.{}.tmp", u64::from_le_bytes(random)));
    let written = (|| {
        let mut f = fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
        f.set_permissions(fs::Permissions::from_mode(0o600))?;
        f.write_all(&text)?;
        f.sync_all()?;
        match mode {
            WriteMode::Replace => fs::rename(&tmp, path).map(|()| true),
            WriteMode::CreateNew => match fs::hard_link(&tmp, path) {
                Ok(()) => Ok(true),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
                Err(e) => Err(e),
            },
        }
    })();
    // After a rename the temporary name is gone; after a link (or a failure) remove it.
    let _ = fs::remove_file(&tmp);
    let created = written.map_err(|e| io_error(path, &e))?;
    if let Ok(d) = fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(created)
}
