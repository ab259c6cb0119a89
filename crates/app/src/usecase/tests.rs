//! Use-case tests over the ports' mocks. They assert the arguments each port receives,
//! not just how often it is called. A mock given no expectation fails the test if called.

use std::io::Write;
use std::sync::{Arc, Mutex};

use domain::execution::SandboxSubject;
use domain::sandbox::SandboxRecord;
use domain::{
    AuditAction, AuditOutcome, CallerClass, CallerIdentity, Durability, IdentityId, Phase,
    SANDBOX_PROVISIONING_FAILED_PREFIX, SandboxId, SandboxState, Timestamp, TokenId,
};
use mockall::predicate::eq;
use ports::{AuditError, Claim, ClaimOutcome, DriverError, MockSandboxRegistry};

use super::*;
use crate::test_support::*;

/// One claim that creates a provisioning record from the request, remembered in `claimed`.
fn claim_creates(registry: &mut MockSandboxRegistry, claimed: &Arc<Mutex<Option<SandboxRecord>>>) {
    let claimed = claimed.clone();
    registry.expect_claim().times(1).returning(move |req| {
        let r = record_for(req, SandboxState::Provisioning);
        *claimed.lock().unwrap() = Some(r.clone());
        Ok(Claim { record: r, outcome: ClaimOutcome::Created })
    });
}

/// `mark_ready` returns the record ready, with the grant's token.
fn mark_ready_echoes(registry: &mut MockSandboxRegistry, claimed: Arc<Mutex<Option<SandboxRecord>>>) {
    registry.expect_mark_ready().times(1).returning(move |id, epoch, grant, _| {
        assert_eq!(epoch, 1);
        let mut r = claimed.lock().unwrap().clone().expect("claimed first");
        assert_eq!(&r.id, id);
        r.state = SandboxState::Ready;
        r.token_id = Some(grant.token_id.clone());
        Ok(r)
    });
}

/// Captures the log lines this thread writes while the returned guard lives (use a
/// current-thread runtime), whatever other tests run in the same process.
pub(crate) struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    pub(crate) fn capture() -> (Self, tracing::subscriber::DefaultGuard) {
        // tracing-core caches each callsite's interest when it is first hit. While exactly
        // one dispatcher is registered, it asks only the default dispatcher of the thread
        // that hits it first: another test's thread (no subscriber) would then cache
        // "never" for the use case's callsites and this test would capture nothing (seen
        // under `cargo test`, whose tests share a process). A second registered dispatcher
        // that lives as long as the process makes every registration ask them all.
        static SECOND: std::sync::OnceLock<tracing::Dispatch> = std::sync::OnceLock::new();
        SECOND.get_or_init(|| tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default()));
        let buf = Arc::new(Mutex::new(Vec::new()));
        let writer = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || SharedWriter(writer.clone()))
            .with_ansi(false)
            .with_max_level(tracing::Level::TRACE)
            .finish();
        (Self(buf), tracing::subscriber::set_default(subscriber))
    }

    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

struct SharedWriter(Arc<Mutex<Vec<u8>>>);

impl Write for SharedWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn lane_off_touches_nothing() {
    // No expectations on minter, driver, registry or audit: any call fails the test.
    let deps = Mocks::new(false).deps();
    let s = ensure_session_sandbox_for_execution(&deps, &actor(CallerClass::User), &agent_execution()).await;
    assert_eq!(s, Ok(SessionEnsureOutcome::Disabled));
    let w = ensure_workflow_sandbox_for_execution(&deps, &actor(CallerClass::Service), &workflow_execution())
        .await;
    assert_eq!(w, Ok(WorkflowEnsureOutcome::Disabled));
    let r = recover_workflow_sandbox(&deps, &actor(CallerClass::Service), &workflow_execution()).await;
    assert_eq!(r, Ok(WorkflowEnsureOutcome::Disabled));
}

