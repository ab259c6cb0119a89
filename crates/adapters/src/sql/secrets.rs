//! Brokered secrets on SQL: one row per org and name, the binding in columns and JSON, the
//! value sealed by [`SecretKeys`] (AES-256-GCM, the org and name as associated data) under
//! a key the row names and the data dir holds.
//!
//! A guarded write (a user's, on its own secrets only) reads the row and writes it in one
//! transaction (Postgres: the row locked `FOR UPDATE`; SQLite: its single writer), so a
//! concurrent write cannot slip between the check and the write.

use std::sync::Arc;

use async_trait::async_trait;
use domain::broker::{BindingInput, SecretBinding, SecretName, SecretScope};
use domain::{CallerClass, IdentityId, OrgId, SecretValue, Timestamp};
use ports::{Cause, PutOutcome, SecretEntry, SecretGuard, SecretLimits, SecretStore, SecretStoreError};
use serde::{Deserialize, Serialize};

use super::secret_keys::{KeyError, SecretKeys};
use super::{Backend, WritePool as _, with_pool};

fn store(e: sqlx::Error) -> SecretStoreError {
    SecretStoreError::Store(Cause::new(e))
}

fn keys(e: KeyError) -> SecretStoreError {
    SecretStoreError::Store(Cause::new(e))
}

fn corrupt(what: impl std::fmt::Display) -> SecretStoreError {
    SecretStoreError::Store(format!("stored secret is invalid: {what}").into())
}

/// The JSON column: the binding but its name and scope.
#[derive(Debug, Serialize, Deserialize)]
struct StoredBinding {
    hosts: Vec<String>,
    header: String,
    format: String,
    methods: Vec<String>,
    paths: Vec<String>,
}

/// The advisory lock class of an org's secret puts on Postgres (`"secr"`), the org's name
/// hashed beside it: one put of an org at a time, so its counts hold until it commits.
const LOCK_SPACE: i32 = 0x7365_6372;

fn scope_columns(scope: &SecretScope) -> (&'static str, String) {
    match scope {
        SecretScope::Identity(id) => ("identity", id.as_str().to_owned()),
        SecretScope::Class(c) => ("class", c.as_str().to_owned()),
        SecretScope::Org => ("org", String::new()),
    }
}

fn binding_json(b: &SecretBinding) -> Result<String, SecretStoreError> {
    serde_json::to_string(&StoredBinding {
        hosts: b.hosts.iter().map(ToString::to_string).collect(),
        header: b.header.as_str().to_owned(),
        format: b.format.as_str().to_owned(),
        methods: b.methods.clone(),
        paths: b.paths.clone(),
    })
    .map_err(corrupt)
}

/// A row without its value.
#[derive(Debug, sqlx::FromRow)]
struct Row {
    name: String,
    scope_kind: String,
    scope_value: String,
    binding: String,
    created_at: i64,
    updated_at: i64,
}

/// A row with its sealed value.
#[derive(Debug, sqlx::FromRow)]
struct SealedRow {
    name: String,
    scope_kind: String,
    scope_value: String,
    binding: String,
    key_id: String,
    sealed: Vec<u8>,
}

fn binding_of(name: &str, kind: &str, value: &str, json: &str) -> Result<SecretBinding, SecretStoreError> {
    let scope = match kind {
        "identity" => SecretScope::Identity(IdentityId::parse(value.to_owned()).map_err(corrupt)?),
        "class" => SecretScope::class(CallerClass::parse_stored(value).map_err(corrupt)?).map_err(corrupt)?,
        "org" => SecretScope::Org,
        other => return Err(corrupt(format!("scope {other:?}"))),
    };
    let stored: StoredBinding = serde_json::from_str(json).map_err(corrupt)?;
    let input = BindingInput {
        hosts: &stored.hosts,
        header: Some(&stored.header),
        format: Some(&stored.format),
        methods: &stored.methods,
        paths: &stored.paths,
    };
    SecretBinding::new(SecretName::parse(name).map_err(corrupt)?, scope, &input).map_err(corrupt)
}

