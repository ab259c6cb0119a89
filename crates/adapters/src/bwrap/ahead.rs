//! Ephemeral sandboxes started ahead.
//!
//! A new ephemeral sandbox is the same whoever asks for it until its first command: a
//! fresh workspace (its image made and mounted), a fresh host uid, a cgroup with the
//! driver's limits, bubblewrap and the supervisor started and answering. Only its id, its
//! record (key, environment, epoch) and its token belong to the caller, and the
//! environment reaches the sandbox with each command, not at start. So the driver keeps
//! [`BwrapConfig::started_ahead`](super::BwrapConfig::started_ahead) of them started
//! under placeholder ids, and a provision of a new ephemeral sandbox takes one: it
//! renames the placeholder's state directory, workspace, image, token directory and
//! cgroup to the sandbox's id, moves the uid's claim to the new workspace name, writes
//! the token and the record, and checks the supervisor still answers. That is a few file
//! renames instead of an image copy, a loop device, a mount, bubblewrap's namespaces and
//! the supervisor's start. A start ahead is refilled in the background after each
//! ephemeral provision, with that provision's workspace quota (a start ahead of another
//! size is discarded, never handed out).
//!
//! Forks are started ahead the same way ([`BwrapConfig::forks_ahead`](super::BwrapConfig::forks_ahead)
//! of them): after an ephemeral fork, the driver starts the next fork of the same snapshot
//! (and quota) under a placeholder, its workspace already filled with the snapshot's files
//! and given to its uid, so the next ephemeral fork of that snapshot is the same few
//! renames. A snapshot never changes, so a fork started ahead is never stale; one whose
//! snapshot is deleted, or that is not the latest forked snapshot's, is discarded. Only
//! the files come ahead: the fork's token is minted for whoever asks for the fork, when
//! they ask, as for any sandbox.
//!
//! A start ahead is never visible: its state directory has no `meta.json` (so
//! [`Layout::list`](super::workspace::Layout::list) and the reconciler never see it) but
//! a marker naming its placeholder. What a start ahead ran never reaches a caller: no
//! command runs in it before it is taken, it holds no token, and it is taken once.
//! The driver's drop ends the ones it holds; a server killed before its drop leaves them
//! running, and the next driver on the same data dir ends them at construction (the
//! marker says which directories are one).
//!
//! Renaming a workspace directory the sandbox's own mount namespace has an image mounted
//! on is allowed (a mount point in another namespace does not pin its name) and the
//! mount follows the directory; the sandbox's `/workspace` is its own bind and does not
//! change. The token directory is bound by its inode and follows its rename too.

use std::path::PathBuf;
use std::time::Duration;

use domain::{Durability, SandboxId};
use ports::driver::{DriverError, ProvisionSpec, SnapshotRef};

use super::workspace::{self, IdMode, SandboxMeta};
use super::{BwrapDriver, Placement, failed, failed_by, spawn};
use crate::supervisor_link::client;
use crate::workspace_image::{Prepared, WorkspaceImage};

/// The name of the marker file in a start ahead's state directory: its placeholder id.
const MARKER: &str = "ahead";

/// The file a start ahead's state directory gains once it is started and can be taken
/// (an operator, or a benchmark, can tell one being started from one that is ready).
const READY: &str = "ahead-ready";

/// What a start ahead is made as, and what a provision must ask for to take it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Kind {
    /// The workspace quota the provision asks for.
    bytes: Option<u64>,
    /// The snapshot whose files its workspace starts with (a fork), or none (empty).
    source: Option<SnapshotRef>,
}

impl Kind {
    /// What `spec` asks for.
    pub(super) fn of(spec: &ProvisionSpec) -> Self {
        Self { bytes: spec.workspace_bytes, source: spec.from_snapshot.clone() }
    }
}

/// An ephemeral sandbox started ahead under a placeholder id.
#[derive(Debug)]
pub(super) struct Ahead {
    placeholder: SandboxId,
    host_id: u32,
    /// What it was made as.
    kind: Kind,
    /// Its workspace image, when it has a quota.
    image: Option<PathBuf>,
}

/// The starts ahead a driver holds.
#[derive(Debug, Default)]
pub(super) struct AheadPool {
    ready: Vec<Ahead>,
    /// The placeholder being started (ended by the driver's drop if it gets that far).
    starting: Option<SandboxId>,
    /// Whether a refill runs.
    filling: bool,
    /// The quota of the latest ephemeral provision of an empty workspace (none before
    /// the first): what the next one likely asks for.
    empty: Option<Option<u64>>,
    /// The latest ephemeral fork: what the next fork likely asks for.
    fork: Option<Kind>,
}

