use proptest::prelude::*;
use regex::Regex;

use super::*;

/// The oracle for SIZE, written independently of the parser: a regular expression and
/// 128-bit arithmetic.
fn size_oracle(input: &str) -> Option<Option<u64>> {
    if input == "unlimited" {
        return Some(None);
    }
    let re = Regex::new(r"^([0-9]+)(B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)?$").unwrap();
    let caps = re.captures(input)?;
    let number: u128 = caps[1].parse().ok()?;
    let factor: u128 = match caps.get(2).map(|m| m.as_str()) {
        None | Some("B") => 1,
        Some("KiB") => 1024,
        Some("MiB") => 1024 * 1024,
        Some("GiB") => 1024 * 1024 * 1024,
        Some("TiB") => 1024 * 1024 * 1024 * 1024,
        Some("KB") => 1_000,
        Some("MB") => 1_000_000,
        Some("GB") => 1_000_000_000,
        Some("TB") => 1_000_000_000_000,
        Some(_) => return None,
    };
    u64::try_from(number.checked_mul(factor)?).ok().map(Some)
}

/// The oracle for DUR.
fn duration_oracle(input: &str) -> Option<Option<u64>> {
    if input == "off" {
        return Some(None);
    }
    let re = Regex::new(r"^([0-9]+)(ms|s|m|h|d)$").unwrap();
    let caps = re.captures(input)?;
    let number: u128 = caps[1].parse().ok()?;
    let factor: u128 = match &caps[2] {
        "ms" => 1,
        "s" => 1000,
        "m" => 60 * 1000,
        "h" => 60 * 60 * 1000,
        "d" => 24 * 60 * 60 * 1000,
        _ => return None,
    };
    u64::try_from(number.checked_mul(factor)?).ok().map(Some)
}

/// The oracle for a host egress rule (input lowered first, as the parser does; a class
/// suffix is matched before lowering, as the parser takes only `user` and `service`).
fn egress_oracle(input: &str) -> Option<(bool, String, Option<u16>)> {
    let label = "[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?";
    let re = Regex::new(&format!(r"^(?P<wild>\*\.)?(?P<host>{label}(?:\.{label})*)(?::(?P<port>[0-9]+))?$"))
        .unwrap();
    let input = match input.rsplit_once('@') {
        Some((rest, "user" | "service")) => rest,
        Some(_) => return None,
        None => input,
    };
    let lowered = input.to_ascii_lowercase();
    // The port part is not lowered by the parser, but digits have no case.
    let caps = re.captures(&lowered)?;
    let wildcard = caps.name("wild").is_some();
    let host = caps["host"].to_owned();
    if host.len() > 253 || (wildcard && !host.contains('.')) {
        return None;
    }
    // A last label of digits alone: an address, or what a client reads as one.
    if Regex::new(r"(^|\.)[0-9]+$").unwrap().is_match(&host) {
        return None;
    }
    let port = match caps.name("port") {
        Some(p) => Some(p.as_str().parse::<u16>().ok().filter(|p| *p > 0)?),
        None => None,
    };
    Some((wildcard, host, port))
}

fn near_size() -> impl Strategy<Value = String> {
    prop_oneof![
        (
            0u64..5_000_000,
            prop::sample::select(vec!["", "B", "KiB", "MiB", "GiB", "TiB", "KB", "MB", "GB", "TB"])
        )
            .prop_map(|(n, u)| format!("{n}{u}")),
        (any::<u64>(), prop::sample::select(vec!["", "TiB", "TB", "GiB"]))
            .prop_map(|(n, u)| format!("{n}{u}")),
        "[0-9]{0,4}[a-zA-Z ]{0,4}",
        "[0-9 +-]{0,22}",
        Just("unlimited".to_owned()),
        Just("Unlimited".to_owned()),
        "\\PC{0,8}",
    ]
}