/// What a key rotation did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rotation {
    /// The new current key's id.
    pub key_id: String,
    /// How many values were sealed again under it.
    pub resealed: u64,
    /// The ids of the old keys removed (no value was sealed under them any more).
    pub removed: Vec<String>,
}

/// The [`SecretStore`] on SQLite or Postgres.
#[derive(Debug, Clone)]
pub struct SqlSecretStore {
    backend: Backend,
    keys: Arc<SecretKeys>,
}

impl SqlSecretStore {
    pub(crate) fn new(backend: Backend, keys: Arc<SecretKeys>) -> Self {
        Self { backend, keys }
    }

    /// Makes a new sealing key current, seals every value again under it, then removes
    /// the key files no value is sealed under any more (see [`super::secret_keys`]).
    ///
    /// # Errors
    /// [`SecretStoreError::Store`]; a rotation cut short leaves every value readable (each
    /// row names its key, and no key still named is removed), and can be run again.
    pub async fn rotate_key(&self) -> Result<Rotation, SecretStoreError> {
        let key_id = self.keys.rotate().map_err(keys)?;
        let mut resealed = 0;
        loop {
            let rows: Vec<(String, String, String, Vec<u8>)> = with_pool!(read &self.backend, p => {
                sqlx::query_as(
                    "SELECT org, name, key_id, sealed FROM secrets WHERE key_id <> $1 ORDER BY org, name LIMIT 100",
                )
                .bind(key_id.as_str())
                .fetch_all(p)
                .await
            })
            .map_err(store)?;
            if rows.is_empty() {
                break;
            }
            for (org, name, old, sealed) in rows {
                let value = self.keys.open(&old, &org, &name, &sealed).map_err(keys)?;
                let (kid, again) = self.keys.seal(&org, &name, &value).map_err(keys)?;
                // Only if untouched since read: a value set meanwhile is sealed already.
                let done = with_pool!(write &self.backend, p => {
                    sqlx::query("UPDATE secrets SET key_id = $1, sealed = $2 WHERE org = $3 AND name = $4 AND key_id = $5")
                        .bind(kid.as_str())
                        .bind(again)
                        .bind(org.as_str())
                        .bind(name.as_str())
                        .bind(old.as_str())
                        .execute(p)
                        .await
                        .map(|r| r.rows_affected())
                })
                .map_err(store)?;
                resealed += done;
            }
        }
        // The webhooks' signing secrets are sealed under the same keys.
        loop {
            let rows: Vec<(String, String, Vec<u8>)> = with_pool!(read &self.backend, p => {
                sqlx::query_as("SELECT org, key_id, sealed FROM webhooks WHERE key_id <> $1 ORDER BY org LIMIT 100")
                    .bind(key_id.as_str())
                    .fetch_all(p)
                    .await
            })
            .map_err(store)?;
            if rows.is_empty() {
                break;
            }
            for (org, old, sealed) in rows {
                let name = super::webhooks::SEAL_NAME;
                let value = self.keys.open(&old, &org, name, &sealed).map_err(keys)?;
                let (kid, again) = self.keys.seal(&org, name, &value).map_err(keys)?;
                with_pool!(write &self.backend, p => {
                    sqlx::query("UPDATE webhooks SET key_id = $1, sealed = $2 WHERE org = $3 AND key_id = $4")
                        .bind(kid.as_str())
                        .bind(again)
                        .bind(org.as_str())
                        .bind(old.as_str())
                        .execute(p)
                        .await
                        .map(|_| ())
                })
                .map_err(store)?;
            }
        }
        let used: Vec<(String,)> = with_pool!(read &self.backend, p => {
            sqlx::query_as("SELECT key_id FROM secrets UNION SELECT key_id FROM webhooks").fetch_all(p).await
        })
        .map_err(store)?;
        let used: Vec<String> = used.into_iter().map(|(k,)| k).collect();
        let removed = self.keys.remove_unused(&used).map_err(keys)?;
        Ok(Rotation { key_id, resealed, removed })
    }

