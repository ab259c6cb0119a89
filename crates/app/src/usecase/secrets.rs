//! Brokered secrets, managed: set ([`set_secret`]), list ([`list_secrets`]) and delete
//! ([`delete_secret`]) an org's secrets. Write-only: no answer of these ever holds a value,
//! nor does an audit event or a log line.
//!
//! Who may do this: a service caller of the org manages every secret of the org; a user
//! caller only secrets scoped to its own identity (any other scope is refused, other
//! secrets are invisible to it); the server's own (`internal`) caller, i.e. the operator's
//! CLI, every secret; a sandbox token nothing. What a caller could try: open a destination
//! by naming it in a secret (refused: every host must be allowed by the org's allowlist for
//! the scope's classes), replace someone else's secret by its name (refused atomically by
//! the store's guard), smuggle a header or a line break (refused by the domain's binding).

use domain::audit::SECRETS_KEY;
use domain::broker::{BindingError, BindingInput, SecretBinding, SecretName, SecretScope, check_value};
use domain::egress::Allowlist;
use domain::{
    Actor, AuditAction, AuditEvent, AuditOutcome, CallerClass, CallerIdentity, OrgId, SandboxKey,
    SecretValue, SessionId,
};
use ports::{PutOutcome, SecretEntry, SecretGuard, SecretLimits, SecretStoreError};
use tracing::{info, warn};

use std::sync::Arc;

use ports::{AuditLog, CallerDirectory, Clock, SecretStore};

use super::{LaneDeps, Policies};

/// What the secret use cases need (the server's, from [`LaneDeps::secret_ports`]; the
/// operator's CLI, from the store alone).
#[derive(Clone)]
pub struct SecretPorts {
    /// The secrets.
    pub secrets: Arc<dyn SecretStore>,
    /// The audit log (set and delete are audited).
    pub audit: Arc<dyn AuditLog>,
    /// Tells the time.
    pub clock: Arc<dyn Clock>,
    /// The callers (the class of an identity scope's caller).
    pub directory: Arc<dyn CallerDirectory>,
    /// The org policies (their egress allowlists).
    pub policies: Arc<Policies>,
}

impl LaneDeps {
    /// The ports of the secret use cases.
    pub fn secret_ports(&self) -> SecretPorts {
        SecretPorts {
            secrets: self.secrets.clone(),
            audit: self.audit.clone(),
            clock: self.clock.clone(),
            directory: self.directory.clone(),
            policies: self.policies.clone(),
        }
    }
}

/// The most secrets one org holds.
pub const MAX_SECRETS_PER_ORG: u32 = 500;

/// The most secrets scoped to one identity, so that one user caller cannot use up its
/// org's [`MAX_SECRETS_PER_ORG`] for everyone else.
pub const MAX_SECRETS_PER_IDENTITY: u32 = 50;

/// Both, as the store checks them in the write itself (concurrent puts cannot pass them).
const LIMITS: SecretLimits =
    SecretLimits { per_org: MAX_SECRETS_PER_ORG, per_identity: MAX_SECRETS_PER_IDENTITY };

/// A secret as asked for (before it is checked).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRequest {
    /// The value (from the body, or the CLI's standard input).
    pub value: SecretValue,
    /// The hosts.
    pub hosts: Vec<String>,
    /// The header (`None`: `authorization`).
    pub header: Option<String>,
    /// The format (`None`: the header's default).
    pub format: Option<String>,
    /// The scope.
    pub scope: SecretScope,
    /// The methods (empty: any).
    pub methods: Vec<String>,
    /// The path prefixes (empty: any).
    pub paths: Vec<String>,
}

/// Why a secret could not be set, listed or deleted. Never holds a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// The caller may not do this (403).
    #[error("{0}")]
    Denied(String),
    /// No secret of that name the caller may see (404).
    #[error("no secret {name} in org {org}")]
    NotFound {
        /// The org.
        org: OrgId,
        /// The name.
        name: String,
    },
    /// The request breaks the rules (400).
    #[error("{0}")]
    Invalid(String),
    /// The org, or the identity scope, holds as many secrets as it may (429).
    #[error("{0}")]
    Exhausted(String),
    /// A secret of that name exists that the caller may not replace (409).
    #[error("the name {0} is taken in this org by a secret you cannot manage")]
    Taken(String),
    /// The store, the policy or the audit log cannot answer (503).
    #[error("{0}")]
    Unavailable(String),
}

impl From<BindingError> for SecretError {
    fn from(e: BindingError) -> Self {
        Self::Invalid(e.to_string())
    }
}

fn unavailable(what: &str, e: &SecretStoreError) -> SecretError {
    warn!(error = %super::chain(e), "{what}");
    SecretError::Unavailable(format!("{what}; try again"))
}

