//! Contract tests of org policy in the store (issue 14), on both databases: the policy
//! store's compare-and-set, quota leases, the quota of running sandboxes under concurrent
//! claims from two replicas, suspend, resume and activity, and the warm pool's adoption.

use std::collections::BTreeSet;
use std::sync::Arc;

use domain::{Durability, PolicyPatch, SandboxId, SandboxState};
use ports::{
    ClaimOutcome, ClaimRequest, PolicyStore, QuotaLeases, RegistryError, ResumeRequest, SandboxRegistry,
    WarmMatch, WarmSlotRequest,
};

use super::{
    GRACE, TestDb, caller, claim_request, grant, org, postgres, sandbox_id, session_key, sqlite, ts,
};

on_both!(policy_store, GRACE, policy_store_contract);
on_both!(quota_leases, GRACE, quota_leases_contract);
on_both!(concurrent_leases, GRACE, concurrent_leases_contract);
on_both!(running_quota, GRACE, running_quota_contract);
on_both!(concurrent_quota, GRACE, concurrent_quota_contract);
on_both!(suspend_resume, GRACE, suspend_resume_contract);
on_both!(warm_pool, GRACE, warm_pool_contract);
on_both!(concurrent_adoption, GRACE, concurrent_adoption_contract);
on_both!(concurrent_adoption_under_quota, GRACE, concurrent_adoption_under_quota_contract);
on_both!(owner_adoption, GRACE, owner_adoption_contract);
on_both!(concurrent_owner_adoption, GRACE, concurrent_owner_adoption_contract);
on_both!(concurrent_owner_adoption_under_quota, GRACE, concurrent_owner_adoption_under_quota_contract);
on_both!(ready_and_audited, GRACE, ready_and_audited_contract);
on_both!(pass_candidates, GRACE, pass_candidates_contract);

const T0: i64 = 1_796_000_000_000;

async fn policy_store_contract(db: &TestDb) {
    let p: Arc<dyn PolicyStore> = db.store.policies();
    let acme = org("acme");
    assert_eq!(p.overrides(&acme).await.unwrap(), None);
    let first = PolicyPatch {
        lane_workflow: Some(false),
        max_sandboxes: Some(Some(3)),
        idle_timeout_ms: Some(None),
        ..Default::default()
    };
    let v1 = p.replace(&acme, &first, 0, ts(T0)).await.unwrap().expect("first write");
    assert_eq!((v1.version, v1.updated_at), (1, ts(T0)));
    // A second writer that also saw "nothing stored" loses and must read again.
    assert_eq!(p.replace(&acme, &PolicyPatch::default(), 0, ts(T0 + 1)).await.unwrap(), None);
    let read = p.overrides(&acme).await.unwrap().unwrap();
    assert_eq!(read, v1);
    assert_eq!(read.patch.idle_timeout_ms, Some(None), "an explicit `off` is kept apart from `not set`");
    assert_eq!(read.patch.max_lifetime_ms, None);
    let second = first.merged(&PolicyPatch { warm_pool: Some(2), ..Default::default() });
    let v2 = p.replace(&acme, &second, 1, ts(T0 + 2)).await.unwrap().expect("second write");
    assert_eq!(v2.version, 2);
    // A stale version is refused.
    assert_eq!(p.replace(&acme, &first, 1, ts(T0 + 3)).await.unwrap(), None);
    assert_eq!(p.overrides(&acme).await.unwrap().unwrap().patch, second);
    p.replace(&org("beta"), &PolicyPatch { lane_session: Some(false), ..Default::default() }, 0, ts(T0))
        .await
        .unwrap()
        .unwrap();
    let all: Vec<String> = p.list().await.unwrap().into_iter().map(|(o, _)| o.to_string()).collect();
    assert_eq!(all, ["acme", "beta"]);
}

async fn quota_leases_contract(db: &TestDb) {
    let l: Arc<dyn QuotaLeases> = db.store.leases();
    let scope = "org:acme";
    assert_eq!(l.lease(scope, "a", 2, 3, ts(T0), 1_000).await.unwrap(), 2);
    assert_eq!(l.lease(scope, "b", 2, 3, ts(T0), 1_000).await.unwrap(), 1, "only one slot is left");
    // Renewing keeps what one holds; asking for more takes only what is free.
    assert_eq!(l.lease(scope, "a", 3, 3, ts(T0 + 10), 1_000).await.unwrap(), 2);
    // Giving back frees the slots at once.
    assert_eq!(l.lease(scope, "a", 0, 3, ts(T0 + 20), 1_000).await.unwrap(), 0);
    assert_eq!(l.lease(scope, "b", 3, 3, ts(T0 + 30), 1_000).await.unwrap(), 3);
    // Another scope is another quota.
    assert_eq!(l.lease("org:beta", "a", 3, 3, ts(T0 + 30), 1_000).await.unwrap(), 3);
    assert_eq!(l.lease(scope, "c", 1, 3, ts(T0 + 40), 1_000).await.unwrap(), 0);
    // A lease that lapses (its replica died) gives its slots back.
    assert_eq!(l.lease(scope, "c", 1, 3, ts(T0 + 1_030), 1_000).await.unwrap(), 1);
    // A smaller limit: nothing beyond it, whatever is asked.
    assert_eq!(l.lease(scope, "d", 5, 2, ts(T0 + 1_040), 1_000).await.unwrap(), 1);
}

