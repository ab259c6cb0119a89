use proptest::prelude::*;

use super::*;

fn valid_id() -> impl Strategy<Value = String> {
    "[A-Za-z0-9._:@-]{1,128}"
}

/// The oracle: the id grammar of the contract, written as a regex independently of the
/// parser (1 to 128 ASCII letters, digits and `._:@-`).
fn grammar() -> &'static regex::Regex {
    static GRAMMAR: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    GRAMMAR.get_or_init(|| regex::Regex::new(r"\A[A-Za-z0-9._:@-]{1,128}\z").unwrap())
}

/// Inputs near the grammar's edges as well as anything at all: the alphabet across the
/// length limit, one stray character among valid ones, any text.
fn candidate() -> impl Strategy<Value = String> {
    prop_oneof![
        ".{0,140}",
        "[A-Za-z0-9._:@-]{0,135}",
        "[A-Za-z0-9._:@-]{120,130}",
        "[A-Za-z0-9._:@-]{0,10}[^A-Za-z0-9._:@-][A-Za-z0-9._:@-]{0,10}",
    ]
}

proptest! {
    #[test]
    fn accepted_exactly_when_valid(input in candidate()) {
        let valid = grammar().is_match(&input);
        prop_assert_eq!(OrgId::parse(input.clone()).is_ok(), valid);
        prop_assert_eq!(IdentityId::parse(input.clone()).is_ok(), valid);
        prop_assert_eq!(SessionId::parse(input.clone()).is_ok(), valid);
        prop_assert_eq!(ExecutionId::parse(input).is_ok(), valid);
    }

    #[test]
    fn valid_ids_round_trip_through_serde(input in valid_id()) {
        let id = ExecutionId::parse(input.clone()).unwrap();
        let json = serde_json::to_string(&id).unwrap();
        prop_assert_eq!(&json, &serde_json::to_string(&input).unwrap());
        let back: ExecutionId = serde_json::from_str(&json).unwrap();
        prop_assert_eq!(back, id);
    }

    #[test]
    fn serde_refuses_what_parse_refuses(input in ".{0,140}") {
        let json = serde_json::to_string(&input).unwrap();
        let parsed = serde_json::from_str::<OrgId>(&json);
        prop_assert_eq!(parsed.is_ok(), OrgId::parse(input).is_ok());
    }

    #[test]
    fn sandbox_ids_are_valid_and_time_ordered(
        t1 in 0u64..(1 << 48), t2 in 0u64..(1 << 48), r1: u128, r2: u128
    ) {
        let a = SandboxId::generate(t1, r1);
        let b = SandboxId::generate(t2, r2);
        prop_assert!(SandboxId::parse(a.as_str()).is_ok());
        prop_assert_eq!(a.unix_millis(), t1);
        if t1 < t2 {
            prop_assert!(a < b);
        }
    }
}

#[test]
fn errors_name_the_input() {
    let err = OrgId::parse("acme corp").unwrap_err();
    assert!(err.to_string().contains("\"acme corp\""), "{err}");
    assert!(err.to_string().contains("' '"), "{err}");
    let err = SandboxId::parse("sbx_nope").unwrap_err();
    assert!(err.to_string().contains("sbx_nope"), "{err}");
    assert!(matches!(OrgId::parse(""), Err(IdError::Empty { kind: "org" })));
}

#[test]
fn sandbox_id_shape() {
    let id = SandboxId::generate(1_700_000_000_000, 42);
    assert!(id.as_str().starts_with("sbx_"));
    assert_eq!(id.as_str().len(), 30);
    assert!(SandboxId::parse("sbx_ZZZZZZZZZZZZZZZZZZZZZZZZZZ").is_err(), "overflowing value");
    assert!(SandboxId::parse("acme").is_err());
}

fn id_regex() -> regex::Regex {
    regex::Regex::new(&id_pattern()).unwrap()
}

fn sandbox_regex() -> regex::Regex {
    regex::Regex::new(&sandbox_id_pattern()).unwrap()
}

#[test]
fn published_patterns_read_as_expected() {
    assert_eq!(id_pattern(), "^[A-Za-z0-9._:@-]{1,128}$");
    assert_eq!(sandbox_id_pattern(), "^sbx_[01234567][0123456789ABCDEFGHJKMNPQRSTVWXYZ]{25}$");
}

proptest! {
    /// The published pattern is the rule: a string parses exactly when it matches.
    #[test]
    fn id_pattern_matches_exactly_what_parses(input in ".{0,140}|[A-Za-z0-9._:@ -]{0,140}") {
        prop_assert_eq!(id_regex().is_match(&input), OrgId::parse(input.clone()).is_ok(), "{:?}", input);
    }

    #[test]
    fn sandbox_id_pattern_matches_exactly_what_parses(
        input in "sbx_[0-9A-Z]{24,27}|sbx_.{26}|.{0,32}", t in 0u64..(1 << 48), r: u128
    ) {
        prop_assert_eq!(sandbox_regex().is_match(&input), SandboxId::parse(input.clone()).is_ok(), "{:?}", input);
        let generated = SandboxId::generate(t, r);
        prop_assert!(sandbox_regex().is_match(generated.as_str()));
        prop_assert_eq!(generated.as_str().chars().count(), SANDBOX_ID_LEN);
    }
}

proptest! {
    /// Terminal ids: generated ones parse and match the published pattern; a string
    /// parses exactly when it matches; a sandbox or snapshot id is not one.
    #[test]
    fn terminal_ids_parse_exactly_when_they_match_the_pattern(
        input in "term_[0-9A-Z]{24,27}|term_.{26}|sbx_[0-7][0-9A-Z]{25}|.{0,32}", t in 0u64..(1 << 48), r: u128
    ) {
        let pattern = regex::Regex::new(&terminal_id_pattern()).unwrap();
        prop_assert_eq!(pattern.is_match(&input), TerminalId::parse(input.clone()).is_ok(), "{:?}", input);
        let generated = TerminalId::generate(t, r);
        prop_assert!(pattern.is_match(generated.as_str()));
        prop_assert!(generated.as_str().starts_with("term_"));
        let sandbox = SandboxId::generate(t, r);
        prop_assert!(TerminalId::parse(sandbox.as_str()).is_err());
        prop_assert_eq!(&generated.as_str()[5..], &sandbox.as_str()[4..]);
    }
}
