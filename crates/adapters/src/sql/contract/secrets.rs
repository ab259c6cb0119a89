//! Contract tests of the brokered secrets in the store (issue 35), on both databases:
//! put, list and delete with their guards, the gate's read by host, values sealed at rest
//! (the plain value is nowhere in the database, a value moved to another row does not
//! open), and key rotation.

use std::sync::Arc;

use domain::broker::{BindingInput, SecretBinding, SecretName, SecretScope};
use domain::{CallerClass, IdentityId, SecretValue};
use ports::{PutOutcome, SecretGuard, SecretLimits, SecretStore};

use super::{GRACE, TestDb, org, postgres, sqlite, ts, with_pool};

on_both!(secrets, GRACE, secrets_contract);
on_both!(secrets_sealed, GRACE, secrets_sealed_contract);
on_both!(secrets_rotation, GRACE, secrets_rotation_contract);
on_both!(secrets_limits, GRACE, secrets_limits_contract);

/// Limits no test here reaches.
const ROOMY: SecretLimits = SecretLimits { per_org: 1_000, per_identity: 1_000 };

fn binding(name: &str, scope: SecretScope, hosts: &[&str]) -> SecretBinding {
    let hosts: Vec<String> = hosts.iter().map(|h| (*h).to_owned()).collect();
    let methods = vec!["GET".to_owned()];
    let paths = vec!["/repos/".to_owned()];
    let input = BindingInput { hosts: &hosts, methods: &methods, paths: &paths, ..BindingInput::default() };
    SecretBinding::new(SecretName::parse(name).unwrap(), scope, &input).unwrap()
}

fn alice() -> IdentityId {
    IdentityId::parse("alice").unwrap()
}

async fn secrets_contract(db: &TestDb) {
    let s: Arc<dyn SecretStore> = db.store.secrets();
    let acme = org("acme");
    let mine = SecretScope::Identity(alice());
    let gh = binding("gh", mine.clone(), &["api.github.com"]);
    let v = SecretValue::new("ghp_one");
    assert_eq!(
        s.put(&acme, &gh, &v, &SecretGuard::Identity(alice()), ROOMY, ts(1)).await.unwrap(),
        PutOutcome::Created
    );
    assert_eq!(
        s.put(&acme, &gh, &SecretValue::new("ghp_two"), &SecretGuard::Identity(alice()), ROOMY, ts(2))
            .await
            .unwrap(),
        PutOutcome::Replaced
    );
    let npm = binding("npm", SecretScope::Class(CallerClass::User), &["*.npmjs.org"]);
    s.put(&acme, &npm, &SecretValue::new("npm_x"), &SecretGuard::Any, ROOMY, ts(3)).await.unwrap();
    // Bob may not replace or delete alice's secret, nor the class's.
    let bob = SecretGuard::Identity(IdentityId::parse("bob").unwrap());
    let bobs = binding("gh", SecretScope::Identity(IdentityId::parse("bob").unwrap()), &["api.github.com"]);
    assert_eq!(
        s.put(&acme, &bobs, &SecretValue::new("b"), &bob, ROOMY, ts(4)).await.unwrap(),
        PutOutcome::Taken
    );
    assert!(!s.delete(&acme, &SecretName::parse("gh").unwrap(), &bob).await.unwrap());
    assert!(
        !s.delete(&acme, &SecretName::parse("npm").unwrap(), &SecretGuard::Identity(alice())).await.unwrap()
    );

    let listed = s.list(&acme).await.unwrap();
    assert_eq!(listed.iter().map(|e| e.binding.name.as_str()).collect::<Vec<_>>(), ["gh", "npm"]);
    assert_eq!(listed[0].binding, gh, "the binding round-trips");
    assert_eq!((listed[0].created_at, listed[0].updated_at), (ts(1), ts(2)));
    assert!(s.list(&org("other")).await.unwrap().is_empty(), "per org");

    let found = s.for_host(&acme, "api.github.com", 443).await.unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!((found[0].0.name.as_str(), found[0].1.expose()), ("gh", "ghp_two"));
    let found = s.for_host(&acme, "registry.npmjs.org", 443).await.unwrap();
    assert_eq!(
        found.iter().map(|(b, v)| (b.name.as_str(), v.expose())).collect::<Vec<_>>(),
        [("npm", "npm_x")]
    );
    assert!(s.for_host(&acme, "registry.npmjs.org", 80).await.unwrap().is_empty(), "no port: 443 alone");
    assert!(s.for_host(&acme, "api.github.com", 8443).await.unwrap().is_empty());
    assert!(s.for_host(&org("other"), "api.github.com", 443).await.unwrap().is_empty());

    assert!(
        s.delete(&acme, &SecretName::parse("gh").unwrap(), &SecretGuard::Identity(alice())).await.unwrap()
    );
    assert!(s.for_host(&acme, "api.github.com", 443).await.unwrap().is_empty(), "deleted: not used");
    assert!(s.delete(&acme, &SecretName::parse("npm").unwrap(), &SecretGuard::Any).await.unwrap());
    assert!(s.list(&acme).await.unwrap().is_empty());
}