async fn concurrent_leases_contract(db: &TestDb) {
    let other = db.replica().await;
    let replicas = [db.store.leases(), other.leases()];
    let start = Arc::new(tokio::sync::Barrier::new(24));
    let mut tasks = Vec::new();
    for i in 0..24 {
        let l = replicas[i % 2].clone();
        let start = start.clone();
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            l.lease("org:acme", &format!("replica-{i}"), 1, 5, ts(T0), 60_000).await.unwrap()
        }));
    }
    let mut granted = 0;
    for t in tasks {
        granted += t.await.unwrap();
    }
    assert_eq!(granted, 5, "24 replicas asking at once share 5 slots");
    other.close().await;
}

fn quota_request(key: &str, n: u128, max: u32) -> ClaimRequest {
    ClaimRequest { max_running: Some(max), ..claim_request(&session_key("acme", key), n, "replica-a", T0) }
}

async fn running_quota_contract(db: &TestDb) {
    let r: Arc<dyn SandboxRegistry> = db.store.registry();
    assert_eq!(r.claim(&quota_request("k1", 1, 2)).await.unwrap().outcome, ClaimOutcome::Created);
    assert_eq!(r.claim(&quota_request("k2", 2, 2)).await.unwrap().outcome, ClaimOutcome::Created);
    let over = r.claim(&quota_request("k3", 3, 2)).await;
    assert_eq!(over, Err(RegistryError::OverQuota { org: org("acme"), limit: 2 }));
    assert_eq!(r.get(&sandbox_id(3)).await.unwrap(), None, "nothing was written");
    // A key that already has its sandbox is not a new one: no quota refusal.
    assert_eq!(r.claim(&quota_request("k1", 4, 2)).await.unwrap().outcome, ClaimOutcome::Existing);
    // Another org has its own count.
    let beta = ClaimRequest { max_running: Some(2), ..claim_request(&session_key("beta", "k3"), 5, "a", T0) };
    assert_eq!(r.claim(&beta).await.unwrap().outcome, ClaimOutcome::Created);
    // A failed provision frees its place.
    r.mark_failed(&sandbox_id(1), 1, "boom", ts(T0 + 1)).await.unwrap();
    assert_eq!(r.claim(&quota_request("k3", 6, 2)).await.unwrap().outcome, ClaimOutcome::Created);
    let counts = r.live_counts().await.unwrap();
    let acme: u64 = counts.iter().filter(|c| c.org == org("acme")).map(|c| c.count).sum();
    assert_eq!(acme, 2);
}

async fn concurrent_quota_contract(db: &TestDb) {
    let other = db.replica().await;
    let replicas = [db.store.registry(), other.registry()];
    let start = Arc::new(tokio::sync::Barrier::new(30));
    let mut tasks = Vec::new();
    for i in 0..30u128 {
        let reg = replicas[(i % 2) as usize].clone();
        let start = start.clone();
        let req = quota_request(&format!("key-{i}"), 100 + i, 7);
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            reg.claim(&req).await
        }));
    }
    let (mut created, mut refused) = (0, 0);
    for t in tasks {
        match t.await.unwrap() {
            Ok(c) => {
                assert_eq!(c.outcome, ClaimOutcome::Created);
                created += 1;
            }
            Err(RegistryError::OverQuota { limit: 7, .. }) => refused += 1,
            Err(e) => panic!("unexpected {e}"),
        }
    }
    assert_eq!((created, refused), (7, 23), "two replicas claiming at once never pass the quota");
    other.close().await;
}