#[tokio::test]
async fn new_session_sandbox_mints_for_the_id_and_provisions_with_the_class() {
    let mut m = Mocks::new(true);
    m.lane_asked_once();
    m.first_ensurer_owns(None);
    let claimed = Arc::new(Mutex::new(None));
    let c2 = claimed.clone();
    m.registry.expect_claim().times(1).returning(move |req| {
        // The claim carries the durability the policy gives a user.
        assert_eq!(req.durability, Durability::Durable);
        assert_eq!(req.key.to_string(), "acme/session/sess-1");
        assert_eq!(req.holder, "replica-a");
        let r = record_for(req, SandboxState::Provisioning);
        *c2.lock().unwrap() = Some(r.clone());
        Ok(Claim { record: r, outcome: ClaimOutcome::Created })
    });
    let c3 = claimed.clone();
    m.minter.expect_mint().times(1).returning(move |req| {
        // The minter receives the caller's id and the sandbox facts; the type has no class.
        assert_eq!(req.subject().as_str(), CALLER_ID);
        assert_eq!(req.org().as_str(), "acme");
        assert_eq!(req.session_claim(), "sess-1");
        assert_eq!(req.execution_id().as_str(), "aex-1");
        assert_eq!(req.sandbox_id(), &c3.lock().unwrap().as_ref().unwrap().id);
        assert!(!format!("{req:?}").to_lowercase().contains("user"), "no class in {req:?}");
        Ok(minted("jti-1"))
    });
    m.driver.expect_provision().times(1).returning(|spec| {
        assert_eq!(spec.epoch, 1, "the claim's fencing epoch reaches the driver");
        // The driver receives the class, the durability and the token; never the id.
        assert_eq!(spec.environment.caller_class(), CallerClass::User);
        assert_eq!(spec.durability, Durability::Durable);
        assert_eq!(spec.credential.expose(), "header.payload-jti-1.sig");
        for (name, value) in spec.environment.vars() {
            assert!(!value.contains(CALLER_ID), "{name} leaks the caller id");
        }
        assert!(!format!("{:?}", spec.environment).contains(CALLER_ID));
        assert!(!format!("{spec:?}").contains("payload-jti-1"), "token must be redacted in Debug");
        let vars = spec.environment.vars();
        assert!(vars.contains(&("SANDLANE_CALLER_CLASS", "user".to_owned())));
        assert!(vars.contains(&("SANDLANE_SESSION_ID", "sess-1".to_owned())));
        Ok(())
    });
    let events = recording_audit(&mut m.audit);
    mark_ready_echoes(&mut m.registry, claimed.clone());
    let deps = m.deps();

    let out = ensure_session_sandbox_for_execution(&deps, &actor(CallerClass::User), &agent_execution())
        .await
        .unwrap();
    let SessionEnsureOutcome::Ready(view) = out else { panic!("expected ready, got {out:?}") };
    assert_eq!(view.state, SandboxState::Ready);
    assert_eq!(view.token_id.as_ref().map(TokenId::as_str), Some("jti-1"));
    assert_eq!(view.durability, Durability::Durable);
    let events = events.lock().unwrap();
    assert_eq!(events.len(), 1, "one audit event per ensure");
    assert_eq!(events[0].action, AuditAction::Ensure);
    assert_eq!(events[0].outcome, AuditOutcome::Provisioned);
    assert_eq!(events[0].caller_id.as_str(), CALLER_ID);
    assert_eq!(events[0].caller_class, CallerClass::User);
    assert_eq!(events[0].sandbox_id.as_ref(), Some(&view.id));
    assert_eq!(events[0].token_id.as_ref().map(TokenId::as_str), Some("jti-1"));
}

#[tokio::test]
async fn workflow_sandbox_has_an_empty_session_and_service_callers_get_ephemeral() {
    let mut m = Mocks::new(true);
    m.lane_asked_once();
    m.first_ensurer_owns(None);
    let claimed = Arc::new(Mutex::new(None));
    let c2 = claimed.clone();
    m.registry.expect_claim().times(1).returning(move |req| {
        assert_eq!(req.durability, Durability::Ephemeral);
        let r = record_for(req, SandboxState::Provisioning);
        *c2.lock().unwrap() = Some(r.clone());
        Ok(Claim { record: r, outcome: ClaimOutcome::Created })
    });
    m.minter.expect_mint().times(1).returning(|req| {
        assert_eq!(req.session_claim(), "");
        assert_eq!(req.session_id(), None);
        assert_eq!(req.execution_id().as_str(), "wfx-1");
        assert_eq!(req.subject().as_str(), CALLER_ID);
        Ok(minted("jti-w"))
    });
    m.driver.expect_provision().times(1).returning(|spec| {
        assert_eq!(spec.environment.caller_class(), CallerClass::Service);
        assert_eq!(spec.durability, Durability::Ephemeral);
        let vars = spec.environment.vars();
        assert!(vars.contains(&("SANDLANE_SESSION_ID", String::new())));
        assert!(vars.contains(&("SANDLANE_CALLER_CLASS", "service".to_owned())));
        Ok(())
    });
    let _events = recording_audit(&mut m.audit);
    mark_ready_echoes(&mut m.registry, claimed);
    let deps = m.deps();
    let out =
        ensure_workflow_sandbox_for_execution(&deps, &actor(CallerClass::Service), &workflow_execution())
            .await;
    let Ok(WorkflowEnsureOutcome::Ready(view)) = out else { panic!("expected ready, got {out:?}") };
    assert_eq!(view.kind, domain::SandboxKind::Workflow);
    assert_eq!(view.key, "wfx-1");
}

fn failing_driver(m: &mut Mocks, claimed: &Arc<Mutex<Option<SandboxRecord>>>) {
    claim_creates(&mut m.registry, claimed);
    m.minter.expect_mint().times(1).returning(|_| Ok(minted("jti-f")));
    m.driver
        .expect_provision()
        .times(1)
        .returning(|_| Err(DriverError::Unavailable("bubblewrap program `nope` not found".into())));
    let c3 = claimed.clone();
    m.registry.expect_mark_failed().times(1).returning(move |id, epoch, message, _| {
        assert_eq!(id, &c3.lock().unwrap().as_ref().unwrap().id);
        assert_eq!(epoch, 1);
        assert!(message.contains("bubblewrap program `nope` not found"));
        Ok(())
    });
    let c4 = claimed.clone();
    m.minter.expect_revoke().times(1).returning(move |id| {
        assert_eq!(id, &c4.lock().unwrap().as_ref().unwrap().id);
        Ok(())
    });
    // Never marked ready.
    m.registry.expect_mark_ready().never();
}

#[tokio::test(flavor = "current_thread")]
async fn driver_failure_gives_the_session_a_prefixed_failed_outcome_logged_and_audited() {
    let (logs, _guard) = Logs::capture();
    let mut m = Mocks::new(true);
    m.first_ensurer_owns(None);
    let claimed = Arc::new(Mutex::new(None));
    failing_driver(&mut m, &claimed);
    let events = recording_audit(&mut m.audit);
    let deps = m.deps();

    let out = ensure_session_sandbox_for_execution(&deps, &actor(CallerClass::User), &agent_execution())
        .await
        .unwrap();
    let SessionEnsureOutcome::Failed(failure) = out else { panic!("expected failed, got {out:?}") };
    let message = failure.message();
    assert!(message.starts_with(SANDBOX_PROVISIONING_FAILED_PREFIX), "{message}");
    assert!(message.contains("bubblewrap program `nope` not found"), "{message}");
    let events = events.lock().unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].outcome, AuditOutcome::Failed);
    assert_eq!(events[0].message, message);
    assert_eq!(events[0].sandbox_id, claimed.lock().unwrap().as_ref().map(|r| r.id.clone()));
    let text = logs.text();
    assert!(
        text.lines().any(|l| l.contains("ERROR") && l.contains(SANDBOX_PROVISIONING_FAILED_PREFIX)),
        "no error-level log line with the prefix in:\n{text}"
    );
    assert!(text.contains("caller_class=user"), "the span carries the class:\n{text}");
    assert!(!text.contains("payload-jti-f"), "no token in logs");
}

