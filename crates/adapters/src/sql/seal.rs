//! Sealing and verifying the audit log, shared by both databases: the audit signing key,
//! the seal encoding, and the verification walk over stored rows and seals.
//!
//! A seal covers a batch of rows, listed in its `entries` as `(seq, row hash)` pairs in
//! ascending seq order. Its hash chains the previous seal's hash, its own fields and the
//! digest of its entries; the hash is signed with the Ed25519 audit key, which lives in a
//! file in the data dir (never in the database).
//!
//! # What verify reports (first bad record)
//! Seals are checked first, in id order (ids must run 1, 2, 3, …), then rows in seq
//! order; the first failure is named:
//! - `seal N`: a missing seal (gap in ids), a broken link to the previous seal, a hash that
//!   does not match the seal's fields, a signature that does not verify, malformed entries,
//!   or a row claimed by two seals.
//! - `row N` when a sealed row is missing (deleted), when a sealed row's contents no longer
//!   hash to the value its seal signed (edited, or swapped with another row), when an
//!   unsealed row's contents do not match its stored hash, or when an unsealed row is
//!   *inserted*: no seal covers it, yet its seq is at or below the `through` (highest seq
//!   sealed so far) of a seal made at least the late grace (default 30 s) before now. A
//!   legitimate row can only be unsealed below a seal's `through` while its insert commits
//!   after a later seq's (rows commit out of seq order in Postgres); the sealer seals such
//!   late rows on its next pass, and refuses rows later than the grace, so they stay
//!   visible to verify. A row forged at the tip of the log, newer than the last seal, is
//!   indistinguishable from a fresh append until sealed; after that it is covered like any
//!   other (seals prove the log was not changed after sealing, not that rows were honest).

use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::Path;

use domain::AuditEvent;
use ed25519_dalek::{Signature, Signer as _, SigningKey, VerifyingKey};
use ports::{AuditError, BadRecord, VerifyReport};
use sha2::{Digest as _, Sha256};

/// The file name of the audit signing key in the data dir.
pub const AUDIT_KEY_FILE: &str = "audit-key";

/// The domain tag that starts every seal hash input.
const SEAL_TAG: &[u8] = b"sandlane.audit.seal.v1";

/// The hash a first seal links to.
pub const GENESIS: [u8; 32] = [0; 32];

/// Bytes per seal entry: an 8-byte big-endian seq and a 32-byte row hash.
const ENTRY_LEN: usize = 40;

/// The Ed25519 key that signs seals. Its `Debug` shows only the key id.
pub struct AuditKey {
    signing: SigningKey,
    verifying: VerifyingKey,
    key_id: String,
}

impl std::fmt::Debug for AuditKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AuditKey({})", self.key_id)
    }
}

