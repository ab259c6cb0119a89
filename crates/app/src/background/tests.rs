use std::sync::{Arc, Mutex};

use domain::execution::SandboxSubject;
use domain::{AuditOutcome, CallerClass, SandboxId, SandboxState, Timestamp};
use mockall::predicate::eq;
use ports::DriverError;

use super::*;
use crate::test_support::*;

#[tokio::test]
async fn refresh_mints_for_the_recorded_caller_and_delivers() {
    let mut m = Mocks::new(true);
    m.directory.expect_is_revoked().returning(|_| Ok(false));
    let due_id = SandboxId::generate(1, 1);
    let mut due = existing_ready(agent_execution().sandbox_key(), &due_id);
    due.token_expires_at = Some(Timestamp::from_unix_millis(NOW + 60_000)); // within the margin
    let fresh_id = SandboxId::generate(2, 2);
    let mut fresh = existing_ready(workflow_execution().sandbox_key(), &fresh_id);
    fresh.token_expires_at = Some(Timestamp::from_unix_millis(NOW + 800_000));
    // The store may answer more than is due: the pass checks again.
    let live = vec![due.clone(), fresh];
    let read_again = due.clone();
    m.registry.expect_get().returning(move |_| Ok(Some(read_again.clone())));
    m.registry
        .expect_list_token_expiring()
        .withf(|horizon| *horizon == Timestamp::from_unix_millis(NOW + 300_000))
        .returning(move |_| Ok(live.clone()));
    let d2 = due_id.clone();
    m.minter.expect_mint().times(1).returning(move |req| {
        // Still FOR the caller who asked, not the internal caller doing the refresh.
        assert_eq!(req.subject().as_str(), CALLER_ID);
        assert_eq!(req.sandbox_id(), &d2);
        assert_eq!(req.session_claim(), "sess-1");
        Ok(minted("jti-refresh"))
    });
    m.driver
        .expect_refresh_credential()
        .withf(move |id, t, env| {
            id == &due_id && t.expose().contains("jti-refresh") && env.sandbox_id() == &due_id
        })
        .times(1)
        .returning(|_, _, _| Ok(()));
    m.registry.expect_record_token().times(1).returning(|_, _, grant, _| {
        assert_eq!(grant.caller.identity_id().as_str(), CALLER_ID);
        Ok(())
    });
    let events = recording_audit(&mut m.audit);
    let deps = m.deps();
    let report = refresh_once(&deps, Duration::from_secs(300)).await;
    assert_eq!(report, RefreshReport { refreshed: 1, failed: 0, skipped_revoked: 0, retired: 0 });
    let events = events.lock().unwrap();
    assert_eq!(events[0].outcome, AuditOutcome::Refreshed);
    assert_eq!(events[0].caller_class, CallerClass::Internal);
}

#[tokio::test]
async fn reconcile_fails_expired_claims_and_removes_orphans() {
    let mut m = Mocks::new(true);
    let stuck_id = SandboxId::generate(3, 3);
    let mut stuck = existing_ready(agent_execution().sandbox_key(), &stuck_id);
    stuck.state = SandboxState::Provisioning;
    stuck.lease.expires_at = Timestamp::from_unix_millis(NOW - 1);
    stuck.lease.epoch = 4;
    let ready_id = SandboxId::generate(4, 4);
    let ready = existing_ready(workflow_execution().sandbox_key(), &ready_id);
    let expired = vec![stuck.clone()];
    m.registry.expect_list_lease_expired().returning(move |_| Ok(expired.clone()));
    let live: Vec<_> = [&stuck, &ready]
        .into_iter()
        .map(|r| ports::LiveId { id: r.id.clone(), org: org(), state: r.state })
        .collect();
    m.registry.expect_live_ids().returning(move || Ok(live.clone()));
    m.registry
        .expect_mark_failed()
        .withf(move |id, epoch, msg, _| id == &stuck_id && *epoch == 4 && msg.contains("expired"))
        .times(1)
        .returning(|_, _, _, _| Ok(()));
    m.minter.expect_revoke().times(1).returning(|_| Ok(()));
    let orphan = SandboxId::generate(5, 5);
    let held = vec![stuck.id.clone(), ready_id.clone(), orphan.clone()];
    m.driver.expect_list().returning(move || Ok(held.clone()));
    m.registry.expect_list_warm().returning(|| Ok(Vec::new()));
    m.registry.expect_get().with(eq(orphan.clone())).returning(|_| Ok(None));
    let removed = Arc::new(Mutex::new(Vec::new()));
    let r2 = removed.clone();
    m.driver.expect_deprovision().returning(move |id| {
        r2.lock().unwrap().push(id.clone());
        Ok(())
    });
    let _events = recording_audit(&mut m.audit);
    let deps = m.deps();
    let report = reconcile_once(&deps).await;
    assert_eq!(report, ReconcileReport { expired_claims: 1, orphans_removed: 1, skipped_unreadable: 0 });
    let removed = removed.lock().unwrap();
    assert_eq!(*removed, vec![stuck.id.clone(), orphan]);
    assert!(!removed.contains(&ready_id), "a ready sandbox is never removed");
}

