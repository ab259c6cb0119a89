//! Preview ports: a process listening on a port inside a sandbox, opened through the
//! server. Whoever may exec in the sandbox may open its ports ([`open_as`]: the same
//! access path and [`Operation::Exec`] as exec, one rule); anyone else only through a
//! preview link ([`create_link`]), whose token is traded once for a cookie
//! ([`trade_token`]) and checked against the store on every request ([`open_with_link`]),
//! so a revocation ([`revoke_link`]) holds at once on every replica. Each link made,
//! opened (at the trade) and revoked is an audit event naming its creator.
//!
//! An open port holds the sandbox's activity (the idle pass does not suspend a sandbox
//! under a preview) and, like exec, resumes a suspended sandbox first. It also holds one of
//! the sandbox's preview places on this replica for as long as it is open
//! (`streams.max_preview_connections_per_sandbox`; one more is [`PreviewError::Busy`]): a
//! sandbox that never answers, or a crowd of visitors of one sandbox, holds at most that
//! many of the replica's connections, never all of them. Link visitors together get three
//! quarters of them, so the sandbox's own callers always find a place.

use domain::preview::{self, DEFAULT_LINK_TTL_S, MAX_LINK_TTL_S, MIN_LINK_TTL_S, token_digest};
use domain::{
    Actor, AuditAction, AuditOutcome, LinkRefusal, Operation, OrgId, PreviewHost, PreviewLink, PreviewLinkId,
    SandboxId, SandboxState, Timestamp,
};
use ports::{AuditError, DriverError, PortStream, PreviewLinkStoreError, RegistryError};
use tracing::{error, info};

use super::LaneDeps;
use super::access::{AccessError, authorize_sandbox, authorize_sandbox_by_id};
use super::audit_event::EventContext;
use super::places::Place;
use super::sandbox::{Admission, ExecError, admit_record};
use super::standing::Standing;