impl AuditKey {
    /// Loads `<data_dir>/audit-key`, creating it (32 random bytes, mode 0600) when missing.
    ///
    /// # Errors
    /// [`AuditError::Key`] when the file cannot be read or created, has the wrong length,
    /// or is readable by group or others.
    pub fn load_or_create(data_dir: &Path) -> Result<Self, AuditError> {
        let path = data_dir.join(AUDIT_KEY_FILE);
        if path.exists() {
            return Self::load(data_dir);
        }
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret).map_err(|e| key_err(&path, &format!("no randomness: {e}")))?;
        std::fs::create_dir_all(data_dir).map_err(|e| key_err(&path, &e.to_string()))?;
        let created = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path);
        let mut file = match created {
            Ok(file) => file,
            // Another process created it first: use theirs.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Self::load(data_dir),
            Err(e) => return Err(key_err(&path, &e.to_string())),
        };
        file.write_all(&secret).and_then(|()| file.sync_all()).map_err(|e| key_err(&path, &e.to_string()))?;
        Ok(Self::from_secret(&secret))
    }

    /// Loads `<data_dir>/audit-key`, which must exist.
    ///
    /// # Errors
    /// [`AuditError::Key`] when the file is missing or unreadable, has the wrong length, or
    /// is readable by group or others.
    pub fn load(data_dir: &Path) -> Result<Self, AuditError> {
        let path = data_dir.join(AUDIT_KEY_FILE);
        let bytes = std::fs::read(&path).map_err(|e| key_err(&path, &e.to_string()))?;
        let mode = std::fs::metadata(&path).map_err(|e| key_err(&path, &e.to_string()))?.permissions().mode();
        if mode & 0o077 != 0 {
            return Err(key_err(&path, "is readable by group or others; chmod 600 it"));
        }
        let secret: [u8; 32] =
            bytes.as_slice().try_into().map_err(|_| key_err(&path, "must hold exactly 32 bytes"))?;
        Ok(Self::from_secret(&secret))
    }

    /// A key from its 32 secret bytes.
    pub fn from_secret(secret: &[u8; 32]) -> Self {
        let signing = SigningKey::from_bytes(secret);
        let verifying = signing.verifying_key();
        let digest: [u8; 32] = Sha256::digest(verifying.to_bytes()).into();
        let key_id = hex(&digest[..8]);
        Self { signing, verifying, key_id }
    }

    /// The key id: the first 8 bytes of SHA-256 of the public key, in hex.
    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    /// Signs a seal hash.
    pub fn sign(&self, seal_hash: &[u8; 32]) -> [u8; 64] {
        self.signing.sign(seal_hash).to_bytes()
    }

    /// Whether `signature` is this key's signature of `seal_hash`.
    pub fn verifies(&self, seal_hash: &[u8; 32], signature: &[u8]) -> bool {
        let Ok(sig) = Signature::from_slice(signature) else {
            return false;
        };
        self.verifying.verify_strict(seal_hash, &sig).is_ok()
    }
}

fn key_err(path: &Path, what: &str) -> AuditError {
    AuditError::Key(format!("{}: {what}", path.display()).into())
}

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Encodes `(seq, row hash)` pairs (ascending seq) as a seal's `entries`.
pub fn encode_entries(entries: &[(i64, [u8; 32])]) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.len() * ENTRY_LEN);
    for (seq, hash) in entries {
        out.extend_from_slice(&seq.to_be_bytes());
        out.extend_from_slice(hash);
    }
    out
}

/// Decodes a seal's `entries`, or `None` when malformed (bad length, seqs not strictly
/// ascending).
pub fn decode_entries(bytes: &[u8]) -> Option<Vec<(i64, [u8; 32])>> {
    if !bytes.len().is_multiple_of(ENTRY_LEN) {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len() / ENTRY_LEN);
    for chunk in bytes.chunks_exact(ENTRY_LEN) {
        let seq = i64::from_be_bytes(chunk[..8].try_into().ok()?);
        let hash: [u8; 32] = chunk[8..].try_into().ok()?;
        if out.last().is_some_and(|(prev, _)| *prev >= seq) {
            return None;
        }
        out.push((seq, hash));
    }
    Some(out)
}

/// A seal as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSeal {
    /// Its id: 1, 2, 3, … in chain order.
    pub id: i64,
    /// The previous seal's hash ([`GENESIS`] for the first).
    pub prev_hash: Vec<u8>,
    /// When it was made (unix ms).
    pub sealed_at: i64,
    /// The highest seq covered by this seal or any earlier one.
    pub through: i64,
    /// How many rows it covers.
    pub row_count: i64,
    /// Its encoded entries.
    pub entries: Vec<u8>,
    /// The id of the key that signed it.
    pub key_id: String,
    /// Its hash.
    pub hash: Vec<u8>,
    /// The signature of its hash.
    pub signature: Vec<u8>,
}

/// The hash of a seal's fields.
pub fn seal_hash(
    id: i64,
    prev_hash: &[u8],
    sealed_at: i64,
    through: i64,
    row_count: i64,
    entries: &[u8],
    key_id: &str,
) -> [u8; 32] {
    let entries_digest: [u8; 32] = Sha256::digest(entries).into();
    let mut h = Sha256::new();
    h.update(SEAL_TAG);
    h.update(id.to_be_bytes());
    h.update((prev_hash.len() as u64).to_be_bytes());
    h.update(prev_hash);
    h.update(sealed_at.to_be_bytes());
    h.update(through.to_be_bytes());
    h.update(row_count.to_be_bytes());
    h.update(entries_digest);
    h.update((key_id.len() as u64).to_be_bytes());
    h.update(key_id.as_bytes());
    h.finalize().into()
}