fn near_duration() -> impl Strategy<Value = String> {
    prop_oneof![
        (0u64..100_000, prop::sample::select(vec!["", "ms", "s", "m", "h", "d", "S", "min", "sec"]))
            .prop_map(|(n, u)| format!("{n}{u}")),
        (any::<u64>(), prop::sample::select(vec!["d", "h", "ms"])).prop_map(|(n, u)| format!("{n}{u}")),
        "[0-9]{0,4}[a-z ]{0,3}",
        Just("off".to_owned()),
        "\\PC{0,8}",
    ]
}

fn near_egress() -> impl Strategy<Value = String> {
    prop_oneof![
        ("(\\*\\.)?", "[a-zA-Z0-9-]{1,8}(\\.[a-zA-Z0-9-]{1,8}){0,3}", prop::option::of(0u32..70_000))
            .prop_map(|(w, h, p)| match p {
                Some(p) => format!("{w}{h}:{p}"),
                None => format!("{w}{h}"),
            }),
        "[a-z.*:0-9-]{0,12}",
        ("[a-z0-9.:]{1,10}", prop::sample::select(vec!["@user", "@service", "@internal", "@", "@User"]))
            .prop_map(|(h, c)| format!("{h}{c}")),
        (
            "[0-9a-f.:]{1,16}",
            "/[0-9]{0,3}(:[0-9]{1,5})?",
            prop::option::of(prop::sample::select(vec!["@user", "@x"]))
        )
            .prop_map(|(a, p, c)| format!("{a}{p}{}", c.unwrap_or(""))),
        "\\PC{0,10}",
    ]
}

