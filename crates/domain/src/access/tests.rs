//! The ownership rule against an independent oracle: a literal table of who may do what,
//! written out by hand from the rule's prose, checked for every cell and for arbitrary
//! actors and targets.

use proptest::prelude::*;

use super::*;

fn org(s: &str) -> OrgId {
    OrgId::parse(s).unwrap()
}

fn id(s: &str) -> IdentityId {
    IdentityId::parse(s).unwrap()
}

fn sbx(n: u128) -> SandboxId {
    SandboxId::generate(1_700_000_000_000, n)
}

fn caller(name: &str, class: CallerClass, orgs: &[&str]) -> Actor {
    if class == CallerClass::Internal {
        return Actor::Caller(CallerIdentity::internal());
    }
    Actor::Caller(
        CallerIdentity::from_wire(id(name), class, orgs.iter().map(|o| org(o)).collect(), None).unwrap(),
    )
}

/// Who the actor is relative to the target, as the table's rows name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Who {
    Internal,
    ServiceOfOrg,
    ServiceOfOtherOrg,
    UserOwner,
    UserNotOwner,
    UserOfOtherOrg,
    TokenOfThisSandbox,
    TokenOfOtherSandbox,
    TokenOfOtherOrg,
}

/// The table: for each row, the operations allowed (E ensure, R recover, D deprovision,
/// G read, X exec, F files, P processes, S snapshot or restore, U use a snapshot), when the target names a sandbox whose key has
/// an owner (`named`) and when it names a key nobody owns yet (`unowned key`).
fn table(who: Who) -> (&'static str, &'static str) {
    //                         named    unowned key
    match who {
        Who::Internal => ("ERDGXFPSU", "ERDGXFPSU"),
        Who::ServiceOfOrg => ("ERDGXFPSU", "ERDGXFPSU"),
        Who::ServiceOfOtherOrg => ("", ""),
        Who::UserOwner => ("ERDGXFPSU", "ERD"), // (an owner of an unowned key is impossible; see below)
        Who::UserNotOwner => ("", "ERD"),
        Who::UserOfOtherOrg => ("", ""),
        Who::TokenOfThisSandbox => ("XFPS", ""),
        Who::TokenOfOtherSandbox => ("", ""),
        Who::TokenOfOtherOrg => ("", ""),
    }
}

fn letter(op: Operation) -> char {
    match op {
        Operation::Ensure => 'E',
        Operation::Recover => 'R',
        Operation::Deprovision => 'D',
        Operation::Read => 'G',
        Operation::Exec => 'X',
        Operation::Files => 'F',
        Operation::Processes => 'P',
        Operation::Snapshot => 'S',
        Operation::UseSnapshot => 'U',
    }
}

const ALL_WHO: [Who; 9] = [
    Who::Internal,
    Who::ServiceOfOrg,
    Who::ServiceOfOtherOrg,
    Who::UserOwner,
    Who::UserNotOwner,
    Who::UserOfOtherOrg,
    Who::TokenOfThisSandbox,
    Who::TokenOfOtherSandbox,
    Who::TokenOfOtherOrg,
];

/// Builds an actor of row `who` against org `acme`, sandbox 1, owner `u-owner`.
fn actor_for(who: Who) -> Actor {
    match who {
        Who::Internal => caller("", CallerClass::Internal, &[]),
        Who::ServiceOfOrg => caller("svc", CallerClass::Service, &["acme"]),
        Who::ServiceOfOtherOrg => caller("svc", CallerClass::Service, &["other"]),
        Who::UserOwner => caller("u-owner", CallerClass::User, &["acme", "other"]),
        Who::UserNotOwner => caller("u-else", CallerClass::User, &["acme"]),
        Who::UserOfOtherOrg => caller("u-owner", CallerClass::User, &["other"]),
        Who::TokenOfThisSandbox => {
            Actor::SandboxToken { org: org("acme"), sandbox_id: sbx(1), subject: id("u-owner") }
        }
        Who::TokenOfOtherSandbox => {
            Actor::SandboxToken { org: org("acme"), sandbox_id: sbx(2), subject: id("u-owner") }
        }
        Who::TokenOfOtherOrg => {
            Actor::SandboxToken { org: org("other"), sandbox_id: sbx(1), subject: id("u-owner") }
        }
    }
}

#[test]
fn every_cell_of_the_table() {
    let acme = org("acme");
    let owner = id("u-owner");
    let sandbox = sbx(1);
    for who in ALL_WHO {
        let (named, unowned) = table(who);
        for op in Operation::ALL {
            let named_target = Target { org: &acme, owner: Some(&owner), sandbox_id: Some(&sandbox) };
            assert_eq!(
                authorize(&actor_for(who), op, &named_target).is_ok(),
                named.contains(letter(op)),
                "{who:?} {op:?} on a named sandbox"
            );
            if who == Who::UserOwner {
                continue; // nobody owns the key, so no caller is its owner
            }
            let key_target = Target { org: &acme, owner: None, sandbox_id: None };
            assert_eq!(
                authorize(&actor_for(who), op, &key_target).is_ok(),
                unowned.contains(letter(op)),
                "{who:?} {op:?} on an unowned key"
            );
        }
    }
}

