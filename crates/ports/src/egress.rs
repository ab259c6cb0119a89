//! Egress: what the server's proxy asks before it connects a sandbox to a destination
//! ([`EgressGate`], the use case's), and how names become addresses ([`Resolver`]).
//!
//! The proxy (an adapter) parses what a sandbox sends and connects; every rule — the
//! org's allowlist, the refused address ranges, the limits, the audit — is the gate's. The
//! gate resolves the name itself (through the [`Resolver`]) and hands the proxy the only
//! addresses it may connect to, so nothing the sandbox controls decides where the bytes go.

use std::net::{IpAddr, SocketAddr};

use async_trait::async_trait;
use domain::SandboxId;

/// How the sandbox asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EgressKind {
    /// A `CONNECT` tunnel (TLS end to end; the proxy sees only the host and port).
    Connect,
    /// A plain HTTP request in absolute form (`GET http://host/…`).
    Http,
}

impl EgressKind {
    /// `connect` or `http`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Connect => "connect",
            Self::Http => "http",
        }
    }
}

/// One destination a sandbox asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressRequest {
    /// The sandbox whose process asks.
    pub sandbox: SandboxId,
    /// The host as the request names it (not yet checked).
    pub host: String,
    /// The port.
    pub port: u16,
    /// How it asked.
    pub kind: EgressKind,
}

/// What one connection may spend; dropping it ends the connection's hold on the
/// sandbox's limits.
pub trait EgressBudget: Send + Sync {
    /// Counts `bytes` more through the connection (either way); `false` once the
    /// sandbox's byte allowance is used up: the proxy then ends the connection.
    fn spend(&self, bytes: u64) -> bool;
}

/// A destination let through: where to connect, and the connection's budget.
pub struct EgressGrant {
    /// The addresses the proxy may connect to (tried in order), all checked.
    pub addrs: Vec<SocketAddr>,
    /// The connection's budget (holds a slot of the sandbox's concurrent connections).
    pub budget: Box<dyn EgressBudget>,
    /// Secrets in scope for this host, for the caller the sandbox acts for now: the proxy
    /// then ends the sandbox's TLS itself (`CONNECT`) or edits the plain request, and adds
    /// them. `None`: the connection stays end to end.
    pub broker: Option<Brokered>,
}

impl std::fmt::Debug for EgressGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressGrant")
            .field("addrs", &self.addrs)
            .field("broker", &self.broker)
            .finish_non_exhaustive()
    }
}

/// What a brokered connection adds to its requests, and where each use is recorded.
pub struct Brokered {
    /// The headers to set (one per header name; values never shown by `Debug`).
    pub injections: Vec<domain::broker::Injection>,
    /// Records every request that used a secret, or was refused by a binding.
    pub audit: std::sync::Arc<dyn BrokerAudit>,
}

impl std::fmt::Debug for Brokered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Brokered").field("injections", &self.injections).finish_non_exhaustive()
    }
}

/// One request of a brokered connection, as the audit records it (never a value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerUse {
    /// The sandbox whose process sent it.
    pub sandbox: SandboxId,
    /// The secret's name.
    pub secret: String,
    /// The host it went to.
    pub host: String,
    /// The request's method.
    pub method: String,
    /// The request's path (without its query).
    pub path: String,
    /// Whether it was sent with the secret (`false`: refused by the binding's methods or
    /// paths, answered 403 by the proxy).
    pub allowed: bool,
}

/// Where brokered requests are recorded (the gate's audit, throttled like egress).
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
#[async_trait]
pub trait BrokerAudit: Send + Sync {
    /// Records `used` before the request is forwarded. `false` when it could not be
    /// recorded: the proxy then refuses the request (503) instead of sending it.
    async fn record(&self, used: &BrokerUse) -> bool;
}

/// Why a destination is refused. The message is shown to the process that asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EgressRefusal {
    /// The request names no valid host or port.
    #[error("{0}")]
    BadRequest(String),
    /// The org's allowlist does not cover the host and port, or the name resolves only
    /// into refused address ranges.
    #[error("{0}")]
    NotAllowed(String),
    /// The name does not resolve.
    #[error("{0}")]
    Unresolvable(String),
    /// A limit of the sandbox is reached (concurrent connections, bytes).
    #[error("{0}")]
    Limited(String),
    /// The server cannot decide now (its store is unreachable): refused, to be tried again.
    #[error("{0}")]
    Unavailable(String),
}

/// Decides each destination a sandbox asks for.
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
#[async_trait]
pub trait EgressGate: Send + Sync {
    /// Lets `request` through or refuses it. MUST write the decision to the audit log
    /// (or count it in a summary), MUST return only addresses outside the refused ranges
    /// unless the org names them, and MUST refuse when it cannot tell.
    ///
    /// # Errors
    /// [`EgressRefusal`], its message for the process that asked.
    async fn open(&self, request: &EgressRequest) -> Result<EgressGrant, EgressRefusal>;
}

/// Why a name did not resolve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ResolveError(pub String);

/// Resolves host names (the system's resolver; a fixed table in tests).
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
#[async_trait]
pub trait Resolver: Send + Sync {
    /// Every address `host` resolves to (an address literal: itself).
    ///
    /// # Errors
    /// [`ResolveError`] when it does not resolve.
    async fn resolve(&self, host: &str) -> Result<Vec<IpAddr>, ResolveError>;
}
