//! The secret use cases against mocks: who manages what, the allowlist, write-only.

use std::sync::Mutex;

use domain::policy::parse_egress;
use domain::{AuditAction, CallerClass, CallerIdentity, IdentityId, OrgId, PolicyPatch};
use ports::{MockAuditLog, MockCallerDirectory, MockClock, MockPolicyStore, PolicyOverrides};

use super::*;
use crate::test_support::{MemorySecretStore, NOW};
use crate::usecase::tests::Logs;

const VALUE: &str = "ghp_TOPSECRETvalue123";

struct Fixture {
    ports: SecretPorts,
    events: Arc<Mutex<Vec<AuditEvent>>>,
}

/// The org `acme` allows api.github.com (any port) for everyone and *.internal.example for
/// services only.
fn fixture() -> Fixture {
    let mut audit = MockAuditLog::new();
    let events = crate::test_support::recording_audit(&mut audit);
    let mut clock = MockClock::new();
    clock.expect_now().returning(|| domain::Timestamp::from_unix_millis(NOW));
    let mut store = MockPolicyStore::new();
    let rules =
        parse_egress(&["api.github.com".to_owned(), "*.internal.example@service".to_owned()]).unwrap();
    store.expect_overrides().returning(move |_| {
        Ok(Some(PolicyOverrides {
            patch: PolicyPatch { egress_allow: Some(rules.clone()), ..PolicyPatch::default() },
            version: 1,
            updated_at: domain::Timestamp::from_unix_millis(NOW),
        }))
    });
    let mut directory = MockCallerDirectory::new();
    directory.expect_list().returning(|| Ok(vec![]));
    Fixture {
        ports: SecretPorts {
            secrets: Arc::new(MemorySecretStore::default()),
            audit: Arc::new(audit),
            clock: Arc::new(clock),
            directory: Arc::new(directory),
            policies: Arc::new(super::super::Policies::new(Arc::new(store), domain::OrgPolicy::builtin())),
        },
        events,
    }
}

fn acme() -> OrgId {
    OrgId::parse("acme").unwrap()
}

fn caller(id: &str, class: CallerClass) -> Actor {
    Actor::Caller(
        CallerIdentity::from_wire(IdentityId::parse(id).unwrap(), class, vec![acme()], None).unwrap(),
    )
}

fn sandbox_token() -> Actor {
    Actor::SandboxToken {
        org: acme(),
        sandbox_id: domain::SandboxId::generate(1, 1),
        subject: IdentityId::parse("alice").unwrap(),
    }
}

fn request(scope: SecretScope, host: &str) -> SecretRequest {
    SecretRequest {
        value: SecretValue::new(VALUE),
        hosts: vec![host.to_owned()],
        header: None,
        format: None,
        scope,
        methods: vec![],
        paths: vec![],
    }
}

fn mine(id: &str) -> SecretScope {
    SecretScope::Identity(IdentityId::parse(id).unwrap())
}

