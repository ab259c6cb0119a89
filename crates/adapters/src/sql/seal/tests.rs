//! Unit tests of the seal encoding and the verification walk.

use domain::{AuditAction, AuditEvent, AuditOutcome, CallerClass, IdentityId, OrgId, SandboxKey};
use domain::{SessionId, Timestamp};

use super::*;

fn event(n: i64) -> AuditEvent {
    AuditEvent {
        action: AuditAction::Ensure,
        key: SandboxKey::Session {
            org: OrgId::parse("acme").unwrap(),
            session_id: SessionId::parse(format!("s-{n}")).unwrap(),
        },
        sandbox_id: None,
        caller_id: IdentityId::parse("u-1").unwrap(),
        caller_class: CallerClass::User,
        durability: None,
        driver: "bubblewrap".into(),
        outcome: AuditOutcome::Provisioned,
        message: String::new(),
        token_id: None,
        at: Timestamp::from_unix_millis(n),
    }
}

fn row(seq: i64) -> StoredRow {
    let e = event(seq);
    StoredRow { seq, stored_hash: e.hash().to_vec(), event: Ok(e) }
}

fn key() -> AuditKey {
    AuditKey::from_secret(&[7; 32])
}

/// Seals rows 1..=10 in two seals (1..=4, 5..=10).
fn sealed_log(k: &AuditKey) -> (Vec<StoredSeal>, Vec<StoredRow>) {
    let rows: Vec<StoredRow> = (1..=10).map(row).collect();
    let hashes: Vec<(i64, [u8; 32])> = rows.iter().map(|r| (r.seq, event(r.seq).hash())).collect();
    let s1 = make_seal(k, &ChainHead::EMPTY, &hashes[..4], 1000);
    let head = ChainHead { id: 1, hash: s1.hash.as_slice().try_into().unwrap(), through: s1.through };
    let s2 = make_seal(k, &head, &hashes[4..], 2000);
    (vec![s1, s2], rows)
}

fn verify(k: &AuditKey, seals: &[StoredSeal], rows: &[StoredRow], cutoff: i64) -> VerifyReport {
    let check = match check_seals(k, seals) {
        Ok(c) => c,
        Err(b) => {
            return VerifyReport { rows: 0, seals: 0, unsealed: 0, first_bad: Some(b) };
        }
    };
    let settled = settled_through(&check.horizons, cutoff);
    let mut walk = RowWalk::new(&check, settled);
    for r in rows {
        walk.push(r);
    }
    walk.finish()
}

fn named(report: &VerifyReport) -> &str {
    &report.first_bad.as_ref().expect("a bad record").record
}

#[test]
fn entries_round_trip_and_reject_disorder() {
    let e = vec![(1, [1; 32]), (5, [5; 32])];
    assert_eq!(decode_entries(&encode_entries(&e)), Some(e));
    assert_eq!(decode_entries(&encode_entries(&[(5, [5; 32]), (1, [1; 32])])), None);
    assert_eq!(decode_entries(&[0; 39]), None);
}

#[test]
fn intact_log_verifies() {
    let k = key();
    let (seals, rows) = sealed_log(&k);
    let report = verify(&k, &seals, &rows, 5000);
    assert!(report.is_intact(), "{report:?}");
    assert_eq!((report.rows, report.seals, report.unsealed), (10, 2, 0));
}

#[test]
fn edited_deleted_swapped_and_inserted_rows_are_named() {
    let k = key();
    let (seals, rows) = sealed_log(&k);

    let mut edited = rows.clone();
    let mut e = event(7);
    e.message = "forged".into();
    edited[6].event = Ok(e.clone());
    edited[6].stored_hash = e.hash().to_vec();
    assert_eq!(named(&verify(&k, &seals, &edited, 5000)), "row 7");

    let mut deleted = rows.clone();
    deleted.remove(2);
    assert_eq!(named(&verify(&k, &seals, &deleted, 5000)), "row 3");
    let mut last_deleted = rows.clone();
    last_deleted.pop();
    assert_eq!(named(&verify(&k, &seals, &last_deleted, 5000)), "row 10");

    let mut swapped = rows.clone();
    let (a, b) = (swapped[3].event.clone(), swapped[4].event.clone());
    swapped[3].event = b;
    swapped[4].event = a;
    assert_eq!(named(&verify(&k, &seals, &swapped, 5000)), "row 4");

    let mut inserted = rows.clone();
    inserted.insert(0, row(0));
    let report = verify(&k, &seals, &inserted, 5000);
    assert_eq!(named(&report), "row 0");
    // Within the late grace, a row below the sealed range may still be a late commit.
    assert!(verify(&k, &seals, &inserted, 999).is_intact());
    // A fresh row above every seal is an unsealed append.
    let mut appended = rows;
    appended.push(row(11));
    let report = verify(&k, &seals, &appended, 5000);
    assert!(report.is_intact());
    assert_eq!(report.unsealed, 1);
}

#[test]
fn edited_missing_and_foreign_seals_are_named() {
    let k = key();
    let (seals, rows) = sealed_log(&k);

    let mut edited = seals.clone();
    edited[1].sealed_at += 1;
    assert_eq!(named(&verify(&k, &edited, &rows, 5000)), "seal 2");

    let mut resigned = seals.clone();
    resigned[0].through = 3;
    assert_eq!(named(&verify(&k, &resigned, &rows, 5000)), "seal 1");

    let mut missing = seals.clone();
    missing.remove(0);
    assert_eq!(named(&verify(&k, &missing, &rows, 5000)), "seal 1");

    let other = AuditKey::from_secret(&[8; 32]);
    let report = verify(&other, &seals, &rows, 5000);
    assert_eq!(named(&report), "seal 1");
    assert!(report.first_bad.unwrap().reason.contains("key"));
}

#[test]
fn key_file_is_created_private_and_reloaded() {
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(AuditKey::load(dir.path()), Err(AuditError::Key(_))));
    let a = AuditKey::load_or_create(dir.path()).unwrap();
    let path = dir.path().join(AUDIT_KEY_FILE);
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let b = AuditKey::load_or_create(dir.path()).unwrap();
    assert_eq!(a.key_id(), b.key_id());
    assert!(!format!("{a:?}").contains(&hex(&std::fs::read(&path).unwrap())));
    assert_eq!(AuditKey::load(dir.path()).unwrap().key_id(), a.key_id());
    std::fs::write(&path, [1u8; 31]).unwrap();
    assert!(matches!(AuditKey::load(dir.path()), Err(AuditError::Key(_))));
    std::fs::write(&path, [1u8; 32]).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert!(matches!(AuditKey::load_or_create(dir.path()), Err(AuditError::Key(_))));
}
