//! Terminal tickets on SQL: one row per ticket, keyed by its SHA-256 in hex; taking one
//! deletes it in the same statement (`DELETE … RETURNING`), so of two replicas taking the
//! same ticket at once only one gets its row.

use async_trait::async_trait;
use domain::{CallerClass, IdentityId, OrgId, SandboxId, TerminalId, Timestamp};
use ports::{Cause, TerminalTickets, TicketGrant, TicketStoreError};

use super::{Backend, with_pool};

fn store(e: sqlx::Error) -> TicketStoreError {
    TicketStoreError::Store(Cause::new(e))
}

fn corrupt(what: impl std::fmt::Display) -> TicketStoreError {
    TicketStoreError::Store(format!("stored terminal ticket is invalid: {what}").into())
}

fn hex(digest: &[u8; 32]) -> String {
    use std::fmt::Write as _;
    digest.iter().fold(String::with_capacity(64), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

type Row = (String, String, String, String, String, i64);

/// The [`TerminalTickets`] on SQLite or Postgres.
#[derive(Debug, Clone)]
pub struct SqlTerminalTickets {
    backend: Backend,
}

impl SqlTerminalTickets {
    pub(crate) fn new(backend: Backend) -> Self {
        Self { backend }
    }
}

#[async_trait]
impl TerminalTickets for SqlTerminalTickets {
    async fn insert(
        &self,
        digest: [u8; 32],
        g: &TicketGrant,
        now: Timestamp,
    ) -> Result<(), TicketStoreError> {
        let digest = hex(&digest);
        with_pool!(write &self.backend, p => {
            async {
                sqlx::query("DELETE FROM terminal_tickets WHERE expires_at <= $1")
                    .bind(now.unix_millis())
                    .execute(p)
                    .await?;
                sqlx::query(
                    "INSERT INTO terminal_tickets (digest, org, sandbox, terminal, identity, class, expires_at) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7)",
                )
                .bind(&digest)
                .bind(g.org.as_str())
                .bind(g.sandbox.as_str())
                .bind(g.terminal.as_str())
                .bind(g.identity.as_str())
                .bind(g.class.as_str())
                .bind(g.expires_at.unix_millis())
                .execute(p)
                .await
                .map(drop)
            }
            .await
        })
        .map_err(store)
    }

    async fn take(&self, digest: [u8; 32], now: Timestamp) -> Result<Option<TicketGrant>, TicketStoreError> {
        let digest = hex(&digest);
        let row: Option<Row> = with_pool!(write &self.backend, p => {
            sqlx::query_as(
                "DELETE FROM terminal_tickets WHERE digest = $1 \
                 RETURNING org, sandbox, terminal, identity, class, expires_at",
            )
            .bind(&digest)
            .fetch_optional(p)
            .await
        })
        .map_err(store)?;
        let Some((org, sandbox, terminal, identity, class, expires_at)) = row else { return Ok(None) };
        let expires_at = Timestamp::from_unix_millis(expires_at);
        if expires_at <= now {
            return Ok(None);
        }
        Ok(Some(TicketGrant {
            org: OrgId::parse(org).map_err(corrupt)?,
            sandbox: SandboxId::parse(sandbox).map_err(corrupt)?,
            terminal: TerminalId::parse(terminal).map_err(corrupt)?,
            identity: IdentityId::parse(identity).map_err(corrupt)?,
            class: CallerClass::parse_wire(&class).map_err(corrupt)?,
            expires_at,
        }))
    }
}