async fn suspend_resume_contract(db: &TestDb) {
    let r: Arc<dyn SandboxRegistry> = db.store.registry();
    let key = session_key("acme", "idle");
    let claimed = r.claim(&claim_request(&key, 1, "replica-a", T0)).await.unwrap();
    assert_eq!(claimed.record.last_active_at, ts(T0));
    let ready =
        r.mark_ready(&sandbox_id(1), 1, &grant("jti-1", "u-1", T0 + 900_000), ts(T0 + 10)).await.unwrap();
    assert_eq!(ready.last_active_at, ts(T0 + 10), "becoming ready is activity");
    // Activity after the cut-off keeps it ready.
    r.touch(&[(sandbox_id(1), ts(T0 + 500)), (sandbox_id(99), ts(T0))]).await.unwrap();
    r.touch(&[(sandbox_id(1), ts(T0 + 100))]).await.unwrap(); // an older report never moves it back
    assert_eq!(r.get(&sandbox_id(1)).await.unwrap().unwrap().last_active_at, ts(T0 + 500));
    assert!(!r.suspend(&sandbox_id(1), ts(T0 + 499), ts(T0 + 2_000)).await.unwrap());
    assert!(r.suspend(&sandbox_id(1), ts(T0 + 500), ts(T0 + 2_000)).await.unwrap());
    assert!(!r.suspend(&sandbox_id(1), ts(T0 + 500), ts(T0 + 2_001)).await.unwrap(), "once");
    let suspended = r.get(&sandbox_id(1)).await.unwrap().unwrap();
    assert_eq!((suspended.state, suspended.updated_at), (SandboxState::Suspended, ts(T0 + 2_000)));
    assert!(suspended.tokens_active(), "a suspended sandbox's tokens stay valid until they expire");
    // It still holds its key; activity reports leave it suspended.
    r.touch(&[(sandbox_id(1), ts(T0 + 3_000))]).await.unwrap();
    assert_eq!(r.get_live(&key).await.unwrap().map(|x| x.state), Some(SandboxState::Suspended));
    let again = r.claim(&claim_request(&key, 2, "replica-b", T0 + 3_000)).await.unwrap();
    assert_eq!((again.outcome, again.record.id.clone()), (ClaimOutcome::Existing, sandbox_id(1)));
    assert!(
        r.live_ids()
            .await
            .unwrap()
            .iter()
            .any(|x| x.id == sandbox_id(1) && x.state == SandboxState::Suspended)
    );
    // It does not count as running: the org's quota has room.
    let other =
        ClaimRequest { max_running: Some(1), ..claim_request(&session_key("acme", "busy"), 3, "a", T0) };
    assert_eq!(r.claim(&other).await.unwrap().outcome, ClaimOutcome::Created);
    // Resuming it would make two: refused.
    let resume = |max: Option<u32>, holder: &str, now: i64| ResumeRequest {
        sandbox: sandbox_id(1),
        holder: holder.into(),
        lease_ms: 1_000,
        max_running: max,
        now: ts(now),
    };
    assert_eq!(
        r.resume(&resume(Some(1), "replica-b", T0 + 4_000)).await,
        Err(RegistryError::OverQuota { org: org("acme"), limit: 1 })
    );
    assert_eq!(r.get(&sandbox_id(1)).await.unwrap().unwrap().state, SandboxState::Suspended);
    let resumed = r.resume(&resume(Some(2), "replica-b", T0 + 4_000)).await.unwrap();
    assert_eq!(resumed.state, SandboxState::Provisioning);
    assert_eq!((resumed.lease.holder.as_str(), resumed.lease.epoch), ("replica-b", 2));
    assert_eq!(resumed.lease.expires_at, ts(T0 + 5_000));
    assert_eq!(resumed.last_active_at, ts(T0 + 4_000));
    assert_eq!(resumed.created_at, ts(T0), "the same sandbox");
    assert!(matches!(
        r.resume(&resume(None, "replica-c", T0 + 4_001)).await,
        Err(RegistryError::InvalidState { action: "resume", .. })
    ));
    assert_eq!(
        r.resume(&ResumeRequest { sandbox: sandbox_id(99), ..resume(None, "x", T0) }).await,
        Err(RegistryError::NotFound(sandbox_id(99)))
    );
    // The old epoch is fenced; the resumer's goes through.
    let g = grant("jti-2", "u-1", T0 + 900_000);
    assert!(matches!(
        r.mark_ready(&sandbox_id(1), 1, &g, ts(T0 + 4_100)).await,
        Err(RegistryError::Fenced { .. })
    ));
    let ready = r.mark_ready(&sandbox_id(1), 2, &g, ts(T0 + 4_100)).await.unwrap();
    assert_eq!(ready.state, SandboxState::Ready);
    let counts = r.live_counts().await.unwrap();
    assert!(counts.iter().all(|c| c.state != SandboxState::Suspended));
}

fn warm_request(n: u128, target: u32, bytes: Option<u64>, now: i64) -> WarmSlotRequest {
    WarmSlotRequest {
        org: org("acme"),
        candidate_id: sandbox_id(n),
        workspace_bytes: bytes,
        target,
        driver: "bubblewrap".into(),
        holder: "replica-a".into(),
        lease_ms: 1_000,
        now: ts(now),
    }
}

fn adopting(key: &str, n: u128, bytes: Option<u64>) -> ClaimRequest {
    ClaimRequest {
        durability: Durability::Ephemeral,
        warm: Some(WarmMatch { workspace_bytes: bytes }),
        ..claim_request(&session_key("acme", key), n, "replica-b", T0 + 100)
    }
}

