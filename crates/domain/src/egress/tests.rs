use std::net::IpAddr;

use proptest::prelude::*;

use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn host_rules_cover_names_and_ports() {
    let exact = HostRule::new(false, "api.example.com", Some(443));
    assert!(exact.covers("api.example.com", 443));
    assert!(!exact.covers("api.example.com", 80));
    assert!(!exact.covers("x.api.example.com", 443));
    let any_port = HostRule::new(false, "Example.COM.", None);
    assert!(any_port.covers("example.com", 1));
    let wild = HostRule::new(true, "example.com", None);
    assert!(wild.covers("a.example.com", 80));
    assert!(wild.covers("a.b.example.com", 80));
    assert!(!wild.covers("example.com", 80), "a wildcard covers names under it, not itself");
    assert!(!wild.covers("badexample.com", 80), "a suffix must start at a label");
    assert!(!wild.covers("example.com.evil.net", 80));
    assert_eq!(wild.to_string(), "*.example.com");
    assert_eq!(exact.to_string(), "api.example.com:443");
}

#[test]
fn wildcard_rules_cover_whole_subtrees() {
    let wild = HostRule::new(true, "example.com", Some(443));
    assert!(wild.covers_all_under("example.com", 443));
    assert!(wild.covers_all_under("api.example.com", 443));
    assert!(!wild.covers_all_under("example.com", 80));
    assert!(!wild.covers_all_under("badexample.com", 443));
    assert!(!wild.covers_all_under("com", 443));
    assert!(!HostRule::new(false, "example.com", None).covers_all_under("example.com", 443));
    let list = Allowlist::new(vec![wild], vec![]);
    assert_eq!(list.allows_all_under("a.example.com", 443).as_deref(), Some("*.example.com:443"));
    assert_eq!(list.allows_all_under("example.org", 443), None);
}

#[test]
fn default_refused_ranges() {
    for refused in [
        "127.0.0.1",
        "127.8.9.10",
        "10.1.2.3",
        "172.16.0.1",
        "172.31.255.255",
        "192.168.1.1",
        "169.254.169.254",
        "100.64.0.1",
        "100.127.255.255",
        "224.0.0.1",
        "239.1.1.1",
        "0.0.0.0",
        "0.1.2.3",
        "255.255.255.255",
        "240.0.0.1",
        "::1",
        "::",
        "fe80::1",
        "fc00::1",
        "fd12::1",
        "ff02::1",
        "::ffff:127.0.0.1",
        "::ffff:10.0.0.1",
        "::ffff:169.254.169.254",
        "::127.0.0.1",
        "64:ff9b::a00:1",
        "2002:7f00:1::",
        // RFC 8215 local-use NAT64, whatever IPv4 address it carries.
        "64:ff9b:1::",
        "64:ff9b:1::101:101",
        "64:ff9b:1:ffff:ffff:ffff:ffff:ffff",
        // RFC 2928 IETF protocol assignments: Teredo, benchmarking, ORCHID...
        "2001::1",
        "2001:0:4136:e378:8000:63bf:3fff:fdd2",
        "2001:2::1",
        "2001:20::1",
        "2001:1ff:ffff:ffff:ffff:ffff:ffff:ffff",
        // Documentation ranges (RFC 5737, 3849, 9637).
        "192.0.2.1",
        "198.51.100.7",
        "203.0.113.255",
        "2001:db8::1",
        "2001:db8:ffff::1",
        "3fff::1",
        "3fff:fff:ffff::1",
    ] {
        assert!(refused_range(ip(refused)).is_some(), "{refused} should be refused");
    }
    // Positive controls: public addresses pass.
    for public in [
        "1.1.1.1",
        "8.8.8.8",
        "100.63.255.255",
        "100.128.0.0",
        "172.32.0.1",
        "2606:4700::1111",
        "::ffff:1.1.1.1",
        // Just outside the IPv6 special-purpose blocks.
        "64:ff9b:2::1",
        "64:ff9a:1::1",
        "2001:200::1",
        "2000:ffff::1",
        "64:ff9b::101:101",
        // Just outside the documentation ranges.
        "192.0.3.1",
        "198.51.101.1",
        "203.0.112.1",
        "2001:db9::1",
        "3fff:1000::1",
        "3ffe:ffff::1",
    ] {
        assert_eq!(refused_range(ip(public)), None, "{public} should pass");
    }
}