#[tokio::test]
async fn driver_failure_gives_the_workflow_unavailable_with_the_prefix() {
    let mut m = Mocks::new(true);
    m.first_ensurer_owns(None);
    let claimed = Arc::new(Mutex::new(None));
    failing_driver(&mut m, &claimed);
    let events = recording_audit(&mut m.audit);
    let deps = m.deps();
    let out =
        ensure_workflow_sandbox_for_execution(&deps, &actor(CallerClass::Service), &workflow_execution())
            .await;
    let Err(EnsureError::Provisioning(failure)) = out else { panic!("expected unavailable, got {out:?}") };
    let message = failure.message();
    assert!(message.starts_with(SANDBOX_PROVISIONING_FAILED_PREFIX), "{message}");
    assert_eq!(events.lock().unwrap()[0].outcome, AuditOutcome::Failed);
}

/// Mocks where the agent execution's key is claimed once and found ready as `id`
/// (its record returned), for a reuse.
fn claims_ready(id: &SandboxId) -> (Mocks, SandboxRecord) {
    let mut m = Mocks::new(true);
    m.first_ensurer_owns(None);
    let existing = existing_ready(agent_execution().sandbox_key(), id);
    let rec = existing.clone();
    m.registry
        .expect_claim()
        .times(1)
        .returning(move |_| Ok(Claim { record: rec.clone(), outcome: ClaimOutcome::Existing }));
    (m, existing)
}

#[tokio::test]
async fn a_ready_session_sandbox_is_reused_with_a_fresh_token_and_no_second_provision() {
    let existing_id = SandboxId::generate(1, 7);
    let (mut m, existing) = claims_ready(&existing_id);
    let id2 = existing_id.clone();
    m.minter.expect_mint().times(1).returning(move |req| {
        assert_eq!(req.sandbox_id(), &id2);
        assert_eq!(req.execution_id().as_str(), "aex-1", "minted for this execution");
        assert_eq!(req.subject().as_str(), CALLER_ID, "minted for this caller");
        Ok(minted("jti-2"))
    });
    m.driver.expect_provision().never();
    m.driver
        .expect_refresh_credential()
        .times(1)
        .withf(move |id, token, env| {
            id == &existing_id
                && token.expose() == "header.payload-jti-2.sig"
                && env.caller_class() == CallerClass::User
                && env.execution_id().as_str() == "aex-1"
        })
        .returning(|_, _, _| Ok(()));
    let read = existing.token_id.clone();
    m.registry.expect_record_token().times(1).returning(move |_, expected, grant, _| {
        // Over the token the ensure read at its claim.
        assert_eq!(expected, read.as_ref(), "recorded over the token read");
        assert_eq!(grant.token_id.as_str(), "jti-2");
        assert_eq!(grant.execution_id.as_str(), "aex-1");
        assert_eq!(grant.caller.identity_id().as_str(), CALLER_ID);
        Ok(())
    });
    let events = recording_audit(&mut m.audit);
    let deps = m.deps();
    let out = ensure_session_sandbox_for_execution(&deps, &actor(CallerClass::User), &agent_execution())
        .await
        .unwrap();
    let SessionEnsureOutcome::Ready(view) = out else { panic!("expected ready, got {out:?}") };
    assert_eq!(view.id, existing.id);
    assert_eq!(view.token_id.as_ref().map(TokenId::as_str), Some("jti-2"));
    assert_eq!(events.lock().unwrap()[0].outcome, AuditOutcome::Reused);
}

/// A token recorded between an ensure's claim and its record (a refresh that may have
/// delivered after the ensure did): the ensure reads the token recorded, delivers its own
/// again and records it over that one, so the sandbox ends holding the token its record
/// names.
#[tokio::test]
async fn a_reuse_that_finds_another_token_recorded_delivers_its_own_again() {
    let existing_id = SandboxId::generate(1, 8);
    let (mut m, existing) = claims_ready(&existing_id);
    m.minter.expect_mint().times(1).returning(|_| Ok(minted("jti-4")));
    m.driver.expect_provision().never();
    let delivered = Arc::new(Mutex::new(Vec::new()));
    let seen = delivered.clone();
    m.driver.expect_refresh_credential().times(2).returning(move |_, token, _| {
        seen.lock().unwrap().push(token.expose().to_owned());
        Ok(())
    });
    let mut order = mockall::Sequence::new();
    let read = existing.token_id.clone();
    m.registry
        .expect_record_token()
        .times(1)
        .in_sequence(&mut order)
        .withf(move |_, expected, _, _| expected == &read.as_ref())
        .returning(|id, _, _, _| Err(ports::RegistryError::Superseded(id.clone())));
    let mut refreshed = existing.clone();
    refreshed.token_id = Some(TokenId::parse("jti-refresh").unwrap());
    m.registry.expect_get().times(1).in_sequence(&mut order).returning(move |_| Ok(Some(refreshed.clone())));
    m.registry.expect_record_token().times(1).in_sequence(&mut order).returning(|_, expected, grant, _| {
        assert_eq!(expected.map(TokenId::as_str), Some("jti-refresh"), "over the token recorded meanwhile");
        assert_eq!(grant.token_id.as_str(), "jti-4");
        Ok(())
    });
    let _events = recording_audit(&mut m.audit);
    let deps = m.deps();
    let out = ensure_session_sandbox_for_execution(&deps, &actor(CallerClass::User), &agent_execution())
        .await
        .unwrap();
    assert!(matches!(out, SessionEnsureOutcome::Ready(ref v) if v.id == existing_id), "{out:?}");
    assert_eq!(*delivered.lock().unwrap(), ["header.payload-jti-4.sig"; 2], "its own token, twice");
}