proptest! {
    #[test]
    fn size_accepted_exactly_as_the_oracle_says(input in near_size()) {
        let got = parse_size(PolicyField::WorkspaceBytes, &input).ok();
        prop_assert_eq!(got, size_oracle(&input), "{:?}", input);
    }

    #[test]
    fn duration_accepted_exactly_as_the_oracle_says(input in near_duration()) {
        let got = parse_duration(PolicyField::IdleTimeout, &input).ok();
        prop_assert_eq!(got, duration_oracle(&input), "{:?}", input);
    }

    #[test]
    fn egress_accepted_exactly_as_the_oracle_says(input in near_egress()) {
        // Ranges (`ADDRESS/PREFIX`) have tests of their own.
        prop_assume!(!input.contains('/'));
        let got = EgressRule::parse(&input).ok().map(|r| (r.is_wildcard(), r.host().to_owned(), r.port()));
        prop_assert_eq!(got, egress_oracle(&input), "{:?}", input);
    }

    #[test]
    fn sizes_and_durations_round_trip(bytes in any::<u64>(), ms in any::<u64>()) {
        prop_assert_eq!(parse_size(PolicyField::WorkspaceBytes, &format_size(bytes)), Ok(Some(bytes)));
        prop_assert_eq!(parse_duration(PolicyField::IdleTimeout, &format_duration_ms(ms)), Ok(Some(ms)));
    }

    #[test]
    fn egress_rules_round_trip(input in near_egress()) {
        if let Ok(rule) = EgressRule::parse(&input) {
            prop_assert_eq!(EgressRule::parse(&rule.to_string()), Ok(rule));
        }
    }

    /// A patch is accepted exactly when every value it sets is within the bounds, which the
    /// oracle writes out again; an accepted patch changes exactly the fields it names.
    #[test]
    fn a_patch_is_accepted_exactly_when_in_bounds_and_changes_only_what_it_names(
        max_sandboxes in prop::option::of(prop::option::of(0u32..1_100_000)),
        max_commands in prop::option::of(prop::option::of(prop_oneof![0u32..3, 999_999u32..1_000_002])),
        per_sandbox in prop::option::of(prop::option::of(0u32..5)),
        workspace in prop::option::of(prop::option::of(prop_oneof![0u64..(3 << 20), (16u64 << 40) - 1..(16u64 << 40) + 2])),
        idle in prop::option::of(prop::option::of(prop_oneof![0u64..2_000, (30 * DAY_MS - 1)..(30 * DAY_MS + 2)])),
        lifetime in prop::option::of(prop::option::of(prop_oneof![0u64..2_000, (366 * DAY_MS - 1)..(366 * DAY_MS + 2)])),
        warm in prop::option::of(prop_oneof![0u32..3, 999u32..1_002]),
        lane_session in prop::option::of(any::<bool>()),
        lane_workflow in prop::option::of(any::<bool>()),
    ) {
        let patch = PolicyPatch {
            lane_session,
            lane_workflow,
            max_sandboxes,
            max_commands,
            max_commands_per_sandbox: per_sandbox,
            workspace_bytes: workspace,
            idle_timeout_ms: idle,
            max_lifetime_ms: lifetime,
            warm_pool: warm,
            egress_allow: None,
            max_snapshots: None,
            snapshot_bytes: None,
        };
        let count_ok = |v: Option<Option<u32>>| v.flatten().is_none_or(|n| (1..=1_000_000).contains(&n));
        let in_bounds = count_ok(max_sandboxes)
            && count_ok(max_commands)
            && count_ok(per_sandbox)
            && workspace.flatten().is_none_or(|b| (1_048_576..=17_592_186_044_416).contains(&b))
            && idle.flatten().is_none_or(|ms| (1_000..=2_592_000_000).contains(&ms))
            && lifetime.flatten().is_none_or(|ms| (1_000..=31_622_400_000).contains(&ms))
            && warm.is_none_or(|n| n <= 1_000);
        let base = OrgPolicy::builtin();
        let got = base.apply(&patch);
        prop_assert_eq!(got.is_ok(), in_bounds, "{:?}: {:?}", patch, got);
        if let Ok(p) = got {
            prop_assert_eq!(p.lane(SandboxKind::Session), lane_session.unwrap_or(true));
            prop_assert_eq!(p.lane(SandboxKind::Workflow), lane_workflow.unwrap_or(true));
            prop_assert_eq!(p.max_sandboxes(), max_sandboxes.unwrap_or(base.max_sandboxes()));
            prop_assert_eq!(p.max_commands(), max_commands.unwrap_or(base.max_commands()));
            prop_assert_eq!(p.max_commands_per_sandbox(), per_sandbox.unwrap_or(base.max_commands_per_sandbox()));
            prop_assert_eq!(p.workspace_bytes(), workspace.unwrap_or(base.workspace_bytes()));
            prop_assert_eq!(p.idle_timeout_ms(), idle.unwrap_or(base.idle_timeout_ms()));
            prop_assert_eq!(p.max_lifetime_ms(), lifetime.unwrap_or(base.max_lifetime_ms()));
            prop_assert_eq!(p.warm_pool(), warm.unwrap_or(base.warm_pool()));
            // The JSON form reads back to the same policy.
            let json = serde_json::to_string(&p).unwrap();
            prop_assert_eq!(serde_json::from_str::<OrgPolicy>(&json).unwrap(), p);
        }
    }
}

#[test]
fn errors_name_the_field_and_the_input() {
    let e = parse_size(PolicyField::WorkspaceBytes, "64mb").unwrap_err();
    assert_eq!(e.field, PolicyField::WorkspaceBytes);
    assert!(e.to_string().starts_with("workspace_bytes: a size is"), "{e}");
    assert!(e.to_string().contains("\"64mb\""), "{e}");
    let e = OrgPolicy::builtin().apply(&PolicyPatch { max_sandboxes: Some(Some(0)), ..Default::default() });
    assert_eq!(
        e.unwrap_err().to_string(),
        "max_sandboxes: must be from 1 to 1000000, or unlimited (got \"0\")"
    );
    let e =
        OrgPolicy::builtin().apply(&PolicyPatch { idle_timeout_ms: Some(Some(500)), ..Default::default() });
    assert_eq!(e.unwrap_err().to_string(), "idle_timeout: must be from 1s to 30d, or off (got \"500ms\")");
    let e = parse_switch(PolicyField::LaneSession, "yes").unwrap_err();
    assert_eq!(e.to_string(), "lane_session: must be on or off (got \"yes\")");
    let e = EgressRule::parse("*.com").unwrap_err();
    assert!(e.to_string().starts_with("egress_allow: a wildcard"), "{e}");
}