#[tokio::test]
async fn a_failed_refresh_is_counted_not_fatal() {
    let mut m = Mocks::new(true);
    m.directory.expect_is_revoked().returning(|_| Ok(false));
    let id = SandboxId::generate(6, 6);
    let mut due = existing_ready(agent_execution().sandbox_key(), &id);
    due.token_expires_at = None;
    let read_again = due.clone();
    m.registry.expect_get().returning(move |_| Ok(Some(read_again.clone())));
    m.registry.expect_list_token_expiring().returning(move |_| Ok(vec![due.clone()]));
    m.minter.expect_mint().returning(|_| Ok(minted("jti-x")));
    m.driver.expect_refresh_credential().returning(|_, _, _| {
        Err(DriverError::Unavailable(ports::Cause::msg("the supervisor does not answer")))
    });
    m.registry.expect_record_token().never();
    let deps = m.deps();
    assert_eq!(
        refresh_once(&deps, Duration::from_secs(300)).await,
        RefreshReport { refreshed: 0, failed: 1, skipped_revoked: 0, retired: 0 }
    );
}

#[tokio::test]
async fn refresh_follows_the_latest_ensurer_and_never_mints_for_a_revoked_caller() {
    let mut m = Mocks::new(true);
    // Created by CALLER_ID; its current token is for "u-later", execution "aex-9".
    let later_id = SandboxId::generate(7, 7);
    let mut later = existing_ready(agent_execution().sandbox_key(), &later_id);
    later.token_caller = domain::SandboxCaller::from_record(
        domain::IdentityId::parse("u-later").unwrap(),
        CallerClass::Service,
    );
    later.execution_id = domain::ExecutionId::parse("aex-9").unwrap();
    later.token_expires_at = None;
    // Its current token is for a caller since revoked.
    let revoked_id = SandboxId::generate(8, 8);
    let mut revoked = existing_ready(workflow_execution().sandbox_key(), &revoked_id);
    revoked.token_caller =
        domain::SandboxCaller::from_record(domain::IdentityId::parse("u-gone").unwrap(), CallerClass::User);
    revoked.token_expires_at = None;
    let live = vec![later, revoked];
    let read_again = live.clone();
    m.registry.expect_get().returning(move |id| Ok(read_again.iter().find(|r| &r.id == id).cloned()));
    m.registry.expect_list_token_expiring().returning(move |_| Ok(live.clone()));
    m.directory.expect_is_revoked().returning(|id| Ok(id.as_str() == "u-gone"));
    m.minter.expect_mint().times(1).returning(|req| {
        assert_eq!(req.subject().as_str(), "u-later", "minted for the latest ensurer");
        assert_eq!(req.execution_id().as_str(), "aex-9", "with that ensure's execution");
        Ok(minted("jti-later"))
    });
    // The commands' environment carries the latest ensurer's class (Service), not the
    // record creator's (User): the refresh is cut by the caller split like the ensure.
    m.driver
        .expect_refresh_credential()
        .withf(move |id, _, env| id == &later_id && env.caller_class() == CallerClass::Service)
        .times(1)
        .returning(|_, _, _| Ok(()));
    m.registry.expect_record_token().times(1).returning(|_, _, grant, _| {
        assert_eq!(grant.caller.identity_id().as_str(), "u-later");
        assert_eq!(grant.caller.class(), CallerClass::Service);
        assert_eq!(grant.execution_id.as_str(), "aex-9");
        Ok(())
    });
    let events = recording_audit(&mut m.audit);
    let deps = m.deps();
    let report = refresh_once(&deps, Duration::from_secs(300)).await;
    assert_eq!(report, RefreshReport { refreshed: 1, failed: 0, skipped_revoked: 1, retired: 0 });
    let events = events.lock().unwrap();
    assert_eq!(events.len(), 1);
    assert!(events[0].message.contains("u-later"), "{:?}", events[0]);
}