#[tokio::test]
async fn a_waiter_reuses_the_sandbox_another_holder_finishes() {
    let mut m = Mocks::new(true);
    m.first_ensurer_owns(None);
    let id = SandboxId::generate(5, 5);
    let mut provisioning = existing_ready(agent_execution().sandbox_key(), &id);
    provisioning.state = SandboxState::Provisioning;
    provisioning.lease.expires_at = Timestamp::from_unix_millis(NOW + 10_000);
    let p = provisioning.clone();
    m.registry
        .expect_claim()
        .times(1)
        .returning(move |_| Ok(Claim { record: p.clone(), outcome: ClaimOutcome::Existing }));
    let mut ready = provisioning.clone();
    ready.state = SandboxState::Ready;
    m.registry.expect_get().with(eq(id.clone())).times(1).returning(move |_| Ok(Some(ready.clone())));
    m.minter.expect_mint().times(1).returning(|_| Ok(minted("jti-3")));
    m.driver.expect_provision().never();
    m.driver.expect_refresh_credential().times(1).returning(|_, _, _| Ok(()));
    m.registry.expect_record_token().times(1).returning(|_, _, _, _| Ok(()));
    let _events = recording_audit(&mut m.audit);
    let deps = m.deps();
    let out = ensure_session_sandbox_for_execution(&deps, &actor(CallerClass::User), &agent_execution())
        .await
        .unwrap();
    assert!(matches!(out, SessionEnsureOutcome::Ready(ref v) if v.id == id), "{out:?}");
}

#[tokio::test]
async fn an_audit_failure_stops_provisioning() {
    let mut m = Mocks::new(true);
    m.first_ensurer_owns(None);
    let claimed = Arc::new(Mutex::new(None));
    claim_creates(&mut m.registry, &claimed);
    m.minter.expect_mint().times(1).returning(|_| Ok(minted("jti-a")));
    m.driver.expect_provision().times(1).returning(|_| Ok(()));
    m.audit.expect_append().returning(|_| Err(AuditError::Store("disk full".into())));
    // The provisioned sandbox is rolled back, its claim failed, its token revoked.
    let c3 = claimed.clone();
    m.driver.expect_deprovision().times(1).returning(move |id| {
        assert_eq!(id, &c3.lock().unwrap().as_ref().unwrap().id);
        Ok(())
    });
    m.registry.expect_mark_failed().times(1).returning(|_, _, msg, _| {
        assert!(msg.contains("audit"), "{msg}");
        Ok(())
    });
    m.minter.expect_revoke().times(1).returning(|_| Ok(()));
    m.registry.expect_mark_ready().never();
    let deps = m.deps();
    let out =
        ensure_workflow_sandbox_for_execution(&deps, &actor(CallerClass::Service), &workflow_execution())
            .await;
    let Err(EnsureError::Provisioning(failure)) = out else { panic!("expected unavailable, got {out:?}") };
    let message = failure.message();
    assert!(message.starts_with(SANDBOX_PROVISIONING_FAILED_PREFIX));
    assert!(message.contains("disk full"), "{message}");
}

#[tokio::test]
async fn recovery_retires_the_old_sandbox_revokes_and_provisions_a_new_id() {
    let mut m = Mocks::new(true);
    m.first_ensurer_owns(None);
    let old_id = SandboxId::generate(1, 1);
    let old = existing_ready(workflow_execution().sandbox_key(), &old_id);
    let o2 = old.clone();
    m.registry.expect_get_live().times(1).returning(move |_| Ok(Some(o2.clone())));
    m.retires_once(&old_id, Some(old.clone()));
    let claimed = Arc::new(Mutex::new(None));
    claim_creates(&mut m.registry, &claimed);
    m.minter.expect_mint().times(1).returning(|_| Ok(minted("jti-r")));
    m.driver.expect_provision().times(1).returning(|_| Ok(()));
    mark_ready_echoes(&mut m.registry, claimed);
    let events = recording_audit(&mut m.audit);
    let deps = m.deps();
    let out = recover_workflow_sandbox(&deps, &actor(CallerClass::Service), &workflow_execution()).await;
    let Ok(WorkflowEnsureOutcome::Ready(view)) = out else { panic!("expected ready, got {out:?}") };
    assert_ne!(view.id, old_id, "a fresh sandbox id");
    let events = events.lock().unwrap();
    let outcomes: Vec<_> = events.iter().map(|e| (e.action, e.outcome)).collect();
    assert_eq!(
        outcomes,
        vec![
            (AuditAction::Recover, AuditOutcome::Deprovisioned),
            (AuditAction::Recover, AuditOutcome::Provisioned)
        ]
    );
}

