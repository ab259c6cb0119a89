//! Contract tests of the snapshot records (issue 36), on both databases: insert, read,
//! list by owner, delete, usage, and the org's quota checked in the insert, also when two
//! replicas insert at once.

use std::sync::Arc;

use domain::{IdentityId, SandboxId, SandboxKey, SessionId, Snapshot, SnapshotId, SnapshotName};
use ports::{SnapshotLimits, SnapshotStore, SnapshotStoreError, SnapshotUsage};

use super::{GRACE, TestDb, org, postgres, sqlite, ts};

on_both!(snapshots, GRACE, snapshots_contract);
on_both!(snapshots_quota_race, GRACE, snapshots_quota_race_contract);

fn snapshot(n: u128, owner: &str, bytes: u64) -> Snapshot {
    let acme = org("acme");
    Snapshot {
        id: SnapshotId::generate(1_000, n),
        source: SandboxId::generate(900, n),
        source_key: SandboxKey::Session { org: acme.clone(), session_id: SessionId::parse("s-1").unwrap() },
        org: acme,
        owner: IdentityId::parse(owner).unwrap(),
        created_by: IdentityId::parse("svc").unwrap(),
        name: (n == 1).then(|| SnapshotName::parse("before").unwrap()),
        created_at: ts(5),
        bytes,
    }
}

const NONE: SnapshotLimits = SnapshotLimits { max_count: None, max_bytes: None, max_from_source: None };

async fn snapshots_contract(db: &TestDb) {
    let s: Arc<dyn SnapshotStore> = db.store.snapshots();
    let acme = org("acme");
    let (a, b) = (snapshot(1, "alice", 100), snapshot(2, "bob", 50));
    s.insert(&a, NONE).await.unwrap();
    s.insert(&b, NONE).await.unwrap();
    assert_eq!(s.get(&acme, &a.id).await.unwrap(), Some(a.clone()), "the record round-trips");
    assert_eq!(s.get(&org("beta"), &a.id).await.unwrap(), None, "another org sees nothing");
    assert_eq!(s.list(&acme, None).await.unwrap(), vec![a.clone(), b.clone()]);
    assert_eq!(s.list(&acme, Some(IdentityId::parse("bob").unwrap())).await.unwrap(), vec![b.clone()]);
    assert_eq!(s.usage(&acme).await.unwrap(), SnapshotUsage { count: 2, bytes: 150 });
    let c = snapshot(3, "alice", 1);
    let full = SnapshotLimits { max_count: Some(2), max_bytes: None, max_from_source: None };
    assert_eq!(
        s.insert(&c, full).await,
        Err(SnapshotStoreError::OverQuota(SnapshotUsage { count: 2, bytes: 150 }))
    );
    let bytes = SnapshotLimits { max_count: None, max_bytes: Some(150), max_from_source: None };
    assert!(matches!(s.insert(&c, bytes).await, Err(SnapshotStoreError::OverQuota(_))));
    assert_eq!(s.get(&acme, &c.id).await.unwrap(), None, "nothing written over the quota");
    assert!(s.delete(&acme, &a.id).await.unwrap());
    assert!(!s.delete(&acme, &a.id).await.unwrap());
    s.insert(&c, bytes).await.unwrap();
    assert_eq!(s.usage(&acme).await.unwrap(), SnapshotUsage { count: 2, bytes: 51 });
    // At most so many of one source (a token's), counted where it is written.
    let per_source = SnapshotLimits { max_from_source: Some(2), ..NONE };
    let of_b = |n: u128| Snapshot { id: SnapshotId::generate(2_000, n), ..b.clone() };
    s.insert(&of_b(1), per_source).await.unwrap();
    assert_eq!(s.insert(&of_b(2), per_source).await, Err(SnapshotStoreError::SourceCap), "b and one more");
    assert_eq!(s.get(&acme, &of_b(2).id).await.unwrap(), None, "nothing written over it");
    s.insert(&snapshot(4, "alice", 1), per_source).await.expect("another source is not counted");
    assert_eq!(s.usage(&org("beta")).await.unwrap(), SnapshotUsage::default());
}

/// Two replicas insert 20 snapshots each at once under a quota of 10: exactly 10 land.
async fn snapshots_quota_race_contract(db: &TestDb) {
    let other = db.replica().await;
    let stores: [Arc<dyn SnapshotStore>; 2] = [db.store.snapshots(), other.snapshots()];
    let limits = SnapshotLimits { max_count: Some(10), max_bytes: None, max_from_source: None };
    let mut tasks = Vec::new();
    for n in 0..40u128 {
        let store = stores[(n % 2) as usize].clone();
        tasks.push(tokio::spawn(async move { store.insert(&snapshot(100 + n, "alice", 1), limits).await }));
    }
    let mut landed = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(()) => landed += 1,
            Err(SnapshotStoreError::OverQuota(_)) => {}
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(landed, 10);
    assert_eq!(stores[0].usage(&org("acme")).await.unwrap().count, 10);
}