/// A sandbox listed as due whose token an ensure re-minted for another caller since (the
/// list may be seconds old when the pass reaches it): nothing is minted for the caller it
/// was listed with.
#[tokio::test]
async fn refresh_skips_a_sandbox_an_ensure_re_minted_since_it_was_listed() {
    let mut m = Mocks::new(true);
    let id = SandboxId::generate(10, 10);
    let mut listed = existing_ready(agent_execution().sandbox_key(), &id);
    listed.token_expires_at = None;
    let mut now = listed.clone();
    now.token_id = Some(domain::TokenId::parse("jti-newer").unwrap());
    now.token_caller =
        domain::SandboxCaller::from_record(domain::IdentityId::parse("u-b").unwrap(), CallerClass::User);
    m.registry.expect_list_token_expiring().returning(move |_| Ok(vec![listed.clone()]));
    m.registry.expect_get().returning(move |_| Ok(Some(now.clone())));
    m.minter.expect_mint().never();
    m.driver.expect_refresh_credential().never();
    m.registry.expect_record_token().never();
    let deps = m.deps();
    assert_eq!(refresh_once(&deps, Duration::from_secs(300)).await, RefreshReport::default());
}

/// A refresh whose token a newer ensure's superseded between its read and its write: its
/// delivery may have replaced the newer token in the sandbox, so it delivers again, for the
/// record as it is now (the newer ensure's caller), over that token.
#[tokio::test]
async fn a_superseded_refresh_delivers_again_for_the_newer_caller() {
    let mut m = Mocks::new(true);
    m.directory.expect_is_revoked().returning(|_| Ok(false));
    let id = SandboxId::generate(11, 11);
    let mut listed = existing_ready(agent_execution().sandbox_key(), &id);
    listed.token_expires_at = None;
    let mut newer = listed.clone();
    newer.token_id = Some(domain::TokenId::parse("jti-newer").unwrap());
    newer.token_caller =
        domain::SandboxCaller::from_record(domain::IdentityId::parse("u-b").unwrap(), CallerClass::User);
    let reads = Arc::new(Mutex::new(vec![newer.clone(), listed.clone()]));
    m.registry.expect_list_token_expiring().returning(move |_| Ok(vec![listed.clone()]));
    m.registry.expect_get().returning(move |_| Ok(reads.lock().unwrap().pop()));
    let subjects = Arc::new(Mutex::new(Vec::new()));
    let seen = subjects.clone();
    m.minter.expect_mint().times(2).returning(move |req| {
        seen.lock().unwrap().push(req.subject().as_str().to_owned());
        Ok(minted("jti-refresh"))
    });
    m.driver.expect_refresh_credential().times(2).returning(|_, _, _| Ok(()));
    let writes = Arc::new(Mutex::new(Vec::new()));
    let w = writes.clone();
    m.registry.expect_record_token().times(2).returning(move |id, expected, grant, _| {
        let mut w = w.lock().unwrap();
        w.push((expected.map(|t| t.as_str().to_owned()), grant.caller.identity_id().as_str().to_owned()));
        if w.len() == 1 { Err(RegistryError::Superseded(id.clone())) } else { Ok(()) }
    });
    let _events = recording_audit(&mut m.audit);
    let deps = m.deps();
    let report = refresh_once(&deps, Duration::from_secs(300)).await;
    assert_eq!(report, RefreshReport { refreshed: 1, failed: 0, skipped_revoked: 0, retired: 0 });
    assert_eq!(*subjects.lock().unwrap(), [CALLER_ID, "u-b"], "then minted for the newer caller");
    let writes = writes.lock().unwrap();
    assert_eq!(writes[1], (Some("jti-newer".to_owned()), "u-b".to_owned()), "over the newer token");
}

