//! The snapshot use cases against mocks: nothing is kept that is not recorded and
//! audited, a lost quota race leaves no files, a sandbox token restores only from its own
//! sandbox's snapshots, and a user lists only its own.

use std::sync::Arc;

use domain::{CallerClass, SandboxState};
use ports::{MockSnapshotStore, SnapshotUsage};

use super::*;
use crate::test_support::{CALLER_ID, Mocks, actor, agent_execution_key, existing_ready, key_owner, org};

fn sandbox() -> SandboxId {
    SandboxId::generate(1, 7)
}

fn snapshot_of(source: SandboxId, owner: &str) -> Snapshot {
    Snapshot {
        id: SnapshotId::generate(2, 9),
        org: org(),
        source,
        source_key: agent_execution_key(),
        owner: IdentityId::parse(owner).unwrap(),
        created_by: IdentityId::parse(owner).unwrap(),
        name: None,
        created_at: Timestamp::from_unix_millis(1),
        bytes: 10,
    }
}

/// The driver takes a snapshot of 10 bytes; the key is owned by the test caller.
fn taking(store: MockSnapshotStore) -> (Mocks, MockSnapshotStore) {
    let mut m = Mocks::new(true);
    let record = existing_ready(agent_execution_key(), &sandbox());
    m.reads_sandbox(record, Some(CALLER_ID));
    m.registry.expect_owner().returning(|_| Ok(Some(key_owner(CALLER_ID))));
    m.driver.expect_snapshot().times(1).returning(|_, _, _| Ok(10));
    (m, store)
}

fn deps_with(m: Mocks, store: MockSnapshotStore) -> LaneDeps {
    let mut deps = m.deps();
    deps.snapshots = Arc::new(store);
    deps
}

/// A store that answers `snapshot` to every read by id, and that snapshot's id.
fn serving(snapshot: Snapshot) -> (SnapshotId, MockSnapshotStore) {
    let id = snapshot.id.clone();
    let mut store = MockSnapshotStore::new();
    store.expect_get().returning(move |_, _| Ok(Some(snapshot.clone())));
    (id, store)
}

#[tokio::test]
async fn a_snapshot_the_audit_log_cannot_take_is_undone() {
    let mut store = MockSnapshotStore::new();
    store.expect_usage().returning(|_| Ok(SnapshotUsage::default()));
    store.expect_insert().times(1).returning(|_, _| Ok(()));
    store.expect_delete().times(1).returning(|_, _| Ok(true));
    let (mut m, store) = taking(store);
    m.audit.expect_append().returning(|_| Err(ports::AuditError::Store(ports::Cause::msg("down"))));
    m.driver.expect_delete_snapshot().times(1).returning(|_| Ok(()));
    let deps = deps_with(m, store);
    let got = take_snapshot(&deps, &actor(CallerClass::User), &org(), &sandbox(), None).await;
    assert!(matches!(got, Err(SnapshotError::Audit(_))), "{got:?}");
}

#[tokio::test]
async fn a_snapshot_that_loses_the_quota_race_leaves_no_files() {
    let mut store = MockSnapshotStore::new();
    store.expect_usage().returning(|_| Ok(SnapshotUsage::default()));
    store
        .expect_insert()
        .times(1)
        .returning(|_, _| Err(SnapshotStoreError::OverQuota(SnapshotUsage { count: 3, bytes: 0 })));
    let (mut m, store) = taking(store);
    m.driver.expect_delete_snapshot().times(1).returning(|_| Ok(()));
    m.audit.expect_append().never();
    let deps = deps_with(m, store);
    let got = take_snapshot(&deps, &actor(CallerClass::User), &org(), &sandbox(), None).await;
    assert!(matches!(got, Err(SnapshotError::Quota(_))), "{got:?}");
}

/// Snapshots a token takes at once all pass the count read before the copy: the store's
/// write, which counts again, refuses the one over, and its files go.
#[tokio::test]
async fn a_token_snapshot_over_its_count_at_the_write_leaves_no_files() {
    let mut store = MockSnapshotStore::new();
    store.expect_usage().returning(|_| Ok(SnapshotUsage::default()));
    store.expect_list().returning(|_, _| Ok(Vec::new()));
    store
        .expect_insert()
        .times(1)
        .withf(|_, limits| limits.max_from_source == Some(MAX_SNAPSHOTS_BY_TOKEN as u32))
        .returning(|_, _| Err(SnapshotStoreError::SourceCap));
    let (mut m, store) = taking(store);
    m.driver.expect_delete_snapshot().times(1).returning(|_| Ok(()));
    m.audit.expect_append().never();
    let deps = deps_with(m, store);
    let token = Actor::SandboxToken {
        org: org(),
        sandbox_id: sandbox(),
        subject: IdentityId::parse(CALLER_ID).unwrap(),
    };
    let got = take_snapshot(&deps, &token, &org(), &sandbox(), None).await;
    assert!(matches!(got, Err(SnapshotError::TokenCap { .. })), "{got:?}");
}