async fn secrets_sealed_contract(db: &TestDb) {
    let s = db.store.secrets();
    let acme = org("acme");
    for name in ["a", "b"] {
        let b = binding(name, SecretScope::Org, &["api.example.com"]);
        s.put(&acme, &b, &SecretValue::new(format!("plain-value-{name}")), &SecretGuard::Any, ROOMY, ts(1))
            .await
            .unwrap();
    }
    let rows: Vec<(Vec<u8>, String)> = with_pool!(read db.store.backend(), p => {
        sqlx::query_as("SELECT sealed, binding FROM secrets").fetch_all(p).await
    })
    .unwrap();
    for (sealed, binding) in &rows {
        assert!(!sealed.windows(11).any(|w| w == b"plain-value"), "sealed at rest");
        assert!(!binding.contains("plain-value"));
    }
    // b's sealed value moved into a's row does not open: the gate's read fails, it does not
    // hand a wrong value over.
    with_pool!(write db.store.backend(), p => {
        sqlx::query("UPDATE secrets SET sealed = (SELECT sealed FROM secrets WHERE name = 'b') WHERE name = 'a'")
            .execute(p)
            .await
            .map(|_| ())
    })
    .unwrap();
    assert!(s.for_host(&acme, "api.example.com", 443).await.is_err());
    // The key is a file of the data dir, not a row.
    let key_dir = db.options.data_dir.join(super::super::secret_keys::SECRET_KEYS_DIR);
    assert!(std::fs::read_dir(key_dir).unwrap().count() >= 2, "a key file and `current`");
}

async fn secrets_rotation_contract(db: &TestDb) {
    let s = db.store.secrets();
    let acme = org("acme");
    for n in 0..150 {
        let b = binding(&format!("s{n}"), SecretScope::Org, &["api.example.com"]);
        s.put(&acme, &b, &SecretValue::new(format!("v{n}")), &SecretGuard::Any, ROOMY, ts(1)).await.unwrap();
    }
    let sql = db.store.secret_store();
    let before = sql.keys_in_use().await.unwrap();
    assert_eq!(before.len(), 1);
    let rotation = sql.rotate_key().await.unwrap();
    assert_eq!(rotation.resealed, 150);
    assert_eq!(rotation.removed, vec![before[0].0.clone()], "the old key goes once nothing uses it");
    assert_eq!(sql.keys_in_use().await.unwrap(), vec![(rotation.key_id.clone(), 150)]);
    // Another replica (a fresh key cache) opens every value under the new key.
    let replica = db.replica().await;
    let values = replica.secrets().for_host(&acme, "api.example.com", 443).await.unwrap();
    assert_eq!(values.len(), 150);
    assert!(values.iter().any(|(b, v)| b.name.as_str() == "s149" && v.expose() == "v149"));
    replica.close().await;
}

/// The limits are checked in the write: an identity past its count and an org past its
/// count get nothing written; a replace is not one more; and concurrent puts of new names
/// (each of which alone would fit) never pass either limit.
async fn secrets_limits_contract(db: &TestDb) {
    let s: Arc<dyn SecretStore> = db.store.secrets();
    let acme = org("acme");
    let limits = SecretLimits { per_org: 3, per_identity: 2 };
    let alices = |name: &str| binding(name, SecretScope::Identity(alice()), &["api.github.com"]);
    let orgs = |name: &str| binding(name, SecretScope::Org, &["api.github.com"]);
    let v = SecretValue::new("v");
    let put = |b: SecretBinding| {
        let (s, acme, v) = (s.clone(), acme.clone(), v.clone());
        async move { s.put(&acme, &b, &v, &SecretGuard::Any, limits, ts(1)).await.unwrap() }
    };
    assert_eq!(put(alices("a")).await, PutOutcome::Created);
    assert_eq!(put(alices("b")).await, PutOutcome::Created);
    assert_eq!(put(alices("c")).await, PutOutcome::IdentityFull);
    assert_eq!(put(alices("a")).await, PutOutcome::Replaced, "a replace is not one more");
    assert_eq!(put(orgs("x")).await, PutOutcome::Created);
    assert_eq!(put(orgs("y")).await, PutOutcome::OrgFull);
    assert_eq!(put(orgs("x")).await, PutOutcome::Replaced, "a replace in a full org");
    // An org-scoped secret moved to alice, who holds her two: refused, the secret unchanged.
    assert_eq!(put(alices("x")).await, PutOutcome::IdentityFull);
    let names: Vec<String> =
        s.list(&acme).await.unwrap().into_iter().map(|e| e.binding.name.to_string()).collect();
    assert_eq!(names, ["a", "b", "x"]);
    assert_eq!(s.list(&acme).await.unwrap()[2].binding.scope, SecretScope::Org);

    // Twenty new names for bob at once, room for five: five are made.
    let beta = org("beta");
    let room = SecretLimits { per_org: 100, per_identity: 5 };
    let mut puts = tokio::task::JoinSet::new();
    for n in 0..20 {
        let (s, beta) = (s.clone(), beta.clone());
        let b = binding(
            &format!("s{n}"),
            SecretScope::Identity(IdentityId::parse("bob").unwrap()),
            &["a.example"],
        );
        puts.spawn(
            async move { s.put(&beta, &b, &SecretValue::new("v"), &SecretGuard::Any, room, ts(1)).await },
        );
    }
    let mut made = 0;
    while let Some(done) = puts.join_next().await {
        match done.unwrap().unwrap() {
            PutOutcome::Created => made += 1,
            PutOutcome::IdentityFull => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(made, 5);
    assert_eq!(s.list(&beta).await.unwrap().len(), 5);
}