#[tokio::test]
async fn the_reconciler_never_removes_what_it_cannot_read() {
    let mut m = Mocks::new(true);
    m.registry.expect_list_lease_expired().returning(|_| Ok(Vec::new()));
    m.registry.expect_live_ids().returning(|| Ok(Vec::new()));
    let unknown = SandboxId::generate(9, 9);
    let held = vec![unknown.clone()];
    m.driver.expect_list().returning(move || Ok(held.clone()));
    m.registry.expect_list_warm().returning(|| Ok(Vec::new()));
    m.registry.expect_get().returning(|_| Err(ports::RegistryError::Store("connection refused".into())));
    m.driver.expect_deprovision().never();
    let deps = m.deps();
    let report = reconcile_once(&deps).await;
    assert_eq!(report, ReconcileReport { expired_claims: 0, orphans_removed: 0, skipped_unreadable: 1 });

    // Nor what belongs to a warm pool (no record names it), nor anything when the pool
    // cannot be listed.
    for warm_listed in [true, false] {
        let mut m = Mocks::new(true);
        m.registry.expect_list_lease_expired().returning(|_| Ok(Vec::new()));
        m.registry.expect_live_ids().returning(|| Ok(Vec::new()));
        let warm = SandboxId::generate(10, 10);
        let held = vec![warm.clone()];
        m.driver.expect_list().returning(move || Ok(held.clone()));
        let w = warm.clone();
        m.registry.expect_list_warm().returning(move || {
            if warm_listed {
                Ok(vec![ports::WarmSandbox {
                    id: w.clone(),
                    org: org(),
                    workspace_bytes: None,
                    driver: "bubblewrap".into(),
                    ready: true,
                    lease: domain::sandbox::Lease {
                        holder: "r".into(),
                        expires_at: Timestamp::from_unix_millis(NOW),
                        epoch: 1,
                    },
                    created_at: Timestamp::from_unix_millis(NOW),
                }])
            } else {
                Err(ports::RegistryError::Store("connection refused".into()))
            }
        });
        m.registry.expect_get().never();
        m.driver.expect_deprovision().never();
        let deps = m.deps();
        assert_eq!(reconcile_once(&deps).await, ReconcileReport::default());
    }

    // And a pass that cannot list the expired claims or the live records touches nothing.
    for failing in ["expired", "live"] {
        let mut m = Mocks::new(true);
        if failing == "expired" {
            m.registry
                .expect_list_lease_expired()
                .returning(|_| Err(ports::RegistryError::Store("refused".into())));
            m.registry.expect_live_ids().never();
            m.driver.expect_list().never();
        } else {
            m.registry.expect_list_lease_expired().returning(|_| Ok(Vec::new()));
            m.registry.expect_live_ids().returning(|| Err(ports::RegistryError::Store("refused".into())));
            // Listed first (see `reconcile_once`), and then left alone.
            let held = vec![SandboxId::generate(12, 12)];
            m.driver.expect_list().returning(move || Ok(held.clone()));
        }
        m.driver.expect_deprovision().never();
        let deps = m.deps();
        assert_eq!(reconcile_once(&deps).await, ReconcileReport::default(), "{failing}");
    }
}

fn stored(org: &str, patch: domain::PolicyPatch) -> (domain::OrgId, ports::PolicyOverrides) {
    let overrides =
        ports::PolicyOverrides { patch, version: 1, updated_at: Timestamp::from_unix_millis(NOW) };
    (domain::OrgId::parse(org).unwrap(), overrides)
}

/// With no idle timeout and no maximum lifetime in the defaults or any org's changes, the
/// two passes read no sandbox at all (the mock registry has no expectation for a list:
/// one would fail the test).
#[tokio::test]
async fn idle_and_lifetime_passes_read_nothing_when_no_org_has_the_limit() {
    let mut m = Mocks::new(true);
    m.policies.expect_list().returning(|| {
        Ok(vec![stored("beta", domain::PolicyPatch { warm_pool: Some(2), ..Default::default() })])
    });
    let deps = m.deps();
    assert_eq!(suspend_idle_once(&deps).await, SuspendReport::default());
    assert_eq!(expire_once(&deps).await, ExpireReport::default());
}