/// The previous seal's state, as the next seal needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainHead {
    /// The last seal's id (0 when none).
    pub id: i64,
    /// Its hash ([`GENESIS`] when none).
    pub hash: [u8; 32],
    /// Its `through` (0 when none).
    pub through: i64,
}

impl ChainHead {
    /// The head of an empty chain.
    pub const EMPTY: Self = Self { id: 0, hash: GENESIS, through: 0 };
}

/// Builds the next seal over `rows` (`(seq, row hash)`, ascending seq, non-empty).
pub fn make_seal(key: &AuditKey, head: &ChainHead, rows: &[(i64, [u8; 32])], now_ms: i64) -> StoredSeal {
    let id = head.id + 1;
    let through = rows.iter().map(|(s, _)| *s).fold(head.through, i64::max);
    let entries = encode_entries(rows);
    let row_count = rows.len() as i64;
    let hash = seal_hash(id, &head.hash, now_ms, through, row_count, &entries, key.key_id());
    let signature = key.sign(&hash).to_vec();
    StoredSeal {
        id,
        prev_hash: head.hash.to_vec(),
        sealed_at: now_ms,
        through,
        row_count,
        entries,
        key_id: key.key_id().to_owned(),
        hash: hash.to_vec(),
        signature,
    }
}

/// One stored audit row, as verify reads it.
#[derive(Debug, Clone)]
pub struct StoredRow {
    /// Its seq.
    pub seq: i64,
    /// The event rebuilt from its columns, or why it could not be.
    pub event: Result<AuditEvent, String>,
    /// The hash stored beside it at append time.
    pub stored_hash: Vec<u8>,
}

/// The seal chain, checked: what it covers and when.
pub struct SealCheck {
    /// `(seq, seal id, hash the seal signed)`, ascending seq.
    pub covered: Vec<(i64, i64, [u8; 32])>,
    /// `(sealed_at, through)` per seal, in chain order.
    pub horizons: Vec<(i64, i64)>,
    /// Seals checked.
    pub seals: u64,
}

fn bad(record: String, reason: impl Into<String>) -> BadRecord {
    BadRecord { record, reason: reason.into() }
}

/// Checks every seal (links, hashes, signatures, entries) in chain order.
///
/// # Errors
/// The first bad seal.
pub fn check_seals(key: &AuditKey, seals: &[StoredSeal]) -> Result<SealCheck, BadRecord> {
    let mut covered = Vec::new();
    let mut horizons = Vec::with_capacity(seals.len());
    let mut prev: Vec<u8> = GENESIS.to_vec();
    let mut prev_through = 0i64;
    for (i, seal) in seals.iter().enumerate() {
        let name = format!("seal {}", seal.id);
        let expected_id = i as i64 + 1;
        if seal.id != expected_id {
            return Err(bad(
                format!("seal {expected_id}"),
                format!("missing: the next seal found is seal {}", seal.id),
            ));
        }
        if seal.prev_hash != prev {
            return Err(bad(name, "does not link to the previous seal's hash"));
        }
        if seal.key_id != key.key_id() {
            return Err(bad(
                name,
                format!("signed by key {}, not the audit key {}", seal.key_id, key.key_id()),
            ));
        }
        let hash = seal_hash(
            seal.id,
            &seal.prev_hash,
            seal.sealed_at,
            seal.through,
            seal.row_count,
            &seal.entries,
            &seal.key_id,
        );
        if seal.hash != hash {
            return Err(bad(name, "stored hash does not match the seal's contents"));
        }
        if !key.verifies(&hash, &seal.signature) {
            return Err(bad(name, "signature does not verify"));
        }
        let Some(entries) = decode_entries(&seal.entries) else {
            return Err(bad(name, "entries are malformed"));
        };
        if entries.len() as i64 != seal.row_count || entries.is_empty() {
            return Err(bad(name, "row count does not match its entries"));
        }
        let max = entries.iter().map(|(s, _)| *s).fold(prev_through, i64::max);
        if seal.through != max {
            return Err(bad(name, "`through` does not match its entries"));
        }
        covered.extend(entries.into_iter().map(|(seq, h)| (seq, seal.id, h)));
        horizons.push((seal.sealed_at, seal.through));
        prev.clone_from(&seal.hash);
        prev_through = seal.through;
    }
    covered.sort_unstable_by_key(|(seq, seal, _)| (*seq, *seal));
    if let Some(w) = covered.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(bad(
            format!("seal {}", w[1].1),
            format!("claims row {}, already sealed by seal {}", w[1].0, w[0].1),
        ));
    }
    Ok(SealCheck { covered, horizons, seals: seals.len() as u64 })
}

