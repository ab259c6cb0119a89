//! Sandbox activity, for the idle timeout, without a database write per command.
//!
//! Each replica notes activity in memory (a command starting and ending, an ensure reusing
//! a sandbox, a file or process operation) and [`ActivityTracker::flush`] reports it to the
//! store every [`crate::background`] activity interval: one write per sandbox touched since
//! the last flush, or still running a command, whatever the number of commands. The idle
//! pass (which may run on another replica) suspends only a sandbox whose recorded activity
//! is older than its org's timeout, in the same statement that checks it.
//!
//! The gap a flush interval leaves is closed where a command starts: when the record the
//! command was authorised with shows an activity older than half the org's idle timeout,
//! the touch is written at once, before the command runs. So a sandbox is never suspended
//! under a command that started while it looked idle elsewhere; a sandbox used more often
//! than every half timeout costs no write per command.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use domain::sandbox::SandboxRecord;
use domain::{SandboxId, Timestamp};
use ports::{Clock, RegistryError, SandboxRegistry};

#[derive(Debug, Default)]
struct Entry {
    /// The sandbox's org (for metrics).
    org: Option<domain::OrgId>,
    /// Commands and operations (file transfers, output followed) running here now.
    running: u32,
    /// Of those, the commands (for metrics).
    commands: u32,
    /// The latest activity not yet reported.
    pending: Option<Timestamp>,
}

/// This replica's view of which sandboxes are active. Cheap to share (`Arc`).
#[derive(Debug, Default)]
pub struct ActivityTracker {
    entries: Mutex<HashMap<SandboxId, Entry>>,
}

/// A command or operation running in a sandbox: the sandbox counts as active until it is
/// dropped (when its end is noted as activity too).
pub struct Running {
    tracker: Arc<ActivityTracker>,
    sandbox: SandboxId,
    clock: Arc<dyn Clock>,
    command: bool,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running").field("sandbox", &self.sandbox).finish_non_exhaustive()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let now = self.clock.now();
        let mut entries = self.tracker.lock();
        let entry = entries.entry(self.sandbox.clone()).or_default();
        entry.running = entry.running.saturating_sub(1);
        if self.command {
            entry.commands = entry.commands.saturating_sub(1);
        }
        entry.pending = Some(entry.pending.map_or(now, |p| p.max(now)));
    }
}

impl ActivityTracker {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SandboxId, Entry>> {
        self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Notes activity in `sandbox` at `now` (reported by the next flush).
    pub fn touch(&self, sandbox: &SandboxId, now: Timestamp) {
        let mut entries = self.lock();
        let entry = entries.entry(sandbox.clone()).or_default();
        entry.pending = Some(entry.pending.map_or(now, |p| p.max(now)));
    }

    /// Notes a command starting in `sandbox`; it counts until the guard is dropped.
    pub fn begin(
        self: &Arc<Self>,
        sandbox: &SandboxId,
        org: &domain::OrgId,
        clock: Arc<dyn Clock>,
    ) -> Running {
        self.start(sandbox, org, clock, true)
    }

    /// Notes an operation that is not a command (a file transfer, a process's output
    /// followed) starting in `sandbox`: the sandbox is active until the guard is dropped,
    /// but it is not counted among the commands running.
    pub fn begin_operation(
        self: &Arc<Self>,
        sandbox: &SandboxId,
        org: &domain::OrgId,
        clock: Arc<dyn Clock>,
    ) -> Running {
        self.start(sandbox, org, clock, false)
    }

    fn start(
        self: &Arc<Self>,
        sandbox: &SandboxId,
        org: &domain::OrgId,
        clock: Arc<dyn Clock>,
        command: bool,
    ) -> Running {
        let now = clock.now();
        {
            let mut entries = self.lock();
            let entry = entries.entry(sandbox.clone()).or_default();
            entry.org = Some(org.clone());
            entry.running += 1;
            if command {
                entry.commands += 1;
            }
            entry.pending = Some(entry.pending.map_or(now, |p| p.max(now)));
        }
        Running { tracker: self.clone(), sandbox: sandbox.clone(), clock, command }
    }

    /// Whether a command or operation runs in `sandbox` on this replica now.
    pub fn is_busy(&self, sandbox: &SandboxId) -> bool {
        self.lock().get(sandbox).is_some_and(|e| e.running > 0)
    }

    /// How many commands run through this replica now, per org (for metrics).
    pub fn running_by_org(&self) -> std::collections::BTreeMap<domain::OrgId, u64> {
        let mut by_org = std::collections::BTreeMap::new();
        for e in self.lock().values().filter(|e| e.commands > 0) {
            if let Some(org) = &e.org {
                *by_org.entry(org.clone()).or_insert(0) += u64::from(e.commands);
            }
        }
        by_org
    }

    /// Writes the activity at once when `record`'s recorded activity is older than
    /// `half_timeout_ms` at `now` (see the module documentation); otherwise only notes it.
    ///
    /// # Errors
    /// [`RegistryError`] when the write fails (the caller refuses the command: the
    /// sandbox could be suspended under it).
    pub async fn note_before_use(
        &self,
        registry: &dyn SandboxRegistry,
        record: &SandboxRecord,
        idle_timeout_ms: Option<u64>,
        now: Timestamp,
    ) -> Result<(), RegistryError> {
        let stale = idle_timeout_ms.is_some_and(|ms| {
            let half = i64::try_from(ms / 2).unwrap_or(i64::MAX);
            record.last_active_at.plus_millis(half) <= now
        });
        if stale {
            registry.touch(&[(record.id.clone(), now)]).await?;
        }
        self.touch(&record.id, now);
        Ok(())
    }

    /// Reports what was noted since the last flush, and the sandboxes still running a
    /// command here (as active now), in one batch. What cannot be written is kept for the
    /// next flush.
    ///
    /// # Errors
    /// [`RegistryError`] from the store.
    pub async fn flush(
        &self,
        registry: &dyn SandboxRegistry,
        now: Timestamp,
    ) -> Result<usize, RegistryError> {
        let batch: Vec<(SandboxId, Timestamp)> = {
            let mut entries = self.lock();
            let batch = entries
                .iter_mut()
                .filter_map(|(id, e)| {
                    let at = if e.running > 0 { Some(now) } else { e.pending.take() };
                    e.pending = None;
                    at.map(|t| (id.clone(), t))
                })
                .collect();
            entries.retain(|_, e| e.running > 0 || e.pending.is_some());
            batch
        };
        if batch.is_empty() {
            return Ok(0);
        }
        if let Err(e) = registry.touch(&batch).await {
            for (id, t) in batch {
                self.touch(&id, t);
            }
            return Err(e);
        }
        Ok(batch.len())
    }
}

#[cfg(test)]
mod tests;
