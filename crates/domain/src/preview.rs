//! Preview ports: a process listening on a TCP port inside a sandbox, reached through the
//! server at its own host name, `{port}-{label}.{preview domain}`, where the label is the
//! sandbox id lower-cased with `_` as `-` ([`PreviewHost`]); the ports that are never open
//! to a preview ([`port_open`]); and preview links, which let someone who may not exec in
//! the sandbox open one port of it until the link expires or is revoked ([`PreviewLink`]).

use sha2::{Digest, Sha256};

use crate::{OrgId, PreviewLinkId, SandboxCaller, SandboxId, Timestamp};

/// The shortest a preview link may live, in seconds.
pub const MIN_LINK_TTL_S: u64 = 60;
/// The longest a preview link may live, in seconds (7 days).
pub const MAX_LINK_TTL_S: u64 = 7 * 24 * 3600;
/// How long a preview link lives when its creator does not say, in seconds (1 hour).
pub const DEFAULT_LINK_TTL_S: u64 = 3600;

/// Whether `port` may be previewed: never port 0, nor the egress proxy's port
/// ([`crate::egress::PROXY_PORT`]), which the lane serves inside every sandbox (a visitor
/// would use the sandbox's egress and its brokered secrets). The supervisor refuses these
/// too, and its own gate's port.
pub fn port_open(port: u16) -> bool {
    port != 0 && port != crate::egress::PROXY_PORT
}

/// The label a sandbox's preview hosts carry: its id lower-cased, `_` as `-` (a DNS label:
/// `sbx_01JB…` is `sbx-01jb…`).
pub fn label(sandbox: &SandboxId) -> String {
    sandbox.as_str().to_ascii_lowercase().replace('_', "-")
}

/// A preview host: which port of which sandbox it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreviewHost {
    /// The port inside the sandbox.
    pub port: u16,
    /// The sandbox.
    pub sandbox: SandboxId,
}

/// Why a host under the preview domain names no sandbox's port.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{host:?} is not a preview host: expected {{port}}-{{sandbox label}}.{domain}")]
pub struct BadPreviewHost {
    /// The host name (without its port).
    pub host: String,
    /// The preview domain.
    pub domain: String,
}

impl PreviewHost {
    /// The host (a `Host` header's value, its port ignored, any case) as a preview host
    /// under `domain`: `None` when it is not under `domain` (the API's own host); an error
    /// when it is, but names no port of a sandbox.
    ///
    /// # Errors
    /// [`BadPreviewHost`].
    pub fn route(host: &str, domain: &str) -> Option<Result<Self, BadPreviewHost>> {
        let name = strip_port(host).trim_end_matches('.').to_ascii_lowercase();
        let domain = domain.trim_end_matches('.').to_ascii_lowercase();
        let first = name.strip_suffix(&domain)?.strip_suffix('.')?;
        let bad = || BadPreviewHost { host: name.clone(), domain: domain.clone() };
        Some(Self::parse_label(first).ok_or_else(bad))
    }

    fn parse_label(first: &str) -> Option<Self> {
        let (port, label) = first.split_once('-')?;
        if port.is_empty()
            || port.len() > 5
            || !port.bytes().all(|b| b.is_ascii_digit())
            || port.starts_with('0')
        {
            return None;
        }
        let port: u16 = port.parse().ok()?;
        let body = label.strip_prefix("sbx-")?;
        let sandbox = SandboxId::parse(format!("sbx_{}", body.to_ascii_uppercase())).ok()?;
        // The label must be exactly the id's: one spelling per host.
        (self::label(&sandbox) == label).then_some(Self { port, sandbox })
    }

    /// The host name of `port` of `sandbox` under `domain`.
    pub fn name(&self, domain: &str) -> String {
        format!(
            "{}-{}.{}",
            self.port,
            label(&self.sandbox),
            domain.trim_end_matches('.').to_ascii_lowercase()
        )
    }
}

/// `host` without a trailing `:port` (an IPv6 literal keeps its brackets).
fn strip_port(host: &str) -> &str {
    match host.rfind(':') {
        Some(i) if !host[i..].contains(']') && host[i + 1..].bytes().all(|b| b.is_ascii_digit()) => {
            &host[..i]
        }
        _ => host,
    }
}

/// The SHA-256 of a link's token: what the store keeps (never the token).
pub fn token_digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// A preview link of one port of one sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreviewLink {
    /// Its id.
    pub id: PreviewLinkId,
    /// The sandbox's org.
    pub org: OrgId,
    /// The sandbox.
    pub sandbox: SandboxId,
    /// The port inside it.
    pub port: u16,
    /// Who made it (a caller allowed to exec in the sandbox then); named by its audit
    /// events.
    pub created_by: SandboxCaller,
    /// When it was made.
    pub created_at: Timestamp,
    /// When it stops opening anything.
    pub expires_at: Timestamp,
    /// When it was revoked, if it was.
    pub revoked_at: Option<Timestamp>,
    /// The SHA-256 of its token ([`token_digest`]).
    pub token_sha256: [u8; 32],
}

/// Why a link does not open a host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LinkRefusal {
    /// No link has this token.
    #[error("the preview link is unknown")]
    Unknown,
    /// It expired.
    #[error("the preview link has expired")]
    Expired,
    /// It was revoked.
    #[error("the preview link was revoked")]
    Revoked,
    /// It is for another sandbox or another port.
    #[error("the preview link is for another sandbox or port")]
    OtherHost,
    /// The caller who made it was revoked: what acted for them ends with them.
    #[error("the preview link's creator was revoked")]
    CreatorRevoked,
}

impl PreviewLink {
    /// Whether this link opens `host` at `now`.
    ///
    /// # Errors
    /// The [`LinkRefusal`] that applies (revoked before expired before another host).
    pub fn admits(&self, host: &PreviewHost, now: Timestamp) -> Result<(), LinkRefusal> {
        if self.revoked_at.is_some() {
            return Err(LinkRefusal::Revoked);
        }
        if now >= self.expires_at {
            return Err(LinkRefusal::Expired);
        }
        if self.sandbox != host.sandbox || self.port != host.port {
            return Err(LinkRefusal::OtherHost);
        }
        Ok(())
    }

    /// The host this link opens.
    pub fn host(&self) -> PreviewHost {
        PreviewHost { port: self.port, sandbox: self.sandbox.clone() }
    }
}

#[cfg(test)]
mod tests;