/// The highest `through` among seals made at or before `cutoff_ms` (`None` when there is
/// none): an unsealed row at or below it is an inserted row, and the sealer will not seal
/// it.
pub fn settled_through(horizons: &[(i64, i64)], cutoff_ms: i64) -> Option<i64> {
    horizons.iter().filter(|(at, _)| *at <= cutoff_ms).map(|(_, through)| *through).max()
}

/// Walks the rows (ascending seq) against the checked seals and stops at the first bad
/// row, in seq order.
pub struct RowWalk<'a> {
    check: &'a SealCheck,
    settled: Option<i64>,
    next_covered: usize,
    seen: u64,
    unsealed: u64,
    first_bad: Option<BadRecord>,
}

impl<'a> RowWalk<'a> {
    /// Starts a walk; `settled` is [`settled_through`] at verify's cutoff.
    pub fn new(check: &'a SealCheck, settled: Option<i64>) -> Self {
        Self { check, settled, next_covered: 0, seen: 0, unsealed: 0, first_bad: None }
    }

    /// Whether a bad row was found (the walk may stop).
    pub fn done(&self) -> bool {
        self.first_bad.is_some()
    }

    /// Checks the next row (rows must come in strictly ascending seq order).
    pub fn push(&mut self, row: &StoredRow) {
        if self.first_bad.is_some() {
            return;
        }
        self.seen += 1;
        // A sealed seq below this row that no row had: that row was deleted.
        if let Some(&(seq, seal, _)) = self.check.covered.get(self.next_covered)
            && seq < row.seq
        {
            self.first_bad = Some(bad(format!("row {seq}"), format!("missing, but sealed by seal {seal}")));
            return;
        }
        let name = || format!("row {}", row.seq);
        let event = match &row.event {
            Ok(e) => e,
            Err(why) => {
                self.first_bad = Some(bad(name(), format!("unreadable: {why}")));
                return;
            }
        };
        let hash = event.hash();
        match self.check.covered.get(self.next_covered) {
            Some(&(seq, seal, signed)) if seq == row.seq => {
                self.next_covered += 1;
                if signed != hash {
                    self.first_bad =
                        Some(bad(name(), format!("contents do not match the hash sealed by seal {seal}")));
                }
            }
            _ => {
                self.unsealed += 1;
                if row.stored_hash.as_slice() != hash.as_slice() {
                    self.first_bad =
                        Some(bad(name(), "unsealed, and its contents do not match its stored hash"));
                } else if let Some(settled) = self.settled.filter(|s| row.seq <= *s) {
                    self.first_bad = Some(bad(
                        name(),
                        format!(
                            "inserted: no seal covers it, yet rows through seq {settled} were \
                             sealed long enough ago that it would have been sealed with them"
                        ),
                    ));
                }
            }
        }
    }

    /// Ends the walk: a report with the first bad record, if any.
    pub fn finish(mut self) -> VerifyReport {
        if self.first_bad.is_none()
            && let Some(&(seq, seal, _)) = self.check.covered.get(self.next_covered)
        {
            self.first_bad = Some(bad(format!("row {seq}"), format!("missing, but sealed by seal {seal}")));
        }
        VerifyReport {
            rows: self.seen,
            seals: self.check.seals,
            unsealed: self.unsealed,
            first_bad: self.first_bad,
        }
    }
}

#[cfg(test)]
mod tests;