#[test]
fn an_allowlist_names_ranges_explicitly() {
    let empty = Allowlist::default();
    assert!(empty.is_empty());
    assert_eq!(empty.allows_host("example.com", 443), None);
    assert!(empty.allows_address(ip("127.0.0.1"), 80).is_err());
    assert!(empty.allows_address(ip("1.1.1.1"), 80).is_ok());
    let list = Allowlist::new(
        vec![HostRule::new(false, "localhost", Some(8080))],
        vec![RangeRule::new(AddressRange::parse("127.0.0.0/8").unwrap(), None)],
    );
    assert_eq!(list.allows_host("localhost", 8080).as_deref(), Some("localhost:8080"));
    assert!(list.allows_host("localhost", 8081).is_none());
    assert!(list.allows_address(ip("127.0.0.1"), 8080).is_ok());
    assert!(list.allows_address(ip("::ffff:127.0.0.1"), 1).is_ok(), "the mapped form of a named range");
    assert_eq!(list.allows_address(ip("10.0.0.1"), 1), Err("private (10/8, 172.16/12, 192.168/16)"));
    assert!(list.allows_address(ip("::1"), 1).is_err(), "an IPv4 range does not name ::1");
    // An address literal is covered by a range rule, on its port.
    let db = Allowlist::new(
        Vec::new(),
        vec![RangeRule::new(AddressRange::parse("10.1.0.0/16").unwrap(), Some(5432))],
    );
    assert!(!db.is_empty());
    assert_eq!(db.allows_host("10.1.2.3", 5432).as_deref(), Some("10.1.0.0/16:5432"));
    assert_eq!(db.allows_host("10.1.2.3", 22), None);
    assert_eq!(db.allows_host("10.2.0.1", 5432), None);
    assert!(db.allows_address(ip("10.1.2.3"), 5432).is_ok());
    assert!(db.allows_address(ip("10.1.2.3"), 22).is_err(), "a range rule names its port only");
}

#[test]
fn ranges_parse_strictly() {
    assert_eq!(AddressRange::parse("10.0.0.0/8").unwrap().to_string(), "10.0.0.0/8");
    assert_eq!(AddressRange::parse("fd00::/8").unwrap().to_string(), "fd00::/8");
    assert!(AddressRange::parse("0.0.0.0/0").unwrap().contains(ip("8.8.8.8")));
    for bad in ["10.0.0.1/8", "10.0.0.0", "10.0.0.0/33", "x/8", "10.0.0.0/", "10.0.0.0/+8", "::/129"] {
        assert!(AddressRange::parse(bad).is_err(), "{bad}");
    }
    assert!(!AddressRange::parse("0.0.0.0/0").unwrap().contains(ip("::1")));
}