#[tokio::test]
async fn a_full_quota_refuses_before_anything_is_copied() {
    let mut m = Mocks::new(true);
    m.defaults = m
        .defaults
        .apply(&domain::PolicyPatch { max_snapshots: Some(Some(2)), ..Default::default() })
        .unwrap();
    m.reads_sandbox(existing_ready(agent_execution_key(), &sandbox()), Some(CALLER_ID));
    m.driver.expect_snapshot().never();
    let mut store = MockSnapshotStore::new();
    store.expect_usage().returning(|_| Ok(SnapshotUsage { count: 2, bytes: 0 }));
    let deps = deps_with(m, store);
    let got = take_snapshot(&deps, &actor(CallerClass::User), &org(), &sandbox(), None).await;
    assert!(
        matches!(got, Err(SnapshotError::Quota(SnapshotQuotaError::Count { held: 2, limit: 2 }))),
        "{got:?}"
    );
}

/// The driver is told what the org's byte quota leaves and the workspace's quota, and a
/// copy it refuses past them is neither recorded nor audited.
#[tokio::test]
async fn the_driver_is_given_what_the_quota_leaves_and_its_refusal_records_nothing() {
    let mut m = Mocks::new(true);
    m.defaults = m
        .defaults
        .apply(&domain::PolicyPatch {
            snapshot_bytes: Some(Some(100 << 20)),
            workspace_bytes: Some(Some(64 << 20)),
            ..Default::default()
        })
        .unwrap();
    m.reads_sandbox(existing_ready(agent_execution_key(), &sandbox()), Some(CALLER_ID));
    m.registry.expect_owner().returning(|_| Ok(Some(key_owner(CALLER_ID))));
    m.driver
        .expect_snapshot()
        .times(1)
        .withf(|_, _, budget| {
            *budget == ports::SnapshotBudget { quota_left: Some(70 << 20), workspace_bytes: Some(64 << 20) }
        })
        .returning(|_, _, _| {
            Err(DriverError::ResourceExhausted("the org's snapshot quota leaves less".into()))
        });
    m.audit.expect_append().never();
    let mut store = MockSnapshotStore::new();
    store.expect_usage().returning(|_| Ok(SnapshotUsage { count: 1, bytes: 30 << 20 }));
    store.expect_insert().never();
    let deps = deps_with(m, store);
    let got = take_snapshot(&deps, &actor(CallerClass::User), &org(), &sandbox(), None).await;
    assert!(matches!(&got, Err(SnapshotError::Driver(DriverError::ResourceExhausted(_)))), "{got:?}");
    let api = crate::http::error::ApiError::from(got.unwrap_err());
    assert_eq!(api.code.status(), axum::http::StatusCode::TOO_MANY_REQUESTS, "{api:?}");
}

#[tokio::test]
async fn a_sandbox_token_restores_only_from_its_own_sandboxes_snapshots() {
    let mut m = Mocks::new(true);
    m.reads_sandbox(existing_ready(agent_execution_key(), &sandbox()), Some(CALLER_ID));
    m.driver.expect_suspend().never();
    m.driver.expect_restore().never();
    let (id, store) = serving(snapshot_of(SandboxId::generate(1, 8), CALLER_ID));
    let deps = deps_with(m, store);
    let token = Actor::SandboxToken {
        org: org(),
        sandbox_id: sandbox(),
        subject: IdentityId::parse(CALLER_ID).unwrap(),
    };
    let got = restore_sandbox(&deps, &token, &org(), &sandbox(), &id).await;
    assert!(matches!(got, Err(SnapshotError::Access(AccessError::NoSnapshot { .. }))), "{got:?}");
}

