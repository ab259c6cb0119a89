//! The quotas of concurrent commands, per org and per sandbox, counted CLUSTER-WIDE.
//!
//! Why cluster-wide: an operator running many tenants sets `max_commands` to cap what one
//! org can run at once, whatever the number of replicas behind the load balancer; a count
//! per replica would let an org run N × replicas commands, and the cap would change with
//! every scaling event.
//!
//! How, without a database write per command: each replica holds a lease of some slots of
//! each scope (`org:ORG`, `sandbox:ID`) in the store ([`ports::QuotaLeases`]), and admits a
//! command against its own slots only, in memory. It asks the store for more only when its
//! slots are all in use (the store grants what the other replicas' unexpired leases leave of
//! the limit, atomically), and the heartbeat ([`CommandGate::heartbeat`], every second)
//! renews what it uses, gives back what it no longer uses, and lets a lease of a replica
//! that died lapse after [`LEASE_TTL_MS`]. So the cluster never runs more than the limit;
//! a replica may refuse a command for up to a heartbeat while another gives back slots it
//! held for commands that just ended.
//!
//! The commands counted are those that run a program: an exec (buffered, or streamed: the
//! permit lives as long as the stream) and a background process, whose permit is held by
//! a watch of the process until it ends (`usecase::processes`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use domain::{OrgId, SandboxId};
use ports::{Clock, PolicyStoreError, QuotaLeases};
use tracing::warn;

/// How long a lease lasts unless renewed.
pub const LEASE_TTL_MS: i64 = 5_000;
/// How often the heartbeat runs (renews and gives back).
pub const HEARTBEAT: Duration = Duration::from_secs(1);
/// How long a scope's slots are kept after its last command ends, so a sandbox used in a
/// loop asks the store once, not per command.
const KEEP_IDLE: Duration = Duration::from_secs(2);

/// Which quota refused a command.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandRefusal {
    /// The org runs `limit` commands already (across every replica).
    #[error("org {org} already runs {limit} commands, its quota (max_commands)")]
    Org {
        /// The org.
        org: OrgId,
        /// Its quota.
        limit: u32,
    },
    /// The sandbox runs `limit` commands already.
    #[error("sandbox {sandbox} already runs {limit} commands, its quota (max_commands_per_sandbox)")]
    Sandbox {
        /// The sandbox.
        sandbox: SandboxId,
        /// Its quota.
        limit: u32,
    },
    /// The leases could not be read or written, so the quota could not be checked.
    #[error("cannot check the command quota now")]
    Store(#[source] PolicyStoreError),
}

#[derive(Debug)]
struct Scope {
    running: u32,
    leased: u32,
    limit: u32,
    last_used: Instant,
    growing: Arc<tokio::sync::Mutex<()>>,
}

impl Scope {
    fn new(limit: u32) -> Self {
        Self { running: 0, leased: 0, limit, last_used: Instant::now(), growing: Arc::default() }
    }
}

/// The command quotas of this replica. Share it (`Arc`).
pub struct CommandGate {
    leases: Arc<dyn QuotaLeases>,
    clock: Arc<dyn Clock>,
    holder: String,
    scopes: Mutex<HashMap<String, Scope>>,
}

impl std::fmt::Debug for CommandGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommandGate").field("holder", &self.holder).finish_non_exhaustive()
    }
}

/// A command's places in its quotas; dropping it frees them (here; the slots stay leased
/// until the heartbeat gives them back).
#[derive(Debug)]
pub struct CommandPermit {
    gate: Arc<CommandGate>,
    scopes: Vec<String>,
}

impl Drop for CommandPermit {
    fn drop(&mut self) {
        for scope in &self.scopes {
            self.gate.release(scope);
        }
    }
}