/// Why a preview could not be opened, or a link made or revoked.
#[derive(Debug, thiserror::Error)]
pub enum PreviewError {
    /// The actor may not exec in the sandbox, or it does not exist for the actor.
    #[error(transparent)]
    Access(#[from] AccessError),
    /// No sandbox has this id.
    #[error("no sandbox {0}")]
    NoSandbox(SandboxId),
    /// The port is one the lane serves inside every sandbox (or 0).
    #[error("port {0} is not open to previews: the lane serves it inside the sandbox")]
    PortClosed(u16),
    /// The link does not open this host now.
    #[error(transparent)]
    Link(LinkRefusal),
    /// The sandbox is not running (provisioning, failed, deprovisioned, or gone from the
    /// driver).
    #[error("sandbox {sandbox_id} is not running ({state})")]
    NotRunning {
        /// The sandbox.
        sandbox_id: SandboxId,
        /// Its state as recorded (`gone` when the driver no longer holds it).
        state: String,
    },
    /// The sandbox could not be made ready (a suspended one not resumed, the policy
    /// unreadable).
    #[error(transparent)]
    Admission(Box<ExecError>),
    /// Nothing answered on the port (refused, no answer in time), or the sandbox's side
    /// failed.
    #[error("the sandbox did not answer on port {port}: {source}")]
    Unreachable {
        /// The port.
        port: u16,
        /// Why.
        #[source]
        source: DriverError,
    },
    /// The request is malformed (a `ttl_s` out of range).
    #[error("{0}")]
    Invalid(String),
    /// The sandbox has as many preview connections open on this replica as it may.
    #[error(
        "sandbox {sandbox_id} already has {limit} preview connections open, its cap \
         (streams.max_preview_connections_per_sandbox); retry once one has ended"
    )]
    Busy {
        /// The sandbox.
        sandbox_id: SandboxId,
        /// The cap.
        limit: u32,
    },
    /// The link store failed.
    #[error("the preview links cannot be read or written now")]
    Store(#[source] PreviewLinkStoreError),
    /// The registry failed.
    #[error("the sandbox's record cannot be read now")]
    Registry(#[source] RegistryError),
    /// The caller directory failed (whether a link's creator was revoked).
    #[error("the caller directory cannot be read now")]
    Directory(#[source] ports::DirectoryError),
    /// The link's creation could not be audited, so it was not made.
    #[error("the preview link could not be audited")]
    Audit(#[source] AuditError),
    /// The system has no entropy for a token.
    #[error("no entropy for a token")]
    Entropy,
    /// No such link of this sandbox's port.
    #[error("no preview link {0} of this sandbox's port")]
    NoLink(PreviewLinkId),
}

/// A connection to a sandbox's port, with the sandbox's activity and one of its preview
/// places held while it lives.
pub struct PreviewConnection {
    /// The connection.
    pub stream: Box<dyn PortStream>,
    /// The sandbox counts as active while this lives.
    _admission: Admission,
    /// The sandbox's preview place.
    place: Place,
    /// Who it acts for, asked again while it lasts ([`super::standing::lapsed`]).
    standing: Standing,
}

impl std::fmt::Debug for PreviewConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PreviewConnection")
    }
}

impl PreviewConnection {
    /// The connection, and what keeps the sandbox active: hold it for as long as the
    /// connection is used (a response's body, an upgraded connection).
    pub fn into_parts(self) -> (Box<dyn PortStream>, Held, Standing) {
        (self.stream, Held { _admission: self._admission, _place: self.place }, self.standing)
    }
}

/// Keeps a sandbox active, and one of its preview places taken, while a preview uses its
/// port (see [`PreviewConnection::into_parts`]).
pub struct Held {
    _admission: Admission,
    _place: Place,
}

fn admission_error(e: ExecError) -> PreviewError {
    match e {
        ExecError::Access(a) => PreviewError::Access(a),
        ExecError::NotReady { sandbox_id, state } => {
            PreviewError::NotRunning { sandbox_id, state: state.to_string() }
        }
        ExecError::Gone(sandbox_id) => PreviewError::NotRunning { sandbox_id, state: "gone".into() },
        other => PreviewError::Admission(Box::new(other)),
    }
}

/// How many of a sandbox's `limit` preview places a connection opened by `standing` may
/// find taken and still get one: all of them for a caller allowed to exec, three quarters
/// for the visitors of links, so that whoever holds a link (and keeps answers unread, or
/// WebSockets open) never locks the sandbox's own callers out of its ports.
fn places_for(standing: &Standing, limit: u32) -> u32 {
    match standing {
        Standing::Caller(_) => limit,
        Standing::Link { .. } => limit - limit / 4,
    }
}

async fn connect(
    deps: &LaneDeps,
    host: &PreviewHost,
    admission: Admission,
    standing: Standing,
) -> Result<PreviewConnection, PreviewError> {
    let limit = places_for(&standing, deps.streams.max_preview_connections_per_sandbox);
    let place = deps
        .previews
        .take(&host.sandbox, limit)
        .ok_or_else(|| PreviewError::Busy { sandbox_id: host.sandbox.clone(), limit })?;
    match deps.driver.open_port(&host.sandbox, host.port).await {
        Ok(stream) => Ok(PreviewConnection { stream, _admission: admission, place, standing }),
        Err(DriverError::NotFound(sandbox_id)) => {
            Err(PreviewError::NotRunning { sandbox_id, state: "gone".into() })
        }
        Err(DriverError::Invalid(_)) => Err(PreviewError::PortClosed(host.port)),
        Err(source) => Err(PreviewError::Unreachable { port: host.port, source }),
    }
}

/// Opens `host`'s port for `actor`, who must be allowed to exec in the sandbox.
///
/// # Errors
/// [`PreviewError`].
pub async fn open_as(
    deps: &LaneDeps,
    actor: &Actor,
    host: &PreviewHost,
) -> Result<PreviewConnection, PreviewError> {
    if !preview::port_open(host.port) {
        return Err(PreviewError::PortClosed(host.port));
    }
    // One read of the record: the host names the sandbox, the record its org. A caller
    // of another org learns nothing of it, not even its org.
    let record = match authorize_sandbox_by_id(deps, actor, Operation::Exec, &host.sandbox).await {
        Err(AccessError::Denied(domain::Denial::NotInOrg { .. })) | Ok(None) => {
            return Err(PreviewError::NoSandbox(host.sandbox.clone()));
        }
        found => found?.ok_or_else(|| PreviewError::NoSandbox(host.sandbox.clone()))?,
    };
    let admission = admit_record(deps, record, false).await.map_err(admission_error)?;
    let identity = match actor {
        Actor::Caller(caller) => caller.identity_id().clone(),
        Actor::SandboxToken { subject, .. } => subject.clone(),
    };
    connect(deps, host, admission, Standing::Caller(identity)).await
}

/// The link whose token is `token`, if it opens `host` now.
pub(crate) async fn link_for(
    deps: &LaneDeps,
    token: &str,
    host: &PreviewHost,
) -> Result<PreviewLink, PreviewError> {
    let link = deps
        .preview_links
        .by_token(&token_digest(token))
        .await
        .map_err(PreviewError::Store)?
        .ok_or(PreviewError::Link(LinkRefusal::Unknown))?;
    link.admits(host, deps.clock.now()).map_err(PreviewError::Link)?;
    // A link acts for its creator, as a token does: not once the creator is revoked.
    if deps.directory.is_revoked(link.created_by.identity_id()).await.map_err(PreviewError::Directory)? {
        return Err(PreviewError::Link(LinkRefusal::CreatorRevoked));
    }
    Ok(link)
}

/// Opens `host`'s port for the bearer of a link's token (its cookie): the link is read
/// from the store on every call.
///
/// # Errors
/// [`PreviewError`].
pub async fn open_with_link(
    deps: &LaneDeps,
    token: &str,
    host: &PreviewHost,
) -> Result<PreviewConnection, PreviewError> {
    if !preview::port_open(host.port) {
        return Err(PreviewError::PortClosed(host.port));
    }
    let link = link_for(deps, token, host).await?;
    let record = deps
        .registry
        .get(&host.sandbox)
        .await
        .map_err(PreviewError::Registry)?
        .filter(|r| r.key.org() == &link.org)
        .ok_or_else(|| PreviewError::NoSandbox(host.sandbox.clone()))?;
    let admission = admit_record(deps, record, false).await.map_err(admission_error)?;
    connect(deps, host, admission, Standing::Link { token: token.to_owned(), host: host.clone() }).await
}

/// Trades a link's token for its cookie: the link, when it opens `host` now, with the
/// opening audited (naming the link's creator; refused when it cannot be). Once per cookie: the visitor then comes
/// with the cookie, which [`open_with_link`] checks.
///
/// # Errors
/// [`PreviewError`].
pub async fn trade_token(
    deps: &LaneDeps,
    token: &str,
    host: &PreviewHost,
) -> Result<PreviewLink, PreviewError> {
    let link = link_for(deps, token, host).await?;
    let record = deps.registry.get(&link.sandbox).await.map_err(PreviewError::Registry)?;
    if let Some(record) = record {
        let ctx = EventContext {
            action: AuditAction::PreviewLinkOpen,
            key: &record.key,
            caller: &link.created_by,
            driver: deps.driver.name(),
        };
        let message = format!("preview link {} of port {} opened", link.id, link.port);
        let event =
            ctx.event(AuditOutcome::Allowed, Some(&link.sandbox), None, None, message, deps.clock.now());
        // An opening that is not in the audit log gives no cookie.
        deps.audit.append(&event).await.map_err(PreviewError::Audit)?;
    }
    Ok(link)
}

/// The caller of a link route: a sandbox token may not make, list or revoke links (a
/// process inside must not publish its own sandbox).
fn caller_only(actor: &Actor) -> Result<&domain::CallerIdentity, PreviewError> {
    match actor {
        Actor::Caller(caller) => Ok(caller),
        Actor::SandboxToken { .. } => {
            Err(PreviewError::Access(AccessError::Denied(domain::Denial::TokenOperation {
                operation: Operation::Exec,
            })))
        }
    }
}

/// A link made, with its token (shown once: only its digest is kept).
#[derive(Debug, Clone)]
pub struct MadeLink {
    /// The link.
    pub link: PreviewLink,
    /// Its token.
    pub token: String,
}

fn random_bytes<const N: usize>() -> Result<[u8; N], PreviewError> {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).map_err(|_| PreviewError::Entropy)?;
    Ok(bytes)
}