#[test]
fn examples_from_the_contract() {
    assert_eq!(parse_size(PolicyField::WorkspaceBytes, "64MiB"), Ok(Some(64 << 20)));
    assert_eq!(parse_duration(PolicyField::IdleTimeout, "90s"), Ok(Some(90_000)));
    assert_eq!(parse_duration(PolicyField::IdleTimeout, "15m"), Ok(Some(900_000)));
    assert_eq!(parse_duration(PolicyField::MaxLifetime, "off"), Ok(None));
    assert_eq!(parse_limit(PolicyField::MaxSandboxes, "unlimited"), Ok(None));
    assert_eq!(format_size(64 << 20), "64MiB");
    assert_eq!(format_duration_ms(90_000), "90s");
    let rules =
        parse_egress(&["PyPI.org:443".into(), "*.example.com".into(), "pypi.org:443".into()]).unwrap();
    let shown: Vec<String> = rules.iter().map(ToString::to_string).collect();
    assert_eq!(shown, ["pypi.org:443", "*.example.com"]);
    assert_eq!(parse_egress(&["none".into()]), Ok(Vec::new()));
}

#[test]
fn idle_and_lifetime_rules() {
    let p = OrgPolicy::builtin()
        .apply(&PolicyPatch {
            idle_timeout_ms: Some(Some(2_000)),
            max_lifetime_ms: Some(Some(60_000)),
            ..Default::default()
        })
        .unwrap();
    let t = Timestamp::from_unix_millis(1_000_000);
    assert!(!p.is_idle(t, t.plus_millis(1_999)));
    assert!(p.is_idle(t, t.plus_millis(2_000)));
    assert!(!p.outlived(t, t.plus_millis(59_999)));
    assert!(p.outlived(t, t.plus_millis(60_000)));
    // Off: never.
    let off = OrgPolicy::builtin();
    assert!(!off.is_idle(t, t.plus_millis(i64::MAX / 2)));
    assert!(!off.outlived(t, t.plus_millis(i64::MAX / 2)));
}

#[test]
fn stored_json_with_a_value_out_of_bounds_is_refused() {
    let mut json = serde_json::to_value(OrgPolicy::builtin()).unwrap();
    json["warm_pool"] = serde_json::json!(5000);
    let e = serde_json::from_value::<OrgPolicy>(json).unwrap_err();
    assert!(e.to_string().contains("warm_pool"), "{e}");
}

fn patch() -> impl Strategy<Value = PolicyPatch> {
    (
        (prop::option::of(any::<bool>()), prop::option::of(any::<bool>())),
        prop::option::of(prop::option::of(any::<u32>())),
        prop::option::of(prop::option::of(any::<u32>())),
        prop::option::of(prop::option::of(any::<u32>())),
        prop::option::of(prop::option::of(any::<u64>())),
        prop::option::of(prop::option::of(any::<u64>())),
        prop::option::of(prop::option::of(any::<u64>())),
        prop::option::of(any::<u32>()),
        prop::option::of(prop::collection::vec("[a-z]{1,5}\\.[a-z]{2,3}(:[1-9][0-9]{0,3})?", 0..3)),
    )
        .prop_map(|((ls, lw), ms, mc, mcs, wb, it, ml, wp, eg)| PolicyPatch {
            lane_session: ls,
            lane_workflow: lw,
            max_sandboxes: ms,
            max_commands: mc,
            max_commands_per_sandbox: mcs,
            workspace_bytes: wb,
            idle_timeout_ms: it,
            max_lifetime_ms: ml,
            warm_pool: wp,
            egress_allow: eg.map(|rules| rules.iter().map(|r| EgressRule::parse(r).unwrap()).collect()),
            max_snapshots: None,
            snapshot_bytes: None,
        })
}