/// The passes read only the candidates older than the shortest limit of any org: here the
/// defaults have a 1 h lifetime and no idle timeout, `acme` a 2 s idle timeout, `beta` a
/// 10 s one and a 5 s lifetime.
#[tokio::test]
async fn idle_and_lifetime_passes_read_only_records_past_the_shortest_limit() {
    let mut m = Mocks::new(true);
    m.defaults = domain::OrgPolicy::builtin()
        .apply(&domain::PolicyPatch { max_lifetime_ms: Some(Some(3_600_000)), ..Default::default() })
        .unwrap();
    m.policies.expect_list().returning(|| {
        Ok(vec![
            stored("acme", domain::PolicyPatch { idle_timeout_ms: Some(Some(2_000)), ..Default::default() }),
            stored(
                "beta",
                domain::PolicyPatch {
                    idle_timeout_ms: Some(Some(10_000)),
                    max_lifetime_ms: Some(Some(5_000)),
                    ..Default::default()
                },
            ),
        ])
    });
    m.registry
        .expect_list_idle()
        .with(eq(Timestamp::from_unix_millis(NOW - 2_000)))
        .times(1)
        .returning(|_| Ok(Vec::new()));
    m.registry
        .expect_list_created_before()
        .with(eq(Timestamp::from_unix_millis(NOW - 5_000)))
        .times(1)
        .returning(|_| Ok(Vec::new()));
    let deps = m.deps();
    assert_eq!(suspend_idle_once(&deps).await, SuspendReport::default());
    assert_eq!(expire_once(&deps).await, ExpireReport::default());
}

/// A pool of 2 with one ready warm sandbox left: while its org adopts here, the pool pass
/// stands aside (no slot is claimed: the mock has no expectation for one); once the org
/// has been quiet for `ADOPTING_MS`, or when its pool is empty, it refills.
#[tokio::test]
async fn the_pool_pass_stands_aside_while_its_org_adopts_from_a_pool_not_empty() {
    let org = domain::OrgId::parse("warm").unwrap();
    let warm_one = |ready: bool| ports::WarmSandbox {
        id: domain::SandboxId::parse("sbx_01J0000000000000000000000W").unwrap(),
        org: org.clone(),
        workspace_bytes: domain::OrgPolicy::builtin().workspace_bytes(),
        driver: "bubblewrap".into(),
        ready,
        lease: domain::sandbox::Lease {
            holder: "replica-a".into(),
            expires_at: Timestamp::from_unix_millis(NOW + 60_000),
            epoch: 1,
        },
        created_at: Timestamp::from_unix_millis(NOW - 1_000),
    };
    let mocks = |ready: bool, claims: usize| {
        let mut m = Mocks::new(true);
        m.defaults = domain::OrgPolicy::builtin()
            .apply(&domain::PolicyPatch { warm_pool: Some(2), ..Default::default() })
            .unwrap();
        m.policies.expect_list().returning(|| Ok(Vec::new()));
        let listed = warm_one(ready);
        m.registry.expect_list_warm().returning(move || Ok(vec![listed.clone()]));
        m.registry.expect_live_counts().returning(|| Ok(Vec::new()));
        // `Ok(None)`: the pool is full meanwhile (another replica filled it): the pass stops.
        m.registry.expect_claim_warm_slot().times(claims).returning(|_| Ok(None));
        m.deps()
    };

    // Adopting (an adoption just now), one ready sandbox left: nothing is claimed.
    let deps = mocks(true, 0);
    deps.pool_demand.adopted(&org, Timestamp::from_unix_millis(NOW));
    let report = refill_pools_once(&deps).await;
    assert_eq!((report.deferred, report.provisioned), (1, 0));

    // Quiet for ADOPTING_MS: it refills (a slot is claimed).
    let deps = mocks(true, 1);
    deps.pool_demand.adopted(&org, Timestamp::from_unix_millis(NOW - crate::usecase::ADOPTING_MS));
    assert_eq!(refill_pools_once(&deps).await.deferred, 0);

    // Adopting, but nothing ready to adopt (the one listed is still being provisioned):
    // it refills at once.
    let deps = mocks(false, 1);
    deps.pool_demand.adopted(&org, Timestamp::from_unix_millis(NOW));
    assert_eq!(refill_pools_once(&deps).await.deferred, 0);
}