/// Makes a preview link of `port` of sandbox `sandbox_id` of `org`, living `ttl_s` seconds
/// (an hour when `None`), for a caller allowed to exec in it (sandbox tokens may not).
/// Audited before it is returned; a link whose event cannot be written is not made.
///
/// # Errors
/// [`PreviewError`].
pub async fn create_link(
    deps: &LaneDeps,
    actor: &Actor,
    org: &OrgId,
    sandbox_id: &SandboxId,
    port: u16,
    ttl_s: Option<u64>,
) -> Result<MadeLink, PreviewError> {
    let ttl_s = ttl_s.unwrap_or(DEFAULT_LINK_TTL_S);
    if !(MIN_LINK_TTL_S..=MAX_LINK_TTL_S).contains(&ttl_s) {
        return Err(PreviewError::Invalid(format!(
            "ttl_s must be between {MIN_LINK_TTL_S} and {MAX_LINK_TTL_S} seconds, got {ttl_s}"
        )));
    }
    if !preview::port_open(port) {
        return Err(PreviewError::PortClosed(port));
    }
    let caller = caller_only(actor)?;
    let record = authorize_sandbox(deps, actor, Operation::Exec, org, sandbox_id).await?;
    if matches!(record.state, SandboxState::Deprovisioned | SandboxState::Failed) {
        return Err(PreviewError::NotRunning {
            sandbox_id: sandbox_id.clone(),
            state: record.state.to_string(),
        });
    }
    let now = deps.clock.now();
    let token: String = random_bytes::<32>()?.iter().map(|b| format!("{b:02x}")).collect();
    let id = PreviewLinkId::generate(
        u64::try_from(now.unix_millis()).unwrap_or(0),
        u128::from_le_bytes(random_bytes::<16>()?),
    );
    let link = PreviewLink {
        id,
        org: org.clone(),
        sandbox: sandbox_id.clone(),
        port,
        created_by: caller.sandbox_caller(),
        created_at: now,
        expires_at: Timestamp::from_unix_millis(
            now.unix_millis().saturating_add(i64::try_from(ttl_s * 1000).unwrap_or(i64::MAX)),
        ),
        revoked_at: None,
        token_sha256: token_digest(&token),
    };
    let ctx = EventContext {
        action: AuditAction::PreviewLinkCreate,
        key: &record.key,
        caller: &link.created_by,
        driver: deps.driver.name(),
    };
    let message =
        format!("preview link {} of port {port}, expires at {} ms", link.id, link.expires_at.unix_millis());
    let event = ctx.event(AuditOutcome::Stored, Some(sandbox_id), None, None, message, now);
    deps.audit.append(&event).await.map_err(PreviewError::Audit)?;
    deps.preview_links.insert(&link).await.map_err(PreviewError::Store)?;
    info!(link = %link.id, sandbox_id = %sandbox_id, port, "preview link made");
    Ok(MadeLink { link, token })
}