#[test]
fn hosts_normalize() {
    assert_eq!(normalize_host("Example.COM.").unwrap(), "example.com");
    assert_eq!(normalize_host("[::1]").unwrap(), "::1");
    assert_eq!(normalize_host("127.0.0.1").unwrap(), "127.0.0.1");
    for bad in ["", "a..b", "a b", "exa%mple.com", "é.com", "a/b", "[::1"] {
        assert!(normalize_host(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn the_proxy_environment_names_the_loopback_port() {
    let vars = proxy_vars();
    assert!(vars.iter().any(|(k, v)| *k == "HTTPS_PROXY" && v.ends_with(&format!(":{PROXY_PORT}"))));
    assert!(vars.iter().any(|(k, _)| *k == "no_proxy"));
}

proptest! {
    /// A range holds exactly the addresses that share its prefix bits.
    #[test]
    fn range_membership_is_the_prefix(a in any::<u32>(), b in any::<u32>(), prefix in 0u8..=32) {
        let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
        let network = std::net::Ipv4Addr::from(a & mask);
        let range = AddressRange::parse(&format!("{network}/{prefix}")).unwrap();
        prop_assert_eq!(range.contains(IpAddr::V4(b.into())), (a & mask) == (b & mask));
    }

    /// Every IPv4-mapped address is refused exactly when its IPv4 address is.
    #[test]
    fn mapped_addresses_follow_their_ipv4(a in any::<u32>()) {
        let v4 = std::net::Ipv4Addr::from(a);
        prop_assert_eq!(
            refused_range(IpAddr::V6(v4.to_ipv6_mapped())).is_some(),
            refused_range(IpAddr::V4(v4)).is_some()
        );
    }

    /// Every address of 64:ff9b:1::/48 and of 2001::/23 is refused, naming its block; the
    /// blocks beside them are not (they hold global unicast addresses).
    #[test]
    fn the_ipv6_special_purpose_blocks_are_refused_whole(low in any::<u128>()) {
        let in_block = |prefix: u128, len: u32| IpAddr::V6((prefix | (low >> len)).into());
        let nat64 = in_block(0x0064_ff9b_0001_u128 << 80, 48);
        prop_assert_eq!(refused_range(nat64), Some("local-use NAT64 (64:ff9b:1::/48)"));
        let ietf = in_block(0x2001_u128 << 112, 23);
        prop_assert_eq!(refused_range(ietf), Some("IETF protocol assignments (2001::/23)"));
        // 64:ff9b:2::/48 and 2001:200::/23, the blocks that follow.
        prop_assert_eq!(refused_range(in_block(0x0064_ff9b_0002_u128 << 80, 48)), None);
        prop_assert_eq!(refused_range(in_block(0x2001_0200_u128 << 96, 23)), None);
        // Refused unless named: a range rule covering the block lets it through.
        let named = Allowlist::new(
            Vec::new(),
            vec![
                RangeRule::new(AddressRange::parse("64:ff9b:1::/48").unwrap(), None),
                RangeRule::new(AddressRange::parse("2001::/23").unwrap(), Some(443)),
            ],
        );
        prop_assert!(named.allows_address(nat64, 80).is_ok());
        prop_assert!(named.allows_address(ietf, 443).is_ok());
        prop_assert!(named.allows_address(ietf, 80).is_err(), "the rule names port 443 only");
        prop_assert!(Allowlist::default().allows_address(nat64, 80).is_err());
    }

    /// A wildcard covers a name exactly when it ends with `.` and the rule's host.
    #[test]
    fn wildcards_cover_exactly_names_under_them(prefix in "[a-z]{0,5}", sep in prop::sample::select(vec!["", ".", "-"])) {
        let rule = HostRule::new(true, "example.com", None);
        let host = format!("{prefix}{sep}example.com");
        prop_assert_eq!(rule.covers(&host, 1), !prefix.is_empty() && sep == ".");
    }
}

#[test]
fn the_throttle_writes_a_burst_then_counts_then_summarizes() {
    let mut throttle = AuditThrottle::new(3, 100, 1_000);
    let d = Destination { sandbox: "s1", host: "a.example".to_owned(), port: 443, allowed: false };
    let written: Vec<bool> = (0..10).map(|i| throttle.admit(&d, i).0).collect();
    assert_eq!(written, [true, true, true, false, false, false, false, false, false, false]);
    // Another destination of the same sandbox has its own burst.
    let other = Destination { host: "b.example".to_owned(), ..d.clone() };
    assert!(throttle.admit(&other, 10).0);
    assert!(throttle.flush(999).is_empty(), "the window has not ended");
    let (written, due) = throttle.admit(&d, 1_000);
    assert!(written, "a new window writes again");
    assert_eq!(due, vec![Summary { destination: d.clone(), count: 7, since_ms: 0 }]);
    assert!(throttle.drain().is_empty(), "nothing counted in the new windows");
}

#[test]
fn the_throttle_caps_one_sandbox_across_destinations() {
    let mut throttle = AuditThrottle::new(2, 3, 1_000);
    let mut written = 0;
    for i in 0..20u16 {
        let d = Destination { sandbox: 7u8, host: format!("h{i}.example"), port: i, allowed: false };
        written += usize::from(throttle.admit(&d, 5).0);
    }
    assert_eq!(written, 3);
    let due = throttle.drain();
    assert_eq!(due.len(), 1, "{due:?}");
    assert_eq!((due[0].destination.host.as_str(), due[0].count), ("*", 17));
    // Another sandbox is not held back by the first.
    let d = Destination { sandbox: 8u8, host: "h.example".to_owned(), port: 1, allowed: true };
    assert!(throttle.admit(&d, 6).0);
}

#[test]
fn the_throttle_holds_at_most_its_cap_whatever_names_arrive() {
    let mut throttle = AuditThrottle::new(3, 100, 60_000);
    let mut written = 0u64;
    // 50,000 distinct names, and one name asked for again and again among them.
    for i in 0..50_000u32 {
        let host = if i % 10 == 0 { "again.example".to_owned() } else { format!("n{i}.example") };
        let d = Destination { sandbox: "s1", host, port: 443, allowed: false };
        let (w, due) = throttle.admit(&d, i64::from(i % 1_000));
        written += u64::from(w);
        assert!(due.is_empty(), "one window");
        assert!(throttle.held() <= 100, "{} destinations held after {i}", throttle.held());
    }
    assert_eq!(written, 100, "the cap, one by one");
    let due = throttle.drain();
    assert_eq!(throttle.held(), 0);
    let counted: u64 = due.iter().map(|s| s.count).sum();
    assert_eq!(written + counted, 50_000, "every decision written or counted");
    // The name asked for again keeps its own summary (its burst, then counted); the rest
    // is one sandbox-wide count.
    let again = due.iter().find(|s| s.destination.host == "again.example").expect("its summary");
    assert_eq!(again.count, 5_000 - 3);
    let wide = due.iter().find(|s| s.destination.host == "*").expect("the sandbox-wide summary");
    assert_eq!(wide.count, 50_000 - 100 - (5_000 - 3));
    assert_eq!(due.len(), 2, "{due:?}");
}

proptest! {
    /// Nothing is lost: every decision is written one by one or counted in a summary; and
    /// the throttle never holds more than its cap of destinations per sandbox and decision.
    #[test]
    fn every_decision_is_written_or_summarized(events in proptest::collection::vec((0u8..3, 0u8..20, any::<bool>(), 0i64..50), 0..300)) {
        let mut throttle = AuditThrottle::new(2, 5, 10);
        let (mut now, mut written, mut counted) = (0i64, 0u64, 0u64);
        let n = events.len() as u64;
        for (sandbox, host, allowed, step) in events {
            now += step;
            let d = Destination { sandbox, host: format!("h{host}"), port: 1, allowed };
            let (w, due) = throttle.admit(&d, now);
            written += u64::from(w);
            counted += due.iter().map(|s| s.count).sum::<u64>();
            prop_assert!(due.iter().all(|s| s.destination.sandbox == sandbox), "admit flushes its own sandbox");
            // Three sandboxes, two kinds of decision, twice the cap each.
            prop_assert!(throttle.held() <= 3 * 2 * 2 * 5, "{} held", throttle.held());
        }
        counted += throttle.drain_sandbox(&0).iter().map(|s| s.count).sum::<u64>();
        counted += throttle.drain().iter().map(|s| s.count).sum::<u64>();
        prop_assert_eq!(written + counted, n);
    }
}

#[test]
fn an_orgs_rules_make_a_list_per_caller_class() {
    use crate::CallerClass;
    use crate::policy::EgressRule;
    let rules: Vec<EgressRule> =
        ["pypi.org:443", "api.internal.example:443@service", "10.1.0.0/16:5432@service", "127.0.0.0/8"]
            .iter()
            .map(|r| EgressRule::parse(r).unwrap())
            .collect();
    let user = Allowlist::from_rules(&rules, CallerClass::User);
    let service = Allowlist::from_rules(&rules, CallerClass::Service);
    assert!(user.allows_host("pypi.org", 443).is_some() && service.allows_host("pypi.org", 443).is_some());
    assert!(user.allows_host("api.internal.example", 443).is_none(), "a service-only rule");
    assert!(service.allows_host("api.internal.example", 443).is_some());
    assert!(user.allows_host("10.1.2.3", 5432).is_none() && service.allows_host("10.1.2.3", 5432).is_some());
    assert!(
        user.allows_address(ip("10.1.2.3"), 5432).is_err()
            && service.allows_address(ip("10.1.2.3"), 5432).is_ok()
    );
    assert!(user.allows_address(ip("127.0.0.1"), 80).is_ok(), "a range for every class");
    assert!(Allowlist::from_rules(&[], CallerClass::User).is_empty(), "no rules, no egress");
}
