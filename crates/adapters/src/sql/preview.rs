//! Preview link records on SQL: one row per org and id, the token kept only as its SHA-256
//! (hex, unique). Every preview request reads its link by that digest, so a revocation
//! holds on the next request on every replica.

use async_trait::async_trait;
use domain::{
    CallerClass, IdentityId, OrgId, PreviewLink, PreviewLinkId, SandboxCaller, SandboxId, Timestamp,
};
use ports::{Cause, PreviewLinkStore, PreviewLinkStoreError};

use super::{Backend, with_pool};

fn store(e: sqlx::Error) -> PreviewLinkStoreError {
    PreviewLinkStoreError::Store(Cause::new(e))
}

fn corrupt(what: impl std::fmt::Display) -> PreviewLinkStoreError {
    PreviewLinkStoreError::Store(format!("stored preview link is invalid: {what}").into())
}

fn hex(digest: &[u8; 32]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    if text.len() != 64 {
        return None;
    }
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[derive(Debug, sqlx::FromRow)]
struct Row {
    org: String,
    id: String,
    sandbox: String,
    port: i32,
    created_by: String,
    created_by_class: String,
    created_at: i64,
    expires_at: i64,
    revoked_at: Option<i64>,
    token_sha256: String,
}

impl Row {
    fn link(self) -> Result<PreviewLink, PreviewLinkStoreError> {
        Ok(PreviewLink {
            id: PreviewLinkId::parse(self.id).map_err(corrupt)?,
            org: OrgId::parse(self.org).map_err(corrupt)?,
            sandbox: SandboxId::parse(self.sandbox).map_err(corrupt)?,
            port: u16::try_from(self.port).map_err(corrupt)?,
            created_by: SandboxCaller::from_record(
                IdentityId::parse(self.created_by).map_err(corrupt)?,
                CallerClass::parse_stored(&self.created_by_class).map_err(corrupt)?,
            ),
            created_at: Timestamp::from_unix_millis(self.created_at),
            expires_at: Timestamp::from_unix_millis(self.expires_at),
            revoked_at: self.revoked_at.map(Timestamp::from_unix_millis),
            token_sha256: unhex(&self.token_sha256).ok_or_else(|| corrupt("token digest"))?,
        })
    }
}

/// The columns, in [`Row`]'s order (a macro: statements are static strings).
macro_rules! columns {
    () => {
        "org, id, sandbox, port, created_by, created_by_class, created_at, expires_at, revoked_at, token_sha256"
    };
}

/// The [`PreviewLinkStore`] on SQLite or Postgres.
#[derive(Debug, Clone)]
pub struct SqlPreviewLinkStore {
    backend: Backend,
}

impl SqlPreviewLinkStore {
    pub(crate) fn new(backend: Backend) -> Self {
        Self { backend }
    }
}

#[async_trait]
impl PreviewLinkStore for SqlPreviewLinkStore {
    async fn insert(&self, l: &PreviewLink) -> Result<(), PreviewLinkStoreError> {
        with_pool!(write &self.backend, p => {
            sqlx::query(concat!(
                "INSERT INTO preview_links (",
                columns!(),
                ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
            ))
            .bind(l.org.as_str())
            .bind(l.id.as_str())
            .bind(l.sandbox.as_str())
            .bind(i32::from(l.port))
            .bind(l.created_by.identity_id().as_str())
            .bind(l.created_by.class().as_str())
            .bind(l.created_at.unix_millis())
            .bind(l.expires_at.unix_millis())
            .bind(l.revoked_at.map(Timestamp::unix_millis))
            .bind(hex(&l.token_sha256))
            .execute(p)
            .await
            .map(|_| ())
        })
        .map_err(store)?;
        Ok(())
    }

    async fn by_token(&self, token_sha256: &[u8; 32]) -> Result<Option<PreviewLink>, PreviewLinkStoreError> {
        let row: Option<Row> = with_pool!(read &self.backend, p => {
            sqlx::query_as(concat!("SELECT ", columns!(), " FROM preview_links WHERE token_sha256 = $1"))
                .bind(hex(token_sha256))
                .fetch_optional(p)
                .await
        })
        .map_err(store)?;
        row.map(Row::link).transpose()
    }

    async fn get(
        &self,
        org: &OrgId,
        id: &PreviewLinkId,
    ) -> Result<Option<PreviewLink>, PreviewLinkStoreError> {
        let row: Option<Row> = with_pool!(read &self.backend, p => {
            sqlx::query_as(concat!("SELECT ", columns!(), " FROM preview_links WHERE org = $1 AND id = $2"))
                .bind(org.as_str())
                .bind(id.as_str())
                .fetch_optional(p)
                .await
        })
        .map_err(store)?;
        row.map(Row::link).transpose()
    }

    async fn list(
        &self,
        org: &OrgId,
        sandbox: &SandboxId,
        port: Option<u16>,
    ) -> Result<Vec<PreviewLink>, PreviewLinkStoreError> {
        let rows: Vec<Row> = with_pool!(read &self.backend, p => {
            sqlx::query_as(concat!(
                "SELECT ",
                columns!(),
                " FROM preview_links WHERE org = $1 AND sandbox = $2 AND ($3 IS NULL OR port = $3) ORDER BY id"
            ))
            .bind(org.as_str())
            .bind(sandbox.as_str())
            .bind(port.map(i32::from))
            .fetch_all(p)
            .await
        })
        .map_err(store)?;
        rows.into_iter().map(Row::link).collect()
    }

    async fn revoke(
        &self,
        org: &OrgId,
        id: &PreviewLinkId,
        at: Timestamp,
    ) -> Result<bool, PreviewLinkStoreError> {
        let n = with_pool!(write &self.backend, p => {
            sqlx::query("UPDATE preview_links SET revoked_at = $3 WHERE org = $1 AND id = $2 AND revoked_at IS NULL")
                .bind(org.as_str())
                .bind(id.as_str())
                .bind(at.unix_millis())
                .execute(p)
                .await
                .map(|r| r.rows_affected())
        })
        .map_err(store)?;
        Ok(n > 0)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn digests_round_trip_through_hex() {
        let digest = domain::preview::token_digest("token");
        assert_eq!(super::unhex(&super::hex(&digest)), Some(digest));
        assert_eq!(super::unhex("zz"), None);
    }
}
