//! Contract tests of the webhooks' store (issue 39), on both databases: the secret sealed
//! and opened, the cursor starting at the org's last audit event and moving only forward,
//! one delivery per audit seq whichever replica queues it, a delivery leased by one
//! replica at a time (also when two lease at once), attempts recorded, the list, removal;
//! a key rotation seals the secret again; no org takes more than its share of a lease
//! (less what it has under way, so an older backlog never crowds another org out),
//! nothing is queued for a webhook removed (or set again) meanwhile, and one unreadable
//! delivery does not hold the others back; ended deliveries are pruned past their
//! retention, pending ones never, and a pruned one is never queued again.

use std::collections::HashSet;
use std::sync::Arc;

use domain::SecretValue;
use ports::{AttemptResult, DeliveryStatus, NewDelivery, WebhookStore};

use super::{GRACE, TestDb, event, org, postgres, sqlite, ts};

on_both!(webhooks, GRACE, webhooks_contract);
on_both!(webhooks_lease_race, GRACE, webhooks_lease_race_contract);
on_both!(webhooks_fairness, GRACE, webhooks_fairness_contract);
on_both!(webhooks_prune, GRACE, webhooks_prune_contract);

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
    let page = w.deliveries(&acme, Some(listed[0].audit_seq), 10).await.unwrap();
    assert_eq!(page.iter().map(|d| d.audit_seq).collect::<Vec<_>>(), [before + 1], "before a given seq");
    let page = w.deliveries(&acme, Some(before + 2), 1).await.unwrap();
    assert_eq!(page.len(), 1, "up to the limit");
    assert!(w.deliveries(&org("beta"), None, 10).await.unwrap().is_empty(), "another org sees none");

    // Leased: with the secret opened; not again while the lease lasts.
    let due = w.lease_due(ts(3_000), ts(33_000), 10, 10, &[]).await.unwrap();
    assert_eq!(due.len(), 2);
    assert_eq!(due[0].secret.expose(), secret.expose());
    assert_eq!(due[0].url, "https://hooks.example.com/in");
    assert!(
        w.lease_due(ts(4_000), ts(34_000), 10, 10, &[]).await.unwrap().is_empty(),
        "leased: not handed out twice"
    );
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
    assert!(
        w.lease_due(ts(9_999), ts(40_000), 10, 10, &[]).await.unwrap().is_empty(),
        "not due before its time"
    );
    let again = w.lease_due(ts(10_000), ts(40_000), 10, 10, &[]).await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].record.attempts, 1);
    assert_eq!(again[0].record.last_status, Some(503));
    // A lapsed lease (its replica died, or its attempt outlasted it) is taken by another;
    // the first holder's late attempt is then not recorded, the second's is.
    let retaken = w.lease_due(ts(40_001), ts(70_000), 10, 10, &[]).await.unwrap();
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
    assert!(w.lease_due(ts(80_000), ts(90_000), 10, 10, &[]).await.unwrap().is_empty());
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
        let (x, y) = tokio::join!(
            a.lease_due(ts(100), ts(100_000), 3, 10, &[]),
            b.lease_due(ts(100), ts(100_000), 3, 10, &[])
        );
        for d in x.unwrap().into_iter().chain(y.unwrap()) {
            assert!(seen.insert(d.record.id.clone()), "{} leased twice (round {round})", d.record.id);
        }
    }
    assert_eq!(seen.len(), 40, "every delivery leased once");
    other.close().await;
}