/// A warm provision slower than its lease (a pod whose image takes minutes) renews the
/// slot's lease, at its epoch, every third of the lease while the driver works: otherwise
/// another replica's pool pass would take the slot for a lapsed one, claim another past
/// the pool's size, and remove this sandbox from under its provision.
#[tokio::test(start_paused = true)]
async fn a_warm_provision_slower_than_its_lease_renews_it() {
    let org = domain::OrgId::parse("warm").unwrap();
    let slot_id = domain::SandboxId::parse("sbx_01J0000000000000000000000W").unwrap();
    let mut m = Mocks::new(true);
    m.defaults = domain::OrgPolicy::builtin()
        .apply(&domain::PolicyPatch { warm_pool: Some(1), ..Default::default() })
        .unwrap();
    m.policies.expect_list().returning(|| Ok(Vec::new()));
    m.registry.expect_list_warm().returning(|| Ok(Vec::new()));
    let counted = org.clone();
    m.registry.expect_live_counts().returning(move || {
        Ok(vec![ports::StateCount { org: counted.clone(), state: SandboxState::Ready, count: 1 }])
    });
    let (slot_org, id) = (org.clone(), slot_id.clone());
    m.registry.expect_claim_warm_slot().times(1).returning(move |req| {
        Ok(Some(ports::WarmSandbox {
            id: id.clone(),
            org: slot_org.clone(),
            workspace_bytes: req.workspace_bytes,
            driver: req.driver.clone(),
            ready: false,
            lease: domain::sandbox::Lease { holder: req.holder.clone(), expires_at: req.now, epoch: 3 },
            created_at: req.now,
        }))
    });
    m.driver.expect_provision().times(1).returning(|_| Ok(()));
    let renewals = Arc::new(Mutex::new(Vec::new()));
    let sink = renewals.clone();
    m.registry.expect_renew_warm_lease().returning(move |id, epoch, until, now| {
        sink.lock().unwrap().push((id.clone(), epoch, until.unix_millis() - now.unix_millis()));
        Ok(())
    });
    m.registry
        .expect_mark_warm_ready()
        .with(eq(slot_id.clone()), eq(3), mockall::predicate::always())
        .times(1)
        .returning(|_, _, _| Ok(()));
    let lease_ms = Mocks::new(true).deps().lease_ms;
    let deps = m.deps_with_slow_driver(Duration::from_millis(u64::try_from(lease_ms).unwrap() * 5 / 2));

    let report = refill_pools_once(&deps).await;
    assert_eq!((report.provisioned, report.failed), (1, 0));
    let renewals = renewals.lock().unwrap();
    // Every third of the lease over two and a half leases: seven renewals, each for a lease.
    assert_eq!(renewals.len(), 7, "{renewals:?}");
    assert!(renewals.iter().all(|r| *r == (slot_id.clone(), 3, lease_ms)), "{renewals:?}");
}

/// The egress scan's failure to reach a sandbox's proxy is a warning only while the
/// sandbox's record still says ready: one deprovisioned (or gone, or suspended) between
/// the listing and the connection has nothing to serve.
#[tokio::test]
async fn an_egress_failure_is_reported_only_for_a_sandbox_still_ready() {
    let ready_id = SandboxId::generate(5, 5);
    let ended_id = SandboxId::generate(6, 6);
    let gone_id = SandboxId::generate(7, 7);
    let unreadable_id = SandboxId::generate(8, 8);
    let mut m = Mocks::new(true);
    let ready = existing_ready(agent_execution().sandbox_key(), &ready_id);
    let mut ended = existing_ready(workflow_execution().sandbox_key(), &ended_id);
    ended.state = SandboxState::Deprovisioned;
    let (r, e, u) = (ready_id.clone(), ended_id.clone(), unreadable_id.clone());
    m.registry.expect_get().returning(move |id| {
        if id == &r {
            Ok(Some(ready.clone()))
        } else if id == &e {
            Ok(Some(ended.clone()))
        } else if id == &u {
            Err(ports::RegistryError::Store("connection refused".into()))
        } else {
            Ok(None)
        }
    });
    let deps = m.deps();
    let registry = deps.registry.as_ref();
    assert!(still_ready(registry, &ready_id).await);
    assert!(!still_ready(registry, &ended_id).await);
    assert!(!still_ready(registry, &gone_id).await);
    assert!(still_ready(registry, &unreadable_id).await, "a doubt is reported");
}

