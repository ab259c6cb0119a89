//! Fixtures shared by the app's unit tests: mocks of every port with sensible defaults,
//! callers, executions and records.

use std::sync::{Arc, Mutex};

use domain::sandbox::{Lease, SandboxRecord};
use domain::{
    AgentExecution, CallerClass, CallerIdentity, Durability, DurabilityPolicy, ExecutionId, IdentityId,
    OrgId, Phase, SandboxCaller, SandboxId, SandboxKey, SandboxState, SandboxToken, SessionId, Timestamp,
    TokenId, WorkflowExecution,
};
use ports::{
    ClaimRequest, MintedCredential, MockAuditLog, MockClock, MockCredentialMinter, MockSandboxDriver,
    MockSandboxLane, MockSandboxRegistry,
};

use crate::usecase::LaneDeps;

pub const CALLER_ID: &str = "u-ada-7f3";
pub const NOW: i64 = 1_796_207_883_000;

pub struct Mocks {
    pub lane: MockSandboxLane,
    pub minter: MockCredentialMinter,
    pub driver: MockSandboxDriver,
    pub registry: MockSandboxRegistry,
    pub audit: MockAuditLog,
}

impl Mocks {
    pub fn new(lane_on: bool) -> Self {
        let mut lane = MockSandboxLane::new();
        lane.expect_enabled().returning(move |_, _| lane_on);
        let mut driver = MockSandboxDriver::new();
        driver.expect_name().return_const("bubblewrap");
        Self {
            lane,
            minter: MockCredentialMinter::new(),
            driver,
            registry: MockSandboxRegistry::new(),
            audit: MockAuditLog::new(),
        }
    }

    pub fn deps(self) -> LaneDeps {
        let mut clock = MockClock::new();
        clock.expect_now().return_const(Timestamp::from_unix_millis(NOW));
        LaneDeps {
            lane: Arc::new(self.lane),
            minter: Arc::new(self.minter),
            driver: Arc::new(self.driver),
            registry: Arc::new(self.registry),
            audit: Arc::new(self.audit),
            clock: Arc::new(clock),
            policy: DurabilityPolicy::default(),
            replica_id: "replica-a".into(),
            lease_ms: 30_000,
            wait_poll_ms: 1,
        }
    }
}

pub fn caller(class: CallerClass) -> SandboxCaller {
    CallerIdentity::from_wire(IdentityId::parse(CALLER_ID).unwrap(), class, vec![org()], None)
        .unwrap()
        .sandbox_caller()
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
        execution_id: req.execution_id.clone(),
        token_id: None,
        token_expires_at: None,
        lease: Lease { holder: req.holder.clone(), expires_at: req.now.plus_millis(req.lease_ms), epoch: 1 },
        tokens_revoked_at: None,
        message: None,
        created_at: req.now,
        updated_at: req.now,
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