#[test]
fn a_user_owning_a_key_may_use_it_by_key_and_by_sandbox() {
    let acme = org("acme");
    let owner = id("u-owner");
    for op in Operation::ALL {
        let by_key = Target { org: &acme, owner: Some(&owner), sandbox_id: None };
        assert!(authorize(&actor_for(Who::UserOwner), op, &by_key).is_ok(), "{op:?}");
    }
}

#[test]
fn denials_name_the_caller_and_never_pass_silently() {
    let acme = org("acme");
    let owner = id("u-owner");
    let sandbox = sbx(1);
    let target = Target { org: &acme, owner: Some(&owner), sandbox_id: Some(&sandbox) };
    let denial = authorize(&actor_for(Who::UserNotOwner), Operation::Exec, &target).unwrap_err();
    assert!(denial.to_string().contains("u-else"), "{denial}");
    let denial = authorize(&actor_for(Who::UserOfOtherOrg), Operation::Read, &target).unwrap_err();
    assert!(denial.to_string().contains("org acme"), "{denial}");
    let denial = authorize(&actor_for(Who::TokenOfThisSandbox), Operation::Deprovision, &target).unwrap_err();
    assert_eq!(denial, Denial::TokenOperation { operation: Operation::Deprovision });
}

fn arb_op() -> impl Strategy<Value = Operation> {
    prop::sample::select(Operation::ALL.to_vec())
}

proptest! {
    /// Arbitrary orgs, identities, owners and sandboxes: classify the actor into a row of
    /// the table by plain comparisons, and look the answer up there.
    #[test]
    fn arbitrary_actors_follow_the_table(
        class in prop::sample::select(vec![CallerClass::User, CallerClass::Service, CallerClass::Internal]),
        token in any::<bool>(),
        actor_org in 0u8..3, target_org in 0u8..3,
        actor_id in 0u8..3, owner in prop::option::of(0u8..3),
        actor_sbx in 0u8..3, target_sbx in prop::option::of(0u8..3),
        op in arb_op(),
    ) {
        let orgs = ["o0", "o1", "o2"];
        let ids = ["i0", "i1", "i2"];
        let target_org_id = org(orgs[target_org as usize]);
        let owner_id = owner.map(|o| id(ids[o as usize]));
        let target_sbx_id = target_sbx.map(|s| sbx(u128::from(s)));
        let target = Target { org: &target_org_id, owner: owner_id.as_ref(), sandbox_id: target_sbx_id.as_ref() };
        let actor = if token {
            Actor::SandboxToken { org: org(orgs[actor_org as usize]), sandbox_id: sbx(u128::from(actor_sbx)), subject: id(ids[actor_id as usize]) }
        } else {
            caller(ids[actor_id as usize], class, &[orgs[actor_org as usize]])
        };
        let same_org = actor_org == target_org;
        let who = if token {
            if !same_org { Who::TokenOfOtherOrg }
            else if target_sbx == Some(actor_sbx) { Who::TokenOfThisSandbox }
            else { Who::TokenOfOtherSandbox }
        } else {
            match class {
                CallerClass::Internal => Who::Internal,
                CallerClass::Service if same_org => Who::ServiceOfOrg,
                CallerClass::Service => Who::ServiceOfOtherOrg,
                CallerClass::User if !same_org => Who::UserOfOtherOrg,
                CallerClass::User if owner == Some(actor_id) => Who::UserOwner,
                CallerClass::User => Who::UserNotOwner,
            }
        };
        let (named, unowned) = table(who);
        // A token's "own sandbox" row needs a named sandbox; the table's unowned-key
        // column is for targets that name no sandbox and have no owner.
        let column = match (owner.is_some(), target_sbx.is_some()) {
            (true, _) => named,
            (false, false) => unowned,
            (false, true) => match who {
                // a named sandbox without an owner: only the unconditional rows pass
                Who::Internal | Who::ServiceOfOrg => named,
                Who::TokenOfThisSandbox => named,
                _ => "",
            },
        };
        let column = if who == Who::TokenOfThisSandbox && target_sbx.is_none() { "" } else { column };
        prop_assert_eq!(authorize(&actor, op, &target).is_ok(), column.contains(letter(op)), "{:?} {:?}", who, op);
    }
}

/// The org-read rule (the policy), cell by cell: service callers of the org and the server
/// may; users, callers of other orgs and sandbox tokens may not.
#[test]
fn org_reads_are_for_the_orgs_service_callers() {
    let acme = org("acme");
    let token = Actor::SandboxToken { org: acme.clone(), sandbox_id: sbx(1), subject: id("svc") };
    let table = [
        (caller("svc", CallerClass::Service, &["acme"]), true),
        (caller("svc", CallerClass::Service, &["beta", "acme"]), true),
        (caller("sandlane:internal", CallerClass::Internal, &[]), true),
        (caller("svc", CallerClass::Service, &["beta"]), false),
        (caller("ada", CallerClass::User, &["acme"]), false),
        (token, false),
    ];
    for (actor, may) in table {
        let got = authorize_org_read(&actor, &acme, "policy");
        assert_eq!(got.is_ok(), may, "{actor:?}: {got:?}");
    }
    let user = caller("ada", CallerClass::User, &["acme"]);
    assert_eq!(
        authorize_org_read(&user, &acme, "policy").unwrap_err().to_string(),
        "only service callers of org acme may read its policy"
    );
}
