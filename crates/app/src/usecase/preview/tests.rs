//! The preview use cases against mocks: a link is audited before it is stored (and not
//! made when its event cannot be written), sandbox tokens make no links, a revoked or
//! expired link and the lane's own ports never reach the driver, and the opening of a link
//! is audited naming its creator.

use std::sync::Arc;

use domain::{CallerClass, IdentityId, SandboxCaller};
use ports::MockPreviewLinkStore;

use super::*;
use crate::test_support::{
    CALLER_ID, Mocks, actor, agent_execution_key, existing_ready, key_owner, org, recording_audit,
};

fn sandbox() -> SandboxId {
    SandboxId::generate(1, 7)
}

fn link(revoked: bool, expires_at: i64) -> PreviewLink {
    PreviewLink {
        id: PreviewLinkId::generate(1, 1),
        org: org(),
        sandbox: sandbox(),
        port: 3000,
        created_by: SandboxCaller::from_record(IdentityId::parse("creator").unwrap(), CallerClass::User),
        created_at: Timestamp::from_unix_millis(0),
        expires_at: Timestamp::from_unix_millis(expires_at),
        revoked_at: revoked.then(|| Timestamp::from_unix_millis(1)),
        token_sha256: token_digest("token"),
    }
}

fn host(port: u16) -> PreviewHost {
    PreviewHost { port, sandbox: sandbox() }
}

fn owned_sandbox() -> Mocks {
    let mut m = Mocks::new(true);
    m.first_ensurer_owns(Some(CALLER_ID));
    m.reads_sandbox(existing_ready(agent_execution_key(), &sandbox()), Some(CALLER_ID));
    m
}

#[tokio::test]
async fn a_link_whose_event_cannot_be_written_is_not_made() {
    let mut m = owned_sandbox();
    m.audit.expect_append().returning(|_| Err(ports::AuditError::Store(ports::Cause::msg("down"))));
    let mut store = MockPreviewLinkStore::new();
    store.expect_insert().times(0);
    let mut deps = m.deps();
    deps.preview_links = Arc::new(store);
    let got = create_link(&deps, &actor(CallerClass::User), &org(), &sandbox(), 3000, None).await;
    assert!(matches!(got, Err(PreviewError::Audit(_))), "{got:?}");
}

#[tokio::test]
async fn a_link_is_made_audited_naming_its_creator_with_only_its_tokens_digest_kept() {
    let mut m = owned_sandbox();
    let events = recording_audit(&mut m.audit);
    let kept = Arc::new(std::sync::Mutex::new(None));
    let mut store = MockPreviewLinkStore::new();
    let sink = kept.clone();
    store.expect_insert().times(1).returning(move |l| {
        *sink.lock().unwrap() = Some(l.clone());
        Ok(())
    });
    let mut deps = m.deps();
    deps.preview_links = Arc::new(store);
    let made =
        create_link(&deps, &actor(CallerClass::User), &org(), &sandbox(), 3000, Some(600)).await.unwrap();
    let stored = kept.lock().unwrap().clone().unwrap();
    assert_eq!(stored.token_sha256, token_digest(&made.token));
    assert_eq!(stored.expires_at.unix_millis() - stored.created_at.unix_millis(), 600_000);
    let events = events.lock().unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].action, AuditAction::PreviewLinkCreate);
    assert_eq!(events[0].caller_id.as_str(), CALLER_ID);
    assert!(!events[0].message.contains(&made.token), "no token in the audit log");
}

#[tokio::test]
async fn sandbox_tokens_make_no_links_and_ttls_are_bounded() {
    let deps = owned_sandbox().deps();
    let token = Actor::SandboxToken {
        org: org(),
        sandbox_id: sandbox(),
        subject: IdentityId::parse(CALLER_ID).unwrap(),
    };
    let got = create_link(&deps, &token, &org(), &sandbox(), 3000, None).await;
    assert!(matches!(got, Err(PreviewError::Access(AccessError::Denied(_)))), "{got:?}");
    let got = create_link(&deps, &actor(CallerClass::User), &org(), &sandbox(), 3000, Some(10)).await;
    assert!(matches!(got, Err(PreviewError::Invalid(_))), "{got:?}");
    let got = create_link(&deps, &actor(CallerClass::User), &org(), &sandbox(), 3128, None).await;
    assert!(matches!(got, Err(PreviewError::PortClosed(3128))), "{got:?}");
}