async fn warm_pool_contract(db: &TestDb) {
    let r: Arc<dyn SandboxRegistry> = db.store.registry();
    let mib = Some(64 << 20);
    let a = r.claim_warm_slot(&warm_request(1, 2, mib, T0)).await.unwrap().expect("slot 1");
    assert!(!a.ready);
    assert_eq!((a.org.as_str(), a.workspace_bytes, a.lease.epoch), ("acme", mib, 1));
    r.claim_warm_slot(&warm_request(2, 2, mib, T0)).await.unwrap().expect("slot 2");
    assert_eq!(r.claim_warm_slot(&warm_request(3, 2, mib, T0)).await.unwrap(), None, "the pool is full");
    // Another workspace quota is another pool; a lapsed provisioning slot does not count.
    assert!(r.claim_warm_slot(&warm_request(4, 1, None, T0)).await.unwrap().is_some());
    assert!(r.claim_warm_slot(&warm_request(5, 2, mib, T0 + 1_000)).await.unwrap().is_some());
    // A provision slower than its lease renews it: the slot still counts, the lease its
    // holder's at its epoch only, and only while it provisions.
    r.renew_warm_lease(&sandbox_id(2), 1, ts(T0 + 5_000), ts(T0 + 900)).await.unwrap();
    assert_eq!(r.claim_warm_slot(&warm_request(6, 2, mib, T0 + 1_500)).await.unwrap(), None, "2 renewed");
    let renewed = r.list_warm().await.unwrap().into_iter().find(|w| w.id == sandbox_id(2)).expect("slot 2");
    assert_eq!((renewed.lease.expires_at, renewed.lease.epoch), (ts(T0 + 5_000), 1));
    let stale = r.renew_warm_lease(&sandbox_id(2), 2, ts(T0 + 9_000), ts(T0 + 900)).await;
    assert!(matches!(stale, Err(RegistryError::Fenced { .. })), "{stale:?}");
    let gone = r.renew_warm_lease(&sandbox_id(99), 1, ts(T0 + 9_000), ts(T0 + 900)).await;
    assert!(matches!(gone, Err(RegistryError::Fenced { .. })), "{gone:?}");
    // Nothing provisioning is adopted.
    let cold = r.claim(&adopting("k0", 10, mib)).await.unwrap();
    assert_eq!(cold.outcome, ClaimOutcome::Created);
    assert!(matches!(r.mark_warm_ready(&sandbox_id(1), 2, ts(T0)).await, Err(RegistryError::Fenced { .. })));
    r.mark_warm_ready(&sandbox_id(1), 1, ts(T0 + 50)).await.unwrap();
    r.mark_warm_ready(&sandbox_id(4), 1, ts(T0 + 50)).await.unwrap();
    // Adoption: the warm sandbox's id, provisioning under the claimer's lease.
    let adopted = r.claim(&adopting("k1", 11, mib)).await.unwrap();
    assert_eq!(adopted.outcome, ClaimOutcome::Adopted);
    let rec = &adopted.record;
    assert_eq!((rec.id.clone(), rec.state), (sandbox_id(1), SandboxState::Provisioning));
    assert_eq!((rec.lease.holder.as_str(), rec.lease.epoch), ("replica-b", 1));
    assert_eq!((rec.durability, rec.key.clone()), (Durability::Ephemeral, session_key("acme", "k1")));
    assert_eq!(rec.created_at, ts(T0 + 100));
    assert_eq!(r.get_live(&session_key("acme", "k1")).await.unwrap().as_ref(), Some(rec));
    // The same key again: its record, no second adoption.
    assert_eq!(r.claim(&adopting("k1", 12, mib)).await.unwrap().outcome, ClaimOutcome::Existing);
    // No ready one with this quota left (4 has another quota): a new record.
    assert_eq!(r.claim(&adopting("k2", 13, mib)).await.unwrap().outcome, ClaimOutcome::Created);
    // Never across orgs.
    let beta = ClaimRequest { ..adopting("k3", 14, None) };
    let beta = ClaimRequest { key: session_key("beta", "k3"), ..beta };
    assert_eq!(r.claim(&beta).await.unwrap().outcome, ClaimOutcome::Created);
    let mine = r.claim(&adopting("k4", 15, None)).await.unwrap();
    assert_eq!((mine.outcome, mine.record.id), (ClaimOutcome::Adopted, sandbox_id(4)));
    // Under the running quota: an adoption is one more running sandbox.
    r.mark_warm_ready(&sandbox_id(2), 1, ts(T0)).await.unwrap();
    let ready = r.renew_warm_lease(&sandbox_id(2), 1, ts(T0 + 9_000), ts(T0 + 900)).await;
    assert!(
        matches!(ready, Err(RegistryError::Fenced { .. })),
        "a ready one has no lease to renew: {ready:?}"
    );
    let over = ClaimRequest { max_running: Some(1), ..adopting("k5", 16, mib) };
    assert!(matches!(r.claim(&over).await, Err(RegistryError::OverQuota { .. })));
    let warm: Vec<_> = r.list_warm().await.unwrap().into_iter().map(|w| (w.id, w.ready)).collect();
    assert_eq!(warm, [(sandbox_id(2), true), (sandbox_id(5), false)], "adopted ones left the pool");
    assert!(r.remove_warm(&sandbox_id(2)).await.unwrap());
    assert!(!r.remove_warm(&sandbox_id(2)).await.unwrap());
    assert!(!r.remove_warm(&sandbox_id(1)).await.unwrap(), "adopted: not in the pool");
}