    /// The ids of the keys values are sealed under now, and how many under each.
    ///
    /// # Errors
    /// [`SecretStoreError::Store`].
    pub async fn keys_in_use(&self) -> Result<Vec<(String, i64)>, SecretStoreError> {
        with_pool!(read &self.backend, p => {
            sqlx::query_as("SELECT key_id, COUNT(*) FROM secrets GROUP BY key_id ORDER BY key_id").fetch_all(p).await
        })
        .map_err(store)
    }
}

#[async_trait]
impl SecretStore for SqlSecretStore {
    async fn put(
        &self,
        org: &OrgId,
        binding: &SecretBinding,
        value: &SecretValue,
        guard: &SecretGuard,
        limits: SecretLimits,
        now: Timestamp,
    ) -> Result<PutOutcome, SecretStoreError> {
        let name = binding.name.as_str();
        let postgres = matches!(self.backend, Backend::Postgres(..));
        let json = binding_json(binding)?;
        let (kind, scope_value) = scope_columns(&binding.scope);
        let (key_id, sealed) = self.keys.seal(org.as_str(), name, value.expose()).map_err(keys)?;
        let select = if postgres {
            "SELECT scope_kind, scope_value FROM secrets WHERE org = $1 AND name = $2 FOR UPDATE"
        } else {
            "SELECT scope_kind, scope_value FROM secrets WHERE org = $1 AND name = $2"
        };
        let now_ms = now.unix_millis();
        with_pool!(write &self.backend, p => {
            async {
                let mut tx = p.begin_write().await?;
                // The org's puts one at a time (SQLite's writer is one already): the counts
                // below hold until the commit.
                if postgres {
                    sqlx::query("SELECT pg_advisory_xact_lock($1, hashtext($2))")
                        .bind(LOCK_SPACE)
                        .bind(org.as_str())
                        .execute(&mut *tx)
                        .await?;
                }
                let existing: Option<(String, String)> =
                    sqlx::query_as(select).bind(org.as_str()).bind(name).fetch_optional(&mut *tx).await?;
                if existing.is_none() {
                    let held: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM secrets WHERE org = $1")
                        .bind(org.as_str())
                        .fetch_one(&mut *tx)
                        .await?;
                    if held >= i64::from(limits.per_org) {
                        return Ok(PutOutcome::OrgFull);
                    }
                }
                if kind == "identity" {
                    let held: i64 = sqlx::query_scalar(
                        "SELECT COUNT(*) FROM secrets WHERE org = $1 AND scope_kind = 'identity' \
                         AND scope_value = $2 AND name <> $3",
                    )
                    .bind(org.as_str())
                    .bind(scope_value.as_str())
                    .bind(name)
                    .fetch_one(&mut *tx)
                    .await?;
                    if held >= i64::from(limits.per_identity) {
                        return Ok(PutOutcome::IdentityFull);
                    }
                }
                let outcome = match existing {
                    None => {
                        let made = sqlx::query(
                            "INSERT INTO secrets (org, name, scope_kind, scope_value, binding, key_id, sealed, \
                             created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8) \
                             ON CONFLICT (org, name) DO NOTHING",
                        )
                        .bind(org.as_str())
                        .bind(name)
                        .bind(kind)
                        .bind(scope_value.as_str())
                        .bind(json.as_str())
                        .bind(key_id.as_str())
                        .bind(sealed.as_slice())
                        .bind(now_ms)
                        .execute(&mut *tx)
                        .await?;
                        // Made by a concurrent write since the read: not replaced blindly.
                        if made.rows_affected() == 1 { PutOutcome::Created } else { PutOutcome::Taken }
                    }
                    Some((k, v)) => {
                        let allowed = match guard {
                            SecretGuard::Any => true,
                            SecretGuard::Identity(id) => k == "identity" && v == id.as_str(),
                        };
                        if allowed {
                            sqlx::query(
                                "UPDATE secrets SET scope_kind = $3, scope_value = $4, binding = $5, key_id = $6, \
                                 sealed = $7, updated_at = $8 WHERE org = $1 AND name = $2",
                            )
                            .bind(org.as_str())
                            .bind(name)
                            .bind(kind)
                            .bind(scope_value.as_str())
                            .bind(json.as_str())
                            .bind(key_id.as_str())
                            .bind(sealed.as_slice())
                            .bind(now_ms)
                            .execute(&mut *tx)
                            .await?;
                            PutOutcome::Replaced
                        } else {
                            PutOutcome::Taken
                        }
                    }
                };
                tx.commit().await?;
                Ok::<_, sqlx::Error>(outcome)
            }
            .await
        })
        .map_err(store)
    }

