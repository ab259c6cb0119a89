//! Fixtures shared by the app's unit tests: mocks of every port with sensible defaults,
//! callers, executions and records.

use std::sync::{Arc, Mutex};

use domain::sandbox::{Lease, SandboxRecord};
use domain::{
    Actor, AgentExecution, CallerClass, CallerIdentity, Durability, DurabilityPolicy, ExecutionId,
    IdentityId, OrgId, Phase, SandboxCaller, SandboxId, SandboxKey, SandboxState, SandboxToken, SessionId,
    Timestamp, TokenId, WorkflowExecution,
};
use ports::{
    ClaimRequest, KeyOwner, MintedCredential, MockAuditLog, MockCallerDirectory, MockClock,
    MockCredentialMinter, MockPolicyStore, MockQuotaLeases, MockSandboxDriver, MockSandboxLane,
    MockSandboxRegistry,
};

use crate::usecase::{ActivityTracker, CommandGate, LaneDeps, Policies};

pub const CALLER_ID: &str = "u-ada-7f3";
pub const NOW: i64 = 1_796_207_883_000;

pub struct Mocks {
    pub lane: MockSandboxLane,
    pub minter: MockCredentialMinter,
    pub driver: MockSandboxDriver,
    pub registry: MockSandboxRegistry,
    pub audit: MockAuditLog,
    pub directory: MockCallerDirectory,
    /// The org policies' store: no org changed anything unless a test says otherwise.
    pub policies: MockPolicyStore,
    /// The command-quota leases (unused while no command quota is set).
    pub leases: MockQuotaLeases,
    /// The default policy.
    pub defaults: domain::OrgPolicy,
    /// The brokered secrets (in memory).
    pub secrets: Arc<MemorySecretStore>,
}

/// One secret in memory: binding, value, created, updated.
type MemoryRow = (domain::broker::SecretBinding, domain::SecretValue, Timestamp, Timestamp);

/// A [`ports::SecretStore`] in memory, with the guards of the real ones.
#[derive(Debug, Default)]
pub struct MemorySecretStore {
    rows: Mutex<std::collections::BTreeMap<(String, String), MemoryRow>>,
    /// When set, every call fails.
    pub failing: std::sync::atomic::AtomicBool,
}

impl MemorySecretStore {
    fn check(&self) -> Result<(), ports::SecretStoreError> {
        if self.failing.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(ports::SecretStoreError::Store("the store is down".into()));
        }
        Ok(())
    }

    fn allows(guard: &ports::SecretGuard, b: &domain::broker::SecretBinding) -> bool {
        match guard {
            ports::SecretGuard::Any => true,
            ports::SecretGuard::Identity(id) => {
                matches!(&b.scope, domain::broker::SecretScope::Identity(own) if own == id)
            }
        }
    }
}

#[async_trait::async_trait]
impl ports::SecretStore for MemorySecretStore {
    async fn put(
        &self,
        org: &OrgId,
        binding: &domain::broker::SecretBinding,
        value: &domain::SecretValue,
        guard: &ports::SecretGuard,
        limits: ports::SecretLimits,
        now: Timestamp,
    ) -> Result<ports::PutOutcome, ports::SecretStoreError> {
        self.check()?;
        let mut rows = self.rows.lock().unwrap();
        let key = (org.to_string(), binding.name.to_string());
        let in_org = rows.keys().filter(|(o, _)| o == org.as_str()).count();
        if !rows.contains_key(&key) && in_org >= limits.per_org as usize {
            return Ok(ports::PutOutcome::OrgFull);
        }
        if matches!(binding.scope, domain::broker::SecretScope::Identity(_)) {
            let held = rows
                .iter()
                .filter(|((o, n), (b, ..))| {
                    o == org.as_str() && n != binding.name.as_str() && b.scope == binding.scope
                })
                .count();
            if held >= limits.per_identity as usize {
                return Ok(ports::PutOutcome::IdentityFull);
            }
        }
        match rows.get(&key) {
            Some((old, ..)) if !Self::allows(guard, old) => Ok(ports::PutOutcome::Taken),
            Some((_, _, created, _)) => {
                let created = *created;
                rows.insert(key, (binding.clone(), value.clone(), created, now));
                Ok(ports::PutOutcome::Replaced)
            }
            None => {
                rows.insert(key, (binding.clone(), value.clone(), now, now));
                Ok(ports::PutOutcome::Created)
            }
        }
    }