impl CommandGate {
    /// A gate over `leases`, holding them as `holder` (this replica's id).
    pub fn new(leases: Arc<dyn QuotaLeases>, clock: Arc<dyn Clock>, holder: impl Into<String>) -> Self {
        Self { leases, clock, holder: holder.into(), scopes: Mutex::new(HashMap::new()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Scope>> {
        self.scopes.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A place for one command of `sandbox` in `org`, under the org's quota and the
    /// sandbox's (`None`: unlimited, not counted).
    ///
    /// # Errors
    /// [`CommandRefusal`] naming the quota that is used up, or the store's failure.
    pub async fn admit(
        self: &Arc<Self>,
        org: &OrgId,
        sandbox: &SandboxId,
        max_commands: Option<u32>,
        max_per_sandbox: Option<u32>,
    ) -> Result<CommandPermit, CommandRefusal> {
        let mut permit = CommandPermit { gate: self.clone(), scopes: Vec::new() };
        if let Some(limit) = max_commands {
            let scope = format!("org:{org}");
            if !self.take(&scope, limit).await? {
                return Err(CommandRefusal::Org { org: org.clone(), limit });
            }
            permit.scopes.push(scope);
        }
        if let Some(limit) = max_per_sandbox {
            let scope = format!("sandbox:{sandbox}");
            if !self.take(&scope, limit).await? {
                // Dropping the permit gives back the org's place.
                return Err(CommandRefusal::Sandbox { sandbox: sandbox.clone(), limit });
            }
            permit.scopes.push(scope);
        }
        Ok(permit)
    }

    /// Takes a slot of `scope`: from this replica's lease if it has a free one, else by
    /// growing the lease (one store call, one grower per scope at a time).
    async fn take(&self, scope: &str, limit: u32) -> Result<bool, CommandRefusal> {
        let growing = {
            let mut scopes = self.lock();
            let s = scopes.entry(scope.to_owned()).or_insert_with(|| Scope::new(limit));
            s.limit = limit;
            s.last_used = Instant::now();
            if s.running < s.leased.min(limit) {
                s.running += 1;
                return Ok(true);
            }
            s.growing.clone()
        };
        let _one = growing.lock().await;
        let want = {
            let mut scopes = self.lock();
            let s = scopes.entry(scope.to_owned()).or_insert_with(|| Scope::new(limit));
            if s.running < s.leased.min(limit) {
                s.running += 1;
                return Ok(true);
            }
            s.running + 1
        };
        let granted = self
            .leases
            .lease(scope, &self.holder, want, limit, self.clock.now(), LEASE_TTL_MS)
            .await
            .map_err(CommandRefusal::Store)?;
        let mut scopes = self.lock();
        let s = scopes.entry(scope.to_owned()).or_insert_with(|| Scope::new(limit));
        s.leased = granted;
        if s.running < granted.min(limit) {
            s.running += 1;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    fn release(&self, scope: &str) {
        let mut scopes = self.lock();
        if let Some(s) = scopes.get_mut(scope) {
            s.running = s.running.saturating_sub(1);
            s.last_used = Instant::now();
        }
    }

    /// Renews the leases in use, gives back slots no longer used (to what runs now; all of
    /// them once a scope has been idle for a while), so other replicas can have them.
    /// A lease that cannot be renewed stops admitting beyond what runs.
    pub async fn heartbeat(&self) {
        let plan: Vec<(String, u32, u32)> = {
            let scopes = self.lock();
            scopes
                .iter()
                .filter(|(_, s)| s.leased > 0 || s.running > 0)
                .map(|(scope, s)| {
                    let keep = if s.running == 0 && s.last_used.elapsed() >= KEEP_IDLE {
                        0
                    } else {
                        s.running.max(s.leased.min(s.running + 1))
                    };
                    (scope.clone(), keep, s.limit)
                })
                .collect()
        };
        for (scope, keep, limit) in plan {
            let result =
                self.leases.lease(&scope, &self.holder, keep, limit, self.clock.now(), LEASE_TTL_MS).await;
            let mut scopes = self.lock();
            let Some(s) = scopes.get_mut(&scope) else { continue };
            match result {
                Ok(granted) => s.leased = granted,
                Err(e) => {
                    warn!(scope = %scope, error = %e, "cannot renew a command quota lease");
                    s.leased = s.running;
                }
            }
            if s.leased == 0 && s.running == 0 {
                scopes.remove(&scope);
            }
        }
    }
}

#[cfg(test)]
mod tests;
