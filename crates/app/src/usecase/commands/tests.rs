use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use domain::{OrgId, SandboxId, Timestamp};
use ports::{Clock, MockQuotaLeases, PolicyStoreError, QuotaLeases};

use super::*;
use crate::test_support::NOW;

/// Leases as the store keeps them (the SQL adapters pass the same contract): one row per
/// scope and holder; a grant never takes the scope's leases past the limit.
#[derive(Default)]
struct MemLeases {
    rows: Mutex<HashMap<(String, String), u32>>,
    calls: Mutex<usize>,
    down: std::sync::atomic::AtomicBool,
}

#[async_trait]
impl QuotaLeases for MemLeases {
    async fn lease(
        &self,
        scope: &str,
        holder: &str,
        want: u32,
        limit: u32,
        _now: Timestamp,
        _ttl_ms: i64,
    ) -> Result<u32, PolicyStoreError> {
        *self.calls.lock().unwrap() += 1;
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(PolicyStoreError::Store("connection refused".into()));
        }
        let mut rows = self.rows.lock().unwrap();
        let others: u32 = rows.iter().filter(|((s, h), _)| s == scope && h != holder).map(|(_, n)| *n).sum();
        let granted = want.min(limit.saturating_sub(others));
        rows.insert((scope.to_owned(), holder.to_owned()), granted);
        Ok(granted)
    }
}

struct Fixed;

impl Clock for Fixed {
    fn now(&self) -> Timestamp {
        Timestamp::from_unix_millis(NOW)
    }
}

fn gate(leases: Arc<dyn QuotaLeases>, holder: &str) -> Arc<CommandGate> {
    Arc::new(CommandGate::new(leases, Arc::new(Fixed), holder))
}

fn acme() -> OrgId {
    OrgId::parse("acme").unwrap()
}

fn sbx(n: u128) -> SandboxId {
    SandboxId::generate(1, n)
}

#[tokio::test]
async fn without_a_quota_nothing_is_counted_or_asked() {
    let mut leases = MockQuotaLeases::new();
    leases.expect_lease().never();
    let g = gate(Arc::new(leases), "a");
    let permits: Vec<_> = futures_permits(&g, 50, None, None).await;
    assert_eq!(permits.len(), 50);
}

async fn futures_permits(
    g: &Arc<CommandGate>,
    n: usize,
    org: Option<u32>,
    per: Option<u32>,
) -> Vec<CommandPermit> {
    let mut out = Vec::new();
    for i in 0..n {
        out.push(g.admit(&acme(), &sbx(i as u128), org, per).await.unwrap());
    }
    out
}

#[tokio::test]
async fn two_replicas_share_the_orgs_quota_and_slots_come_back() {
    let store = Arc::new(MemLeases::default());
    let (a, b) = (gate(store.clone(), "a"), gate(store.clone(), "b"));
    let one = a.admit(&acme(), &sbx(1), Some(3), None).await.unwrap();
    let two = a.admit(&acme(), &sbx(2), Some(3), None).await.unwrap();
    let three = b.admit(&acme(), &sbx(3), Some(3), None).await.unwrap();
    let refused = b.admit(&acme(), &sbx(4), Some(3), None).await.unwrap_err();
    assert_eq!(refused, CommandRefusal::Org { org: acme(), limit: 3 });
    assert!(a.admit(&acme(), &sbx(5), Some(3), None).await.is_err(), "the cluster runs 3 already");
    // A command ends: its slot is this replica's to reuse at once, without the store.
    drop(one);
    let calls = *store.calls.lock().unwrap();
    let again = a.admit(&acme(), &sbx(6), Some(3), None).await.unwrap();
    assert_eq!(*store.calls.lock().unwrap(), calls, "reused from the lease");
    // Both of A's end; its heartbeat gives back all but one spare, so B can run one more.
    drop((two, again));
    a.heartbeat().await;
    let four = b.admit(&acme(), &sbx(7), Some(3), None).await.unwrap();
    assert!(b.admit(&acme(), &sbx(8), Some(3), None).await.is_err(), "A still holds a spare");
    drop((three, four));
}

#[tokio::test]
async fn the_sandbox_quota_is_checked_after_the_orgs_and_gives_its_place_back() {
    let store = Arc::new(MemLeases::default());
    let g = gate(store.clone(), "a");
    let first = g.admit(&acme(), &sbx(1), Some(5), Some(1)).await.unwrap();
    let refused = g.admit(&acme(), &sbx(1), Some(5), Some(1)).await.unwrap_err();
    assert_eq!(refused, CommandRefusal::Sandbox { sandbox: sbx(1), limit: 1 });
    // The refused command did not keep an org place: four more fit in other sandboxes.
    let others = futures_permits_from(&g, 2..6, Some(5), Some(1)).await;
    assert_eq!(others.len(), 4);
    drop(first);
    assert!(g.admit(&acme(), &sbx(1), Some(5), Some(1)).await.is_ok());
}

async fn futures_permits_from(
    g: &Arc<CommandGate>,
    range: std::ops::Range<u128>,
    org: Option<u32>,
    per: Option<u32>,
) -> Vec<CommandPermit> {
    let mut out = Vec::new();
    for i in range {
        out.push(g.admit(&acme(), &sbx(i), org, per).await.unwrap());
    }
    out
}

#[tokio::test]
async fn a_store_that_cannot_answer_refuses_what_needs_it_and_stops_admitting_beyond_what_runs() {
    let store = Arc::new(MemLeases::default());
    let g = gate(store.clone(), "a");
    let held = g.admit(&acme(), &sbx(1), Some(4), None).await.unwrap();
    let second = g.admit(&acme(), &sbx(2), Some(4), None).await.unwrap();
    drop(second); // a spare slot in the lease
    store.down.store(true, std::sync::atomic::Ordering::SeqCst);
    g.heartbeat().await; // cannot renew: from now on, only what runs is held
    let refused = g.admit(&acme(), &sbx(3), Some(4), None).await.unwrap_err();
    assert!(matches!(refused, CommandRefusal::Store(_)), "{refused:?}");
    drop(held);
}

#[tokio::test]
async fn concurrent_admissions_on_one_replica_never_pass_the_limit() {
    let store = Arc::new(MemLeases::default());
    let g = gate(store, "a");
    let mut tasks = Vec::new();
    for i in 0..20u128 {
        let g = g.clone();
        tasks.push(tokio::spawn(async move { g.admit(&acme(), &sbx(i), Some(7), None).await.ok() }));
    }
    let mut held = Vec::new();
    for t in tasks {
        held.extend(t.await.unwrap());
    }
    assert_eq!(held.len(), 7);
}
