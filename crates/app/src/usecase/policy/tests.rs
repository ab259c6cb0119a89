use std::sync::Arc;
use std::time::Duration;

use domain::{CallerClass, PolicyPatch, SandboxKind};
use ports::{MockPolicyStore, PolicyOverrides, PolicyStoreError, SandboxLane};

use super::*;
use crate::test_support::{NOW, actor, org};

fn overrides(patch: PolicyPatch, version: i64) -> PolicyOverrides {
    PolicyOverrides { patch, version, updated_at: Timestamp::from_unix_millis(NOW) }
}

fn workflow_off() -> PolicyPatch {
    PolicyPatch { lane_workflow: Some(false), ..Default::default() }
}

#[tokio::test]
async fn a_fresh_entry_costs_no_read_and_a_stale_one_is_read_again() {
    let mut store = MockPolicyStore::new();
    store.expect_overrides().times(1).returning(|_| Ok(Some(overrides(workflow_off(), 3))));
    let policies = Policies::new(Arc::new(store), OrgPolicy::builtin());
    for _ in 0..5 {
        let p = policies.of(&org()).await.unwrap();
        assert_eq!((p.version, p.policy.lane(SandboxKind::Workflow)), (3, false));
        assert_eq!(p.overridden, [PolicyField::LaneWorkflow]);
    }
    // With no time to live, every read goes to the store.
    let mut store = MockPolicyStore::new();
    store.expect_overrides().times(3).returning(|_| Ok(None));
    let policies = Policies::with_ttl(Arc::new(store), OrgPolicy::builtin(), Duration::ZERO);
    for _ in 0..3 {
        assert_eq!(policies.of(&org()).await.unwrap().version, 0);
    }
}

#[tokio::test]
async fn a_store_that_fails_keeps_the_last_answer_and_without_one_the_lane_is_off() {
    let calls = std::sync::atomic::AtomicUsize::new(0);
    let mut store = MockPolicyStore::new();
    store.expect_overrides().returning(move |_| {
        if calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
            Ok(Some(overrides(workflow_off(), 1)))
        } else {
            Err(PolicyStoreError::Store("connection refused".into()))
        }
    });
    let policies = Arc::new(Policies::with_ttl(Arc::new(store), OrgPolicy::builtin(), Duration::ZERO));
    assert_eq!(policies.of(&org()).await.unwrap().version, 1);
    assert_eq!(policies.of(&org()).await.unwrap().version, 1, "the last answer, not the defaults");
    let other = domain::OrgId::parse("beta").unwrap();
    assert!(matches!(policies.of(&other).await, Err(PolicyReadError::Store { .. })));
    let lane = PolicyLane { enabled: true, policies: policies.clone() };
    assert!(!lane.enabled(&other, SandboxKind::Session).await, "undecided is off");
    assert!(lane.enabled(&org(), SandboxKind::Session).await);
    assert!(!lane.enabled(&org(), SandboxKind::Workflow).await, "the org's lane");
    let off = PolicyLane { enabled: false, policies };
    assert!(!off.enabled(&org(), SandboxKind::Session).await, "the server's switch wins");
}

#[tokio::test]
async fn the_policy_is_read_by_the_orgs_service_callers_only() {
    let mut store = MockPolicyStore::new();
    store.expect_overrides().returning(|_| Ok(None));
    let policies = Policies::new(Arc::new(store), OrgPolicy::builtin());
    assert!(get_org_policy(&policies, &actor(CallerClass::Service), &org()).await.is_ok());
    assert!(get_org_policy(&policies, &actor(CallerClass::Internal), &org()).await.is_ok());
    let denied = get_org_policy(&policies, &actor(CallerClass::User), &org()).await;
    assert!(matches!(denied, Err(GetPolicyError::Access(AccessError::Denied(_)))), "{denied:?}");
    let beta = domain::OrgId::parse("beta").unwrap();
    let denied = get_org_policy(&policies, &actor(CallerClass::Service), &beta).await;
    assert!(matches!(denied, Err(GetPolicyError::Access(_))), "another org's: {denied:?}");
}

#[tokio::test]
async fn a_change_keeps_the_other_fields_retries_a_lost_race_and_writes_nothing_invalid() {
    let mut store = MockPolicyStore::new();
    let reads = std::sync::atomic::AtomicUsize::new(0);
    store.expect_overrides().returning(move |_| {
        // The first read is stale: another change (version 2, with a warm pool) lands
        // before this one writes.
        Ok(Some(if reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
            overrides(workflow_off(), 1)
        } else {
            overrides(PolicyPatch { warm_pool: Some(3), ..workflow_off() }, 2)
        }))
    });
    store.expect_replace().times(2).returning(|_, patch, version, now| {
        Ok((version == 2).then(|| PolicyOverrides { patch: patch.clone(), version: 3, updated_at: now }))
    });
    let policies = Policies::new(Arc::new(store), OrgPolicy::builtin());
    let patch = PolicyPatch { max_sandboxes: Some(Some(4)), ..Default::default() };
    let done = set_org_policy(&policies, &org(), &patch, Timestamp::from_unix_millis(NOW)).await.unwrap();
    assert_eq!(done.version, 3);
    let p = &done.policy;
    assert_eq!((p.max_sandboxes(), p.warm_pool(), p.lane(SandboxKind::Workflow)), (Some(4), 3, false));

    let mut store = MockPolicyStore::new();
    store.expect_overrides().returning(|_| Ok(None));
    store.expect_replace().never();
    let policies = Policies::new(Arc::new(store), OrgPolicy::builtin());
    let bad = PolicyPatch { warm_pool: Some(5_000), ..Default::default() };
    let e = set_org_policy(&policies, &org(), &bad, Timestamp::from_unix_millis(NOW)).await.unwrap_err();
    assert!(e.to_string().starts_with("warm_pool: "), "{e}");
}