#[tokio::test]
async fn revoked_expired_and_other_hosts_links_never_reach_the_driver() {
    for (stored, at, want) in [
        (link(true, i64::MAX), host(3000), LinkRefusal::Revoked),
        (link(false, 10), host(3000), LinkRefusal::Expired),
        (link(false, i64::MAX), host(3001), LinkRefusal::OtherHost),
    ] {
        let mut m = Mocks::new(true);
        m.driver.expect_open_port().times(0);
        let mut store = MockPreviewLinkStore::new();
        store.expect_by_token().returning(move |_| Ok(Some(stored.clone())));
        let mut deps = m.deps();
        deps.preview_links = Arc::new(store);
        let got = open_with_link(&deps, "token", &at).await;
        assert!(matches!(got, Err(PreviewError::Link(r)) if r == want), "{got:?}");
        let got = trade_token(&deps, "token", &at).await;
        assert!(matches!(got, Err(PreviewError::Link(r)) if r == want), "{got:?}");
    }
}

#[tokio::test]
async fn the_lanes_own_port_is_refused_before_anything_is_read() {
    let mut m = Mocks::new(true);
    m.registry.expect_get().times(0);
    m.driver.expect_open_port().times(0);
    let deps = m.deps();
    let got = open_as(&deps, &actor(CallerClass::Service), &host(domain::egress::PROXY_PORT)).await;
    assert!(matches!(got, Err(PreviewError::PortClosed(_))), "{got:?}");
    let got = open_with_link(&deps, "token", &host(domain::egress::PROXY_PORT)).await;
    assert!(matches!(got, Err(PreviewError::PortClosed(_))), "{got:?}");
}

/// The lane's ports for trading the token of a standing link of a ready sandbox, with
/// `audit` as the audit log.
fn trading(audit: impl FnOnce(&mut ports::MockAuditLog)) -> LaneDeps {
    let mut m = Mocks::new(true);
    m.directory.expect_is_revoked().returning(|_| Ok(false));
    audit(&mut m.audit);
    let record = existing_ready(agent_execution_key(), &sandbox());
    m.registry.expect_get().returning(move |_| Ok(Some(record.clone())));
    let mut store = MockPreviewLinkStore::new();
    store.expect_by_token().returning(|_| Ok(Some(link(false, i64::MAX))));
    let mut deps = m.deps();
    deps.preview_links = Arc::new(store);
    deps
}

#[tokio::test]
async fn a_links_opening_is_audited_naming_its_creator() {
    let mut events = None;
    let deps = trading(|audit| events = Some(recording_audit(audit)));
    trade_token(&deps, "token", &host(3000)).await.unwrap();
    let events = events.unwrap();
    let events = events.lock().unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!((events[0].action, events[0].caller_id.as_str()), (AuditAction::PreviewLinkOpen, "creator"));
}

#[tokio::test]
async fn a_links_opening_the_audit_log_cannot_take_gives_no_cookie() {
    let deps = trading(|audit| {
        audit.expect_append().returning(|_| Err(ports::AuditError::Store(ports::Cause::msg("down"))));
    });
    let got = trade_token(&deps, "token", &host(3000)).await;
    assert!(matches!(got, Err(PreviewError::Audit(_))), "{got:?}");
}

#[tokio::test]
async fn opening_as_a_caller_reads_the_record_once_and_exec_s_rule_decides() {
    // The key's owner: one read of the record (with its owner), then the port.
    let mut m = Mocks::new(true);
    m.registry.expect_get().times(0);
    m.registry.expect_get_with_owner().times(1).returning(|_| {
        Ok(Some((existing_ready(agent_execution_key(), &sandbox()), Some(key_owner(CALLER_ID)))))
    });
    m.registry.expect_touch().returning(|_| Ok(()));
    m.driver
        .expect_open_port()
        .times(1)
        .returning(|_, _| Err(DriverError::Invalid("nothing listens".into())));
    let got = open_as(&m.deps(), &actor(CallerClass::User), &host(3000)).await;
    assert!(matches!(got, Err(PreviewError::PortClosed(3000))), "the owner reaches the port: {got:?}");

    // Another user of the org: refused as exec would be, before the port.
    let mut m = Mocks::new(true);
    m.reads_sandbox(existing_ready(agent_execution_key(), &sandbox()), Some("someone-else"));
    m.driver.expect_open_port().times(0);
    let got = open_as(&m.deps(), &actor(CallerClass::User), &host(3000)).await;
    assert!(matches!(got, Err(PreviewError::Access(AccessError::Denied(_)))), "{got:?}");

    // No such sandbox.
    let mut m = Mocks::new(true);
    m.registry.expect_get_with_owner().returning(|_| Ok(None));
    m.driver.expect_open_port().times(0);
    let got = open_as(&m.deps(), &actor(CallerClass::Service), &host(3000)).await;
    assert!(matches!(got, Err(PreviewError::NoSandbox(_))), "{got:?}");
}

