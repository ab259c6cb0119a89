use proptest::prelude::*;

use super::*;
use crate::id::{ExecutionId, SessionId};

fn opt_id() -> impl Strategy<Value = Option<String>> {
    prop::option::of("[a-z0-9:]{1,6}")
}

prop_compose! {
    fn event()(
        action in prop::sample::select(vec![AuditAction::Ensure, AuditAction::Recover, AuditAction::Deprovision, AuditAction::Refresh, AuditAction::Reconcile, AuditAction::Egress, AuditAction::EgressSummary]),
        org in "[a-z]{1,4}",
        session: bool,
        key in "[a-z0-9]{1,4}",
        sandbox in prop::option::of((0u64..1000, 0u128..4)),
        caller in "[a-z]{1,4}",
        class in prop::sample::select(CallerClass::ALL.to_vec()),
        durability in prop::option::of(prop::sample::select(vec![Durability::Durable, Durability::Ephemeral])),
        driver in "[a-z]{0,3}",
        outcome in prop::sample::select(vec![AuditOutcome::Provisioned, AuditOutcome::Reused, AuditOutcome::Failed, AuditOutcome::Deprovisioned, AuditOutcome::Absent, AuditOutcome::Refreshed, AuditOutcome::Denied, AuditOutcome::Repaired, AuditOutcome::Allowed, AuditOutcome::Refused]),
        message in ".{0,6}",
        token in opt_id(),
        at in -5i64..5,
    ) -> AuditEvent {
        let org = OrgId::parse(org).unwrap();
        let key = if session {
            SandboxKey::Session { org, session_id: SessionId::parse(key).unwrap() }
        } else {
            SandboxKey::Workflow { org, execution_id: ExecutionId::parse(key).unwrap() }
        };
        AuditEvent {
            action,
            key,
            sandbox_id: sandbox.map(|(t, r)| SandboxId::generate(t, r)),
            caller_id: IdentityId::parse(caller).unwrap(),
            caller_class: class,
            durability,
            driver,
            outcome,
            message,
            token_id: token.map(|t| TokenId::parse(t).unwrap()),
            at: Timestamp::from_unix_millis(at),
        }
    }
}

proptest! {
    #[test]
    fn distinct_events_have_distinct_encodings(a in event(), b in event()) {
        prop_assert_eq!(a == b, a.canonical_bytes() == b.canonical_bytes());
        prop_assert_eq!(a == b, a.hash() == b.hash());
    }

    #[test]
    fn encoding_is_deterministic(a in event()) {
        prop_assert_eq!(a.canonical_bytes(), a.clone().canonical_bytes());
    }
}

#[test]
fn field_boundaries_matter() {
    // "ab" + "c" must differ from "a" + "bc": lengths are part of the encoding.
    let base = AuditEvent {
        action: AuditAction::Ensure,
        key: SandboxKey::Session {
            org: OrgId::parse("ab").unwrap(),
            session_id: SessionId::parse("c").unwrap(),
        },
        sandbox_id: None,
        caller_id: IdentityId::parse("u").unwrap(),
        caller_class: CallerClass::User,
        durability: None,
        driver: String::new(),
        outcome: AuditOutcome::Provisioned,
        message: String::new(),
        token_id: None,
        at: Timestamp::from_unix_millis(0),
    };
    let mut other = base.clone();
    other.key =
        SandboxKey::Session { org: OrgId::parse("a").unwrap(), session_id: SessionId::parse("bc").unwrap() };
    assert_ne!(base.canonical_bytes(), other.canonical_bytes());
    assert_eq!(base.hash().len(), 32);
}

/// Every action and outcome name parses back to itself, and no two share a name (the
/// canonical encoding holds them by name, so it stays injective).
#[test]
fn action_and_outcome_names_are_distinct_and_round_trip() {
    use std::collections::HashSet;
    let actions = [
        AuditAction::Ensure,
        AuditAction::Recover,
        AuditAction::Deprovision,
        AuditAction::Refresh,
        AuditAction::Reconcile,
        AuditAction::Egress,
        AuditAction::EgressSummary,
    ];
    let names: HashSet<&str> = actions.iter().map(|a| a.as_str()).collect();
    assert_eq!(names.len(), actions.len());
    for a in actions {
        assert_eq!(AuditAction::parse(a.as_str()), Ok(a));
    }
    let outcomes = [
        AuditOutcome::Provisioned,
        AuditOutcome::Reused,
        AuditOutcome::Failed,
        AuditOutcome::Deprovisioned,
        AuditOutcome::Absent,
        AuditOutcome::Refreshed,
        AuditOutcome::Denied,
        AuditOutcome::Repaired,
        AuditOutcome::Allowed,
        AuditOutcome::Refused,
    ];
    let names: HashSet<&str> = outcomes.iter().map(|o| o.as_str()).collect();
    assert_eq!(names.len(), outcomes.len());
    for o in outcomes {
        assert_eq!(AuditOutcome::parse(o.as_str()), Ok(o));
    }
}