/// How each of [`race_claims`]' claimers claims.
#[derive(Clone, Copy)]
enum Claimer {
    /// `claim` alone.
    Claim,
    /// As an ensure by the key's owner: `adopt_as_owner`, then `claim` when nothing was
    /// adopted.
    OwnerFirst,
}

/// Fills the org's pool with `pool` ready warm sandboxes, then makes 20 claims of new keys
/// at once from two replicas (each with `max_running`), and sorts the answers: the warm
/// sandboxes adopted (each at most once), how many were created, how many refused.
async fn race_claims(
    db: &TestDb,
    pool: u32,
    max_running: Option<u32>,
    claimer: Claimer,
) -> (BTreeSet<SandboxId>, usize, usize) {
    let r = db.store.registry();
    for n in 0..u128::from(pool) {
        let w = r.claim_warm_slot(&warm_request(n, pool, None, T0)).await.unwrap().unwrap();
        r.mark_warm_ready(&w.id, 1, ts(T0)).await.unwrap();
    }
    let other = db.replica().await;
    let replicas = [db.store.registry(), other.registry()];
    let start = Arc::new(tokio::sync::Barrier::new(20));
    let mut tasks = Vec::new();
    for i in 0..20u128 {
        let reg = replicas[(i % 2) as usize].clone();
        let start = start.clone();
        let req = ClaimRequest { max_running, ..adopting(&format!("key-{i}"), 100 + i, None) };
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            if let Claimer::OwnerFirst = claimer {
                match reg.adopt_as_owner(&req).await {
                    Ok(Some(record)) => return Ok(ports::Claim { record, outcome: ClaimOutcome::Adopted }),
                    Ok(None) => {}
                    Err(e) => return Err(e),
                }
            }
            reg.claim(&req).await
        }));
    }
    let (mut adopted, mut created, mut refused) = (BTreeSet::new(), 0, 0);
    for t in tasks {
        match t.await.unwrap() {
            Ok(c) if c.outcome == ClaimOutcome::Adopted => {
                assert!(adopted.insert(c.record.id), "adopted twice");
            }
            Ok(c) if c.outcome == ClaimOutcome::Created => created += 1,
            Ok(c) => panic!("unexpected {:?}", c.outcome),
            Err(RegistryError::OverQuota { .. }) => refused += 1,
            Err(e) => panic!("unexpected {e}"),
        }
    }
    other.close().await;
    (adopted, created, refused)
}

async fn concurrent_adoption_contract(db: &TestDb) {
    let (adopted, created, refused) = race_claims(db, 5, None, Claimer::Claim).await;
    assert_eq!(adopted, (0..5u128).map(sandbox_id).collect(), "each warm sandbox adopted once");
    assert_eq!((created, refused), (15, 0));
    assert!(db.store.registry().list_warm().await.unwrap().is_empty());
}

/// As [`concurrent_adoption_contract`], each claimer an owner trying its adoption first.
async fn concurrent_owner_adoption_contract(db: &TestDb) {
    let (adopted, created, refused) = race_claims(db, 5, None, Claimer::OwnerFirst).await;
    assert_eq!(adopted, (0..5u128).map(sandbox_id).collect(), "each warm sandbox adopted once");
    assert_eq!((created, refused), (15, 0));
    assert!(db.store.registry().list_warm().await.unwrap().is_empty());
}

/// Adoptions and creations of one org under its quota of running sandboxes, from two
/// replicas at once (the org's lock; on Postgres an adoption's commit does not wait for
/// the WAL flush): never past the quota, each warm sandbox adopted at most once, the rest
/// refused.
async fn concurrent_adoption_under_quota_contract(db: &TestDb) {
    let (adopted, created, refused) = race_claims(db, 6, Some(4), Claimer::Claim).await;
    assert_eq!((adopted.len(), created, refused), (4, 0, 16), "the quota of 4 held; the pool served first");
    assert_eq!(
        db.store.registry().list_warm().await.unwrap().len(),
        2,
        "the other warm sandboxes stay in the pool"
    );
}