#[tokio::test]
async fn a_link_whose_creator_was_revoked_opens_nothing() {
    let mut m = Mocks::new(true);
    m.directory.expect_is_revoked().withf(|who| who.as_str() == "creator").returning(|_| Ok(true));
    m.driver.expect_open_port().times(0);
    m.audit.expect_append().times(0);
    let mut store = MockPreviewLinkStore::new();
    store.expect_by_token().returning(|_| Ok(Some(link(false, i64::MAX))));
    let mut deps = m.deps();
    deps.preview_links = Arc::new(store);
    let got = open_with_link(&deps, "token", &host(3000)).await;
    assert!(matches!(got, Err(PreviewError::Link(LinkRefusal::CreatorRevoked))), "{got:?}");
    let got = trade_token(&deps, "token", &host(3000)).await;
    assert!(matches!(got, Err(PreviewError::Link(LinkRefusal::CreatorRevoked))), "{got:?}");
}

#[tokio::test]
async fn a_caller_of_another_org_learns_nothing_of_a_sandbox_by_its_preview_host() {
    let mut m = Mocks::new(true);
    m.reads_sandbox(existing_ready(agent_execution_key(), &sandbox()), Some(CALLER_ID));
    m.driver.expect_open_port().times(0);
    let deps = m.deps();
    let stranger = Actor::Caller(
        domain::CallerIdentity::from_wire(
            IdentityId::parse("stranger").unwrap(),
            CallerClass::Service,
            vec![OrgId::parse("other-org").unwrap()],
            None,
        )
        .unwrap(),
    );
    let got = open_as(&deps, &stranger, &host(3000)).await;
    assert!(matches!(got, Err(PreviewError::NoSandbox(_))), "not a 403 naming the org: {got:?}");
}

/// A sandbox's port that never answers.
struct Silent;

impl PortStream for Silent {
    fn poll_read(
        &mut self,
        _: &mut std::task::Context<'_>,
        _: &mut [u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::task::Poll::Pending
    }
    fn poll_write(
        &mut self,
        _: &mut std::task::Context<'_>,
        _: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::task::Poll::Pending
    }
    fn poll_flush(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn poll_shutdown(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

#[tokio::test]
async fn a_sandbox_holds_at_most_its_cap_of_preview_connections_here() {
    let mut m = Mocks::new(true);
    m.registry.expect_get_with_owner().returning(|_| {
        Ok(Some((existing_ready(agent_execution_key(), &sandbox()), Some(key_owner(CALLER_ID)))))
    });
    m.registry.expect_touch().returning(|_| Ok(()));
    let mut opens = mockall::Sequence::new();
    // The first open fails (nothing listens yet), then the port answers: three opens reach
    // the driver in all, never the one past the cap.
    m.driver
        .expect_open_port()
        .times(1)
        .in_sequence(&mut opens)
        .returning(|_, _| Err(DriverError::Unavailable(ports::Cause::msg("nothing listens yet"))));
    m.driver
        .expect_open_port()
        .times(2)
        .in_sequence(&mut opens)
        .returning(|_, _| Ok(Box::new(Silent) as Box<dyn PortStream>));
    let mut deps = m.deps();
    deps.streams.max_preview_connections_per_sandbox = 1;
    let user = actor(CallerClass::User);

    let got = open_as(&deps, &user, &host(3000)).await;
    assert!(matches!(got, Err(PreviewError::Unreachable { .. })), "{got:?}");
    assert_eq!(deps.previews.held(&sandbox()), 0, "a failed open gives its place back");

    let first = open_as(&deps, &user, &host(3000)).await.expect("the first connection");
    let (stream, held, _) = first.into_parts();
    drop(stream);
    assert_eq!(deps.previews.held(&sandbox()), 1, "the place lives with what the relay holds");
    let got = open_as(&deps, &user, &host(3001)).await;
    assert!(
        matches!(&got, Err(PreviewError::Busy { limit: 1, sandbox_id }) if *sandbox_id == sandbox()),
        "one past the cap, on any port, is refused before the driver is asked: {got:?}"
    );

    drop(held);
    let again = open_as(&deps, &user, &host(3000)).await;
    assert!(again.is_ok(), "the place given back is taken again: {again:?}");
}

#[test]
fn link_visitors_leave_a_quarter_of_the_places_to_callers() {
    let link = Standing::Link { token: "t".into(), host: host(3000) };
    let caller = Standing::Caller(IdentityId::parse(CALLER_ID).unwrap());
    assert_eq!((places_for(&caller, 64), places_for(&link, 64)), (64, 48));
    assert_eq!((places_for(&caller, 1), places_for(&link, 1)), (1, 1), "a cap of one is shared");
    assert_eq!(places_for(&link, 0), 0);
    assert_eq!(places_for(&link, 4), 3);
}
