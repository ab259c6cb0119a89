//! Contract tests of the webhooks' store (issue 39), on both databases: the secret sealed
//! and opened, the cursor starting at the org's last audit event and moving only forward,
//! one delivery per audit seq whichever replica queues it, a delivery leased by one
//! replica at a time (also when two lease at once), attempts recorded, the list, removal;
//! a key rotation seals the secret again.

use std::collections::HashSet;
use std::sync::Arc;

use domain::SecretValue;
use ports::{AttemptResult, DeliveryStatus, NewDelivery, WebhookStore};

use super::{GRACE, TestDb, event, org, postgres, sqlite, ts};

on_both!(webhooks, GRACE, webhooks_contract);
on_both!(webhooks_lease_race, GRACE, webhooks_lease_race_contract);

fn delivery(seq: i64) -> NewDelivery {
    NewDelivery {
        id: format!("msg_{seq}"),
        audit_seq: seq,
        event_type: "sandbox.ready".into(),
        payload: format!("{{\"seq\":{seq}}}"),
    }
}

async fn webhooks_contract(db: &TestDb) {
    let w: Arc<dyn WebhookStore> = db.store.webhooks();
    let acme = org("acme");
    // Events before the webhook is set are not delivered: the cursor starts past them.
    let before = db.store.audit().append(&event("acme", 2)).await.unwrap();
    let secret = SecretValue::new("whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0");
    w.set(&acme, "https://hooks.example.com/in", &secret, ts(1_000)).await.unwrap();
    let hooks = w.list().await.unwrap();
    assert_eq!(hooks.len(), 1);
    assert_eq!((hooks[0].url.as_str(), hooks[0].cursor), ("https://hooks.example.com/in", before));
    // The secret is sealed: not in the row as written.
    let raw: Vec<(Vec<u8>,)> = super::with_pool!(read db.store.backend(), p => {
        sqlx::query_as("SELECT sealed FROM webhooks").fetch_all(p).await
    })
    .unwrap();
    assert!(!String::from_utf8_lossy(&raw[0].0).contains("c2VjcmV0"), "the secret is sealed at rest");
    // A key rotation seals it again and keeps the key it needs (it opens below).
    let rotation = db.store.secret_store().rotate_key().await.unwrap();
    assert_eq!(rotation.resealed, 0, "no brokered secret here; the webhook's is resealed beside them");
    let kid: Vec<(String,)> = super::with_pool!(read db.store.backend(), p => {
        sqlx::query_as("SELECT key_id FROM webhooks").fetch_all(p).await
    })
    .unwrap();
    assert_eq!(kid[0].0, rotation.key_id, "sealed under the new key");

    // Queued twice (two replicas read the same events): one row each.
    w.enqueue(&acme, &[delivery(before + 1), delivery(before + 2)], before + 2, ts(2_000)).await.unwrap();
    w.enqueue(&acme, &[delivery(before + 1), delivery(before + 2)], before + 2, ts(2_001)).await.unwrap();
    // The cursor never goes back.
    w.enqueue(&acme, &[], before, ts(2_002)).await.unwrap();
    assert_eq!(w.list().await.unwrap()[0].cursor, before + 2);
    let listed = w.deliveries(&acme, None, 10).await.unwrap();
    assert_eq!(
        listed.iter().map(|d| d.audit_seq).collect::<Vec<_>>(),
        [before + 2, before + 1],
        "newest first"
    );
    assert!(listed.iter().all(|d| d.status == DeliveryStatus::Pending && d.attempts == 0));
    let page = w.deliveries(&acme, Some(listed[0].id.clone()), 10).await.unwrap();
    assert_eq!(page.iter().map(|d| d.audit_seq).collect::<Vec<_>>(), [before + 1], "before a given id");
    assert!(w.deliveries(&org("beta"), None, 10).await.unwrap().is_empty(), "another org sees none");

    // Leased: with the secret opened; not again while the lease lasts.
    let due = w.lease_due(ts(3_000), ts(33_000), 10).await.unwrap();
    assert_eq!(due.len(), 2);
    assert_eq!(due[0].secret.expose(), secret.expose());
    assert_eq!(due[0].url, "https://hooks.example.com/in");
    assert!(w.lease_due(ts(4_000), ts(34_000), 10).await.unwrap().is_empty(), "leased: not handed out twice");
    // A failed attempt: pending again at its time, lease freed.
    let retry = AttemptResult {
        status: DeliveryStatus::Pending,
        next_attempt_at: ts(10_000),
        http_status: Some(503),
        error: Some("the receiver answered 503".into()),
    };
    assert!(w.record_attempt(&due[0].record.id, ts(33_000), &retry, ts(5_000)).await.unwrap());
    let delivered = AttemptResult {
        status: DeliveryStatus::Delivered,
        next_attempt_at: ts(5_000),
        http_status: Some(204),
        error: None,
    };
    assert!(w.record_attempt(&due[1].record.id, ts(33_000), &delivered, ts(5_000)).await.unwrap());
    assert!(w.lease_due(ts(9_999), ts(40_000), 10).await.unwrap().is_empty(), "not due before its time");
    let again = w.lease_due(ts(10_000), ts(40_000), 10).await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].record.attempts, 1);
    assert_eq!(again[0].record.last_status, Some(503));
    // A lapsed lease (its replica died, or its attempt outlasted it) is taken by another;
    // the first holder's late attempt is then not recorded, the second's is.
    let retaken = w.lease_due(ts(40_001), ts(70_000), 10).await.unwrap();
    assert_eq!(retaken.len(), 1, "a lapsed lease is taken again");
    assert_eq!(retaken[0].record.id, again[0].record.id);
    let late = AttemptResult { status: DeliveryStatus::Delivered, ..delivered.clone() };
    assert!(
        !w.record_attempt(&again[0].record.id, ts(40_000), &late, ts(41_000)).await.unwrap(),
        "the lapsed holder's attempt is not recorded"
    );
    let id = again[0].record.id.clone();
    let listed = w.deliveries(&acme, None, 10).await.unwrap();
    let kept = listed.iter().find(|d| d.id == id).unwrap();
    assert_eq!((kept.status, kept.attempts), (DeliveryStatus::Pending, 1), "left as it was");
    assert!(w.record_attempt(&id, ts(70_000), &retry, ts(42_000)).await.unwrap());
    let listed = w.deliveries(&acme, None, 10).await.unwrap();
    assert_eq!(listed.iter().find(|d| d.id == id).unwrap().attempts, 2, "the holder's attempt is");

    // Removal gives up what is pending and stops leasing.
    assert!(w.remove(&acme, ts(50_000)).await.unwrap());
    assert!(!w.remove(&acme, ts(50_001)).await.unwrap());
    assert!(w.list().await.unwrap().is_empty());
    assert!(w.lease_due(ts(80_000), ts(90_000), 10).await.unwrap().is_empty());
    let statuses: Vec<DeliveryStatus> =
        w.deliveries(&acme, None, 10).await.unwrap().iter().map(|d| d.status).collect();
    assert!(statuses.contains(&DeliveryStatus::Failed) && statuses.contains(&DeliveryStatus::Delivered));
}

async fn webhooks_lease_race_contract(db: &TestDb) {
    let acme = org("acme");
    let secret = SecretValue::new("whsec_c2VjcmV0");
    db.store.webhooks().set(&acme, "http://hooks.example.com/", &secret, ts(1)).await.unwrap();
    let many: Vec<NewDelivery> = (1..=40).map(delivery).collect();
    db.store.webhooks().enqueue(&acme, &many, 40, ts(2)).await.unwrap();
    // Two replicas lease at once, in rounds: every delivery goes to exactly one.
    let other = db.replica().await;
    let (a, b) = (db.store.webhooks(), other.webhooks());
    let mut seen = HashSet::new();
    for round in 0..10 {
        let (x, y) = tokio::join!(a.lease_due(ts(100), ts(100_000), 3), b.lease_due(ts(100), ts(100_000), 3));
        for d in x.unwrap().into_iter().chain(y.unwrap()) {
            assert!(seen.insert(d.record.id.clone()), "{} leased twice (round {round})", d.record.id);
        }
    }
    assert_eq!(seen.len(), 40, "every delivery leased once");
    other.close().await;
}