async fn webhooks_fairness_contract(db: &TestDb) {
    let w: Arc<dyn WebhookStore> = db.store.webhooks();
    let (acme, beta, gone) = (org("acme"), org("beta"), org("gone"));
    let secret = SecretValue::new("whsec_c2VjcmV0");
    w.set(&acme, "http://acme.example.com/", &secret, ts(1)).await.unwrap();
    w.set(&beta, "http://beta.example.com/", &secret, ts(1)).await.unwrap();
    // acme's backlog is older than beta's one delivery: beta still gets a place.
    for seq in 1..=6 {
        w.enqueue(&acme, &[delivery(seq)], seq, ts(1 + seq)).await.unwrap();
    }
    w.enqueue(&beta, &[delivery(7)], 7, ts(10)).await.unwrap();
    let due = w.lease_due(ts(100), ts(1_000), 10, 2, &[]).await.unwrap();
    // (Handed out in no given order.)
    let seqs = |due: &[ports::DueDelivery]| {
        let mut seqs: Vec<(String, i64)> =
            due.iter().map(|d| (d.record.org.as_str().to_owned(), d.record.audit_seq)).collect();
        seqs.sort();
        seqs
    };
    let of = |org: &str, seq: i64| (org.to_owned(), seq);
    assert_eq!(seqs(&due), [of("acme", 1), of("acme", 2), of("beta", 7)], "acme's two oldest, and beta's");
    // Once those lapse: acme has its share under way already (a receiver that hangs), so
    // its older backlog takes none of the places, and beta's newer delivery gets one.
    let busy = [(acme.clone(), 2)];
    let due = w.lease_due(ts(1_001), ts(1_100), 2, 2, &busy).await.unwrap();
    assert_eq!(seqs(&due), [of("beta", 7)], "nothing more of acme's while its share is under way");
    let due = w.lease_due(ts(1_101), ts(1_200), 2, 2, &[(acme.clone(), 1)]).await.unwrap();
    assert_eq!(seqs(&due), [of("acme", 1), of("beta", 7)], "one of acme's, with one under way");

    // A replica that read a webhook before its removal queues nothing after it.
    w.set(&gone, "http://gone.example.com/", &secret, ts(1)).await.unwrap();
    assert!(w.remove(&gone, ts(4)).await.unwrap());
    w.enqueue(&gone, &[delivery(8)], 8, ts(5)).await.unwrap();
    assert!(w.deliveries(&gone, None, 10).await.unwrap().is_empty(), "nothing queued for a removed webhook");
    // Nor, once it is set again, the events from before the new set.
    let first = db.store.audit().append(&event("gone", 2)).await.unwrap();
    let last = db.store.audit().append(&event("gone", 4)).await.unwrap();
    w.set(&gone, "http://gone.example.com/", &secret, ts(6)).await.unwrap();
    w.enqueue(&gone, &[delivery(first), delivery(last)], last, ts(7)).await.unwrap();
    assert!(
        w.deliveries(&gone, None, 10).await.unwrap().is_empty(),
        "the events before the set are not owed"
    );

    // A delivery whose secret does not open is skipped; the others are handed out.
    super::with_pool!(write db.store.backend(), p => {
        sqlx::query("UPDATE webhooks SET sealed = $1 WHERE org = 'beta'").bind(vec![0u8; 8]).execute(p).await.map(|_| ())
    })
    .unwrap();
    w.enqueue(&beta, &[delivery(9)], 9, ts(8)).await.unwrap();
    let due = w.lease_due(ts(2_000), ts(3_000), 10, 10, &[]).await.unwrap();
    assert_eq!(
        seqs(&due),
        (1..=6).map(|n| of("acme", n)).collect::<Vec<_>>(),
        "acme's go out; beta's are skipped"
    );
    // A URL set over acme's: what acme is owed goes to the new one, with the new secret.
    let moved = SecretValue::new("whsec_bW92ZWQ=");
    w.set(&acme, "http://acme-moved.example.com/", &moved, ts(3_500)).await.unwrap();
    let due = w.lease_due(ts(4_000), ts(4_500), 10, 10, &[]).await.unwrap();
    assert_eq!(seqs(&due), (1..=6).map(|n| of("acme", n)).collect::<Vec<_>>(), "still owed after the move");
    assert!(
        due.iter().all(|d| d.url == "http://acme-moved.example.com/" && d.secret.expose() == moved.expose()),
        "to the new URL, signed with the new secret"
    );

    // A delivery left without its webhook (queued by a server before this check) is
    // given up when it comes due, not leased again and again.
    super::with_pool!(write db.store.backend(), p => {
        sqlx::query(
            "INSERT INTO webhook_deliveries (id, org, audit_seq, event_type, payload, status, attempts, \
             next_attempt_at, lease_until, created_at, updated_at) \
             VALUES ('msg_orphan', 'orphan', 1, 'sandbox.ready', '{}', 'pending', 0, 0, 0, 0, 0)",
        )
        .execute(p)
        .await
        .map(|_| ())
    })
    .unwrap();
    let due = w.lease_due(ts(5_000), ts(6_000), 10, 10, &[]).await.unwrap();
    assert!(due.iter().all(|d| d.record.id != "msg_orphan"));
    let orphan = w.deliveries(&org("orphan"), None, 10).await.unwrap();
    assert_eq!(orphan.len(), 1);
    assert_eq!(orphan[0].status, DeliveryStatus::Failed);
}

