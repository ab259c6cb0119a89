use proptest::prelude::*;

use super::*;
use crate::policy::PolicyPatch;

fn policy(max: Option<u32>, bytes: Option<u64>) -> OrgPolicy {
    OrgPolicy::builtin()
        .apply(&PolicyPatch {
            max_snapshots: Some(max),
            snapshot_bytes: Some(bytes),
            ..PolicyPatch::default()
        })
        .expect("valid")
}

#[test]
fn names_follow_their_rule() {
    assert!(SnapshotName::parse("before-refactor.v2_1").is_ok());
    for bad in ["", "a b", "ä", "x/y", &"n".repeat(MAX_SNAPSHOT_NAME_LEN + 1)] {
        let e = SnapshotName::parse(bad).expect_err(bad);
        assert!(e.to_string().contains("must be 1 to 64"), "{e}");
    }
    let parsed: Result<SnapshotName, _> = serde_json::from_str("\"a b\"");
    assert!(parsed.is_err(), "deserialising goes through the rule");
}

#[test]
fn the_quota_names_what_refuses() {
    assert_eq!(admit(&policy(None, None), 1_000_000, u64::MAX / 2, 1 << 40), Ok(()));
    assert_eq!(admit(&policy(Some(2), None), 2, 0, 0), Err(SnapshotQuotaError::Count { held: 2, limit: 2 }));
    assert_eq!(admit(&policy(Some(2), None), 1, 0, 0), Ok(()));
    let mib = 1 << 20;
    assert_eq!(
        admit(&policy(None, Some(mib)), 0, mib, 0),
        Err(SnapshotQuotaError::Bytes { would: mib, limit: mib }),
        "before taking one, a full quota leaves no room"
    );
    assert_eq!(admit(&policy(None, Some(mib)), 0, mib - 1, 1), Ok(()), "exactly the quota fits");
    assert_eq!(
        admit(&policy(None, Some(mib)), 0, mib - 1, 2),
        Err(SnapshotQuotaError::Bytes { would: mib + 1, limit: mib })
    );
}

proptest! {
    /// Admitted means within both quotas once the snapshot is added.
    #[test]
    fn admitted_snapshots_stay_within_the_quota(
        max in proptest::option::of(1u32..100),
        limit in proptest::option::of((1u64 << 20)..(1u64 << 30)),
        held in 0u64..200,
        held_bytes in 0u64..(1u64 << 31),
        adding in 0u64..(1u64 << 31),
    ) {
        let p = policy(max, limit);
        if admit(&p, held, held_bytes, adding).is_ok() {
            if let Some(max) = max { prop_assert!(held < u64::from(max)); }
            if let Some(limit) = limit { prop_assert!(held_bytes + adding <= limit); }
        }
    }

    /// Generated ids parse, keep their time, and never pass for the other kind.
    #[test]
    fn snapshot_ids_are_generated_ids_of_their_own(millis in 0u64..(1u64 << 48), random: u128) {
        let id = SnapshotId::generate(millis, random);
        prop_assert_eq!(SnapshotId::parse(id.as_str()), Ok(id.clone()));
        prop_assert!(SandboxId::parse(id.as_str()).is_err());
        let pattern = regex_lite(&crate::id::snapshot_id_pattern(), id.as_str());
        prop_assert!(pattern);
    }
}

/// Whether `input` matches the generated-id pattern (`^snp_[0-7][alphabet]{25}$`),
/// checked by hand: the pattern is three parts.
fn regex_lite(pattern: &str, input: &str) -> bool {
    let Some(rest) = pattern.strip_prefix("^snp_[") else { return false };
    let Some((first, rest)) = rest.split_once("][") else { return false };
    let Some((alphabet, _)) = rest.split_once(']') else { return false };
    let Some(body) = input.strip_prefix("snp_") else { return false };
    body.len() == 26 && first.contains(&body[..1]) && body[1..].chars().all(|c| alphabet.contains(c))
}
