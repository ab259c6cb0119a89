//! The keys that seal brokered secrets at rest: AES-256-GCM (`ring::aead`), each value
//! under a fresh random 96-bit nonce, with the org and the secret's name as associated data
//! (a sealed value moved to another row, or another org, does not open).
//!
//! The keys live in the data dir beside the audit key, never in the database:
//! `<data_dir>/secret-keys/<ID>.key` (32 random bytes, mode 0600), and
//! `<data_dir>/secret-keys/current` names the one new values are sealed under. Each row
//! names its key's id. Rotation ([`super::SqlSecretStore::rotate_key`]) makes a new key
//! current, seals every value again under it, and then removes the key files no row names
//! any more; until then an old key stays, so values sealed under it keep opening (on every
//! replica sharing the data dir; replicas on other hosts need the same files).

use std::collections::HashMap;
use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use sha2::{Digest as _, Sha256};

use super::seal::hex;

/// The directory of the secret keys in the data dir.
pub const SECRET_KEYS_DIR: &str = "secret-keys";
/// The file naming the current key.
const CURRENT_FILE: &str = "current";
/// The tag that starts every value's associated data.
const AAD_TAG: &[u8] = b"sandlane.secret.v1";

/// Why a key could not be read or made, or a value not sealed or opened. Never holds a
/// value or a key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("secret keys: {0}")]
pub struct KeyError(pub String);

/// One key, loaded.
struct Key {
    id: String,
    aead: LessSafeKey,
}

/// The secret keys of one data dir, loaded on first use and kept.
pub struct SecretKeys {
    dir: PathBuf,
    loaded: Mutex<HashMap<String, Arc<Key>>>,
}

impl std::fmt::Debug for SecretKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretKeys").field("dir", &self.dir).finish_non_exhaustive()
    }
}

fn err(path: &Path, what: impl std::fmt::Display) -> KeyError {
    KeyError(format!("{}: {what}", path.display()))
}

/// The associated data of a value: the tag, then the org and the name, each behind its
/// 4-byte big-endian length.
fn aad(org: &str, name: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(AAD_TAG.len() + 8 + org.len() + name.len());
    out.extend_from_slice(AAD_TAG);
    for part in [org, name] {
        out.extend_from_slice(&u32::try_from(part.len()).unwrap_or(u32::MAX).to_be_bytes());
        out.extend_from_slice(part.as_bytes());
    }
    out
}

impl SecretKeys {
    /// The keys under `<data_dir>/secret-keys` (nothing is read yet).
    pub fn new(data_dir: &Path) -> Self {
        Self { dir: data_dir.join(SECRET_KEYS_DIR), loaded: Mutex::new(HashMap::new()) }
    }

    fn key_from(secret: &[u8; 32]) -> Result<Key, KeyError> {
        let digest: [u8; 32] =
            Sha256::new().chain_update(b"sandlane.secret-key.id").chain_update(secret).finalize().into();
        let unbound = UnboundKey::new(&AES_256_GCM, secret).map_err(|_| KeyError("bad key length".into()))?;
        Ok(Key { id: hex(&digest[..8]), aead: LessSafeKey::new(unbound) })
    }