#[tokio::test(flavor = "current_thread")]
async fn who_manages_what() {
    let f = fixture();
    let d = &f.ports;
    let (alice, bob, svc) = (
        caller("alice", CallerClass::User),
        caller("bob", CallerClass::User),
        caller("svc", CallerClass::Service),
    );
    // A user sets its own; not another's, not a class's or the org's.
    let (created, entry) =
        set_secret(d, &alice, &acme(), "gh", request(mine("alice"), "api.github.com")).await.unwrap();
    assert!(created);
    assert_eq!(entry.binding.format.as_str(), "Bearer {value}");
    for scope in [mine("bob"), SecretScope::Class(CallerClass::User), SecretScope::Org] {
        let e = set_secret(d, &alice, &acme(), "x", request(scope, "api.github.com")).await.unwrap_err();
        assert!(matches!(e, SecretError::Denied(_)), "{e:?}");
    }
    // A service sets any scope; a sandbox token nothing; a caller of another org nothing.
    set_secret(d, &svc, &acme(), "org-gh", request(SecretScope::Org, "api.github.com")).await.unwrap();
    let e = set_secret(d, &sandbox_token(), &acme(), "y", request(mine("alice"), "api.github.com"))
        .await
        .unwrap_err();
    assert!(matches!(e, SecretError::Denied(_)));
    let other = OrgId::parse("other").unwrap();
    assert!(matches!(
        set_secret(d, &svc, &other, "y", request(SecretScope::Org, "api.github.com")).await.unwrap_err(),
        SecretError::Denied(_)
    ));
    assert!(matches!(list_secrets(d, &sandbox_token(), &acme()).await.unwrap_err(), SecretError::Denied(_)));
    assert!(matches!(
        delete_secret(d, &sandbox_token(), &acme(), "gh").await.unwrap_err(),
        SecretError::Denied(_)
    ));
    // Bob sees none of alice's or the org's, cannot delete or take them.
    assert!(list_secrets(d, &bob, &acme()).await.unwrap().is_empty());
    assert!(matches!(delete_secret(d, &bob, &acme(), "gh").await.unwrap_err(), SecretError::NotFound { .. }));
    assert!(matches!(
        delete_secret(d, &alice, &acme(), "org-gh").await.unwrap_err(),
        SecretError::NotFound { .. }
    ));
    assert!(matches!(
        set_secret(d, &bob, &acme(), "gh", request(mine("bob"), "api.github.com")).await.unwrap_err(),
        SecretError::Taken(_)
    ));
    // Alice sees her own; the service sees both.
    let names = |v: Vec<SecretEntry>| v.into_iter().map(|e| e.binding.name.to_string()).collect::<Vec<_>>();
    assert_eq!(names(list_secrets(d, &alice, &acme()).await.unwrap()), ["gh"]);
    assert_eq!(names(list_secrets(d, &svc, &acme()).await.unwrap()), ["gh", "org-gh"]);
    // Replacing keeps created_at; deleting works for the owner and for a service.
    let (created, _) =
        set_secret(d, &alice, &acme(), "gh", request(mine("alice"), "api.github.com")).await.unwrap();
    assert!(!created);
    delete_secret(d, &alice, &acme(), "gh").await.unwrap();
    delete_secret(d, &svc, &acme(), "org-gh").await.unwrap();
    let actions: Vec<_> =
        f.events.lock().unwrap().iter().map(|e| (e.action, e.caller_id.to_string())).collect();
    assert_eq!(
        actions,
        [
            (AuditAction::SecretSet, "alice".to_owned()),
            (AuditAction::SecretSet, "svc".to_owned()),
            (AuditAction::SecretSet, "alice".to_owned()),
            (AuditAction::SecretDelete, "alice".to_owned()),
            (AuditAction::SecretDelete, "svc".to_owned()),
        ]
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_secret_never_opens_a_destination() {
    let f = fixture();
    let d = &f.ports;
    let svc = caller("svc", CallerClass::Service);
    let e =
        set_secret(d, &svc, &acme(), "x", request(SecretScope::Org, "evil.example.com")).await.unwrap_err();
    assert!(matches!(&e, SecretError::Invalid(m) if m.contains("evil.example.com:443")), "{e:?}");
    // *.internal.example is allowed for services only: fine for the service class, not the org.
    set_secret(
        d,
        &svc,
        &acme(),
        "svc",
        request(SecretScope::Class(CallerClass::Service), "*.internal.example:443"),
    )
    .await
    .unwrap();
    let e = set_secret(d, &svc, &acme(), "o", request(SecretScope::Org, "*.internal.example:443"))
        .await
        .unwrap_err();
    assert!(matches!(&e, SecretError::Invalid(m) if m.contains("user callers")), "{e:?}");
    // An identity the directory does not know may be either class.
    let e = set_secret(d, &svc, &acme(), "i", request(mine("carol"), "*.internal.example:443"))
        .await
        .unwrap_err();
    assert!(matches!(e, SecretError::Invalid(_)));
    // Bad bindings: 400.
    let mut bad = request(SecretScope::Org, "api.github.com");
    bad.header = Some("Proxy-Authorization".into());
    assert!(matches!(set_secret(d, &svc, &acme(), "x", bad).await.unwrap_err(), SecretError::Invalid(_)));
    let mut bad = request(SecretScope::Org, "api.github.com");
    bad.value = SecretValue::new("a\r\nX-Evil: 1");
    assert!(matches!(set_secret(d, &svc, &acme(), "x", bad).await.unwrap_err(), SecretError::Invalid(_)));
    assert!(matches!(
        set_secret(d, &svc, &acme(), "bad/name", request(SecretScope::Org, "api.github.com"))
            .await
            .unwrap_err(),
        SecretError::Invalid(_)
    ));
}

#[tokio::test(flavor = "current_thread")]
async fn the_value_is_in_no_answer_event_or_log_line() {
    let (logs, _guard) = Logs::capture();
    let f = fixture();
    let d = &f.ports;
    let svc = caller("svc", CallerClass::Service);
    let (_, entry) =
        set_secret(d, &svc, &acme(), "gh", request(SecretScope::Org, "api.github.com")).await.unwrap();
    let listed = list_secrets(d, &svc, &acme()).await.unwrap();
    let e =
        set_secret(d, &svc, &acme(), "x", request(SecretScope::Org, "evil.example.com")).await.unwrap_err();
    delete_secret(d, &svc, &acme(), "gh").await.unwrap();
    let shown = format!("{entry:?} {listed:?} {e:?} {e}");
    assert!(!shown.contains(VALUE));
    for event in f.events.lock().unwrap().iter() {
        assert!(!format!("{event:?}").contains(VALUE));
    }
    let text = logs.text();
    assert!(text.contains("secret set"), "the log was captured: {text}");
    assert!(!text.contains(VALUE));
}

#[tokio::test(flavor = "current_thread")]
async fn a_store_failure_is_unavailable() {
    let f = fixture();
    let store = Arc::new(MemorySecretStore::default());
    store.failing.store(true, std::sync::atomic::Ordering::Relaxed);
    let d = SecretPorts { secrets: store, ..f.ports.clone() };
    let svc = caller("svc", CallerClass::Service);
    let e =
        set_secret(&d, &svc, &acme(), "gh", request(SecretScope::Org, "api.github.com")).await.unwrap_err();
    assert!(matches!(e, SecretError::Unavailable(_)));
    assert!(f.events.lock().unwrap().is_empty(), "nothing stored, nothing audited");
}
