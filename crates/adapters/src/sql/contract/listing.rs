//! Contract test of an org's listing (`SandboxRegistry::list_org`, the console's list), on
//! both databases: thousands of records read a page at a time, each once and in id order,
//! with its key's owner; another org's never; ended records only when asked.

use std::sync::Arc;

use domain::{CallerClass, IdentityId, SandboxId, SandboxState};
use ports::{OrgListing, SandboxRegistry};

use super::{GRACE, TestDb, caller, claim_request, org, postgres, session_key, sqlite, ts};

on_both!(org_listing, GRACE, org_listing_contract);

async fn org_listing_contract(db: &TestDb) {
    let r: Arc<dyn SandboxRegistry> = db.store.registry();
    let t0 = 1_796_000_000_000;
    // 2,500 sandboxes in acme, with one of globex's after every 25th; every 10th failed,
    // every 7th key owned by a service.
    let mut acme = Vec::new();
    for n in 1..=2_600u128 {
        let globex = n % 26 == 0;
        let key = session_key(if globex { "globex" } else { "acme" }, &format!("s-{n}"));
        let claim = r.claim(&claim_request(&key, n, "replica-a", t0)).await.unwrap();
        if globex {
            continue;
        }
        let class = if acme.len() % 7 == 0 { CallerClass::Service } else { CallerClass::User };
        r.claim_owner(&key, &caller(&format!("owner-{n}"), class), ts(t0)).await.unwrap();
        let ended = acme.len() % 10 == 9;
        if ended {
            r.mark_failed(&claim.record.id, 1, "boom", ts(t0 + 1)).await.unwrap();
        }
        acme.push((claim.record.id, n, class, ended));
    }
    assert_eq!(acme.len(), 2_500);

    for ended in [false, true] {
        let want: Vec<&SandboxId> = acme.iter().filter(|a| ended || !a.3).map(|a| &a.0).collect();
        let mut seen = Vec::new();
        let mut after = None;
        loop {
            let listing = OrgListing { org: org("acme"), after: after.clone(), limit: 1_000, ended };
            let page = r.list_org(&listing).await.unwrap();
            for (record, owner) in &page {
                let (_, n, class, was_ended) = acme.iter().find(|a| a.0 == record.id).expect("acme's only");
                let owner = owner.as_ref().expect("every key has its owner");
                assert_eq!(owner.identity_id, IdentityId::parse(format!("owner-{n}")).unwrap());
                assert_eq!(owner.class, *class);
                let state = if *was_ended { SandboxState::Failed } else { SandboxState::Provisioning };
                assert_eq!(record.state, state);
            }
            seen.extend(page.iter().map(|(r, _)| r.id.clone()));
            if page.len() < 1_000 {
                break;
            }
            after = page.last().map(|(r, _)| r.id.clone());
        }
        assert_eq!(seen.iter().collect::<Vec<_>>(), want, "every record once, in id order (ended: {ended})");
    }

    // A page after the last id is empty; an org with nothing lists nothing.
    let last = acme.last().map(|a| a.0.clone());
    let listing = OrgListing { org: org("acme"), after: last, limit: 10, ended: true };
    assert!(r.list_org(&listing).await.unwrap().is_empty());
    let listing = OrgListing { org: org("initech"), after: None, limit: 10, ended: true };
    assert!(r.list_org(&listing).await.unwrap().is_empty());
}