/// A ready sandbox whose init ended on its own (the driver no longer holds it) is retired
/// by the refresher, as an ensure would retire it, and audited: not re-minted at every
/// pass with its org's quota held.
#[tokio::test]
async fn a_ready_sandbox_the_driver_lost_is_retired_by_the_refresher() {
    let mut m = Mocks::new(true);
    m.directory.expect_is_revoked().returning(|_| Ok(false));
    let id = SandboxId::generate(1, 9);
    let mut due = existing_ready(agent_execution().sandbox_key(), &id);
    due.token_expires_at = Some(Timestamp::from_unix_millis(NOW + 60_000));
    let listed = vec![due.clone()];
    m.registry.expect_list_token_expiring().returning(move |_| Ok(listed.clone()));
    let read_again = due.clone();
    m.registry.expect_get().returning(move |_| Ok(Some(read_again.clone())));
    m.minter.expect_mint().times(1).returning(|_| Ok(minted("jti-lost")));
    m.driver
        .expect_refresh_credential()
        .times(1)
        .returning(|id, _, _| Err(DriverError::NotFound(id.clone())));
    m.registry.expect_record_token().times(0);
    m.retires_once(&id, Some(due));
    let events = recording_audit(&mut m.audit);
    let deps = m.deps();
    let report = refresh_once(&deps, Duration::from_secs(300)).await;
    assert_eq!(report, RefreshReport { refreshed: 0, failed: 0, skipped_revoked: 0, retired: 1 });
    let events = events.lock().unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!((events[0].outcome, events[0].sandbox_id.as_ref()), (AuditOutcome::Repaired, Some(&id)));
}

/// Sandboxes whose refresh never ends (a supervisor that accepts and never answers, an
/// API server that hangs) each hold one place of the pass for [`REFRESH_DEADLINE`], never
/// the pass: listed first and more of them than the pass has places, they neither keep the
/// other sandboxes' tokens from being refreshed at once nor keep the pass from ending.
#[tokio::test(start_paused = true)]
async fn a_refresh_that_never_ends_holds_one_place_not_the_pass() {
    let mut m = Mocks::new(true);
    m.directory.expect_is_revoked().returning(|_| Ok(false));
    let ids: Vec<SandboxId> =
        (0..REFRESH_AT_ONCE + 4).map(|i| SandboxId::generate(7, i as u128 + 1)).collect();
    let (stalled, healthy) = ids.split_at(REFRESH_AT_ONCE + 1);
    let records: std::collections::HashMap<SandboxId, SandboxRecord> = ids
        .iter()
        .map(|id| {
            let mut r = existing_ready(agent_execution().sandbox_key(), id);
            r.token_expires_at = Some(Timestamp::from_unix_millis(NOW + 60_000));
            (id.clone(), r)
        })
        .collect();
    let listed: Vec<SandboxRecord> = ids.iter().map(|id| records[id].clone()).collect();
    m.registry.expect_list_token_expiring().returning(move |_| Ok(listed.clone()));
    m.registry.expect_get().returning(move |id| Ok(records.get(id).cloned()));
    m.minter.expect_mint().returning(|_| Ok(minted("jti-new")));
    let started = tokio::time::Instant::now();
    let delivered = Arc::new(Mutex::new(Vec::new()));
    let sink = delivered.clone();
    m.driver.expect_refresh_credential().returning(move |id, _, _| {
        sink.lock().unwrap().push((id.clone(), started.elapsed()));
        Ok(())
    });
    m.registry.expect_record_token().times(healthy.len()).returning(|_, _, _, _| Ok(()));
    let events = recording_audit(&mut m.audit);
    let deps = m.deps_with_stalled_refreshes(stalled.to_vec());

    let pass = tokio::time::timeout(Duration::from_secs(3600), refresh_once(&deps, Duration::from_secs(300)));
    let report = pass.await.expect("the pass ended");
    assert_eq!(
        report,
        RefreshReport { refreshed: healthy.len(), failed: stalled.len(), skipped_revoked: 0, retired: 0 }
    );
    // The stalled ones took two rounds of places: the pass ended after two deadlines.
    assert!(started.elapsed() <= 2 * REFRESH_DEADLINE + Duration::from_secs(1), "{:?}", started.elapsed());
    let delivered = delivered.lock().unwrap();
    let mut reached: Vec<&SandboxId> = delivered.iter().map(|(id, _)| id).collect();
    reached.sort();
    let mut want: Vec<&SandboxId> = healthy.iter().collect();
    want.sort();
    assert_eq!(reached, want);
    // The healthy ones waited for one place to come free, not for every stalled refresh.
    assert!(
        delivered.iter().all(|(_, at)| *at <= REFRESH_DEADLINE + Duration::from_secs(1)),
        "{delivered:?}"
    );
    assert_eq!(events.lock().unwrap().len(), healthy.len());
}

