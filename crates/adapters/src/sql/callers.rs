//! The caller directory on SQL: random keys shown once, stored as SHA-256 hashes, looked
//! up by a hash prefix and compared in constant time.
//!
//! A key is 32 random bytes (256 bits), rendered `sk_` + unpadded base64url. With that
//! much entropy a fast hash is enough: there is nothing to brute-force, so a slow
//! password hash (argon2, bcrypt) would only cost CPU on every request.

use async_trait::async_trait;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use domain::{CallerClass, CallerIdentity, CallerKey, IdentityId, OrgId, Timestamp};
use ports::{CallerDirectory, CallerEntry, Cause, DirectoryError};
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;

use super::{Backend, with_pool};

/// The prefix of every caller key.
pub const KEY_PREFIX: &str = "sk_";

/// Bytes of the key's hash kept in the indexed lookup column.
const LOOKUP_LEN: usize = 8;

fn store(e: sqlx::Error) -> DirectoryError {
    DirectoryError::Store(Cause::new(e))
}

fn corrupt(what: impl std::fmt::Display) -> DirectoryError {
    DirectoryError::Store(format!("stored caller is invalid: {what}").into())
}

fn key_hash(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// A caller as stored.
#[derive(Debug, sqlx::FromRow)]
struct CallerRow {
    identity_id: String,
    class: String,
    orgs: String,
    display_name: Option<String>,
    created_at: i64,
    revoked_at: Option<i64>,
}

impl CallerRow {
    fn identity(&self) -> Result<CallerIdentity, DirectoryError> {
        let orgs = self
            .orgs
            .split(' ')
            .filter(|o| !o.is_empty())
            .map(OrgId::parse)
            .collect::<Result<Vec<_>, _>>()
            .map_err(corrupt)?;
        CallerIdentity::from_wire(
            IdentityId::parse(self.identity_id.clone()).map_err(corrupt)?,
            CallerClass::parse_wire(&self.class).map_err(corrupt)?,
            orgs,
            self.display_name.clone(),
        )
        .map_err(corrupt)
    }
}

/// The [`CallerDirectory`] on SQLite or Postgres.
#[derive(Debug, Clone)]
pub struct SqlCallerDirectory {
    backend: Backend,
}

impl SqlCallerDirectory {
    pub(crate) fn new(backend: Backend) -> Self {
        Self { backend }
    }
}

#[derive(Debug, sqlx::FromRow)]
struct KeyRow {
    key_hash: Vec<u8>,
    #[sqlx(flatten)]
    caller: CallerRow,
}

#[async_trait]
impl CallerDirectory for SqlCallerDirectory {
    async fn authenticate(&self, key: &CallerKey) -> Result<Option<CallerIdentity>, DirectoryError> {
        let hash = key_hash(key.expose());
        let rows: Vec<KeyRow> = with_pool!(fast read &self.backend, p => {
            sqlx::query_as(
                "SELECT key_hash, identity_id, class, orgs, display_name, created_at, revoked_at \
                 FROM callers WHERE key_lookup = $1",
            )
            .bind(&hash[..LOOKUP_LEN])
            .fetch_all(p)
            .await
        })
        .map_err(store)?;
        // Compare every candidate in constant time; the prefix only narrows the scan.
        let mut found = None;
        for row in rows {
            let same: bool = row.key_hash.as_slice().ct_eq(&hash).into();
            if same && row.caller.revoked_at.is_none() {
                found = Some(row.caller);
            }
        }
        found.map(|c| c.identity()).transpose()
    }

    async fn add(&self, caller: &CallerIdentity, now: Timestamp) -> Result<CallerKey, DirectoryError> {
        if caller.class() == CallerClass::Internal {
            return Err(DirectoryError::InternalRefused);
        }
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret)
            .map_err(|e| DirectoryError::Store(format!("no randomness for a key: {e}").into()))?;
        let key = CallerKey::new(format!("{KEY_PREFIX}{}", URL_SAFE_NO_PAD.encode(secret)));
        let hash = key_hash(key.expose());
        let orgs = caller.orgs().iter().map(OrgId::as_str).collect::<Vec<_>>().join(" ");
        let result = with_pool!(write &self.backend, p => {
            sqlx::query(
                "INSERT INTO callers (identity_id, class, orgs, display_name, key_lookup, \
                 key_hash, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7) \
                 ON CONFLICT (identity_id) DO NOTHING",
            )
            .bind(caller.identity_id().as_str())
            .bind(caller.class().as_str())
            .bind(orgs)
            .bind(caller.display_name())
            .bind(&hash[..LOOKUP_LEN])
            .bind(&hash[..])
            .bind(now.unix_millis())
            .execute(p)
            .await
            .map(|r| r.rows_affected())
        })
        .map_err(store)?;
        if result == 0 {
            return Err(DirectoryError::Exists(caller.identity_id().clone()));
        }
        Ok(key)
    }

    async fn is_revoked(&self, caller: &IdentityId) -> Result<bool, DirectoryError> {
        let revoked: Option<Option<i64>> = with_pool!(read &self.backend, p => {
            sqlx::query_scalar("SELECT revoked_at FROM callers WHERE identity_id = $1")
                .bind(caller.as_str())
                .fetch_optional(p)
                .await
        })
        .map_err(store)?;
        Ok(matches!(revoked, Some(Some(_))))
    }

    async fn revoke(&self, caller: &IdentityId, now: Timestamp) -> Result<(), DirectoryError> {
        let result = with_pool!(write &self.backend, p => {
            sqlx::query(
                "UPDATE callers SET revoked_at = COALESCE(revoked_at, $2) WHERE identity_id = $1",
            )
            .bind(caller.as_str())
            .bind(now.unix_millis())
            .execute(p)
            .await
            .map(|r| r.rows_affected())
        })
        .map_err(store)?;
        if result == 0 {
            return Err(DirectoryError::NotFound(caller.clone()));
        }
        Ok(())
    }

    async fn list(&self) -> Result<Vec<CallerEntry>, DirectoryError> {
        let rows: Vec<CallerRow> = with_pool!(read &self.backend, p => {
            sqlx::query_as(
                "SELECT identity_id, class, orgs, display_name, created_at, revoked_at \
                 FROM callers ORDER BY created_at, identity_id",
            )
            .fetch_all(p)
            .await
        })
        .map_err(store)?;
        rows.into_iter()
            .map(|row| {
                Ok(CallerEntry {
                    identity: row.identity()?,
                    created_at: Timestamp::from_unix_millis(row.created_at),
                    revoked_at: row.revoked_at.map(Timestamp::from_unix_millis),
                })
            })
            .collect()
    }
}