/// A suspended sandbox is claimed before its processes are ended and its workspace
/// replaced: when a resume (an ensure's, an exec's, another replica's) claimed it first,
/// the restore touches nothing and asks to try again; no resume can start it while its
/// workspace is replaced, since the claim is the restore's until it starts it.
#[tokio::test]
async fn a_restore_of_a_suspended_sandbox_a_resume_claimed_first_touches_nothing() {
    let mut m = Mocks::new(true);
    let mut suspended = existing_ready(agent_execution_key(), &sandbox());
    suspended.state = SandboxState::Suspended;
    m.reads_sandbox(suspended.clone(), Some(CALLER_ID));
    m.registry.expect_get().returning(move |_| Ok(Some(suspended.clone())));
    m.registry.expect_resume().times(1).returning(|r| {
        Err(ports::RegistryError::InvalidState {
            sandbox_id: r.sandbox.clone(),
            state: "provisioning".into(),
            action: "resume",
        })
    });
    m.driver.expect_suspend().never();
    m.driver.expect_restore().never();
    m.driver.expect_provision().never();
    let (id, store) = serving(snapshot_of(sandbox(), CALLER_ID));
    let deps = deps_with(m, store);
    let got = restore_sandbox(&deps, &actor(CallerClass::User), &org(), &sandbox(), &id).await;
    assert!(matches!(&got, Err(SnapshotError::Conflict(m)) if m.contains("being resumed")), "{got:?}");
}

#[tokio::test]
async fn a_user_lists_its_own_snapshots_a_service_all_a_token_none() {
    let mut store = MockSnapshotStore::new();
    store
        .expect_list()
        .withf(|_, owner| owner.as_ref().map(IdentityId::as_str) == Some(CALLER_ID))
        .times(1)
        .returning(|_, _| Ok(vec![]));
    store.expect_list().withf(|_, owner| owner.is_none()).times(1).returning(|_, _| Ok(vec![]));
    let deps = deps_with(Mocks::new(true), store);
    list_snapshots(&deps, &actor(CallerClass::User), &org()).await.unwrap();
    list_snapshots(&deps, &actor(CallerClass::Service), &org()).await.unwrap();
    let token = Actor::SandboxToken {
        org: org(),
        sandbox_id: sandbox(),
        subject: IdentityId::parse(CALLER_ID).unwrap(),
    };
    assert!(matches!(
        list_snapshots(&deps, &token, &org()).await,
        Err(SnapshotError::Access(AccessError::Denied(_)))
    ));
}

#[tokio::test]
async fn another_users_snapshot_is_not_found_and_a_failed_or_gone_sandbox_is_refused() {
    let mut store = MockSnapshotStore::new();
    let theirs = snapshot_of(sandbox(), "someone-else");
    let id = theirs.id.clone();
    store.expect_get().returning(move |_, _| Ok(Some(theirs.clone())));
    let mut m = Mocks::new(true);
    let mut failed = existing_ready(agent_execution_key(), &sandbox());
    failed.state = SandboxState::Failed;
    m.reads_sandbox(failed, Some(CALLER_ID));
    m.driver.expect_snapshot().never();
    let deps = deps_with(m, store);
    let got = usable_snapshot(&deps, &actor(CallerClass::User), &org(), &id).await;
    assert!(matches!(got, Err(AccessError::NoSnapshot { .. })), "{got:?}");
    assert!(usable_snapshot(&deps, &actor(CallerClass::Service), &org(), &id).await.is_ok());
    let got = take_snapshot(&deps, &actor(CallerClass::User), &org(), &sandbox(), None).await;
    assert!(matches!(got, Err(SnapshotError::NotLive { state: SandboxState::Failed, .. })), "{got:?}");
}

#[tokio::test]
async fn a_sandbox_token_keeps_at_most_ten_snapshots_of_its_sandbox() {
    let mut m = Mocks::new(true);
    m.reads_sandbox(existing_ready(agent_execution_key(), &sandbox()), Some(CALLER_ID));
    m.driver.expect_snapshot().never();
    let mut store = MockSnapshotStore::new();
    let held: Vec<Snapshot> = (0..MAX_SNAPSHOTS_BY_TOKEN as u128)
        .map(|n| Snapshot { id: SnapshotId::generate(3, n), ..snapshot_of(sandbox(), CALLER_ID) })
        .collect();
    store.expect_list().returning(move |_, _| Ok(held.clone()));
    let deps = deps_with(m, store);
    let token = Actor::SandboxToken {
        org: org(),
        sandbox_id: sandbox(),
        subject: IdentityId::parse(CALLER_ID).unwrap(),
    };
    let got = take_snapshot(&deps, &token, &org(), &sandbox(), None).await;
    assert!(matches!(got, Err(SnapshotError::TokenCap { .. })), "{got:?}");
}