    /// The key `id`, from memory or its file.
    fn key(&self, id: &str) -> Result<Arc<Key>, KeyError> {
        if let Some(key) = self.loaded.lock().unwrap_or_else(PoisonError::into_inner).get(id) {
            return Ok(key.clone());
        }
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(KeyError(format!("{id:?} is not a key id")));
        }
        let path = self.dir.join(format!("{id}.key"));
        let bytes = std::fs::read(&path).map_err(|e| err(&path, e))?;
        let mode = std::fs::metadata(&path).map_err(|e| err(&path, e))?.permissions().mode();
        if mode & 0o077 != 0 {
            return Err(err(&path, "is readable by group or others; chmod 600 it"));
        }
        let secret: [u8; 32] =
            bytes.as_slice().try_into().map_err(|_| err(&path, "must hold exactly 32 bytes"))?;
        let key = Self::key_from(&secret)?;
        if key.id != id {
            return Err(err(&path, "holds another key than its name says"));
        }
        let key = Arc::new(key);
        self.loaded.lock().unwrap_or_else(PoisonError::into_inner).insert(id.to_owned(), key.clone());
        Ok(key)
    }

    /// The id of the current key, `None` when none was made yet.
    ///
    /// # Errors
    /// [`KeyError`] when the directory cannot be read.
    pub fn current_id(&self) -> Result<Option<String>, KeyError> {
        let path = self.dir.join(CURRENT_FILE);
        match std::fs::read_to_string(&path) {
            Ok(text) => Ok(Some(text.trim().to_owned())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(err(&path, e)),
        }
    }

    /// The current key, made when there is none (read again on every call, so a rotation
    /// by another process holds here at the next write).
    fn current(&self) -> Result<Arc<Key>, KeyError> {
        match self.current_id()? {
            Some(id) => self.key(&id),
            None => self.rotate().and_then(|id| self.key(&id)),
        }
    }

    /// Makes a new key and makes it current; returns its id.
    ///
    /// # Errors
    /// [`KeyError`] when no randomness or no file can be had.
    pub fn rotate(&self) -> Result<String, KeyError> {
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret).map_err(|e| KeyError(format!("no randomness: {e}")))?;
        let key = Self::key_from(&secret)?;
        std::fs::create_dir_all(&self.dir).map_err(|e| err(&self.dir, e))?;
        std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| err(&self.dir, e))?;
        let path = self.dir.join(format!("{}.key", key.id));
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| err(&path, e))?;
        file.write_all(&secret).and_then(|()| file.sync_all()).map_err(|e| err(&path, e))?;
        // The current key is named by a file replaced whole (a reader sees the old or the new).
        let tmp = self.dir.join(format!("{CURRENT_FILE}.{}", key.id));
        let mut next = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| err(&tmp, e))?;
        next.write_all(key.id.as_bytes()).and_then(|()| next.sync_all()).map_err(|e| err(&tmp, e))?;
        std::fs::rename(&tmp, self.dir.join(CURRENT_FILE)).map_err(|e| err(&tmp, e))?;
        let id = key.id.clone();
        self.loaded.lock().unwrap_or_else(PoisonError::into_inner).insert(id.clone(), Arc::new(key));
        Ok(id)
    }

    /// Removes the key files whose ids are not in `keep` (nor current); returns their ids.
    ///
    /// # Errors
    /// [`KeyError`] when the directory cannot be read or a file removed.
    pub fn remove_unused(&self, keep: &[String]) -> Result<Vec<String>, KeyError> {
        let current = self.current_id()?;
        let mut removed = Vec::new();
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(removed),
            Err(e) => return Err(err(&self.dir, e)),
        };
        for entry in entries {
            let entry = entry.map_err(|e| err(&self.dir, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(id) = name.strip_suffix(".key") else { continue };
            if keep.iter().any(|k| k == id) || current.as_deref() == Some(id) {
                continue;
            }
            std::fs::remove_file(entry.path()).map_err(|e| err(&entry.path(), e))?;
            self.loaded.lock().unwrap_or_else(PoisonError::into_inner).remove(id);
            removed.push(id.to_owned());
        }
        removed.sort();
        Ok(removed)
    }

    /// Seals `value` for the secret `name` of `org` under the current key: the key's id and
    /// the nonce followed by the ciphertext and its tag.
    ///
    /// # Errors
    /// [`KeyError`].
    pub fn seal(&self, org: &str, name: &str, value: &str) -> Result<(String, Vec<u8>), KeyError> {
        let key = self.current()?;
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::fill(&mut nonce).map_err(|e| KeyError(format!("no randomness: {e}")))?;
        let mut sealed = value.as_bytes().to_vec();
        key.aead
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad(org, name)),
                &mut sealed,
            )
            .map_err(|_| KeyError("cannot seal".into()))?;
        let mut out = Vec::with_capacity(NONCE_LEN + sealed.len());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        Ok((key.id.clone(), out))
    }

    /// Opens what [`SecretKeys::seal`] made for the same org and name.
    ///
    /// # Errors
    /// [`KeyError`] when the key is missing or the value does not open (another row's, or
    /// changed).
    pub fn open(&self, key_id: &str, org: &str, name: &str, sealed: &[u8]) -> Result<String, KeyError> {
        let key = self.key(key_id)?;
        if sealed.len() < NONCE_LEN {
            return Err(KeyError(format!("the sealed value of {org}/{name} is too short")));
        }
        let (nonce, body) = sealed.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| KeyError("bad nonce".into()))?;
        let mut body = body.to_vec();
        let plain = key.aead.open_in_place(nonce, Aad::from(aad(org, name)), &mut body).map_err(|_| {
            KeyError(format!("the sealed value of {org}/{name} does not open under key {key_id}"))
        })?;
        String::from_utf8(plain.to_vec())
            .map_err(|_| KeyError(format!("the value of {org}/{name} is not UTF-8")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_open_only_in_their_own_row_and_keys_rotate() {
        let dir = tempfile::tempdir().unwrap();
        let keys = SecretKeys::new(dir.path());
        assert_eq!(keys.current_id().unwrap(), None);
        let (kid, sealed) = keys.seal("acme", "gh", "ghp_secret").unwrap();
        assert!(!sealed.windows(10).any(|w| w == b"ghp_secret"), "sealed, not plain");
        assert_eq!(keys.open(&kid, "acme", "gh", &sealed).unwrap(), "ghp_secret");
        assert!(keys.open(&kid, "acme", "npm", &sealed).is_err(), "another name");
        assert!(keys.open(&kid, "other", "gh", &sealed).is_err(), "another org");
        let mut changed = sealed.clone();
        *changed.last_mut().unwrap() ^= 1;
        assert!(keys.open(&kid, "acme", "gh", &changed).is_err(), "changed");
        let (_, again) = keys.seal("acme", "gh", "ghp_secret").unwrap();
        assert_ne!(again, sealed, "a fresh nonce every time");
        let path = dir.path().join(SECRET_KEYS_DIR).join(format!("{kid}.key"));
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        // Another process (a new SecretKeys) opens it from the file.
        assert_eq!(SecretKeys::new(dir.path()).open(&kid, "acme", "gh", &sealed).unwrap(), "ghp_secret");

        let next = keys.rotate().unwrap();
        assert_ne!(next, kid);
        assert_eq!(keys.current_id().unwrap().as_deref(), Some(next.as_str()));
        assert_eq!(keys.seal("acme", "gh", "v").unwrap().0, next);
        assert_eq!(keys.remove_unused(std::slice::from_ref(&kid)).unwrap(), Vec::<String>::new());
        assert_eq!(keys.remove_unused(&[]).unwrap(), vec![kid.clone()]);
        assert!(SecretKeys::new(dir.path()).open(&kid, "acme", "gh", &sealed).is_err(), "removed");
    }
}