/// The caller a request acts for: a caller key of the org (sandbox tokens refused).
fn manager<'a>(actor: &'a Actor, org: &OrgId) -> Result<&'a CallerIdentity, SecretError> {
    match actor {
        Actor::SandboxToken { .. } => {
            Err(SecretError::Denied("a sandbox token may not manage secrets; use a caller key".to_owned()))
        }
        Actor::Caller(c) if c.may_act_in(org) => Ok(c),
        Actor::Caller(c) => {
            Err(SecretError::Denied(format!("caller {} may not act in org {org}", c.identity_id())))
        }
    }
}

/// What `caller` may replace or remove.
fn guard_of(caller: &CallerIdentity) -> SecretGuard {
    match caller.class() {
        CallerClass::User => SecretGuard::Identity(caller.identity_id().clone()),
        CallerClass::Service | CallerClass::Internal => SecretGuard::Any,
    }
}

/// Whether `caller` may see or manage a secret of `scope`.
fn manages(caller: &CallerIdentity, scope: &SecretScope) -> bool {
    match caller.class() {
        CallerClass::User => matches!(scope, SecretScope::Identity(id) if id == caller.identity_id()),
        CallerClass::Service | CallerClass::Internal => true,
    }
}

/// The classes of the callers a secret of `scope` may be used for.
async fn classes_of(
    deps: &SecretPorts,
    caller: &CallerIdentity,
    scope: &SecretScope,
) -> Result<Vec<CallerClass>, SecretError> {
    match scope {
        SecretScope::Class(c) => Ok(vec![*c]),
        SecretScope::Org => Ok(vec![CallerClass::User, CallerClass::Service]),
        SecretScope::Identity(id)
            if id == caller.identity_id() && caller.class() != CallerClass::Internal =>
        {
            Ok(vec![caller.class()])
        }
        SecretScope::Identity(id) => {
            let callers = deps.directory.list().await.map_err(|e| {
                warn!(error = %super::chain(&e), "cannot read the caller directory");
                SecretError::Unavailable("cannot read the caller directory now; try again".to_owned())
            })?;
            // A caller the directory does not know may come with either class.
            Ok(callers
                .iter()
                .find(|c| c.identity.identity_id() == id)
                .map_or_else(|| vec![CallerClass::User, CallerClass::Service], |c| vec![c.identity.class()]))
        }
    }
}

/// The audit event of a change to the org's secrets (the binding, never the value).
fn event(
    deps: &SecretPorts,
    caller: &CallerIdentity,
    org: &OrgId,
    action: AuditAction,
    outcome: AuditOutcome,
    message: String,
) -> Result<AuditEvent, SecretError> {
    let session_id = SessionId::parse(SECRETS_KEY).map_err(|e| SecretError::Unavailable(e.to_string()))?;
    Ok(AuditEvent {
        action,
        key: SandboxKey::Session { org: org.clone(), session_id },
        sandbox_id: None,
        caller_id: caller.identity_id().clone(),
        caller_class: caller.class(),
        durability: None,
        driver: String::new(),
        outcome,
        message,
        token_id: None,
        at: deps.clock.now(),
    })
}

/// Writes `event`; a failure is logged and told (the change itself stands).
async fn audit(deps: &SecretPorts, event: &AuditEvent) -> Result<(), SecretError> {
    if let Err(e) = deps.audit.append(event).await {
        warn!(org = %event.org(), action = %event.action, error = %super::chain(&e), "cannot audit a change to a secret");
        return Err(SecretError::Unavailable(
            "the change was made but its audit event could not be written; see the server log".to_owned(),
        ));
    }
    Ok(())
}

/// Describes a binding for the audit (never the value).
pub fn describe(b: &SecretBinding) -> String {
    let hosts: Vec<String> = b.hosts.iter().map(ToString::to_string).collect();
    let mut text = format!(
        "secret {}: hosts {}, header {}, scope {}",
        b.name,
        hosts.join(" "),
        b.header.as_str(),
        b.scope
    );
    if !b.methods.is_empty() {
        text.push_str(&format!(", methods {}", b.methods.join(" ")));
    }
    if !b.paths.is_empty() {
        text.push_str(&format!(", paths {}", b.paths.join(" ")));
    }
    text
}