/// As [`concurrent_adoption_under_quota_contract`], each claimer an owner trying its
/// adoption first (which never refuses: the claim after it does).
async fn concurrent_owner_adoption_under_quota_contract(db: &TestDb) {
    let (adopted, created, refused) = race_claims(db, 6, Some(4), Claimer::OwnerFirst).await;
    assert_eq!((adopted.len(), created, refused), (4, 0, 16), "the quota of 4 held; the pool served first");
    assert_eq!(db.store.registry().list_warm().await.unwrap().len(), 2);
}

/// The owner's adoption: one step records the caller as the key's owner and adopts for it.
/// Another identity's key, a key with a live record, the quota, an empty pool and a claim
/// without a pool adopt nothing, and the pool keeps what it had.
async fn owner_adoption_contract(db: &TestDb) {
    let r: Arc<dyn SandboxRegistry> = db.store.registry();
    for n in 0..3 {
        let w = r.claim_warm_slot(&warm_request(n, 3, None, T0)).await.unwrap().unwrap();
        r.mark_warm_ready(&w.id, 1, ts(T0)).await.unwrap();
    }
    let pooled = || async { r.list_warm().await.unwrap().into_iter().map(|w| w.id).collect::<Vec<_>>() };
    // No pool to adopt from: nothing is read or written.
    let unpooled = ClaimRequest { warm: None, ..adopting("k0", 10, None) };
    assert_eq!(r.adopt_as_owner(&unpooled).await.unwrap(), None);
    assert_eq!(r.owner(&unpooled.key).await.unwrap(), None);
    // A fresh key: its first ensurer owns it and adopts the oldest warm sandbox.
    let first = adopting("k1", 11, None);
    let rec = r.adopt_as_owner(&first).await.unwrap().expect("the owner adopts");
    assert_eq!((rec.id.clone(), rec.state), (sandbox_id(0), SandboxState::Provisioning));
    assert_eq!((rec.lease.holder.as_str(), rec.lease.epoch), ("replica-b", 1));
    assert_eq!((rec.key.clone(), rec.caller_id.as_str()), (first.key.clone(), "u-1"));
    assert_eq!(r.owner(&first.key).await.unwrap().unwrap().identity_id.as_str(), "u-1");
    assert_eq!(r.get_live(&first.key).await.unwrap(), Some(rec.clone()));
    assert_eq!(pooled().await, [sandbox_id(1), sandbox_id(2)]);
    // The same key again: it has its record; no second adoption.
    assert_eq!(r.adopt_as_owner(&adopting("k1", 12, None)).await.unwrap(), None);
    // Another identity's key: nothing adopted, the owner unchanged.
    let bobs = session_key("acme", "k2");
    let bob = caller("u-bob", domain::CallerClass::User);
    r.claim_owner(&bobs, &bob, ts(T0)).await.unwrap();
    assert_eq!(r.adopt_as_owner(&adopting("k2", 13, None)).await.unwrap(), None);
    assert_eq!(r.owner(&bobs).await.unwrap().unwrap().identity_id.as_str(), "u-bob");
    assert_eq!(r.get_live(&bobs).await.unwrap(), None);
    // At the org's quota (k1 runs): nothing adopted, no refusal (the claim after it refuses).
    let over = ClaimRequest { max_running: Some(1), ..adopting("k3", 14, None) };
    assert_eq!(r.adopt_as_owner(&over).await.unwrap(), None);
    assert_eq!(pooled().await, [sandbox_id(1), sandbox_id(2)]);
    // Under a quota with room (the org's lock): the owner adopts, and owns the key.
    let room = ClaimRequest { max_running: Some(5), ..adopting("k4", 15, None) };
    let rec = r.adopt_as_owner(&room).await.unwrap().expect("adopted under the quota");
    assert_eq!(rec.id, sandbox_id(1));
    assert_eq!(r.owner(&room.key).await.unwrap().unwrap().identity_id.as_str(), "u-1");
    // Another identity's key under a quota: nothing adopted either.
    let bob_over = ClaimRequest { max_running: Some(5), ..adopting("k2", 16, None) };
    assert_eq!(r.adopt_as_owner(&bob_over).await.unwrap(), None);
    // Another workspace quota matches nothing: the pool keeps its last one.
    assert_eq!(r.adopt_as_owner(&adopting("k5", 17, Some(1 << 20))).await.unwrap(), None);
    assert_eq!(pooled().await, [sandbox_id(2)]);
    // Another replica sees the owners and the adopted records.
    let replica = db.replica().await;
    assert_eq!(replica.registry().get_live(&first.key).await.unwrap().map(|r| r.id), Some(sandbox_id(0)));
    replica.close().await;
}