    async fn list(&self, org: &OrgId) -> Result<Vec<ports::SecretEntry>, ports::SecretStoreError> {
        self.check()?;
        let rows = self.rows.lock().unwrap();
        Ok(rows
            .iter()
            .filter(|((o, _), _)| o == org.as_str())
            .map(|(_, (b, _, c, u))| ports::SecretEntry {
                binding: b.clone(),
                created_at: *c,
                updated_at: *u,
            })
            .collect())
    }

    async fn delete(
        &self,
        org: &OrgId,
        name: &domain::broker::SecretName,
        guard: &ports::SecretGuard,
    ) -> Result<bool, ports::SecretStoreError> {
        self.check()?;
        let mut rows = self.rows.lock().unwrap();
        let key = (org.to_string(), name.to_string());
        match rows.get(&key) {
            Some((b, ..)) if Self::allows(guard, b) => {
                rows.remove(&key);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn for_host(
        &self,
        org: &OrgId,
        host: &str,
        port: u16,
    ) -> Result<Vec<(domain::broker::SecretBinding, domain::SecretValue)>, ports::SecretStoreError> {
        self.check()?;
        let rows = self.rows.lock().unwrap();
        Ok(rows
            .iter()
            .filter(|((o, _), (b, ..))| o == org.as_str() && b.covers(host, port))
            .map(|(_, (b, v, ..))| (b.clone(), v.clone()))
            .collect())
    }
}

impl Mocks {
    pub fn new(lane_on: bool) -> Self {
        let mut lane = MockSandboxLane::new();
        lane.expect_enabled().returning(move |_, _| lane_on);
        let mut driver = MockSandboxDriver::new();
        driver.expect_name().return_const("bubblewrap");
        let mut policies = MockPolicyStore::new();
        policies.expect_overrides().returning(|_| Ok(None));
        Self {
            lane,
            minter: MockCredentialMinter::new(),
            driver,
            registry: MockSandboxRegistry::new(),
            audit: MockAuditLog::new(),
            directory: MockCallerDirectory::new(),
            policies,
            leases: MockQuotaLeases::new(),
            defaults: domain::OrgPolicy::builtin(),
            secrets: Arc::default(),
        }
    }

    /// The lane is on and asked exactly once (an ensure decides it once per request).
    pub fn lane_asked_once(&mut self) {
        self.lane = MockSandboxLane::new();
        self.lane.expect_enabled().times(1).returning(|_, _| true);
    }

    /// The first ensurer of a key owns it: `claim_owner` returns the claiming caller, and
    /// `owner` returns `owner` (for deprovision and the sandbox routes).
    pub fn first_ensurer_owns(&mut self, owner: Option<&str>) {
        self.registry.expect_claim_owner().returning(|_, caller, now| {
            Ok(KeyOwner { identity_id: caller.identity_id().clone(), class: caller.class(), since: now })
        });
        let owner = owner.map(key_owner);
        self.registry.expect_owner().returning(move |_| Ok(owner.clone()));
    }

    /// The sandbox routes read `record` (whatever id is asked for), its key owned by
    /// `owner` (a user).
    pub fn reads_sandbox(&mut self, record: SandboxRecord, owner: Option<&str>) {
        let owner = owner.map(key_owner);
        self.registry.expect_get_with_owner().returning(move |_| Ok(Some((record.clone(), owner.clone()))));
    }

    /// Sandbox `id` is retired once, as a deprovision or a repair retires it: its record
    /// marked deprovisioned (answering `before`, the record as it was), its tokens revoked,
    /// what the driver holds of it removed.
    pub fn retires_once(&mut self, id: &SandboxId, before: Option<SandboxRecord>) {
        self.registry
            .expect_mark_deprovisioned()
            .with(mockall::predicate::eq(id.clone()), mockall::predicate::always())
            .times(1)
            .returning(move |_, _| Ok(before.clone()));
        self.minter.expect_revoke().with(mockall::predicate::eq(id.clone())).times(1).returning(|_| Ok(()));
        self.driver
            .expect_deprovision()
            .with(mockall::predicate::eq(id.clone()))
            .times(1)
            .returning(|_| Ok(()));
    }

    pub fn deps(self) -> LaneDeps {
        let mut clock = MockClock::new();
        clock.expect_now().return_const(Timestamp::from_unix_millis(NOW));
        let clock: Arc<dyn ports::Clock> = Arc::new(clock);
        LaneDeps {
            lane: Arc::new(self.lane),
            minter: Arc::new(self.minter),
            driver: Arc::new(self.driver),
            registry: Arc::new(self.registry),
            audit: Arc::new(self.audit),
            clock: clock.clone(),
            policy: DurabilityPolicy::default(),
            replica_id: "replica-a".into(),
            lease_ms: 30_000,
            wait_poll_ms: 1,
            ensure_deadline: std::time::Duration::from_secs(30),
            directory: Arc::new(self.directory),
            policies: Arc::new(Policies::new(Arc::new(self.policies), self.defaults)),
            activity: Arc::new(ActivityTracker::default()),
            commands: Arc::new(CommandGate::new(Arc::new(self.leases), clock, "replica-a")),
            streams: crate::usecase::StreamLimits::default(),
            file_ops: Arc::default(),
            previews: Arc::default(),
            pool_demand: std::sync::Arc::default(),
            secrets: self.secrets,
            snapshots: Arc::new(ports::MockSnapshotStore::new()),
            tickets: Arc::new(ports::MockTerminalTickets::new()),
            preview_links: Arc::new(ports::MockPreviewLinkStore::new()),
        }
    }
}

/// `owner`, a user, as the owner of a key since just before [`NOW`].
pub fn key_owner(owner: &str) -> KeyOwner {
    KeyOwner {
        identity_id: IdentityId::parse(owner).unwrap(),
        class: CallerClass::User,
        since: Timestamp::from_unix_millis(NOW - 1),
    }
}

pub fn caller(class: CallerClass) -> SandboxCaller {
    CallerIdentity::from_wire(IdentityId::parse(CALLER_ID).unwrap(), class, vec![org()], None)
        .unwrap()
        .sandbox_caller()
}

/// The test caller ([`CALLER_ID`], a member of `acme`) as an actor of `class`; the server's
/// own `internal` caller for `Internal`.
pub fn actor(class: CallerClass) -> Actor {
    if class == CallerClass::Internal {
        return Actor::Caller(CallerIdentity::internal());
    }
    Actor::Caller(
        CallerIdentity::from_wire(IdentityId::parse(CALLER_ID).unwrap(), class, vec![org()], None).unwrap(),
    )
}

pub fn org() -> OrgId {
    OrgId::parse("acme").unwrap()
}

pub fn agent_execution() -> AgentExecution {
    AgentExecution {
        org: org(),
        session_id: SessionId::parse("sess-1").unwrap(),
        execution_id: ExecutionId::parse("aex-1").unwrap(),
        phase: Phase::Pending,
    }
}

pub fn agent_execution_key() -> SandboxKey {
    domain::execution::SandboxSubject::sandbox_key(&agent_execution())
}

pub fn workflow_execution() -> WorkflowExecution {
    WorkflowExecution {
        org: org(),
        execution_id: ExecutionId::parse("wfx-1").unwrap(),
        phase: Phase::Pending,
    }
}

pub fn record_for(req: &ClaimRequest, state: SandboxState) -> SandboxRecord {
    SandboxRecord {
        id: req.candidate_id.clone(),
        key: req.key.clone(),
        durability: req.durability,
        state,
        driver: req.driver.clone(),
        caller_id: req.caller.identity_id().clone(),
        caller_class: req.caller.class(),
        token_caller: req.caller.clone(),
        execution_id: req.execution_id.clone(),
        token_id: None,
        token_expires_at: None,
        lease: Lease { holder: req.holder.clone(), expires_at: req.now.plus_millis(req.lease_ms), epoch: 1 },
        tokens_revoked_at: None,
        message: None,
        created_at: req.now,
        updated_at: req.now,
        last_active_at: req.now,
    }
}

pub fn existing_ready(key: SandboxKey, id: &SandboxId) -> SandboxRecord {
    let req = ClaimRequest {
        key,
        candidate_id: id.clone(),
        durability: Durability::Durable,
        driver: "bubblewrap".into(),
        caller: caller(CallerClass::User),
        execution_id: ExecutionId::parse("aex-0").unwrap(),
        holder: "replica-b".into(),
        lease_ms: 30_000,
        now: Timestamp::from_unix_millis(NOW - 60_000),
        max_running: None,
        warm: None,
    };
    let mut r = record_for(&req, SandboxState::Ready);
    r.token_id = Some(TokenId::parse("jti-old").unwrap());
    r
}

pub fn minted(jti: &str) -> MintedCredential {
    MintedCredential {
        token: SandboxToken::new(format!("header.payload-{jti}.sig")),
        token_id: TokenId::parse(jti).unwrap(),
        issued_at: Timestamp::from_unix_millis(NOW),
        expires_at: Timestamp::from_unix_millis(NOW + 900_000),
    }
}

/// Records every audit event appended.
pub fn recording_audit(audit: &mut MockAuditLog) -> Arc<Mutex<Vec<domain::AuditEvent>>> {
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = events.clone();
    audit.expect_append().returning(move |e| {
        let mut v = sink.lock().unwrap();
        v.push(e.clone());
        Ok(v.len() as i64)
    });
    events
}

/// An upload of the given chunks, for the files use cases.
pub struct ChunkSource(pub std::collections::VecDeque<Vec<u8>>);

impl ChunkSource {
    pub fn of(chunks: &[&[u8]]) -> Box<Self> {
        Box::new(Self(chunks.iter().map(|c| c.to_vec()).collect()))
    }
}

#[async_trait::async_trait]
impl ports::ByteSource for ChunkSource {
    async fn next(&mut self) -> Result<Option<Vec<u8>>, ports::SourceError> {
        Ok(self.0.pop_front())
    }
}

/// Bytes out of a sandbox, for the files use cases.
pub struct ChunkStream(pub std::collections::VecDeque<Vec<u8>>);

#[async_trait::async_trait]
impl ports::ByteStream for ChunkStream {
    async fn next(&mut self) -> Result<Option<Vec<u8>>, ports::DriverError> {
        Ok(self.0.pop_front())
    }
}

/// A driver that waits `delay` in `provision` before handing over to the mock (a slow
/// provision), and `start_delay` in `start_process` after the mock started the process (a
/// slow answer to a start that happened), `restore_delay` in `restore` before the mock
/// (a large workspace copied), and never answers a `refresh_credential` of the sandboxes
/// in `stalled_refreshes` (a supervisor or an API server that hangs): for leases,
/// deadlines and callers that go away.
pub struct SlowDriver {
    pub inner: MockSandboxDriver,
    pub delay: std::time::Duration,
    pub start_delay: std::time::Duration,
    pub restore_delay: std::time::Duration,
    pub stalled_refreshes: Vec<SandboxId>,
}

#[async_trait::async_trait]
impl ports::SandboxDriver for SlowDriver {
    fn name(&self) -> &'static str {
        "bubblewrap"
    }
    async fn provision(&self, spec: &ports::ProvisionSpec) -> Result<(), ports::DriverError> {
        tokio::time::sleep(self.delay).await;
        self.inner.provision(spec).await
    }
    async fn refresh_credential(
        &self,
        sandbox: &SandboxId,
        credential: &SandboxToken,
        environment: &domain::DriverEnvironment,
    ) -> Result<(), ports::DriverError> {
        if self.stalled_refreshes.contains(sandbox) {
            std::future::pending::<()>().await;
        }
        self.inner.refresh_credential(sandbox, credential, environment).await
    }
    async fn exec(
        &self,
        sandbox: &SandboxId,
        request: &domain::ExecRequest,
    ) -> Result<domain::ExecOutput, ports::DriverError> {
        self.inner.exec(sandbox, request).await
    }
    async fn deprovision(&self, sandbox: &SandboxId) -> Result<(), ports::DriverError> {
        self.inner.deprovision(sandbox).await
    }
    async fn suspend(&self, sandbox: &SandboxId) -> Result<(), ports::DriverError> {
        self.inner.suspend(sandbox).await
    }
    async fn restore(
        &self,
        sandbox: &SandboxId,
        snapshot: &ports::SnapshotRef,
    ) -> Result<(), ports::DriverError> {
        tokio::time::sleep(self.restore_delay).await;
        self.inner.restore(sandbox, snapshot).await
    }
    async fn list(&self) -> Result<Vec<SandboxId>, ports::DriverError> {
        self.inner.list().await
    }
    async fn stand_down(&self) {
        self.inner.stand_down().await;
    }
    async fn health(&self) -> ports::DriverHealth {
        self.inner.health().await
    }
    async fn exec_stream(
        &self,
        sandbox: &SandboxId,
        request: &domain::ExecRequest,
    ) -> Result<Box<dyn ports::OutputStream>, ports::DriverError> {
        self.inner.exec_stream(sandbox, request).await
    }
    async fn start_process(
        &self,
        sandbox: &SandboxId,
        request: &domain::ProcessRequest,
        caps: &domain::ProcessCaps,
    ) -> Result<domain::ProcessInfo, ports::DriverError> {
        let started = self.inner.start_process(sandbox, request, caps).await;
        tokio::time::sleep(self.start_delay).await;
        started
    }
    async fn list_processes(
        &self,
        sandbox: &SandboxId,
    ) -> Result<Vec<domain::ProcessInfo>, ports::DriverError> {
        self.inner.list_processes(sandbox).await
    }
    async fn process(
        &self,
        sandbox: &SandboxId,
        pid: u32,
    ) -> Result<domain::ProcessInfo, ports::DriverError> {
        self.inner.process(sandbox, pid).await
    }
    async fn process_output(
        &self,
        sandbox: &SandboxId,
        pid: u32,
        follow: bool,
    ) -> Result<Box<dyn ports::OutputStream>, ports::DriverError> {
        self.inner.process_output(sandbox, pid, follow).await
    }
    async fn write_stdin(
        &self,
        sandbox: &SandboxId,
        pid: u32,
        bytes: &[u8],
        close: bool,
    ) -> Result<(), ports::DriverError> {
        self.inner.write_stdin(sandbox, pid, bytes, close).await
    }
    async fn signal_process(
        &self,
        sandbox: &SandboxId,
        pid: u32,
        signal: domain::Signal,
    ) -> Result<(), ports::DriverError> {
        self.inner.signal_process(sandbox, pid, signal).await
    }
    async fn process_input(
        &self,
        sandbox: &SandboxId,
        pid: u32,
    ) -> Result<Box<dyn ports::ProcessInput>, ports::DriverError> {
        self.inner.process_input(sandbox, pid).await
    }
    async fn read_path(
        &self,
        sandbox: &SandboxId,
        path: &domain::SandboxPath,
    ) -> Result<ports::ReadOutcome, ports::DriverError> {
        self.inner.read_path(sandbox, path).await
    }
    async fn write_file(
        &self,
        sandbox: &SandboxId,
        path: &domain::SandboxPath,
        contents: Box<dyn ports::ByteSource>,
    ) -> Result<u64, ports::DriverError> {
        self.inner.write_file(sandbox, path, contents).await
    }
    async fn delete_path(
        &self,
        sandbox: &SandboxId,
        path: &domain::SandboxPath,
        recursive: bool,
    ) -> Result<(), ports::DriverError> {
        self.inner.delete_path(sandbox, path, recursive).await
    }
    async fn archive_out(
        &self,
        sandbox: &SandboxId,
        path: &domain::SandboxPath,
    ) -> Result<Box<dyn ports::ByteStream>, ports::DriverError> {
        self.inner.archive_out(sandbox, path).await
    }
    async fn archive_in(
        &self,
        sandbox: &SandboxId,
        path: &domain::SandboxPath,
        archive: Box<dyn ports::ByteSource>,
    ) -> Result<ports::Unpacked, ports::DriverError> {
        self.inner.archive_in(sandbox, path, archive).await
    }
}

impl Mocks {
    /// The deps with the mock driver slowed down by `delay` in `provision`.
    pub fn deps_with_slow_driver(self, delay: std::time::Duration) -> LaneDeps {
        self.deps_with_slow(|d| d.delay = delay)
    }

    /// The deps with the mock driver's answer to `start_process` slowed down by `delay`.
    pub fn deps_with_slow_start(self, delay: std::time::Duration) -> LaneDeps {
        self.deps_with_slow(|d| d.start_delay = delay)
    }

    /// The deps with the mock driver's `restore` slowed down by `delay`.
    pub fn deps_with_slow_restore(self, delay: std::time::Duration) -> LaneDeps {
        self.deps_with_slow(|d| d.restore_delay = delay)
    }

    /// The deps with a driver that never answers a refresh of the sandboxes `stalled`.
    pub fn deps_with_stalled_refreshes(self, stalled: Vec<SandboxId>) -> LaneDeps {
        self.deps_with_slow(|d| d.stalled_refreshes = stalled)
    }

    fn deps_with_slow(self, configure: impl FnOnce(&mut SlowDriver)) -> LaneDeps {
        let Mocks { lane, minter, driver, registry, audit, directory, policies, leases, defaults, secrets } =
            self;
        let mut deps = Mocks {
            lane,
            minter,
            driver: MockSandboxDriver::new(),
            registry,
            audit,
            directory,
            policies,
            leases,
            defaults,
            secrets,
        }
        .deps();
        let zero = std::time::Duration::ZERO;
        let mut slow = SlowDriver {
            inner: driver,
            delay: zero,
            start_delay: zero,
            restore_delay: zero,
            stalled_refreshes: Vec::new(),
        };
        configure(&mut slow);
        deps.driver = Arc::new(slow);
        deps
    }
}
