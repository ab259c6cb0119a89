use proptest::prelude::*;

use super::*;
use crate::IdentityId;

const DOMAIN: &str = "preview.localhost";

fn sandbox(n: u128) -> SandboxId {
    SandboxId::generate(1_700_000_000_000, n)
}

#[test]
fn a_host_names_a_port_of_a_sandbox() {
    let id = sandbox(7);
    let host = format!("3000-{}.preview.localhost:7878", label(&id));
    assert_eq!(PreviewHost::route(&host, DOMAIN), Some(Ok(PreviewHost { port: 3000, sandbox: id.clone() })));
    assert_eq!(PreviewHost::route(&host.to_ascii_uppercase(), DOMAIN).unwrap().unwrap().sandbox, id);
    assert!(label(&id).starts_with("sbx-") && label(&id) == label(&id).to_ascii_lowercase());
}

#[test]
fn other_hosts_are_not_previews() {
    assert_eq!(PreviewHost::route("127.0.0.1:7878", DOMAIN), None);
    assert_eq!(PreviewHost::route("localhost", DOMAIN), None);
    assert_eq!(PreviewHost::route("preview.localhost", DOMAIN), None);
    assert_eq!(PreviewHost::route("[::1]:7878", DOMAIN), None);
    assert_eq!(PreviewHost::route("xpreview.localhost", DOMAIN), None);
}

#[test]
fn malformed_preview_hosts_are_refused() {
    let l = label(&sandbox(1));
    for bad in [
        "x.preview.localhost".to_owned(),
        format!("-{l}.preview.localhost"),
        format!("0-{l}.preview.localhost"),
        format!("080-{l}.preview.localhost"),
        format!("70000-{l}.preview.localhost"),
        format!("3000-{}.preview.localhost", l.replace("sbx-", "sbx_")),
        "3000-sbx-zz.preview.localhost".to_owned(),
        format!("a.3000-{l}.preview.localhost"),
    ] {
        assert!(matches!(PreviewHost::route(&bad, DOMAIN), Some(Err(_))), "{bad}");
    }
}

#[test]
fn the_proxy_port_and_zero_are_never_open() {
    assert!(!port_open(0));
    assert!(!port_open(crate::egress::PROXY_PORT));
    assert!(port_open(3000));
}

fn link(expires: i64) -> PreviewLink {
    PreviewLink {
        id: PreviewLinkId::generate(1, 1),
        org: OrgId::parse("acme").unwrap(),
        sandbox: sandbox(1),
        port: 3000,
        created_by: SandboxCaller::from_record(IdentityId::parse("alice").unwrap(), crate::CallerClass::User),
        created_at: Timestamp::from_unix_millis(0),
        expires_at: Timestamp::from_unix_millis(expires),
        revoked_at: None,
        token_sha256: token_digest("t"),
    }
}

#[test]
fn a_link_opens_its_host_until_it_expires_or_is_revoked() {
    let l = link(1000);
    let now = Timestamp::from_unix_millis(999);
    assert_eq!(l.admits(&l.host(), now), Ok(()));
    assert_eq!(l.admits(&l.host(), Timestamp::from_unix_millis(1000)), Err(LinkRefusal::Expired));
    let other_port = PreviewHost { port: 3001, sandbox: l.sandbox.clone() };
    assert_eq!(l.admits(&other_port, now), Err(LinkRefusal::OtherHost));
    let other_sandbox = PreviewHost { port: 3000, sandbox: sandbox(2) };
    assert_eq!(l.admits(&other_sandbox, now), Err(LinkRefusal::OtherHost));
    let revoked = PreviewLink { revoked_at: Some(now), ..l };
    assert_eq!(revoked.admits(&revoked.host(), now), Err(LinkRefusal::Revoked));
}

proptest! {
    /// Every sandbox's every port round-trips through its host name, whatever the case and
    /// the port of the `Host` header.
    #[test]
    fn hosts_round_trip(ms in 0u64..(1 << 48), random in any::<u128>(), port in 1u16.., listen in any::<u16>()) {
        let host = PreviewHost { port, sandbox: SandboxId::generate(ms, random) };
        let name = host.name(DOMAIN);
        prop_assert_eq!(PreviewHost::route(&name, DOMAIN), Some(Ok(host.clone())));
        prop_assert_eq!(PreviewHost::route(&format!("{}:{listen}", name.to_ascii_uppercase()), DOMAIN), Some(Ok(host)));
    }

    /// Arbitrary host names never panic the parser, and whatever it accepts names itself.
    #[test]
    fn arbitrary_hosts_never_panic(first in "[a-zA-Z0-9_.:-]{0,64}") {
        let host = format!("{first}.{DOMAIN}");
        if let Some(Ok(parsed)) = PreviewHost::route(&host, DOMAIN) {
            prop_assert_eq!(parsed.name(DOMAIN), host.to_ascii_lowercase().split(':').next().unwrap_or_default().to_owned());
        }
    }
}