    async fn list(&self, org: &OrgId) -> Result<Vec<SecretEntry>, SecretStoreError> {
        let rows: Vec<Row> = with_pool!(read &self.backend, p => {
            sqlx::query_as(
                "SELECT name, scope_kind, scope_value, binding, created_at, updated_at FROM secrets \
                 WHERE org = $1 ORDER BY name",
            )
            .bind(org.as_str())
            .fetch_all(p)
            .await
        })
        .map_err(store)?;
        rows.into_iter()
            .map(|r| {
                Ok(SecretEntry {
                    binding: binding_of(&r.name, &r.scope_kind, &r.scope_value, &r.binding)?,
                    created_at: Timestamp::from_unix_millis(r.created_at),
                    updated_at: Timestamp::from_unix_millis(r.updated_at),
                })
            })
            .collect()
    }

    async fn delete(
        &self,
        org: &OrgId,
        name: &SecretName,
        guard: &SecretGuard,
    ) -> Result<bool, SecretStoreError> {
        let done = with_pool!(write &self.backend, p => {
            match guard {
                SecretGuard::Any => {
                    sqlx::query("DELETE FROM secrets WHERE org = $1 AND name = $2")
                        .bind(org.as_str())
                        .bind(name.as_str())
                        .execute(p)
                        .await
                        .map(|r| r.rows_affected())
                }
                SecretGuard::Identity(id) => {
                    sqlx::query(
                        "DELETE FROM secrets WHERE org = $1 AND name = $2 AND scope_kind = 'identity' \
                         AND scope_value = $3",
                    )
                    .bind(org.as_str())
                    .bind(name.as_str())
                    .bind(id.as_str())
                    .execute(p)
                    .await
                    .map(|r| r.rows_affected())
                }
            }
        })
        .map_err(store)?;
        Ok(done > 0)
    }

    async fn for_host(
        &self,
        org: &OrgId,
        host: &str,
        port: u16,
    ) -> Result<Vec<(SecretBinding, SecretValue)>, SecretStoreError> {
        // Every connection a sandbox opens to an allowed host asks: the bindings are read
        // (small), and only the sealed values of those that cover the host (up to 8 KiB
        // each, of up to 500 secrets an org may hold).
        let bindings: Vec<(String, String, String, String)> = with_pool!(fast read &self.backend, p => {
            sqlx::query_as("SELECT name, scope_kind, scope_value, binding FROM secrets WHERE org = $1 ORDER BY name")
                .bind(org.as_str())
                .fetch_all(p)
                .await
        })
        .map_err(store)?;
        let mut out = Vec::new();
        for (name, kind, value, json) in bindings {
            if !binding_of(&name, &kind, &value, &json)?.covers(host, port) {
                continue;
            }
            let row: Option<SealedRow> = with_pool!(fast read &self.backend, p => {
                sqlx::query_as(
                    "SELECT name, scope_kind, scope_value, binding, key_id, sealed FROM secrets \
                     WHERE org = $1 AND name = $2",
                )
                .bind(org.as_str())
                .bind(&name)
                .fetch_optional(p)
                .await
            })
            .map_err(store)?;
            // Deleted since, or rebound to other hosts: as the binding now says.
            let Some(r) = row else { continue };
            let binding = binding_of(&r.name, &r.scope_kind, &r.scope_value, &r.binding)?;
            if !binding.covers(host, port) {
                continue;
            }
            let value = self.keys.open(&r.key_id, org.as_str(), &r.name, &r.sealed).map_err(keys)?;
            out.push((binding, SecretValue::new(value)));
        }
        Ok(out)
    }
}