/// The links of `port` of sandbox `sandbox_id` of `org` (all ports when `None`), for a
/// caller allowed to exec in it.
///
/// # Errors
/// [`PreviewError`].
pub async fn list_links(
    deps: &LaneDeps,
    actor: &Actor,
    org: &OrgId,
    sandbox_id: &SandboxId,
    port: Option<u16>,
) -> Result<Vec<PreviewLink>, PreviewError> {
    caller_only(actor)?;
    authorize_sandbox(deps, actor, Operation::Exec, org, sandbox_id).await?;
    deps.preview_links.list(org, sandbox_id, port).await.map_err(PreviewError::Store)
}

/// Revokes link `id` of `port` of sandbox `sandbox_id` of `org`, at once for every replica
/// (each preview request reads the link); revoking a revoked link changes nothing. The
/// revocation is audited naming the link's creator (and, in its message, who revoked it).
///
/// # Errors
/// [`PreviewError`]; [`PreviewError::NoLink`] for a link of another sandbox or port.
pub async fn revoke_link(
    deps: &LaneDeps,
    actor: &Actor,
    org: &OrgId,
    sandbox_id: &SandboxId,
    port: u16,
    id: &PreviewLinkId,
) -> Result<(), PreviewError> {
    let by = caller_only(actor)?.identity_id().to_string();
    let record = authorize_sandbox(deps, actor, Operation::Exec, org, sandbox_id).await?;
    let link = deps
        .preview_links
        .get(org, id)
        .await
        .map_err(PreviewError::Store)?
        .filter(|l| &l.sandbox == sandbox_id && l.port == port)
        .ok_or_else(|| PreviewError::NoLink(id.clone()))?;
    let now = deps.clock.now();
    if !deps.preview_links.revoke(org, id, now).await.map_err(PreviewError::Store)? {
        return Ok(());
    }
    let ctx = EventContext {
        action: AuditAction::PreviewLinkRevoke,
        key: &record.key,
        caller: &link.created_by,
        driver: deps.driver.name(),
    };
    let message = format!("preview link {} of port {port} revoked by {by}", link.id);
    let event = ctx.event(AuditOutcome::Deleted, Some(sandbox_id), None, None, message, now);
    if let Err(e) = deps.audit.append(&event).await {
        error!(link = %id, error = %e, "a preview link's revocation could not be audited");
    }
    Ok(())
}

#[cfg(test)]
mod tests;