/// The new migration on a database that already holds sandboxes (SQLite rebuilds the
/// table for the new state): the records stay, live keys stay held, and suspension works.
async fn migration_keeps_records(url: Option<String>) {
    let data = tempfile::tempdir().unwrap();
    let backend = if url.is_some() { "postgres" } else { "sqlite" };
    let earlier = tempfile::tempdir().unwrap();
    for name in ["0001_init.sql", "0002_owners.sql"] {
        let from =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations").join(backend).join(name);
        std::fs::copy(from, earlier.path().join(name)).unwrap();
    }
    let migrator = sqlx::migrate::Migrator::new(earlier.path()).await.unwrap();
    let insert = "INSERT INTO sandboxes (id, org, kind, key, durability, state, driver, caller_id, \
                  caller_class, token_caller_id, token_caller_class, execution_id, lease_holder, \
                  lease_expires_at, lease_epoch, claim_nonce, created_at, updated_at) VALUES \
                  ($1, 'acme', 'session', $2, 'durable', $3, 'bubblewrap', 'u-1', 'user', 'u-1', 'user', \
                  'ex-1', 'a', 0, 1, $1, 10, $4)";
    let rows = [(sandbox_id(1), "s1", "ready", 20), (sandbox_id(2), "s2", "deprovisioned", 30)];
    match &url {
        Some(url) => {
            let pool = sqlx::PgPool::connect(url).await.unwrap();
            migrator.run(&pool).await.unwrap();
            for (id, key, state, at) in &rows {
                sqlx::query(insert)
                    .bind(id.as_str())
                    .bind(*key)
                    .bind(*state)
                    .bind(*at as i64)
                    .execute(&pool)
                    .await
                    .unwrap();
            }
            pool.close().await;
        }
        None => {
            let options = sqlx::sqlite::SqliteConnectOptions::new()
                .filename(data.path().join(super::super::SQLITE_FILE))
                .create_if_missing(true);
            let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
            migrator.run(&pool).await.unwrap();
            for (id, key, state, at) in &rows {
                sqlx::query(insert)
                    .bind(id.as_str())
                    .bind(*key)
                    .bind(*state)
                    .bind(*at as i64)
                    .execute(&pool)
                    .await
                    .unwrap();
            }
            pool.close().await;
        }
    }
    let store =
        super::Store::open(super::StoreOptions::new(data.path()).with_url(url.as_deref())).await.unwrap();
    let r = store.registry();
    let kept = r.get(&sandbox_id(1)).await.unwrap().unwrap();
    assert_eq!((kept.state, kept.last_active_at, kept.created_at), (SandboxState::Ready, ts(20), ts(10)));
    assert_eq!(r.get(&sandbox_id(2)).await.unwrap().unwrap().state, SandboxState::Deprovisioned);
    let again = r.claim(&claim_request(&session_key("acme", "s1"), 3, "b", T0)).await.unwrap();
    assert_eq!(
        (again.outcome, again.record.id),
        (ClaimOutcome::Existing, sandbox_id(1)),
        "the key stays held"
    );
    assert!(r.suspend(&sandbox_id(1), ts(20), ts(T0)).await.unwrap());
    assert_eq!(r.get_live(&session_key("acme", "s1")).await.unwrap().unwrap().state, SandboxState::Suspended);
    store.close().await;
}

#[tokio::test]
async fn migration_keeps_records_sqlite() {
    migration_keeps_records(None).await;
}

#[tokio::test]
async fn migration_keeps_records_postgres() {
    let Some(url) = super::fresh_postgres_url().await else { return };
    migration_keeps_records(Some(url)).await;
}