/// A restore of a ready sandbox whose claim is then refused (here the org's quota, lowered
/// below what it runs): its processes were ended when its record moved to suspended, as an
/// idle suspension's are, so nothing runs that the record says is suspended; the refusal
/// is audited as a failed restore naming the snapshot.
#[tokio::test]
async fn a_restore_whose_claim_is_refused_leaves_no_process_running_and_is_audited() {
    let mut m = Mocks::new(true);
    let ready = existing_ready(agent_execution_key(), &sandbox());
    m.reads_sandbox(ready.clone(), Some(CALLER_ID));
    m.registry.expect_suspend().times(1).returning(|_, _, _| Ok(true));
    let mut suspended = ready.clone();
    suspended.state = SandboxState::Suspended;
    m.registry.expect_get().returning(move |_| Ok(Some(suspended.clone())));
    m.registry
        .expect_resume()
        .times(1)
        .returning(|_| Err(ports::RegistryError::OverQuota { org: org(), limit: 1 }));
    m.driver.expect_suspend().times(1).returning(|_| Ok(()));
    m.driver.expect_restore().never();
    m.driver.expect_provision().never();
    let events = crate::test_support::recording_audit(&mut m.audit);
    let (id, store) = serving(snapshot_of(sandbox(), CALLER_ID));
    let deps = deps_with(m, store);
    let got = restore_sandbox(&deps, &actor(CallerClass::User), &org(), &sandbox(), &id).await;
    assert!(matches!(&got, Err(SnapshotError::Claim(_))), "{got:?}");
    let events = events.lock().unwrap();
    let failed: Vec<_> = events.iter().filter(|e| e.action == AuditAction::Restore).collect();
    assert_eq!(failed.len(), 1, "{events:?}");
    assert_eq!(failed[0].outcome, AuditOutcome::Failed);
    assert!(
        failed[0].message.contains(&id.to_string()) && failed[0].message.contains("stays suspended"),
        "{failed:?}"
    );
}

/// A restore slower than a lease (a large workspace copied) renews its claim's lease every
/// third of it while the driver works, as a provision does: otherwise the reconciler would
/// take the claim for a dead one, fail the record and remove the sandbox mid-restore.
#[tokio::test(start_paused = true)]
async fn a_restore_slower_than_its_lease_renews_the_claim() {
    let mut m = Mocks::new(true);
    let mut suspended = existing_ready(agent_execution_key(), &sandbox());
    suspended.state = SandboxState::Suspended;
    m.reads_sandbox(suspended.clone(), Some(CALLER_ID));
    let mut claimed = suspended.clone();
    claimed.state = SandboxState::Provisioning;
    claimed.lease.epoch = 5;
    let state = Arc::new(std::sync::Mutex::new(suspended.clone()));
    let read = state.clone();
    m.registry.expect_get().returning(move |_| Ok(Some(read.lock().unwrap().clone())));
    let resumed = claimed.clone();
    m.registry.expect_resume().times(1).returning(move |_| Ok(resumed.clone()));
    let renewals = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = renewals.clone();
    m.registry.expect_renew_lease().returning(move |id, epoch, _, _| {
        sink.lock().unwrap().push((id.clone(), epoch));
        Ok(())
    });
    m.driver.expect_suspend().returning(|_| Ok(()));
    m.driver.expect_restore().times(1).returning(|_, _| Ok(()));
    m.driver.expect_provision().times(1).returning(|_| Ok(()));
    m.minter.expect_mint().returning(|_| Ok(crate::test_support::minted("jti-restored")));
    crate::test_support::recording_audit(&mut m.audit);
    let ready = state.clone();
    m.registry.expect_mark_ready().times(1).returning(move |_, _, _, _| {
        let mut r = ready.lock().unwrap();
        r.state = SandboxState::Ready;
        Ok(r.clone())
    });
    let (id, store) = serving(snapshot_of(sandbox(), CALLER_ID));
    let lease_ms = Mocks::new(true).deps().lease_ms;
    let mut deps =
        m.deps_with_slow_restore(std::time::Duration::from_millis(u64::try_from(lease_ms).unwrap() * 5 / 2));
    deps.snapshots = Arc::new(store);
    let got = restore_sandbox(&deps, &actor(CallerClass::User), &org(), &sandbox(), &id).await;
    assert!(got.is_ok(), "{got:?}");
    // Every third of the lease over two and a half leases: seven renewals, at the claim's epoch.
    let renewals = renewals.lock().unwrap();
    assert_eq!(renewals.len(), 7, "{renewals:?}");
    assert!(renewals.iter().all(|r| *r == (sandbox(), 5)), "{renewals:?}");
}