/// Makes or replaces the secret `name` of `org`. Returns whether it was made (`true`) or
/// replaced, and its entry (without the value).
///
/// # Errors
/// [`SecretError`]: 403 for a sandbox token, a caller of another org, a user naming another
/// scope than its own identity; 400 for a binding or value that breaks the rules, or a host
/// the org's allowlist does not allow for the scope's classes (named); 409 when the name
/// is another's; 429 when the org or the identity scope holds its most secrets; 503 when the store, the policy or the audit cannot answer.
pub async fn set_secret(
    deps: &SecretPorts,
    actor: &Actor,
    org: &OrgId,
    name: &str,
    request: SecretRequest,
) -> Result<(bool, SecretEntry), SecretError> {
    let caller = manager(actor, org)?;
    let name = SecretName::parse(name)?;
    if !manages(caller, &request.scope) {
        return Err(SecretError::Denied(format!(
            "a user caller may set only secrets scoped to its own identity ({{\"identity\":\"{}\"}})",
            caller.identity_id()
        )));
    }
    check_value(&request.value)?;
    let input = BindingInput {
        hosts: &request.hosts,
        header: request.header.as_deref(),
        format: request.format.as_deref(),
        methods: &request.methods,
        paths: &request.paths,
    };
    let binding = SecretBinding::new(name.clone(), request.scope.clone(), &input)?;
    // A secret never widens egress: each host must be reachable already, for every class
    // of caller it may be used for.
    let policy = deps.policies.of(org).await.map_err(|e| {
        warn!(%org, error = %super::chain(&e), "cannot read the org's policy");
        SecretError::Unavailable(format!("cannot read the egress allowlist of org {org} now; try again"))
    })?;
    for class in classes_of(deps, caller, &binding.scope).await? {
        let allowlist = Allowlist::from_rules(policy.policy.egress_allow(), class);
        for host in &binding.hosts {
            if let Err(denied) = host.allowed_by(&allowlist) {
                return Err(SecretError::Invalid(format!(
                    "host {denied} is not in the egress allowlist of org {org} for {} callers; a secret \
                     never opens a destination (add it with `sandlane org set --egress-allow`)",
                    class.as_str()
                )));
            }
        }
    }
    let now = deps.clock.now();
    let outcome = deps
        .secrets
        .put(org, &binding, &request.value, &guard_of(caller), LIMITS, now)
        .await
        .map_err(|e| unavailable("cannot store the secret now", &e))?;
    let created = match outcome {
        PutOutcome::Created => true,
        PutOutcome::Replaced => false,
        PutOutcome::Taken => return Err(SecretError::Taken(name.to_string())),
        PutOutcome::OrgFull => {
            return Err(SecretError::Exhausted(format!(
                "org {org} holds {MAX_SECRETS_PER_ORG} secrets, its limit"
            )));
        }
        PutOutcome::IdentityFull => {
            let SecretScope::Identity(id) = &binding.scope else {
                return Err(SecretError::Exhausted(format!("org {org}'s secrets are at their limit")));
            };
            return Err(SecretError::Exhausted(format!(
                "identity {id} holds {MAX_SECRETS_PER_IDENTITY} secrets in org {org}, its limit"
            )));
        }
    };
    let verb = if created { "created" } else { "replaced" };
    info!(%org, secret = %name, caller = %caller.identity_id(), verb, "secret set");
    let e = event(
        deps,
        caller,
        org,
        AuditAction::SecretSet,
        AuditOutcome::Stored,
        format!("{} ({verb})", describe(&binding)),
    )?;
    audit(deps, &e).await?;
    let created_at = if created {
        now
    } else {
        // A replace keeps the secret's first date (read back; unread, the answer says now).
        let listed = deps.secrets.list(org).await.unwrap_or_default();
        listed.iter().find(|e| e.binding.name == name).map_or(now, |e| e.created_at)
    };
    Ok((created, SecretEntry { binding, created_at, updated_at: now }))
}

/// The org's secrets the caller may see, by name, without values.
///
/// # Errors
/// [`SecretError::Denied`] for a sandbox token or a caller of another org;
/// [`SecretError::Unavailable`].
pub async fn list_secrets(
    deps: &SecretPorts,
    actor: &Actor,
    org: &OrgId,
) -> Result<Vec<SecretEntry>, SecretError> {
    let caller = manager(actor, org)?;
    let all = deps.secrets.list(org).await.map_err(|e| unavailable("cannot read the secrets now", &e))?;
    Ok(all.into_iter().filter(|e| manages(caller, &e.binding.scope)).collect())
}

/// Deletes the secret `name` of `org`; from the next connection on, no sandbox uses it.
///
/// # Errors
/// [`SecretError::Denied`] for a sandbox token or a caller of another org;
/// [`SecretError::NotFound`] when there is none the caller may manage;
/// [`SecretError::Unavailable`].
pub async fn delete_secret(
    deps: &SecretPorts,
    actor: &Actor,
    org: &OrgId,
    name: &str,
) -> Result<(), SecretError> {
    let caller = manager(actor, org)?;
    let not_found = || SecretError::NotFound { org: org.clone(), name: name.chars().take(80).collect() };
    let name = SecretName::parse(name).map_err(|_| not_found())?;
    let deleted = deps
        .secrets
        .delete(org, &name, &guard_of(caller))
        .await
        .map_err(|e| unavailable("cannot delete the secret now", &e))?;
    if !deleted {
        return Err(not_found());
    }
    info!(%org, secret = %name, caller = %caller.identity_id(), "secret deleted");
    let e = event(
        deps,
        caller,
        org,
        AuditAction::SecretDelete,
        AuditOutcome::Deleted,
        format!("secret {name} deleted"),
    )?;
    audit(deps, &e).await
}

#[cfg(test)]
mod tests;
