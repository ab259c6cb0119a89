//! Contract tests of the terminal tickets (issue 37), on both databases: a ticket is taken
//! once and only once (also by two replicas at once), never after it expired, and only by
//! its digest.

use std::sync::Arc;

use domain::{CallerClass, IdentityId, SandboxId, TerminalId};
use ports::{TerminalTickets, TicketGrant};

use super::{GRACE, TestDb, org, postgres, sqlite, ts};

on_both!(tickets, GRACE, tickets_contract);
on_both!(tickets_race, GRACE, tickets_race_contract);

fn grant(n: u128, expires: i64) -> TicketGrant {
    TicketGrant {
        org: org("acme"),
        sandbox: SandboxId::generate(900, n),
        terminal: TerminalId::generate(1_000, n),
        identity: IdentityId::parse("alice").unwrap(),
        class: CallerClass::User,
        expires_at: ts(expires),
    }
}

async fn tickets_contract(db: &TestDb) {
    let t: Arc<dyn TerminalTickets> = db.store.terminal_tickets();
    let g = grant(1, 60);
    t.insert([1; 32], &g, ts(0)).await.unwrap();
    assert_eq!(t.take([2; 32], ts(1)).await.unwrap(), None, "another digest takes nothing");
    assert_eq!(t.take([1; 32], ts(1)).await.unwrap(), Some(g.clone()), "the grant round-trips");
    assert_eq!(t.take([1; 32], ts(1)).await.unwrap(), None, "a ticket is taken once");
    t.insert([3; 32], &grant(3, 60), ts(0)).await.unwrap();
    assert_eq!(t.take([3; 32], ts(60)).await.unwrap(), None, "not once it expired");
    assert_eq!(t.take([3; 32], ts(10)).await.unwrap(), None, "and an expired take removed it");
    let service = TicketGrant { class: CallerClass::Service, ..grant(4, 90) };
    t.insert([4; 32], &service, ts(0)).await.unwrap();
    // A later insert forgets the tickets expired by then.
    t.insert([5; 32], &grant(5, 200), ts(100)).await.unwrap();
    assert_eq!(t.take([4; 32], ts(50)).await.unwrap(), None, "forgotten once expired");
    assert_eq!(t.take([5; 32], ts(150)).await.unwrap(), Some(grant(5, 200)));
}

/// Two replicas take the same 20 tickets at once: each is taken exactly once.
async fn tickets_race_contract(db: &TestDb) {
    let other = db.replica().await;
    let stores: [Arc<dyn TerminalTickets>; 2] = [db.store.terminal_tickets(), other.terminal_tickets()];
    for n in 0..20u8 {
        stores[0].insert([n; 32], &grant(u128::from(n), 60), ts(0)).await.unwrap();
    }
    let mut tasks = Vec::new();
    for n in 0..40u8 {
        let store = stores[usize::from(n % 2)].clone();
        tasks.push(tokio::spawn(async move { store.take([n / 2; 32], ts(1)).await.unwrap().is_some() }));
    }
    let mut taken = 0;
    for task in tasks {
        taken += usize::from(task.await.unwrap());
    }
    assert_eq!(taken, 20);
}