#[tokio::test]
async fn failed_phase_deprovisions_and_repeating_is_idempotent() {
    let mut m = Mocks::new(true);
    m.first_ensurer_owns(None);
    let id = SandboxId::generate(9, 9);
    let rec = existing_ready(agent_execution().sandbox_key(), &id);
    let mut calls = 0;
    m.registry.expect_get_live().times(2).returning(move |_| {
        calls += 1;
        Ok(if calls == 1 { Some(rec.clone()) } else { None })
    });
    m.registry.expect_mark_deprovisioned().times(1).returning(|_, _| Ok(None));
    m.minter.expect_revoke().with(eq(id.clone())).times(1).returning(|_| Ok(()));
    m.driver.expect_deprovision().with(eq(id.clone())).times(1).returning(|_| Ok(()));
    let events = recording_audit(&mut m.audit);
    let deps = m.deps();
    let exec = agent_execution();
    let c = actor(CallerClass::Internal);
    let effect = apply_phase_move(&deps, &exec, Phase::InProgress, Phase::Failed, &c).await;
    assert_eq!(effect, Ok(domain::lifecycle::SandboxEffect::Deprovision));
    let again = deprovision_sandbox(&deps, &c, &exec.sandbox_key()).await;
    assert_eq!(again, Ok(DeprovisionOutcome::Absent));
    let events = events.lock().unwrap();
    assert_eq!(events[0].outcome, AuditOutcome::Deprovisioned);
    assert_eq!(events[0].caller_class, CallerClass::Internal);
    assert_eq!(events[1].outcome, AuditOutcome::Absent);
}

#[tokio::test]
async fn impossible_phase_moves_touch_nothing() {
    let deps = Mocks::new(true).deps();
    let c = actor(CallerClass::User);
    let err = apply_phase_move(&deps, &workflow_execution(), Phase::Completed, Phase::InProgress, &c).await;
    assert!(matches!(err, Err(PhaseMoveError::Impossible(_))), "{err:?}");
    let ok = apply_phase_move(&deps, &workflow_execution(), Phase::Pending, Phase::InProgress, &c).await;
    assert_eq!(ok, Ok(domain::lifecycle::SandboxEffect::None));
}

/// What the ports saw of the caller during one ensure that the driver fails: the claim's
/// caller, the mint's subject, the driver's class, and every argument as `Debug`.
#[derive(Default)]
struct SeenCaller {
    claim: Option<domain::SandboxCaller>,
    mint_subject: Option<IdentityId>,
    driver_class: Option<CallerClass>,
    debug: String,
}

fn failing_driver_seeing(m: &mut Mocks) -> Arc<Mutex<SeenCaller>> {
    let seen = Arc::new(Mutex::new(SeenCaller::default()));
    let s = seen.clone();
    m.registry.expect_claim().times(1).returning(move |req| {
        let mut s = s.lock().unwrap();
        s.claim = Some(req.caller.clone());
        s.debug.push_str(&format!("{req:?}\n"));
        Ok(Claim { record: record_for(req, SandboxState::Provisioning), outcome: ClaimOutcome::Created })
    });
    let s = seen.clone();
    m.minter.expect_mint().times(1).returning(move |req| {
        let mut s = s.lock().unwrap();
        s.mint_subject = Some(req.subject().clone());
        s.debug.push_str(&format!("{req:?}\n"));
        Ok(minted("jti-c"))
    });
    let s = seen.clone();
    m.driver.expect_provision().times(1).returning(move |spec| {
        let mut s = s.lock().unwrap();
        s.driver_class = Some(spec.environment.caller_class());
        s.debug.push_str(&format!("{spec:?} {:?}\n", spec.environment.vars()));
        Err(DriverError::Unavailable("bubblewrap program `nope` not found".into()))
    });
    m.registry.expect_mark_failed().times(1).returning(|_, _, _, _| Ok(()));
    m.minter.expect_revoke().times(1).returning(|_| Ok(()));
    m.registry.expect_mark_ready().never();
    seen
}

#[tokio::test]
async fn chain_steps_hand_the_body_only_the_cut_caller() {
    use crate::chain::{
        CreateContext, CreateStep, EnsureSessionSandboxStep, EnsureWorkflowSandboxStep, StepError,
    };

    // An identity with more than the cut: a display name and a second org. The body must
    // receive exactly (id, class), written here without `sandbox_caller()`.
    let identity = |class| {
        CallerIdentity::from_wire(
            IdentityId::parse("u-grace-9").unwrap(),
            class,
            vec![org(), domain::OrgId::parse("globex").unwrap()],
            Some("Grace Hopper".into()),
        )
        .unwrap()
    };
    let check = |seen: &SeenCaller, events: &[domain::AuditEvent], class: CallerClass| {
        let cut = domain::SandboxCaller::from_record(IdentityId::parse("u-grace-9").unwrap(), class);
        assert_eq!(seen.claim.as_ref(), Some(&cut), "the claim carries the cut caller");
        assert_eq!(
            seen.mint_subject.as_ref().map(IdentityId::as_str),
            Some("u-grace-9"),
            "minted for the id"
        );
        assert_eq!(seen.driver_class, Some(class), "the driver gets the class");
        assert_eq!(events.len(), 1);
        assert_eq!((events[0].caller_id.as_str(), events[0].caller_class), ("u-grace-9", class));
        for rest in ["Grace Hopper", "globex"] {
            assert!(!seen.debug.contains(rest), "{rest} reached a port:\n{}", seen.debug);
            assert!(!format!("{events:?}").contains(rest), "{rest} reached the audit: {events:?}");
        }
    };

    // Session step: a failure becomes a warning; the launch goes on.
    let mut m = Mocks::new(true);
    m.first_ensurer_owns(None);
    let seen = failing_driver_seeing(&mut m);
    let events = recording_audit(&mut m.audit);
    let deps = Arc::new(m.deps());
    let mut ctx = CreateContext::new(agent_execution(), identity(CallerClass::User));
    EnsureSessionSandboxStep::new(deps).run(&mut ctx).await.unwrap();
    assert_eq!(ctx.warnings.len(), 1);
    assert!(ctx.warnings[0].starts_with(SANDBOX_PROVISIONING_FAILED_PREFIX));
    check(&seen.lock().unwrap(), &events.lock().unwrap(), CallerClass::User);

    // Workflow step: the same failure stops the chain.
    let mut m = Mocks::new(true);
    m.first_ensurer_owns(None);
    let seen = failing_driver_seeing(&mut m);
    let events = recording_audit(&mut m.audit);
    let deps = Arc::new(m.deps());
    let mut ctx = CreateContext::new(workflow_execution(), identity(CallerClass::Service));
    let err = EnsureWorkflowSandboxStep::new(deps).run(&mut ctx).await.unwrap_err();
    let StepError::Unavailable(message) = err else { panic!("expected unavailable, got {err:?}") };
    assert!(message.starts_with(SANDBOX_PROVISIONING_FAILED_PREFIX));
    check(&seen.lock().unwrap(), &events.lock().unwrap(), CallerClass::Service);
}

