use proptest::prelude::*;

use super::*;
use crate::broker::choose;
use crate::caller::SandboxCaller;
use crate::egress::HostRule;

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

fn binding(name: &str, scope: SecretScope, hosts: &[&str], header: Option<&str>) -> SecretBinding {
    let hosts = strings(hosts);
    let input = BindingInput { hosts: &hosts, header, ..BindingInput::default() };
    SecretBinding::new(SecretName::parse(name).unwrap(), scope, &input).unwrap()
}

fn caller(id: &str, class: CallerClass) -> SandboxCaller {
    SandboxCaller::from_record(IdentityId::parse(id).unwrap(), class)
}

#[test]
fn names_follow_the_rules() {
    for ok in ["gh", "GITHUB_TOKEN", "npm.registry-1", "0x"] {
        assert!(SecretName::parse(ok).is_ok(), "{ok}");
    }
    for bad in ["", "-x", ".x", "a b", "a/b", "a:b", "é", &"a".repeat(65)] {
        assert!(SecretName::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn hosts_parse_with_wildcards_and_ports() {
    let h = SecretHost::parse("API.Example.com").unwrap();
    assert_eq!(h.to_string(), "api.example.com");
    assert_eq!(h.ports(), vec![443]);
    assert!(h.covers("api.example.com", 443) && !h.covers("api.example.com", 80));
    // In clear (plain HTTP) only on a port the host names, and never on 443.
    assert!(!h.covers_in_clear("api.example.com", 443) && !h.covers_in_clear("api.example.com", 80));
    let named = SecretHost::parse("api.example.com:8080").unwrap();
    assert!(
        named.covers_in_clear("api.example.com", 8080) && !named.covers_in_clear("other.example.com", 8080)
    );
    assert!(!SecretHost::parse("api.example.com:443").unwrap().covers_in_clear("api.example.com", 443));
    assert!(!h.covers("api.example.com", 8443));
    let w = SecretHost::parse("*.example.com:8443").unwrap();
    assert!(w.covers("a.example.com", 8443));
    assert!(!w.covers("example.com", 8443));
    assert!(!w.covers("a.example.com", 443));
    assert_eq!(SecretHost::parse("[::1]:8080").unwrap().to_string(), "[::1]:8080");
    for bad in
        ["", "*.com", "*.1.2.3.4", "a.*.com", "*", "x:0", "x:99999", "x:", "x:+1", "[::1", "a b", "*.[::1]"]
    {
        assert!(SecretHost::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn headers_refuse_what_the_proxy_owns() {
    assert_eq!(HeaderName::parse("X-Api-Key").unwrap().as_str(), "x-api-key");
    assert_eq!(HeaderName::parse("Authorization").unwrap().as_str(), "authorization");
    for bad in [
        "host",
        "Content-Length",
        "transfer-encoding",
        "Connection",
        "proxy-authorization",
        "Proxy-Connection",
        "upgrade",
        "te",
        ":authority",
        "x\r\ny",
        "a b",
        "",
    ] {
        assert!(HeaderName::parse(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn formats_hold_the_placeholder_once() {
    let auth = HeaderName::authorization();
    assert_eq!(ValueFormat::default_for(&auth).as_str(), "Bearer {value}");
    assert_eq!(ValueFormat::default_for(&HeaderName::parse("x-api-key").unwrap()).as_str(), "{value}");
    assert!(ValueFormat::parse("token {value}").is_ok());
    for bad in ["", "Bearer", "{value}{value}", "a\r\n{value}", "{value}\0"] {
        assert!(ValueFormat::parse(bad).is_err(), "{bad:?}");
    }
    let rendered = ValueFormat::parse("Basic {value}").unwrap().render(&SecretValue::new("{value}x"));
    assert_eq!(rendered.expose(), "Basic {value}x", "the value is put in once, not re-expanded");
}

#[test]
fn values_refuse_control_characters_and_never_show_themselves() {
    assert!(check_value(&SecretValue::new("ghp_abc")).is_ok());
    for bad in ["", "zq\nzq", "zq\rzq", "zq\0zq", " zqzq", "zqzq ", &"zq".repeat(MAX_VALUE_LEN)] {
        let err = check_value(&SecretValue::new(bad)).unwrap_err();
        assert!(!err.to_string().contains("zq"), "the error shows no value");
    }
}

#[test]
fn bindings_check_methods_and_paths() {
    let hosts = strings(&["api.github.com"]);
    let name = || SecretName::parse("gh").unwrap();
    let methods = strings(&["get", "GET", "Post"]);
    let paths = strings(&["/repos/acme", "/user/"]);
    let input = BindingInput { hosts: &hosts, methods: &methods, paths: &paths, ..BindingInput::default() };
    let b = SecretBinding::new(name(), SecretScope::Org, &input).unwrap();
    assert_eq!(b.methods, strings(&["GET", "POST"]));
    assert_eq!(b.header.as_str(), "authorization");
    assert_eq!(b.format.as_str(), "Bearer {value}");
    for bad in ["repos", "/a/../b", "/a/./b", "/a?x", "/a#x", "/%2e%2e", "/a\\b", "/a b"] {
        let paths = strings(&[bad]);
        let input = BindingInput { hosts: &hosts, paths: &paths, ..BindingInput::default() };
        assert!(SecretBinding::new(name(), SecretScope::Org, &input).is_err(), "{bad}");
    }
    let methods = strings(&["GE T"]);
    let input = BindingInput { hosts: &hosts, methods: &methods, ..BindingInput::default() };
    assert!(SecretBinding::new(name(), SecretScope::Org, &input).is_err());
    let none = BindingInput::default();
    assert!(SecretBinding::new(name(), SecretScope::Org, &none).is_err(), "a host is needed");
    assert!(SecretScope::class(CallerClass::Internal).is_err());
}

#[test]
fn the_allowlist_must_allow_every_port_a_host_covers() {
    let list = Allowlist::new(
        vec![HostRule::new(false, "api.github.com", Some(443)), HostRule::new(true, "npmjs.org", None)],
        vec![],
    );
    assert_eq!(SecretHost::parse("api.github.com:443").unwrap().allowed_by(&list), Ok(()));
    assert_eq!(SecretHost::parse("api.github.com").unwrap().allowed_by(&list), Ok(()), "no port means 443");
    assert_eq!(
        SecretHost::parse("api.github.com:80").unwrap().allowed_by(&list),
        Err("api.github.com:80".to_owned())
    );
    assert_eq!(SecretHost::parse("*.npmjs.org").unwrap().allowed_by(&list), Ok(()));
    assert_eq!(SecretHost::parse("registry.npmjs.org").unwrap().allowed_by(&list), Ok(()));
    assert_eq!(
        SecretHost::parse("*.github.com:443").unwrap().allowed_by(&list),
        Err("*.github.com:443".into())
    );
}

#[test]
fn identity_beats_class_beats_org_per_header() {
    let hosts = ["api.example.com"];
    let secrets = vec![
        (binding("org-key", SecretScope::Org, &hosts, None), SecretValue::new("o")),
        (binding("users", SecretScope::Class(CallerClass::User), &hosts, None), SecretValue::new("c")),
        (
            binding("alice", SecretScope::Identity(IdentityId::parse("alice").unwrap()), &hosts, None),
            SecretValue::new("a"),
        ),
        (binding("extra", SecretScope::Org, &hosts, Some("x-extra")), SecretValue::new("e")),
        (
            binding("elsewhere", SecretScope::Org, &["other.example.com"], Some("x-other")),
            SecretValue::new("z"),
        ),
    ];
    let pick = |c: &SandboxCaller| {
        choose(&secrets, c, "api.example.com", 443, false)
            .into_iter()
            .map(|i| (i.header, i.secret, i.value.expose().to_owned()))
            .collect::<Vec<_>>()
    };
    let alice = pick(&caller("alice", CallerClass::User));
    assert_eq!(
        alice,
        vec![
            ("authorization".into(), "alice".into(), "Bearer a".into()),
            ("x-extra".into(), "extra".into(), "e".into())
        ]
    );
    assert_eq!(pick(&caller("bob", CallerClass::User))[0].1, "users");
    assert_eq!(pick(&caller("svc", CallerClass::Service))[0].1, "org-key");
    assert!(pick(&caller("sandlane:internal", CallerClass::Internal)).is_empty());
    assert!(choose(&secrets, &caller("alice", CallerClass::User), "api.example.com", 8443, false).is_empty());
    assert!(
        choose(&secrets, &caller("alice", CallerClass::User), "api.example.com", 443, true).is_empty(),
        "a host without a port is never sent its secret in clear"
    );
}

fn arb_scope() -> impl Strategy<Value = SecretScope> {
    prop_oneof![
        prop_oneof![Just("alice"), Just("bob")]
            .prop_map(|id| SecretScope::Identity(IdentityId::parse(id).unwrap())),
        prop_oneof![Just(CallerClass::User), Just(CallerClass::Service)].prop_map(SecretScope::Class),
        Just(SecretScope::Org),
    ]
}

proptest! {
    /// Whatever the org holds, the choice is: one injection per header, each from a secret
    /// in scope that names the host, and none in scope that fits better (or as well with an
    /// earlier name) for the same header.
    #[test]
    fn the_choice_is_the_best_fit(
        specs in proptest::collection::vec(
            (arb_scope(), prop_oneof![Just("authorization"), Just("x-key")],
             prop_oneof![Just("api.example.com"), Just("*.example.com"), Just("api.example.com:8443")]),
            0..8),
        who in prop_oneof![Just("alice"), Just("carol")],
        class in prop_oneof![Just(CallerClass::User), Just(CallerClass::Service)],
    ) {
        let secrets: Vec<_> = specs.iter().enumerate().map(|(i, (scope, header, host))| {
            (binding(&format!("s{i}"), scope.clone(), &[host], Some(header)), SecretValue::new(format!("v{i}")))
        }).collect();
        let c = caller(who, class);
        let chosen = choose(&secrets, &c, "api.example.com", 443, false);
        let mut headers: Vec<_> = chosen.iter().map(|i| i.header.clone()).collect();
        headers.dedup();
        prop_assert_eq!(headers.len(), chosen.len());
        for header in ["authorization", "x-key"] {
            let fits: Vec<_> = secrets.iter().filter(|(b, _)| b.header.as_str() == header
                && b.covers("api.example.com", 443)).filter_map(|(b, _)| {
                    b.scope.rank(c.identity_id(), c.class()).map(|r| (r, b.name.to_string()))
                }).collect();
            let got = chosen.iter().find(|i| i.header == header);
            match fits.iter().min() {
                None => prop_assert!(got.is_none()),
                Some((_, name)) => prop_assert_eq!(&got.unwrap().secret, name),
            }
        }
    }

    /// A host that parses is shown in a form that parses to the same host.
    #[test]
    fn hosts_round_trip(wild in any::<bool>(), labels in proptest::collection::vec("[a-z0-9]{1,8}", 2..4),
                        port in proptest::option::of(1u16..)) {
        let text = format!("{}{}{}", if wild { "*." } else { "" }, labels.join("."),
                           port.map(|p| format!(":{p}")).unwrap_or_default());
        let host = SecretHost::parse(&text).unwrap();
        prop_assert_eq!(SecretHost::parse(&host.to_string()).unwrap(), host.clone());
        prop_assert_eq!(host.to_string(), text);
    }

    /// No header that parses is refused by the proxy's rules, and each is lower case.
    #[test]
    fn parsed_headers_are_safe(input in "[A-Za-z:\\- \r\n]{1,20}") {
        if let Ok(h) = HeaderName::parse(&input) {
            prop_assert_eq!(h.as_str(), input.to_ascii_lowercase());
            prop_assert!(!h.as_str().starts_with("proxy-") && !REFUSED_HEADERS.contains(&h.as_str()));
            prop_assert!(h.as_str().bytes().all(is_tchar));
        }
    }

    /// A rendered value never holds CR, LF or NUL.
    #[test]
    fn rendered_values_are_header_safe(format in "[ -~\r\n]{0,12}", value in "[ -~\r\n\0]{0,12}") {
        let fmt = format!("{format}{{value}}");
        if let (Ok(f), Ok(())) = (ValueFormat::parse(&fmt), check_value(&SecretValue::new(value.clone()))) {
            let out = f.render(&SecretValue::new(value));
            prop_assert!(!out.expose().contains(['\r', '\n', '\0']));
        }
    }
}