impl AheadPool {
    /// How many starts ahead of `kind` the driver keeps.
    fn wanted(&self, kind: &Kind, config: &super::BwrapConfig) -> usize {
        match &kind.source {
            None if self.empty == Some(kind.bytes) => config.started_ahead,
            Some(_) if self.fork.as_ref() == Some(kind) => config.forks_ahead,
            _ => 0,
        }
    }

    /// How many starts ahead of `kind` are ready.
    fn held(&self, kind: &Kind) -> usize {
        self.ready.iter().filter(|a| &a.kind == kind).count()
    }

    /// Whether the pool wants one more start ahead of `kind` than it holds.
    fn wants_more(&self, kind: &Kind, config: &super::BwrapConfig) -> bool {
        self.held(kind) < self.wanted(kind, config)
    }

    /// The next kind to start ahead: one the pool holds fewer of than it wants.
    fn next(&self, config: &super::BwrapConfig) -> Option<Kind> {
        let empty = self.empty.map(|bytes| Kind { bytes, source: None });
        [empty, self.fork.clone()].into_iter().flatten().find(|kind| self.wants_more(kind, config))
    }

    /// Whether the pool holds a start ahead it no longer wants ([`AheadPool::take_stale`]).
    fn has_stale(&self, config: &super::BwrapConfig) -> bool {
        self.ready.iter().any(|a| self.held(&a.kind) > self.wanted(&a.kind, config))
    }

    /// Takes out the starts ahead the pool no longer wants (of an earlier quota or
    /// snapshot, or more of one kind than it keeps).
    fn take_stale(&mut self, config: &super::BwrapConfig) -> Vec<Ahead> {
        let mut stale = Vec::new();
        for ahead in std::mem::take(&mut self.ready) {
            if self.wants_more(&ahead.kind, config) {
                self.ready.push(ahead);
            } else {
                stale.push(ahead);
            }
        }
        stale
    }

    /// Takes out the starts ahead that are ready (placeholder and host uid).
    fn take_ready(&mut self) -> Vec<(SandboxId, Option<u32>)> {
        self.ready.drain(..).map(|a| (a.placeholder, Some(a.host_id))).collect()
    }
}

/// Counts a provision that starts a sandbox itself while it runs (see
/// [`BwrapDriver::fill_ahead`]).
pub(super) struct Starting<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> Starting<'a> {
    pub(super) fn new(count: &'a std::sync::atomic::AtomicUsize) -> Self {
        count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Self(count)
    }
}

impl Drop for Starting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Resets the pool's `filling` flag however the refill ends (its task may be dropped).
struct Filling<'a>(&'a BwrapDriver);

impl Drop for Filling<'_> {
    /// (`starting` stays: a refill dropped halfway leaves its start to the driver's drop.)
    fn drop(&mut self) {
        self.0.ahead.lock().unwrap_or_else(std::sync::PoisonError::into_inner).filling = false;
    }
}

fn new_placeholder() -> SandboxId {
    let mut random = [0u8; 16];
    // A failed read of randomness leaves zeros: the time and the counter still make the
    // id unique within this process, and the create below refuses a taken one.
    let _ = getrandom::fill(&mut random);
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    SandboxId::generate(millis, u128::from_le_bytes(random) ^ u128::from(n))
}

impl BwrapDriver {
    /// Starts sandboxes ahead in the background like the ephemeral one `spec` asked for
    /// (an empty workspace of its quota, or a fork of its snapshot), until
    /// [`BwrapConfig::started_ahead`](super::BwrapConfig::started_ahead) (or
    /// [`forks_ahead`](super::BwrapConfig::forks_ahead)) are ready.
    pub(super) fn start_ahead(&self, spec: &ProvisionSpec) {
        let kind = Kind::of(spec);
        let keep = if kind.source.is_some() { self.config.forks_ahead } else { self.config.started_ahead };
        if keep == 0 || !self.cgroups.can_rename() {
            return;
        }
        {
            let mut pool = self.ahead.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            match &kind.source {
                None => pool.empty = Some(kind.bytes),
                Some(_) => pool.fork = Some(kind),
            }
        }
        self.refill_ahead();
    }

    /// Starts the pool's refill unless one runs or there is nothing to do.
    fn refill_ahead(&self) {
        let Some(me) = self.me.upgrade() else { return };
        let Ok(handle) = tokio::runtime::Handle::try_current() else { return };
        {
            let mut pool = self.ahead.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if pool.filling || !(pool.has_stale(&self.config) || pool.next(&self.config).is_some()) {
                return;
            }
            pool.filling = true;
        }
        handle.spawn(async move { me.fill_ahead().await });
    }