// ---------------------------------------------------------------------------------------
// detached work, deadlines, leases, repair

type Claimed = Arc<Mutex<Option<SandboxRecord>>>;
type Events = Arc<Mutex<Vec<domain::AuditEvent>>>;

/// Mocks for a new session sandbox whose provision succeeds: the claimed record and the
/// audit events.
fn provisions_ok(m: &mut Mocks) -> (Claimed, Events) {
    m.first_ensurer_owns(None);
    let claimed = Arc::new(Mutex::new(None));
    claim_creates(&mut m.registry, &claimed);
    m.minter.expect_mint().times(1).returning(|_| Ok(minted("jti-slow")));
    m.driver.expect_provision().times(1).returning(|_| Ok(()));
    mark_ready_echoes(&mut m.registry, claimed.clone());
    let events = recording_audit(&mut m.audit);
    (claimed, events)
}

async fn eventually(what: &str, check: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !check() {
        assert!(std::time::Instant::now() < deadline, "{what} did not happen within 10 s");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn an_ensure_whose_caller_goes_away_still_provisions_and_audits() {
    let mut m = Mocks::new(true);
    let (claimed, events) = provisions_ok(&mut m);
    m.registry.expect_renew_lease().returning(|_, _, _, _| Ok(()));
    let deps = m.deps_with_slow_driver(std::time::Duration::from_millis(300));
    let request = tokio::spawn({
        let deps = deps.clone();
        async move {
            ensure_session_sandbox_for_execution(&deps, &actor(CallerClass::User), &agent_execution()).await
        }
    });
    // The caller goes away while the driver provisions.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(claimed.lock().unwrap().is_some(), "the claim was made before the caller left");
    request.abort();
    assert!(request.await.unwrap_err().is_cancelled());
    eventually("the provisioned event", || {
        events.lock().unwrap().iter().any(|e| e.outcome == AuditOutcome::Provisioned)
    })
    .await;
    // mark_ready has a times(1) expectation: checked when the mocks drop; wait for it.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
}

#[tokio::test]
async fn past_its_deadline_a_session_ensure_answers_failed_and_provisioning_goes_on() {
    let mut m = Mocks::new(true);
    let (_claimed, events) = provisions_ok(&mut m);
    m.registry.expect_renew_lease().returning(|_, _, _, _| Ok(()));
    let mut deps = m.deps_with_slow_driver(std::time::Duration::from_millis(400));
    deps.ensure_deadline = std::time::Duration::from_millis(100);
    let out = ensure_session_sandbox_for_execution(&deps, &actor(CallerClass::User), &agent_execution())
        .await
        .unwrap();
    let SessionEnsureOutcome::Failed(failure) = out else { panic!("expected failed, got {out:?}") };
    let message = failure.message();
    assert!(message.starts_with(SANDBOX_PROVISIONING_FAILED_PREFIX), "{message}");
    assert!(message.contains("not ready after 100 ms"), "{message}");
    eventually("the provisioned event", || {
        events.lock().unwrap().iter().any(|e| e.outcome == AuditOutcome::Provisioned)
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
}

#[tokio::test]
async fn past_its_deadline_a_workflow_ensure_is_unavailable_with_the_prefix() {
    let mut m = Mocks::new(true);
    let (_claimed, events) = provisions_ok(&mut m);
    m.registry.expect_renew_lease().returning(|_, _, _, _| Ok(()));
    let mut deps = m.deps_with_slow_driver(std::time::Duration::from_millis(400));
    deps.ensure_deadline = std::time::Duration::from_millis(100);
    let out =
        ensure_workflow_sandbox_for_execution(&deps, &actor(CallerClass::Service), &workflow_execution())
            .await;
    let Err(EnsureError::Provisioning(failure)) = out else { panic!("expected unavailable, got {out:?}") };
    let message = failure.message();
    assert!(message.starts_with(SANDBOX_PROVISIONING_FAILED_PREFIX), "{message}");
    eventually("the provisioned event", || {
        events.lock().unwrap().iter().any(|e| e.outcome == AuditOutcome::Provisioned)
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
}

#[tokio::test]
async fn a_provision_slower_than_its_lease_renews_it_under_its_epoch() {
    let mut m = Mocks::new(true);
    let (claimed, _events) = provisions_ok(&mut m);
    let renewals = Arc::new(Mutex::new(Vec::new()));
    let r2 = renewals.clone();
    m.registry.expect_renew_lease().returning(move |id, epoch, until, now| {
        r2.lock().unwrap().push((id.clone(), epoch, until.unix_millis() - now.unix_millis()));
        Ok(())
    });
    let mut deps = m.deps_with_slow_driver(std::time::Duration::from_millis(250));
    deps.lease_ms = 60; // renewed every 20 ms
    let out = ensure_session_sandbox_for_execution(&deps, &actor(CallerClass::User), &agent_execution())
        .await
        .unwrap();
    assert!(matches!(out, SessionEnsureOutcome::Ready(_)), "{out:?}");
    let renewals = renewals.lock().unwrap();
    assert!(renewals.len() >= 5, "renewed {} times in 250 ms", renewals.len());
    let id = claimed.lock().unwrap().as_ref().unwrap().id.clone();
    assert!(renewals.iter().all(|(i, epoch, ahead)| *i == id && *epoch == 1 && *ahead == 60), "{renewals:?}");
}

#[tokio::test]
async fn a_ready_sandbox_gone_from_the_driver_is_repaired_and_provisioned_again() {
    let mut m = Mocks::new(true);
    m.first_ensurer_owns(None);
    let gone_id = SandboxId::generate(1, 41);
    let gone = existing_ready(agent_execution().sandbox_key(), &gone_id);
    let claims = Arc::new(Mutex::new(0));
    let claimed = Arc::new(Mutex::new(None));
    let (c, cl) = (claims.clone(), claimed.clone());
    m.registry.expect_claim().times(2).returning(move |req| {
        let mut n = c.lock().unwrap();
        *n += 1;
        if *n == 1 {
            return Ok(Claim { record: gone.clone(), outcome: ClaimOutcome::Existing });
        }
        let r = record_for(req, SandboxState::Provisioning);
        *cl.lock().unwrap() = Some(r.clone());
        Ok(Claim { record: r, outcome: ClaimOutcome::Created })
    });
    m.minter.expect_mint().times(2).returning(|_| Ok(minted("jti-n")));
    let g = gone_id.clone();
    m.driver
        .expect_refresh_credential()
        .times(1)
        .returning(move |_, _, _| Err(DriverError::NotFound(g.clone())));
    let still = existing_ready(agent_execution().sandbox_key(), &gone_id);
    m.registry.expect_get().with(eq(gone_id.clone())).times(1).returning(move |_| Ok(Some(still.clone())));
    m.retires_once(&gone_id, None);
    m.driver.expect_provision().times(1).returning(|_| Ok(()));
    mark_ready_echoes(&mut m.registry, claimed);
    let events = recording_audit(&mut m.audit);
    let deps = m.deps();
    let out = ensure_session_sandbox_for_execution(&deps, &actor(CallerClass::User), &agent_execution())
        .await
        .unwrap();
    let SessionEnsureOutcome::Ready(view) = out else { panic!("expected ready, got {out:?}") };
    assert_ne!(view.id, gone_id, "provisioned again under a fresh id");
    let outcomes: Vec<_> = events.lock().unwrap().iter().map(|e| e.outcome).collect();
    assert_eq!(outcomes, vec![AuditOutcome::Reused, AuditOutcome::Repaired, AuditOutcome::Provisioned]);
    assert_eq!(events.lock().unwrap()[1].sandbox_id.as_ref(), Some(&gone_id));
}

/// The ready sandbox is deprovisioned while an ensure reuses it (the deprovision wins):
/// no repair is audited, and the ensure claims the key again and provisions afresh.
#[tokio::test]
async fn a_reuse_racing_a_deprovision_claims_the_key_again() {
    for driver_saw_it in [true, false] {
        let mut m = Mocks::new(true);
        m.first_ensurer_owns(None);
        let old_id = SandboxId::generate(1, 43);
        let old = existing_ready(agent_execution().sandbox_key(), &old_id);
        let rounds = Arc::new(Mutex::new(0));
        let claimed = Arc::new(Mutex::new(None));
        let (r, cl, o) = (rounds.clone(), claimed.clone(), old.clone());
        m.registry.expect_claim().times(2).returning(move |req| {
            let mut n = r.lock().unwrap();
            *n += 1;
            if *n == 1 {
                return Ok(Claim { record: o.clone(), outcome: ClaimOutcome::Existing });
            }
            let rec = record_for(req, SandboxState::Provisioning);
            *cl.lock().unwrap() = Some(rec.clone());
            Ok(Claim { record: rec, outcome: ClaimOutcome::Created })
        });
        m.minter.expect_mint().times(2).returning(|_| Ok(minted("jti-race")));
        let mut retired = old.clone();
        retired.state = SandboxState::Deprovisioned;
        if driver_saw_it {
            // The driver already removed it; the registry says it is retired.
            let g = old_id.clone();
            m.driver
                .expect_refresh_credential()
                .times(1)
                .returning(move |_, _, _| Err(DriverError::NotFound(g.clone())));
            m.registry.expect_get().times(1).returning(move |_| Ok(Some(retired.clone())));
        } else {
            // The driver delivered the token; the record moved on before it was recorded.
            m.driver.expect_refresh_credential().times(1).returning(|_, _, _| Ok(()));
            let id = old_id.clone();
            m.registry.expect_record_token().times(1).returning(move |_, _, _, _| {
                Err(ports::RegistryError::InvalidState {
                    sandbox_id: id.clone(),
                    state: "deprovisioned".into(),
                    action: "record a token",
                })
            });
        }
        m.registry.expect_mark_deprovisioned().never();
        m.driver.expect_provision().times(1).returning(|_| Ok(()));
        mark_ready_echoes(&mut m.registry, claimed);
        let events = recording_audit(&mut m.audit);
        let deps = m.deps();
        let out = ensure_session_sandbox_for_execution(&deps, &actor(CallerClass::User), &agent_execution())
            .await
            .unwrap();
        let SessionEnsureOutcome::Ready(view) = out else { panic!("expected ready, got {out:?}") };
        assert_ne!(view.id, old_id);
        let outcomes: Vec<_> = events.lock().unwrap().iter().map(|e| e.outcome).collect();
        assert_eq!(
            outcomes,
            vec![AuditOutcome::Reused, AuditOutcome::Provisioned],
            "driver saw it: {driver_saw_it}"
        );
    }
}

/// `acme`'s policy with a pool of two warm sandboxes.
fn with_warm_pool(m: &mut Mocks) {
    m.defaults = domain::OrgPolicy::builtin()
        .apply(&domain::PolicyPatch { warm_pool: Some(2), ..Default::default() })
        .unwrap();
}

/// An ensure by the key's owner in an org with a warm pool decides ownership and adopts
/// in one registry step: no separate owner claim, no second claim. The warm sandbox is
/// bound to this execution and caller, and marked ready with its `adopted` event.
#[tokio::test]
async fn an_owners_ensure_adopts_in_one_registry_step() {
    let mut m = Mocks::new(true);
    with_warm_pool(&mut m);
    m.registry.expect_claim_owner().never();
    m.registry.expect_claim().never();
    let claimed = Arc::new(Mutex::new(None));
    let c2 = claimed.clone();
    m.registry.expect_adopt_as_owner().times(1).returning(move |req| {
        assert_eq!(req.caller.identity_id().as_str(), CALLER_ID);
        assert_eq!(
            (req.durability, req.key.to_string().as_str()),
            (Durability::Ephemeral, "acme/workflow/wfx-1")
        );
        assert!(req.warm.is_some(), "a pool to adopt from");
        let r = record_for(req, SandboxState::Provisioning);
        *c2.lock().unwrap() = Some(r.clone());
        Ok(Some(r))
    });
    m.minter.expect_mint().times(1).returning(|req| {
        assert_eq!((req.subject().as_str(), req.execution_id().as_str()), (CALLER_ID, "wfx-1"));
        Ok(minted("jti-a"))
    });
    let c3 = claimed.clone();
    m.driver.expect_refresh_credential().times(1).returning(move |id, token, environment| {
        assert_eq!(Some(id), c3.lock().unwrap().as_ref().map(|r| &r.id));
        assert_eq!(token.expose(), "header.payload-jti-a.sig");
        assert_eq!(environment.caller_class(), CallerClass::Service);
        Ok(())
    });
    m.registry.expect_mark_ready_audited().times(1).returning(move |id, epoch, grant, event, _| {
        assert_eq!((event.action, event.outcome), (AuditAction::Ensure, AuditOutcome::Adopted));
        assert_eq!(event.caller_id.as_str(), CALLER_ID);
        let mut r = claimed.lock().unwrap().clone().expect("adopted first");
        assert_eq!((&r.id, epoch), (id, r.lease.epoch));
        r.state = SandboxState::Ready;
        r.token_id = Some(grant.token_id.clone());
        Ok(r)
    });
    let deps = m.deps();
    let out =
        ensure_workflow_sandbox_for_execution(&deps, &actor(CallerClass::Service), &workflow_execution())
            .await;
    let Ok(WorkflowEnsureOutcome::Ready(view)) = out else { panic!("expected ready, got {out:?}") };
    assert_eq!(
        (view.state, view.token_id.as_ref().map(TokenId::as_str)),
        (SandboxState::Ready, Some("jti-a"))
    );
}

/// When the owner's step adopts nothing because another user owns the key, the usual check
/// decides: the second user is refused, the refusal audited, and nothing is claimed.
#[tokio::test]
async fn a_non_owner_whose_adoption_finds_another_owner_is_refused_and_audited() {
    let mut m = Mocks::new(true);
    with_warm_pool(&mut m);
    m.registry.expect_adopt_as_owner().times(1).returning(|req| {
        assert_eq!(req.caller.identity_id().as_str(), CALLER_ID);
        Ok(None)
    });
    m.registry.expect_claim_owner().times(1).returning(|_, _, _| Ok(key_owner("u-bob")));
    m.registry.expect_claim().never();
    let events = recording_audit(&mut m.audit);
    let mut deps = m.deps();
    // Users' workspaces ephemeral here, so a user's ensure may adopt from the pool.
    deps.policy = domain::DurabilityPolicy { user: Durability::Ephemeral, ..Default::default() };
    let out =
        ensure_workflow_sandbox_for_execution(&deps, &actor(CallerClass::User), &workflow_execution()).await;
    assert!(
        matches!(out, Err(EnsureError::Access(AccessError::Denied(domain::Denial::NotOwner { .. })))),
        "{out:?}"
    );
    let events = events.lock().unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!((events[0].action, events[0].outcome), (AuditAction::Ensure, AuditOutcome::Denied));
}

/// A user's ensure under the default policy (a durable workspace, never from the pool)
/// costs no adoption step in an org with a pool.
#[tokio::test]
async fn a_durable_ensure_tries_no_adoption() {
    let mut m = Mocks::new(true);
    with_warm_pool(&mut m);
    m.registry.expect_adopt_as_owner().never();
    m.registry.expect_claim_owner().times(1).returning(|_, _, _| Ok(key_owner("u-bob")));
    let events = recording_audit(&mut m.audit);
    let deps = m.deps();
    let out =
        ensure_workflow_sandbox_for_execution(&deps, &actor(CallerClass::User), &workflow_execution()).await;
    assert!(matches!(out, Err(EnsureError::Access(AccessError::Denied(_)))), "{out:?}");
    assert_eq!(events.lock().unwrap().len(), 1);
}