/// Ready and the ensure's audit event in one transaction: both, or (fenced) neither.
async fn ready_and_audited_contract(db: &TestDb) {
    let r = db.store.registry();
    let audit = db.store.audit();
    let key = session_key("acme", "both");
    let claimed = r.claim(&claim_request(&key, 1, "replica-a", T0)).await.unwrap();
    let mut event = super::event("acme", 2);
    event.key = key.clone();
    event.sandbox_id = Some(claimed.record.id.clone());
    let g = grant("jti-1", "u-1", T0 + 900_000);
    // A stale epoch: nothing is written, the event neither.
    assert!(matches!(
        r.mark_ready_audited(&sandbox_id(1), 2, &g, &event, ts(T0 + 1)).await,
        Err(RegistryError::Fenced { .. })
    ));
    assert_eq!(audit.verify().await.unwrap().rows, 0, "no audit row for a fenced move");
    let ready = r.mark_ready_audited(&sandbox_id(1), 1, &g, &event, ts(T0 + 2)).await.unwrap();
    assert_eq!((ready.state, ready.last_active_at), (SandboxState::Ready, ts(T0 + 2)));
    let report = audit.verify().await.unwrap();
    assert!(report.is_intact());
    assert_eq!(report.rows, 1);
    // It pages like any appended event.
    let start = std::time::Instant::now();
    loop {
        let page = audit.page(&org("acme"), 0, 10).await.unwrap();
        if let Some(entry) = page.entries.first() {
            assert_eq!(entry.event, event);
            break;
        }
        assert!(start.elapsed() < std::time::Duration::from_secs(10), "the event never paged");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(matches!(
        r.mark_ready_audited(&sandbox_id(1), 1, &g, &event, ts(T0 + 3)).await,
        Err(RegistryError::Fenced { .. })
    ));
    assert_eq!(audit.verify().await.unwrap().rows, 1, "a second move writes nothing");
}

/// The idle and lifetime passes read only their candidates: `list_idle` the ready records
/// last active at or before the cut-off (least recently active first), `list_created_before`
/// the ready and suspended ones created at or before it (oldest first). Neither returns a
/// provisioning, failed or deprovisioned record; `ready_ids` lists the ready ones' ids,
/// `ready_ids_since` those changed since a time.
async fn pass_candidates_contract(db: &TestDb) {
    let r: Arc<dyn SandboxRegistry> = db.store.registry();
    let ids =
        |records: Vec<domain::sandbox::SandboxRecord>| records.into_iter().map(|x| x.id).collect::<Vec<_>>();
    // 1..=4 created at T0 + 0, 10, 20, 30; 1..=3 made ready (activity at T0 + 100 + n).
    for n in 1..=4u128 {
        let at = T0 + 10 * (n as i64 - 1);
        r.claim(&claim_request(&session_key("acme", &format!("k{n}")), n, "replica-a", at)).await.unwrap();
    }
    for n in 1..=3u128 {
        let at = T0 + 100 + n as i64;
        r.mark_ready(&sandbox_id(n), 1, &grant(&format!("jti-{n}"), "u-1", T0 + 900_000), ts(at))
            .await
            .unwrap();
    }
    // 1 is active again later than 2 and 3; 3 is suspended; 4 is still provisioning.
    // One batch: 1 moves on, 2's older report leaves it, 4 (provisioning) moves on.
    r.touch(&[(sandbox_id(1), ts(T0 + 500)), (sandbox_id(2), ts(T0 + 50)), (sandbox_id(4), ts(T0 + 700))])
        .await
        .unwrap();
    let registry = &r;
    let active = |n: u128| async move { registry.get(&sandbox_id(n)).await.unwrap().unwrap().last_active_at };
    assert_eq!(
        (active(1).await, active(2).await, active(4).await),
        (ts(T0 + 500), ts(T0 + 102), ts(T0 + 700))
    );
    assert!(r.suspend(&sandbox_id(3), ts(T0 + 103), ts(T0 + 600)).await.unwrap());

    assert_eq!(ids(r.list_idle(ts(T0 + 101)).await.unwrap()), Vec::<SandboxId>::new());
    assert_eq!(ids(r.list_idle(ts(T0 + 102)).await.unwrap()), vec![sandbox_id(2)], "at the cut-off counts");
    assert_eq!(ids(r.list_idle(ts(T0 + 10_000)).await.unwrap()), vec![sandbox_id(2), sandbox_id(1)]);

    assert_eq!(ids(r.list_created_before(ts(T0 - 1)).await.unwrap()), Vec::<SandboxId>::new());
    assert_eq!(ids(r.list_created_before(ts(T0 + 10)).await.unwrap()), vec![sandbox_id(1), sandbox_id(2)]);
    assert_eq!(
        ids(r.list_created_before(ts(T0 + 10_000)).await.unwrap()),
        vec![sandbox_id(1), sandbox_id(2), sandbox_id(3)],
        "ready and suspended, never provisioning"
    );
    let ready_ids = || async { r.ready_ids().await.unwrap().into_iter().collect::<BTreeSet<_>>() };
    assert_eq!(ready_ids().await, BTreeSet::from([sandbox_id(1), sandbox_id(2)]), "the egress scan's ids");
    // Between full listings, the scan reads the ready ones changed since its last pass.
    let since = |at: i64| async move {
        registry.ready_ids_since(ts(at)).await.unwrap().into_iter().collect::<BTreeSet<_>>()
    };
    assert_eq!(since(T0).await, BTreeSet::from([sandbox_id(1), sandbox_id(2)]));
    let recent = since(T0 + 102).await;
    assert!(recent.contains(&sandbox_id(2)), "made ready at the cut-off: {recent:?}");
    assert!(!recent.contains(&sandbox_id(3)) && !recent.contains(&sandbox_id(4)), "{recent:?}");
    assert_eq!(since(T0 + 100_000).await, BTreeSet::new(), "nothing changed since");
    r.mark_deprovisioned(&sandbox_id(1), ts(T0 + 700)).await.unwrap();
    assert_eq!(ready_ids().await, BTreeSet::from([sandbox_id(2)]));
    assert_eq!(ids(r.list_idle(ts(T0 + 10_000)).await.unwrap()), vec![sandbox_id(2)]);
    assert_eq!(
        ids(r.list_created_before(ts(T0 + 10_000)).await.unwrap()),
        vec![sandbox_id(2), sandbox_id(3)]
    );
}