proptest! {
    /// The stored form of a patch reads back to the same patch: `null` (unlimited, off)
    /// stays apart from a field not named.
    #[test]
    fn patches_round_trip_through_json(p in patch()) {
        let json = serde_json::to_string(&p).unwrap();
        prop_assert_eq!(serde_json::from_str::<PolicyPatch>(&json).unwrap(), p.clone());
        let named: Vec<&str> = p.fields().iter().map(|f| f.as_str()).collect();
        let object = serde_json::from_str::<serde_json::Value>(&json).unwrap();
        prop_assert_eq!(object.as_object().unwrap().len(), named.len());
    }

    /// Merging: a field the later patch names wins; every other keeps the earlier value;
    /// applying the merge equals applying one after the other.
    #[test]
    fn merged_patches_apply_like_two_changes(a in patch(), b in patch()) {
        let m = a.merged(&b);
        prop_assert_eq!(m.max_sandboxes, b.max_sandboxes.or(a.max_sandboxes));
        prop_assert_eq!(m.egress_allow.clone(), b.egress_allow.clone().or(a.egress_allow.clone()));
        let base = OrgPolicy::builtin();
        let one = base.apply(&m);
        let two = base.apply(&a).and_then(|p| p.apply(&b));
        if let (Ok(one), Ok(two)) = (&one, &two) {
            prop_assert_eq!(one, two);
        }
        // When both steps are valid, the merge is too.
        if two.is_ok() {
            prop_assert!(one.is_ok());
        }
    }
}

#[test]
fn egress_ranges_and_classes_parse_and_round_trip() {
    use crate::caller::CallerClass;
    let r = EgressRule::parse("10.1.0.0/16:5432@service").unwrap();
    assert_eq!(
        (r.range().map(|r| r.to_string()), r.port(), r.class()),
        (Some("10.1.0.0/16".to_owned()), Some(5432), Some(CallerClass::Service))
    );
    assert_eq!(r.to_string(), "10.1.0.0/16:5432@service");
    let v6 = EgressRule::parse("fd00::/8:443").unwrap();
    assert_eq!((v6.host(), v6.port()), ("fd00::/8", Some(443)));
    assert_eq!(EgressRule::parse(&v6.to_string()), Ok(v6));
    let h = EgressRule::parse("*.Example.com:443@user").unwrap();
    assert_eq!(
        (h.is_wildcard(), h.host(), h.port(), h.class()),
        (true, "example.com", Some(443), Some(CallerClass::User))
    );
    assert_eq!(h.range(), None);
    for bad in
        ["10.0.0.1/8", "10.0.0.0/33", "10.0.0.0/8:0", "x/8", "a.com@internal", "a.com@", "a.com@User", "/8"]
    {
        let e = EgressRule::parse(bad).unwrap_err();
        assert!(e.to_string().starts_with("egress_allow: "), "{bad}: {e}");
    }
}

/// The form an error suggests: what follows its last `: `, up to the quoted input.
fn suggested(e: &PolicyError) -> String {
    let reason = &e.reason;
    reason.rsplit_once(": ").map(|(_, form)| form.to_owned()).unwrap_or_default()
}

