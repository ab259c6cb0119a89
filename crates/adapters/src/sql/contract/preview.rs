//! Contract tests of the preview links (issue 37), on both databases: insert, find by the
//! token's digest, list by sandbox and port, revoke once, and a revocation seen by another
//! replica's next read.

use std::sync::Arc;

use domain::preview::token_digest;
use domain::{CallerClass, IdentityId, PreviewLink, PreviewLinkId, SandboxCaller, SandboxId, Timestamp};
use ports::PreviewLinkStore;

use super::{GRACE, TestDb, org, postgres, sqlite, ts};

on_both!(preview_links, GRACE, preview_links_contract);

fn link(n: u128, port: u16) -> PreviewLink {
    PreviewLink {
        id: PreviewLinkId::generate(1_000, n),
        org: org("acme"),
        sandbox: SandboxId::generate(900, 1),
        port,
        created_by: SandboxCaller::from_record(IdentityId::parse("alice").unwrap(), CallerClass::User),
        created_at: ts(5),
        expires_at: ts(3605),
        revoked_at: None,
        token_sha256: token_digest(&format!("token-{n}")),
    }
}

async fn preview_links_contract(db: &TestDb) {
    let s: Arc<dyn PreviewLinkStore> = db.store.preview_links();
    let other = db.replica().await.preview_links();
    let acme = org("acme");
    let (a, b) = (link(1, 3000), link(2, 8080));
    s.insert(&a).await.unwrap();
    s.insert(&b).await.unwrap();
    assert_eq!(s.by_token(&token_digest("token-1")).await.unwrap(), Some(a.clone()), "round-trips");
    assert_eq!(s.by_token(&token_digest("nope")).await.unwrap(), None);
    assert_eq!(s.get(&acme, &a.id).await.unwrap(), Some(a.clone()));
    assert_eq!(s.get(&org("beta"), &a.id).await.unwrap(), None, "another org sees nothing");
    assert_eq!(s.list(&acme, &a.sandbox, None).await.unwrap(), vec![a.clone(), b.clone()]);
    assert_eq!(s.list(&acme, &a.sandbox, Some(8080)).await.unwrap(), vec![b.clone()]);
    assert_eq!(s.list(&acme, &SandboxId::generate(900, 2), None).await.unwrap(), vec![]);
    let at = Timestamp::from_unix_millis(7_000);
    assert!(s.revoke(&acme, &a.id, at).await.unwrap());
    assert!(!s.revoke(&acme, &a.id, at).await.unwrap(), "revoked once");
    assert!(!s.revoke(&org("beta"), &b.id, at).await.unwrap(), "not another org's");
    let seen = other.by_token(&token_digest("token-1")).await.unwrap().unwrap();
    assert_eq!(seen.revoked_at, Some(at), "another replica's next read sees the revocation");
    assert_eq!(other.by_token(&token_digest("token-2")).await.unwrap().unwrap().revoked_at, None);
}