/// A pass under way when the server stops has a grace to end: one that ends within it
/// ends, one that never ends is dropped after it, and `every` returns either way.
#[tokio::test(start_paused = true)]
async fn a_pass_under_way_at_the_stop_has_a_grace_then_is_dropped() {
    for (takes, finished) in [(PASS_STOP_GRACE / 2, true), (Duration::from_secs(3600), false)] {
        let (stop_tx, stop_rx) = watch::channel(false);
        let ended = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = ended.clone();
        let runner = tokio::spawn(every(Duration::from_secs(60), stop_rx, move || {
            let flag = flag.clone();
            async move {
                tokio::time::sleep(takes).await;
                flag.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }));
        tokio::time::sleep(Duration::from_millis(10)).await;
        let stopped_at = tokio::time::Instant::now();
        stop_tx.send(true).unwrap();
        runner.await.unwrap();
        assert!(stopped_at.elapsed() <= PASS_STOP_GRACE, "{takes:?}: {:?}", stopped_at.elapsed());
        assert_eq!(ended.load(std::sync::atomic::Ordering::SeqCst), finished, "{takes:?}");
    }
}

/// A warm slot claimed while the reconciler lists, and made by the driver just after: the
/// reconciler never removes it from under its provision. The listings see the world as it
/// moves on (each listing is one step later): the slot is claimed, and its sandbox made,
/// just before the third listing, so a reconciler that listed the registry before the
/// driver would find the sandbox and no owner.
#[tokio::test]
async fn a_warm_slot_claimed_during_a_reconcile_is_not_taken_for_an_orphan() {
    let mut m = Mocks::new(true);
    let step = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let next =
        |step: &Arc<std::sync::atomic::AtomicUsize>| step.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let warm = SandboxId::generate(11, 11);
    m.registry.expect_list_lease_expired().returning(|_| Ok(Vec::new()));
    let s = step.clone();
    m.registry.expect_live_ids().returning(move || {
        next(&s);
        Ok(Vec::new())
    });
    let (s, w) = (step.clone(), warm.clone());
    m.registry.expect_list_warm().returning(move || {
        let claimed = next(&s) >= 2;
        let slot = ports::WarmSandbox {
            id: w.clone(),
            org: org(),
            workspace_bytes: None,
            driver: "bubblewrap".into(),
            ready: false,
            lease: domain::sandbox::Lease {
                holder: "r".into(),
                expires_at: Timestamp::from_unix_millis(NOW + 60_000),
                epoch: 1,
            },
            created_at: Timestamp::from_unix_millis(NOW),
        };
        Ok(if claimed { vec![slot] } else { Vec::new() })
    });
    let (s, w) = (step.clone(), warm.clone());
    m.driver.expect_list().returning(move || Ok(if next(&s) >= 2 { vec![w.clone()] } else { Vec::new() }));
    // Not a sandboxes-table record: a warm slot's re-read finds nothing.
    m.registry.expect_get().returning(|_| Ok(None));
    m.driver.expect_deprovision().never();
    let deps = m.deps();
    let report = reconcile_once(&deps).await;
    assert_eq!(report.orphans_removed, 0);
}