#[test]
fn a_rule_that_could_never_match_is_refused_naming_the_form_that_works() {
    for (input, form) in [
        ("127.0.0.1:8080", "127.0.0.1/32:8080"),
        ("127.0.0.1", "127.0.0.1/32"),
        ("10.1.2.3:5432@service", "10.1.2.3/32:5432@service"),
        ("::1", "::1/128"),
        ("fd00::1@user", "fd00::1/128@user"),
        ("[::1]", "::1/128"),
        ("[fd00::1]:443", "fd00::1/128:443"),
        ("::ffff:127.0.0.1", "::ffff:127.0.0.1/128"),
    ] {
        let e = EgressRule::parse(input).unwrap_err();
        assert_eq!(e.field, PolicyField::EgressAllow);
        assert!(e.to_string().starts_with("egress_allow: an address is written as a range"), "{input}: {e}");
        assert_eq!(suggested(&e), form, "{input}: {e}");
        assert!(EgressRule::parse(form).is_ok(), "the suggested {form} parses");
    }
    // Names only an address could be: a client sends the address, never the name.
    for input in ["127.1", "10.1:80", "*.0.1", "host.123", "1.2.3.4.5"] {
        let e = EgressRule::parse(input).unwrap_err();
        assert!(e.reason.contains("last label is not all digits"), "{input}: {e}");
        assert!(e.reason.contains("127.0.0.1/32:8080"), "{input}: {e}");
    }
    for bad in ["[::1]x", "[::1]:0", "[::1]:99999"] {
        assert!(EgressRule::parse(bad).is_err(), "{bad}");
    }
    // Names with digits elsewhere are names.
    for ok in ["1password.com", "10.in-addr.example", "s3.amazonaws.com:443", "123abc"] {
        assert!(EgressRule::parse(ok).is_ok(), "{ok}");
    }
}

#[test]
fn a_rule_stored_before_the_check_still_reads() {
    // An org's stored policy with such a rule stays readable (as the host rule it was),
    // while setting it again is refused.
    let stored: EgressRule = serde_json::from_str("\"127.0.0.1:8080\"").unwrap();
    assert_eq!((stored.host(), stored.port(), stored.range()), ("127.0.0.1", Some(8080), None));
    assert_eq!(stored.to_string(), "127.0.0.1:8080");
    assert!(EgressRule::parse(&stored.to_string()).is_err());
    let patch: PolicyPatch =
        serde_json::from_str(r#"{"egress_allow":["127.0.0.1:8080","pypi.org"]}"#).unwrap();
    assert_eq!(patch.egress_allow.map(|r| r.len()), Some(2));
    assert!(serde_json::from_str::<EgressRule>("\"::1\"").is_err(), "never accepted, never stored");
}

proptest! {
    /// Every address written alone, with any port and class, is refused; the range the
    /// error names parses, and the list it makes covers the address on that port.
    #[test]
    fn an_address_alone_is_refused_and_its_range_covers_it(
        v4 in any::<u32>(),
        v6 in any::<u128>(),
        port in prop::option::of(1u16..),
        class in prop::option::of(prop::sample::select(vec!["user", "service"])),
        bracketed in any::<bool>(),
    ) {
        let class_suffix = class.map(|c| format!("@{c}")).unwrap_or_default();
        let port_suffix = port.map(|p| format!(":{p}")).unwrap_or_default();
        let v4 = std::net::Ipv4Addr::from(v4);
        let v6 = std::net::Ipv6Addr::from(v6);
        let v6_text = if bracketed || port.is_some() { format!("[{v6}]") } else { v6.to_string() };
        for (address, text) in [(std::net::IpAddr::V4(v4), v4.to_string()), (std::net::IpAddr::V6(v6), v6_text)] {
            let input = format!("{text}{port_suffix}{class_suffix}");
            let Err(e) = EgressRule::parse(&input) else {
                return Err(TestCaseError::fail(format!("{input} was accepted")));
            };
            let form = suggested(&e);
            let rule = EgressRule::parse(&form).map_err(|e| TestCaseError::fail(format!("{input}: {e}")))?;
            prop_assert_eq!(rule.port(), port);
            prop_assert_eq!(rule.class().map(|c| c.as_str()), class);
            let class = rule.class().unwrap_or(crate::caller::CallerClass::User);
            let list = crate::egress::Allowlist::from_rules(&[rule], class);
            let host = crate::egress::normalize_host(&address.to_string()).unwrap();
            prop_assert!(list.allows_host(&host, port.unwrap_or(80)).is_some(), "{} covers {}", form, host);
            prop_assert!(list.allows_address(address, port.unwrap_or(80)).is_ok());
        }
    }
}