async fn webhooks_prune_contract(db: &TestDb) {
    let w: Arc<dyn WebhookStore> = db.store.webhooks();
    let acme = org("acme");
    let secret = SecretValue::new("whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0");
    w.set(&acme, "https://hooks.example.com/in", &secret, ts(1_000)).await.unwrap();
    let base = w.list().await.unwrap()[0].cursor;
    let seqs: Vec<i64> = (1..=5).map(|n| base + n).collect();
    let made: Vec<NewDelivery> = seqs.iter().map(|s| delivery(*s)).collect();
    w.enqueue(&acme, &made, base + 5, ts(2_000)).await.unwrap();
    let due = w.lease_due(ts(3_000), ts(33_000), 10, 10, &[]).await.unwrap();
    assert_eq!(due.len(), 5);
    // Three end (two delivered, one given up) at 5,000, 6,000 and 7,000; one is to be
    // tried again; one is left leased.
    let ended =
        |status, at| AttemptResult { status, next_attempt_at: ts(at), http_status: Some(200), error: None };
    let by_seq = |seq: i64| due.iter().find(|d| d.record.audit_seq == seq).unwrap().record.id.clone();
    for (seq, status, at) in [
        (seqs[0], DeliveryStatus::Delivered, 5_000),
        (seqs[1], DeliveryStatus::Failed, 6_000),
        (seqs[2], DeliveryStatus::Delivered, 7_000),
        (seqs[3], DeliveryStatus::Pending, 4_000),
    ] {
        assert!(w.record_attempt(&by_seq(seq), ts(33_000), &ended(status, at), ts(at)).await.unwrap());
    }

    assert_eq!(w.prune(ts(5_000), 10).await.unwrap(), 0, "nothing ended before 5,000");
    assert_eq!(w.prune(ts(100_000), 1).await.unwrap(), 1, "up to the limit, oldest first");
    let left = |w: Arc<dyn WebhookStore>| {
        let acme = acme.clone();
        async move {
            let mut seqs: Vec<i64> =
                w.deliveries(&acme, None, 10).await.unwrap().iter().map(|d| d.audit_seq).collect();
            seqs.sort_unstable();
            seqs
        }
    };
    assert_eq!(left(w.clone()).await, seqs[1..].to_vec(), "the oldest ended one went first");
    assert_eq!(w.prune(ts(6_500), 10).await.unwrap(), 1, "the one given up at 6,000");
    assert_eq!(w.prune(ts(100_000), 10).await.unwrap(), 1, "the one delivered at 7,000");
    assert_eq!(left(w.clone()).await, seqs[3..].to_vec(), "pending deliveries stay, leased or not");
    // A page that goes on from a pruned delivery's seq still lists the older ones left.
    let page = w.deliveries(&acme, Some(seqs[4] + 1), 1).await.unwrap();
    let after_pruned = w.deliveries(&acme, Some(seqs[2]), 10).await.unwrap();
    assert_eq!((page.len(), after_pruned.len()), (1, 0), "nothing below the pruned ones but them");
    let from_pruned = w.deliveries(&acme, Some(seqs[4]), 10).await.unwrap();
    assert_eq!(from_pruned.iter().map(|d| d.audit_seq).collect::<Vec<_>>(), [seqs[3]]);
    assert_eq!(w.prune(ts(i64::MAX), 10).await.unwrap(), 0);

    // A pruned delivery's event read again (a replica behind, or the same page again) is
    // not queued again: it is behind the cursor.
    w.enqueue(&acme, &made, base + 5, ts(200_000)).await.unwrap();
    assert_eq!(left(w.clone()).await, seqs[3..].to_vec(), "nothing pruned comes back");
}