    /// Forgets the forks started ahead of `snapshot` (being deleted) and ends them.
    pub(super) async fn forget_forks_of(&self, snapshot: &SnapshotRef) {
        let stale = {
            let mut pool = self.ahead.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if pool.fork.as_ref().is_some_and(|k| k.source.as_ref() == Some(snapshot)) {
                pool.fork = None;
            }
            pool.take_stale(&self.config)
        };
        for old in stale {
            self.discard_ahead(&old.placeholder, Some(old.host_id)).await;
        }
    }

    /// Refills the pool. It stands aside while provisions start sandboxes themselves (a
    /// burst that emptied the pool): a start ahead then only competes with them for the
    /// cores and the prepared starts, and the pool fills again once they are done.
    async fn fill_ahead(&self) {
        let filling = Filling(self);
        loop {
            while self.cold_starts.load(std::sync::atomic::Ordering::Relaxed) > 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let (next, stale) = {
                let mut pool = self.ahead.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                let stale = pool.take_stale(&self.config);
                let next = pool.next(&self.config);
                if stale.is_empty() && next.is_none() {
                    // Cleared with the decision, under the same lock: a provision that
                    // wants more from now on starts a refill of its own. (The guard, whose
                    // drop would clear it again under that refill, is not needed any more.)
                    pool.filling = false;
                    std::mem::forget(filling);
                    return;
                }
                (next, stale)
            };
            if !stale.is_empty() {
                for old in stale {
                    self.discard_ahead(&old.placeholder, Some(old.host_id)).await;
                }
                // What is wanted may have changed meanwhile.
                continue;
            }
            let Some(kind) = next else { continue };
            let placeholder = new_placeholder();
            if let Ok(mut pool) = self.ahead.lock() {
                pool.starting = Some(placeholder.clone());
            }
            match self.make_ahead(&placeholder, kind.clone()).await {
                Ok(ahead) => {
                    // Still wanted? Its snapshot may have been deleted, another forked, or
                    // the driver stood down while it started (which wants none).
                    let unwanted = {
                        let mut pool = self.ahead.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                        pool.starting = None;
                        if pool.wants_more(&ahead.kind, &self.config) {
                            pool.ready.push(ahead);
                            None
                        } else {
                            Some(ahead)
                        }
                    };
                    if let Some(old) = unwanted {
                        self.discard_ahead(&old.placeholder, Some(old.host_id)).await;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot start a sandbox ahead");
                    self.discard_ahead(&placeholder, None).await;
                    let mut pool = self.ahead.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    pool.starting = None;
                    // A fork that cannot be started ahead (its snapshot deleted meanwhile, or
                    // unreadable) is not tried again at every provision: the next fork of a
                    // snapshot asks again.
                    if pool.fork.as_ref() == Some(&kind) {
                        pool.fork = None;
                    }
                    return;
                }
            }
        }
    }

    /// Starts a sandbox under `placeholder`: state directory with its marker, workspace
    /// and host uid, token directory, the snapshot's files for a fork, image, processes.
    async fn make_ahead(&self, placeholder: &SandboxId, kind: Kind) -> Result<Ahead, DriverError> {
        // A fork's snapshot is read first: one that is gone leaves nothing made or claimed.
        let quota = match &kind.source {
            None => kind.bytes,
            Some(snapshot) => self.fork_quota_of(kind.bytes, snapshot)?,
        };
        let dir = self.layout.sandbox_dir(placeholder);
        workspace::mkdir_all(&dir, 0o700).map_err(failed)?;
        std::fs::write(dir.join(MARKER), placeholder.as_str())
            .map_err(|e| failed_by(format!("cannot mark {}", dir.display()), e))?;
        let workspace = self.layout.ephemeral_workspace(placeholder);
        let (host_id, _) = self.claim_workspace(&workspace, &format!("ephemeral/{placeholder}"))?;
        let owner = self.drop_to_id(host_id);
        workspace::mkdir_all(&self.layout.control_dir(placeholder), 0o700).map_err(failed)?;
        self.make_run_dir(placeholder, owner)?;
        let (uid, gid) = self.owner_of(host_id);
        if let Some(snapshot) = &kind.source {
            let image = quota.map(|_| self.layout.ephemeral_image(placeholder));
            self.seed_ahead(snapshot, workspace.clone(), image, quota, (uid, gid)).await?;
        }
        let (image, attached) = match quota {
            None => (None, None),
            Some(bytes) => {
                let path = self.layout.ephemeral_image(placeholder);
                let ws = WorkspaceImage::new(path.clone(), workspace.clone(), self.layout.image_templates());
                let attached = tokio::task::spawn_blocking(move || match ws.prepare_image(bytes)? {
                    Prepared::Created | Prepared::Existing => ws.attach(),
                    Prepared::Legacy => Err("a new workspace holds files already".to_owned()),
                })
                .await
                .map_err(|e| failed_by("the workspace image task failed", e))?
                .map_err(|e| failed(format!("cannot set up the workspace quota: {e}")))?;
                (Some(path), Some(attached))
            }
        };
        let device = attached.as_ref().map(|a| spawn::Device { number: a.number(), uid, gid });
        self.start(placeholder, Placement { workspace: &workspace, host_id }, device).await?;
        // The sandbox's mount holds the device from here.
        drop(attached);
        std::fs::write(dir.join(READY), "")
            .map_err(|e| failed_by(format!("cannot mark {}", dir.display()), e))?;
        Ok(Ahead { placeholder: placeholder.clone(), host_id, kind, image })
    }

    /// Makes sandbox `spec` out of a start ahead, if one of its kind is ready: `Ok(true)`
    /// when it was, `Ok(false)` when the provision must start one (nothing of this id is
    /// left behind either way).
    pub(super) async fn adopt_ahead(&self, spec: &ProvisionSpec) -> Result<bool, DriverError> {
        if spec.durability != Durability::Ephemeral {
            return Ok(false);
        }
        let kind = Kind::of(spec);
        let taken = {
            let mut pool = self.ahead.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let at = pool.ready.iter().position(|a| a.kind == kind);
            at.map(|i| pool.ready.swap_remove(i))
        };
        let Some(ahead) = taken else { return Ok(false) };
        let id = spec.sandbox_id();
        match self.rename_ahead(&ahead, spec).await {
            Ok(()) => Ok(true),
            Err(e) => {
                tracing::warn!(sandbox = %id, error = %e, "a sandbox started ahead could not be taken; starting one");
                self.discard_ahead(&ahead.placeholder, Some(ahead.host_id)).await;
                if let Err(e) = self.remove(id).await {
                    tracing::warn!(sandbox = %id, error = %e, "could not clean up after a start ahead");
                }
                Ok(false)
            }
        }
    }

    async fn rename_ahead(&self, ahead: &Ahead, spec: &ProvisionSpec) -> Result<(), DriverError> {
        let (from, id) = (&ahead.placeholder, spec.sandbox_id());
        let rename = |a: PathBuf, b: PathBuf| {
            std::fs::rename(&a, &b)
                .map_err(|e| failed_by(format!("cannot rename {} to {}", a.display(), b.display()), e))
        };
        {
            // The uid's claim names the workspace by its sandbox's state directory: both
            // move under the allocation lock (the host's too), so no allocation or reap on
            // the host sees the claim stale.
            let _held = self.allocating()?;
            rename(self.layout.sandbox_dir(from), self.layout.sandbox_dir(id))?;
            if matches!(self.ids, IdMode::PerWorkspace(_)) {
                self.layout
                    .move_host_id(ahead.host_id, &format!("ephemeral/{from}"), &format!("ephemeral/{id}"))
                    .map_err(failed)?;
            }
        }
        let workspace = self.layout.ephemeral_workspace(id);
        rename(self.layout.ephemeral_workspace(from), workspace.clone())?;
        let image = match &ahead.image {
            Some(old) => {
                let new = self.layout.ephemeral_image(id);
                // With its quota and loop device beside it (a snapshot reads the quota).
                WorkspaceImage::new(old.clone(), workspace.clone(), self.layout.image_templates())
                    .move_to(&new)
                    .map_err(failed)?;
                Some(new)
            }
            None => None,
        };
        rename(self.layout.run_dir(from), self.layout.run_dir(id))?;
        self.cgroups
            .rename(from.as_str(), id.as_str())
            .map_err(|e| failed_by(format!("cannot rename the cgroup of {from}"), e))?;
        let owner = self.drop_to_id(ahead.host_id);
        self.layout.write_token(id, spec.credential.expose().as_bytes(), owner).map_err(failed)?;
        self.new_ca(id)?;
        let meta = SandboxMeta::of(spec, workspace, ahead.host_id, image);
        self.layout.write_meta(id, &meta).map_err(failed)?;
        let _ = std::fs::remove_file(self.layout.sandbox_dir(id).join(MARKER));
        let _ = std::fs::remove_file(self.layout.sandbox_dir(id).join(READY));
        client::ping(&self.layout.socket_path(id), super::CONNECT_TIMEOUT)
            .await
            .map_err(|e| failed_by("the supervisor started ahead does not answer", e))?;
        Ok(())
    }

    /// Ends a start ahead and removes what it holds (`host_id` when known: its claim is
    /// released at once rather than left stale).
    async fn discard_ahead(&self, placeholder: &SandboxId, host_id: Option<u32>) {
        if let Err(e) = self.remove(placeholder).await {
            tracing::warn!(sandbox = %placeholder, error = %e, "could not remove a sandbox started ahead");
        }
        if let Some(uid) = host_id {
            self.release_host_id(uid, &format!("ephemeral/{placeholder}"));
        }
    }

    /// Ends the starts ahead, and starts none until the next ephemeral provision: it waits
    /// (up to a minute: a fork's fill copies a snapshot's image) for a running refill,
    /// which then wants nothing more. A refill still running after that ends the start it
    /// makes itself, once made (no longer wanted), so nothing is removed from under it.
    pub(super) async fn end_ahead(&self) {
        {
            let mut pool = self.ahead.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            pool.empty = None;
            pool.fork = None;
        }
        let mut filling = true;
        for _ in 0..6000 {
            filling = self.ahead.lock().unwrap_or_else(std::sync::PoisonError::into_inner).filling;
            if !filling {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let held = if filling {
            self.ahead.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take_ready()
        } else {
            self.take_all_ahead()
        };
        for (placeholder, host_id) in held {
            self.discard_ahead(&placeholder, host_id).await;
        }
    }

    /// The starts ahead this driver holds and the one it is starting.
    pub(super) fn take_all_ahead(&self) -> Vec<(SandboxId, Option<u32>)> {
        let mut pool = self.ahead.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut all = pool.take_ready();
        all.extend(pool.starting.take().map(|p| (p, None)));
        all
    }

    /// State directories that are starts ahead (their marker and no record): a previous
    /// driver's, or one taken halfway (the marker names the placeholder it came from).
    pub(super) fn stale_ahead(&self) -> Vec<(SandboxId, Option<u32>)> {
        let Ok(entries) = std::fs::read_dir(self.layout.sandboxes()) else { return Vec::new() };
        let mut found = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(marker) = std::fs::read_to_string(path.join(MARKER)) else { continue };
            if path.join("meta.json").exists() {
                continue;
            }
            if let Some(id) = entry.file_name().to_str().and_then(|n| SandboxId::parse(n).ok()) {
                if let Ok(placeholder) = SandboxId::parse(marker.trim())
                    && placeholder != id
                {
                    found.push((placeholder, None));
                }
                found.push((id, None));
            }
        }
        found
    }

    /// Ends `ahead` (starts ahead, see [`Self::take_all_ahead`] and [`Self::stale_ahead`])
    /// from synchronous code (construction, drop), on a thread and runtime of its own.
    pub(super) fn discard_ahead_now(&self, ahead: Vec<(SandboxId, Option<u32>)>) {
        if ahead.is_empty() {
            return;
        }
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
                    tracing::warn!("cannot end the sandboxes started ahead: no runtime");
                    return;
                };
                rt.block_on(async {
                    for (placeholder, host_id) in &ahead {
                        let ended = tokio::time::timeout(
                            Duration::from_secs(10),
                            self.discard_ahead(placeholder, *host_id),
                        );
                        if ended.await.is_err() {
                            tracing::warn!(sandbox = %placeholder, "a sandbox started ahead did not end in time");
                        }
                    }
                });
            });
        });
    }
}

#[cfg(test)]
impl BwrapDriver {
    /// Waits (up to 20 s) until no refill runs; returns the placeholders of the starts
    /// ahead then ready.
    pub(super) async fn settled_ahead(&self) -> Vec<SandboxId> {
        for _ in 0..2000 {
            if !self.ahead.lock().unwrap_or_else(std::sync::PoisonError::into_inner).filling {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let pool = self.ahead.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        pool.ready.iter().map(|a| a.placeholder.clone()).collect()
    }

    /// Whether the driver starts forks of some snapshot ahead.
    pub(super) fn forking_ahead(&self) -> bool {
        self.ahead.lock().unwrap_or_else(std::sync::PoisonError::into_inner).fork.is_some()
    }

    /// Forgets the starts ahead without ending them, as a server killed would.
    pub(super) fn forget_ahead(&self) -> Vec<SandboxId> {
        self.take_all_ahead().into_iter().map(|(p, _)| p).collect()
    }
}
