//! Contract tests: one test body per port, run against SQLite and Postgres alike; plus
//! concurrent claims from two pools ("replicas"), lease take-over, tamper detection and a
//! 100,000-row verify on both databases.
//!
//! Postgres tests read `SANDLANE_TEST_POSTGRES_URL` (see `scripts/pg-throwaway.sh`) and
//! create a fresh database per test. Without it they fail, unless the developer skips
//! them by name (`SANDLANE_TEST_SKIP=postgres`; see `tests::services`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use domain::{
    AuditAction, AuditEvent, AuditOutcome, CallerClass, CallerIdentity, CallerKey, Durability, ExecutionId,
    IdentityId, OrgId, SandboxCaller, SandboxId, SandboxKey, SandboxState, SessionId, Timestamp, TokenId,
};
use ports::{
    AuditLog, CallerDirectory, ClaimOutcome, ClaimRequest, DirectoryError, RegistryError, SandboxRegistry,
    TokenGrant,
};
use sha2::{Digest as _, Sha256};

use super::{Backend, Store, StoreOptions, with_pool};

/// A store on a fresh database, and what it lives in.
struct TestDb {
    store: Store,
    options: StoreOptions,
    _dir: tempfile::TempDir,
}

impl TestDb {
    /// Another store (another pool: a second "replica") on the same database and data dir.
    async fn replica(&self) -> Store {
        Store::open(self.options.clone()).await.expect("second store")
    }
}

async fn sqlite(late_grace: Duration) -> TestDb {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut options = StoreOptions::new(dir.path());
    options.late_grace = late_grace;
    let store = Store::open(options.clone()).await.expect("sqlite store");
    assert_eq!(store.backend_name(), "sqlite");
    TestDb { store, options, _dir: dir }
}

/// The URL of a fresh database on the test Postgres; `None` when the developer skips
/// Postgres by name (without Postgres the test fails: see `tests::services`).
pub(crate) async fn fresh_postgres_url() -> Option<String> {
    let admin = tests::services::postgres_admin_url()?;
    let mut random = [0u8; 8];
    getrandom::fill(&mut random).expect("random");
    let name = format!("t_{}", super::seal::hex(&random));
    let mut conn =
        <sqlx::PgConnection as sqlx::Connection>::connect(&admin).await.expect("connect to the test cluster");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut conn)
        .await
        .expect("create test database");
    let base = admin.rsplit_once('/').map_or(admin.as_str(), |(b, _)| b);
    Some(format!("{base}/{name}"))
}

async fn postgres(late_grace: Duration) -> Option<TestDb> {
    let url = fresh_postgres_url().await?;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut options = StoreOptions::new(dir.path()).with_url(Some(&url));
    options.late_grace = late_grace;
    let store = Store::open(options.clone()).await.expect("postgres store");
    assert_eq!(store.backend_name(), "postgres");
    Some(TestDb { store, options, _dir: dir })
}

/// Runs `$body(&TestDb)` as a SQLite test and a Postgres test.
macro_rules! on_both {
    ($name:ident, $grace:ident, $body:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn sqlite() {
                let db = super::sqlite(super::$grace).await;
                super::$body(&db).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn postgres() {
                let Some(db) = super::postgres(super::$grace).await else {
                    return;
                };
                super::$body(&db).await;
            }
        }
    };
}

const NO_GRACE: Duration = Duration::ZERO;
const GRACE: Duration = super::DEFAULT_LATE_GRACE;

on_both!(registry, GRACE, registry_contract);
on_both!(lease_takeover, GRACE, lease_takeover_contract);
on_both!(concurrent_claims, GRACE, concurrent_claims_contract);
on_both!(callers, GRACE, callers_contract);
on_both!(audit, GRACE, audit_contract);
on_both!(concurrent_sealers, GRACE, concurrent_sealers_contract);
on_both!(append_only, GRACE, append_only_contract);
on_both!(tamper_edited_row, NO_GRACE, tamper_edited_row);
on_both!(tamper_deleted_row, NO_GRACE, tamper_deleted_row);
on_both!(tamper_inserted_row, NO_GRACE, tamper_inserted_row);
on_both!(tamper_swapped_rows, NO_GRACE, tamper_swapped_rows);
on_both!(tamper_edited_seal, NO_GRACE, tamper_edited_seal);
on_both!(tamper_deleted_seal, NO_GRACE, tamper_deleted_seal);
on_both!(verify_100k, GRACE, verify_100k_contract);
on_both!(ownership, GRACE, ownership_contract);
on_both!(concurrent_owners, GRACE, concurrent_owners_contract);
on_both!(lease_renewal, GRACE, lease_renewal_contract);
on_both!(revoked_callers, GRACE, revoked_callers_contract);
on_both!(audit_tail, GRACE, audit_tail_contract);
on_both!(background_candidates, GRACE, background_candidates_contract);

// ---------------------------------------------------------------------------------------
// fixtures

fn org(s: &str) -> OrgId {
    OrgId::parse(s).unwrap()
}

pub(crate) fn session_key(o: &str, s: &str) -> SandboxKey {
    SandboxKey::Session { org: org(o), session_id: SessionId::parse(s).unwrap() }
}

fn sandbox_id(n: u128) -> SandboxId {
    SandboxId::generate(1_796_000_000_000 + n as u64, n)
}

fn ts(ms: i64) -> Timestamp {
    Timestamp::from_unix_millis(ms)
}

fn caller(id: &str, class: CallerClass) -> SandboxCaller {
    SandboxCaller::from_record(IdentityId::parse(id).unwrap(), class)
}

pub(crate) fn claim_request(key: &SandboxKey, candidate: u128, holder: &str, now: i64) -> ClaimRequest {
    ClaimRequest {
        key: key.clone(),
        candidate_id: sandbox_id(candidate),
        durability: Durability::Durable,
        driver: "bubblewrap".into(),
        caller: caller("u-1", CallerClass::User),
        execution_id: ExecutionId::parse("ex-1").unwrap(),
        holder: holder.into(),
        lease_ms: 1_000,
        now: ts(now),
        max_running: None,
        warm: None,
    }
}

fn grant(token: &str, caller_id: &str, expires: i64) -> TokenGrant {
    TokenGrant {
        token_id: TokenId::parse(token).unwrap(),
        expires_at: ts(expires),
        execution_id: ExecutionId::parse("ex-2").unwrap(),
        caller: caller(caller_id, CallerClass::User),
    }
}

pub(super) fn event(o: &str, n: i64) -> AuditEvent {
    AuditEvent {
        action: if n % 2 == 0 { AuditAction::Ensure } else { AuditAction::Deprovision },
        key: session_key(o, &format!("s-{n}")),
        sandbox_id: (n % 3 != 0).then(|| sandbox_id(n as u128)),
        caller_id: IdentityId::parse(format!("u-{}", n % 7)).unwrap(),
        caller_class: CallerClass::ALL[(n % 3) as usize],
        durability: (n % 2 == 0).then_some(Durability::Ephemeral),
        driver: "bubblewrap".into(),
        outcome: AuditOutcome::Provisioned,
        message: format!("event {n}"),
        token_id: (n % 4 == 0).then(|| TokenId::parse(format!("jti-{n}")).unwrap()),
        at: ts(1_796_000_000_000 + n),
    }
}

/// Runs `sql` as an attacker with write access would: past the append-only triggers.
async fn tamper(store: &Store, sql: &str) {
    let script = match store.backend() {
        Backend::Sqlite { .. } => format!(
            "DROP TRIGGER audit_events_no_update; DROP TRIGGER audit_events_no_delete; \
             DROP TRIGGER audit_seals_no_update; DROP TRIGGER audit_seals_no_delete; {sql};"
        ),
        Backend::Postgres(..) => {
            format!("BEGIN; SET LOCAL session_replication_role = replica; {sql}; COMMIT;")
        }
    };
    with_pool!(write store.backend(), p => {
        sqlx::raw_sql(sqlx::AssertSqlSafe(script)).execute(p).await.map(|_| ())
    })
    .expect("tamper statement");
}

/// Runs a statement and returns the database's error message, if any.
async fn try_exec(store: &Store, sql: &'static str) -> Result<(), String> {
    with_pool!(write store.backend(), p => {
        sqlx::query(sql).execute(p).await.map(|_| ())
    })
    .map_err(|e| e.to_string())
}

// ---------------------------------------------------------------------------------------
// registry

async fn registry_contract(db: &TestDb) {
    let r: Arc<dyn SandboxRegistry> = db.store.registry();
    let key = session_key("acme", "s-1");
    let t0 = 1_796_000_000_000;

    let first = r.claim(&claim_request(&key, 1, "replica-a", t0)).await.unwrap();
    assert_eq!(first.outcome, ClaimOutcome::Created);
    let rec = &first.record;
    assert_eq!(rec.id, sandbox_id(1));
    assert_eq!(rec.key, key);
    assert_eq!(rec.state, SandboxState::Provisioning);
    assert_eq!(rec.durability, Durability::Durable);
    assert_eq!(rec.driver, "bubblewrap");
    assert_eq!(rec.caller_id.as_str(), "u-1");
    assert_eq!(rec.caller_class, CallerClass::User);
    assert_eq!((rec.lease.holder.as_str(), rec.lease.epoch), ("replica-a", 1));
    assert_eq!(rec.lease.expires_at, ts(t0 + 1_000));
    assert_eq!((rec.token_id.as_ref(), rec.tokens_revoked_at), (None, None));
    assert_eq!((rec.created_at, rec.updated_at), (ts(t0), ts(t0)));

    // A second claim under a live lease gets the same record, unchanged.
    let again = r.claim(&claim_request(&key, 2, "replica-b", t0 + 10)).await.unwrap();
    assert_eq!(again.outcome, ClaimOutcome::Existing);
    assert_eq!(&again.record, rec);
    assert_eq!(r.get(&rec.id).await.unwrap().as_ref(), Some(rec));
    assert_eq!(r.get_live(&key).await.unwrap().as_ref(), Some(rec));
    assert_eq!(r.get(&sandbox_id(99)).await.unwrap(), None);
    assert_eq!(r.get_live(&session_key("acme", "other")).await.unwrap(), None);
    // Keys are unique within an org, not across orgs.
    let elsewhere = r.claim(&claim_request(&session_key("beta", "s-1"), 3, "a", t0)).await;
    assert_eq!(elsewhere.unwrap().outcome, ClaimOutcome::Created);

    // Fenced and unknown moves.
    let g = grant("jti-1", "u-1", t0 + 900_000);
    assert_eq!(
        r.mark_ready(&rec.id, 2, &g, ts(t0 + 20)).await,
        Err(RegistryError::Fenced { sandbox_id: rec.id.clone(), epoch: 2 })
    );
    assert_eq!(
        r.mark_ready(&sandbox_id(99), 1, &g, ts(t0)).await,
        Err(RegistryError::NotFound(sandbox_id(99)))
    );
    let ready = r.mark_ready(&rec.id, 1, &g, ts(t0 + 20)).await.unwrap();
    assert_eq!(ready.state, SandboxState::Ready);
    assert_eq!(ready.token_id.as_ref().map(TokenId::as_str), Some("jti-1"));
    assert_eq!(ready.token_expires_at, Some(ts(t0 + 900_000)));
    assert_eq!(ready.execution_id.as_str(), "ex-2");
    assert_eq!(ready.updated_at, ts(t0 + 20));
    assert!(ready.tokens_active());
    // Ready twice is fenced (no longer provisioning).
    assert!(matches!(r.mark_ready(&rec.id, 1, &g, ts(t0 + 21)).await, Err(RegistryError::Fenced { .. })));
    assert!(matches!(
        r.mark_failed(&rec.id, 1, "late", ts(t0 + 21)).await,
        Err(RegistryError::Fenced { .. })
    ));

    // A ready record is returned to every later claim, lease or not.
    let later = r.claim(&claim_request(&key, 4, "replica-b", t0 + 60_000)).await.unwrap();
    assert_eq!(later.outcome, ClaimOutcome::Existing);
    assert_eq!(later.record, ready);

    // The token caller: the creator until a token is recorded, then whoever it was for.
    assert_eq!(ready.token_caller, caller("u-1", CallerClass::User));
    let jti = |s: &str| TokenId::parse(s).unwrap();
    r.record_token(&rec.id, Some(&jti("jti-1")), &grant("jti-2", "u-2", t0 + 1_000_000), ts(t0 + 30))
        .await
        .unwrap();
    // A writer that read the earlier token (a refresh of a list read before that ensure)
    // records nothing: the newer ensure's caller stays.
    assert_eq!(
        r.record_token(&rec.id, Some(&jti("jti-1")), &grant("jti-3", "u-1", t0 + 2_000_000), ts(t0 + 31))
            .await,
        Err(RegistryError::Superseded(rec.id.clone()))
    );
    let now = r.get(&rec.id).await.unwrap().unwrap();
    assert_eq!(now.token_caller, caller("u-2", CallerClass::User));
    assert_eq!(now.caller_id.as_str(), "u-1", "the creator stays recorded");
    assert_eq!(now.execution_id.as_str(), "ex-2");
    assert_eq!(now.token_id.as_ref().map(TokenId::as_str), Some("jti-2"));
    assert_eq!(now.token_expires_at, Some(ts(t0 + 1_000_000)));
    assert_eq!(
        r.record_token(&sandbox_id(99), None, &g, ts(t0)).await,
        Err(RegistryError::NotFound(sandbox_id(99)))
    );

    // Revocation is idempotent: the first time stands.
    r.revoke_tokens(&rec.id, ts(t0 + 40)).await.unwrap();
    r.revoke_tokens(&rec.id, ts(t0 + 50)).await.unwrap();
    let revoked = r.get(&rec.id).await.unwrap().unwrap();
    assert_eq!(revoked.tokens_revoked_at, Some(ts(t0 + 40)));
    assert!(!revoked.tokens_active());
    assert_eq!(r.revoke_tokens(&sandbox_id(99), ts(t0)).await, Err(RegistryError::NotFound(sandbox_id(99))));

    // Deprovision returns the record as it was, then the deprovisioned one; frees the key.
    let live = r.live_ids().await.unwrap();
    assert_eq!(live.len(), 2);
    let before = r.mark_deprovisioned(&rec.id, ts(t0 + 60)).await.unwrap().unwrap();
    assert_eq!(before, revoked);
    let second = r.mark_deprovisioned(&rec.id, ts(t0 + 70)).await.unwrap().unwrap();
    assert_eq!(second.state, SandboxState::Deprovisioned);
    assert_eq!(second.updated_at, ts(t0 + 60));
    assert_eq!(second.tokens_revoked_at, Some(ts(t0 + 40)));
    assert_eq!(r.mark_deprovisioned(&sandbox_id(99), ts(t0)).await.unwrap(), None);
    assert_eq!(r.get_live(&key).await.unwrap(), None);
    assert_eq!(r.live_ids().await.unwrap().len(), 1);
    assert_eq!(
        r.record_token(&rec.id, Some(&jti("jti-2")), &g, ts(t0 + 80)).await,
        Err(RegistryError::InvalidState {
            sandbox_id: rec.id.clone(),
            state: "deprovisioned".into(),
            action: "record a token"
        })
    );
    assert!(matches!(r.mark_ready(&rec.id, 1, &g, ts(t0 + 80)).await, Err(RegistryError::Fenced { .. })));

    // The freed key is claimed afresh; a failure frees it again.
    let fresh = r.claim(&claim_request(&key, 5, "replica-b", t0 + 100)).await.unwrap();
    assert_eq!(fresh.outcome, ClaimOutcome::Created);
    assert_eq!(fresh.record.id, sandbox_id(5));
    assert!(matches!(
        r.mark_failed(&sandbox_id(5), 7, "boom", ts(t0 + 110)).await,
        Err(RegistryError::Fenced { epoch: 7, .. })
    ));
    assert_eq!(
        r.mark_failed(&sandbox_id(99), 1, "boom", ts(t0)).await,
        Err(RegistryError::NotFound(sandbox_id(99)))
    );
    r.mark_failed(&sandbox_id(5), 1, "boom", ts(t0 + 110)).await.unwrap();
    let failed = r.get(&sandbox_id(5)).await.unwrap().unwrap();
    assert_eq!(failed.state, SandboxState::Failed);
    assert_eq!(failed.message.as_deref(), Some("boom"));
    assert_eq!(r.get_live(&key).await.unwrap(), None);
    let internal = ClaimRequest {
        caller: caller("sandlane:internal", CallerClass::Internal),
        durability: Durability::Ephemeral,
        ..claim_request(&key, 6, "replica-a", t0 + 200)
    };
    let third = r.claim(&internal).await.unwrap();
    assert_eq!(third.outcome, ClaimOutcome::Created);
    assert_eq!(third.record.caller_class, CallerClass::Internal);
    assert_eq!(third.record.durability, Durability::Ephemeral);

    // live_ids is oldest first, with each one's org and state.
    let live = r.live_ids().await.unwrap();
    let ids: Vec<_> = live.iter().map(|x| x.id.clone()).collect();
    assert_eq!(ids, vec![sandbox_id(3), sandbox_id(6)]);
    assert_eq!((live[0].org.as_str(), live[1].org.as_str()), ("beta", "acme"), "{live:?}");
    assert_eq!(live[1].state, SandboxState::Provisioning);
}

/// What the refresher and the reconciler read instead of every live record: the ready
/// sandboxes whose token expires by a horizon, the provisioning ones whose lease expired.
async fn background_candidates_contract(db: &TestDb) {
    let r: Arc<dyn SandboxRegistry> = db.store.registry();
    let t0 = 1_796_000_000_000;
    // Ready with tokens expiring at t0+100, t0+500 and t0+900; one provisioning (lease to
    // t0+1000); one ready then deprovisioned (token at t0+50).
    for (n, expires) in [(1, 500), (2, 100), (3, 900), (5, 50)] {
        let key = session_key("acme", &format!("s-{n}"));
        let c = r.claim(&claim_request(&key, n, "replica-a", t0)).await.unwrap();
        r.mark_ready(&c.record.id, 1, &grant(&format!("jti-{n}"), "u-1", t0 + expires), ts(t0 + 1))
            .await
            .unwrap();
    }
    r.mark_deprovisioned(&sandbox_id(5), ts(t0 + 2)).await.unwrap();
    r.claim(&claim_request(&session_key("acme", "s-4"), 4, "replica-a", t0)).await.unwrap();

    let due = |horizon: i64| {
        let r = r.clone();
        async move {
            r.list_token_expiring(ts(t0 + horizon))
                .await
                .unwrap()
                .into_iter()
                .map(|x| x.id)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(due(99).await, vec![]);
    assert_eq!(due(100).await, vec![sandbox_id(2)], "at the horizon is due");
    assert_eq!(due(600).await, vec![sandbox_id(2), sandbox_id(1)], "soonest first");
    assert_eq!(due(10_000).await, vec![sandbox_id(2), sandbox_id(1), sandbox_id(3)], "ready ones only");

    let expired = |now: i64| {
        let r = r.clone();
        async move {
            r.list_lease_expired(ts(t0 + now)).await.unwrap().into_iter().map(|x| x.id).collect::<Vec<_>>()
        }
    };
    assert_eq!(expired(999).await, vec![]);
    assert_eq!(expired(1_000).await, vec![sandbox_id(4)], "provisioning ones whose lease ran out");

    let live: Vec<_> = r.live_ids().await.unwrap().into_iter().map(|x| (x.id, x.state)).collect();
    assert_eq!(live.len(), 4, "the deprovisioned one is not live: {live:?}");
    assert!(live.contains(&(sandbox_id(4), SandboxState::Provisioning)), "{live:?}");
}

async fn lease_takeover_contract(db: &TestDb) {
    let a: Arc<dyn SandboxRegistry> = db.store.registry();
    let other = db.replica().await;
    let b: Arc<dyn SandboxRegistry> = other.registry();
    let key = session_key("acme", "lease");
    let t0 = 1_796_000_000_000;

    let mine = a.claim(&claim_request(&key, 1, "replica-a", t0)).await.unwrap();
    assert_eq!(mine.outcome, ClaimOutcome::Created);
    // Not lapsed yet (expires at t0 + 1000).
    let early = b.claim(&claim_request(&key, 2, "replica-b", t0 + 999)).await.unwrap();
    assert_eq!(early.outcome, ClaimOutcome::Existing);
    assert_eq!(early.record.lease.holder, "replica-a");
    // Lapsed: replica-b takes it over, same sandbox, next epoch.
    let taken = b.claim(&claim_request(&key, 3, "replica-b", t0 + 1_000)).await.unwrap();
    assert_eq!(taken.outcome, ClaimOutcome::TakenOver);
    assert_eq!(taken.record.id, sandbox_id(1));
    assert_eq!(taken.record.lease.holder, "replica-b");
    assert_eq!(taken.record.lease.epoch, 2);
    assert_eq!(taken.record.lease.expires_at, ts(t0 + 2_000));
    assert_eq!(taken.record.updated_at, ts(t0 + 1_000));
    assert_eq!(taken.record.created_at, ts(t0));
    // Someone else now sees replica-b's live lease.
    let third = a.claim(&claim_request(&key, 4, "replica-c", t0 + 1_500)).await.unwrap();
    assert_eq!(third.outcome, ClaimOutcome::Existing);
    assert_eq!(third.record, taken.record);

    // The stale holder's writes are refused.
    let g = grant("jti-a", "u-1", t0 + 900_000);
    let fenced = RegistryError::Fenced { sandbox_id: sandbox_id(1), epoch: 1 };
    assert_eq!(a.mark_ready(&sandbox_id(1), 1, &g, ts(t0 + 1_600)).await, Err(fenced.clone()));
    assert_eq!(a.mark_failed(&sandbox_id(1), 1, "x", ts(t0 + 1_600)).await, Err(fenced));
    // The new holder's write goes through.
    let gb = grant("jti-b", "u-1", t0 + 900_000);
    let ready = b.mark_ready(&sandbox_id(1), 2, &gb, ts(t0 + 1_700)).await.unwrap();
    assert_eq!(ready.state, SandboxState::Ready);
    assert_eq!(ready.token_id.as_ref().map(TokenId::as_str), Some("jti-b"));
    assert_eq!(ready.lease.epoch, 2);

    // Many takers of one lapsed lease: exactly one wins.
    let key2 = session_key("acme", "lease-2");
    a.claim(&claim_request(&key2, 10, "dead", t0)).await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..16u128 {
        let reg = if i % 2 == 0 { a.clone() } else { b.clone() };
        let req = claim_request(&key2, 100 + i, &format!("taker-{i}"), t0 + 5_000);
        tasks.push(tokio::spawn(async move { reg.claim(&req).await.unwrap() }));
    }
    let mut took = 0;
    for t in tasks {
        let c = t.await.unwrap();
        assert_eq!(c.record.id, sandbox_id(10));
        assert_eq!(c.record.lease.epoch, 2);
        took += usize::from(c.outcome == ClaimOutcome::TakenOver);
    }
    assert_eq!(took, 1);
    other.close().await;
}

async fn concurrent_claims_contract(db: &TestDb) {
    let other = db.replica().await;
    let replicas = [db.store.registry(), other.registry()];
    let key = session_key("acme", "contended");
    let start = Arc::new(tokio::sync::Barrier::new(64));
    let mut tasks = Vec::new();
    for i in 0..64u128 {
        let reg = replicas[(i % 2) as usize].clone();
        let start = start.clone();
        let req = claim_request(&key, 1000 + i, &format!("replica-{}", i % 2), 1_796_000_000_000);
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            reg.claim(&req).await.unwrap()
        }));
    }
    let mut created = 0;
    let mut ids = std::collections::BTreeSet::new();
    for t in tasks {
        let c = t.await.unwrap();
        created += usize::from(c.outcome == ClaimOutcome::Created);
        assert_ne!(c.outcome, ClaimOutcome::TakenOver);
        ids.insert(c.record.id);
    }
    assert_eq!(created, 1, "exactly one claim creates");
    assert_eq!(ids.len(), 1, "every claim returns the same sandbox: {ids:?}");
    assert_eq!(db.store.registry().live_ids().await.unwrap().len(), 1);
    other.close().await;
}

// ---------------------------------------------------------------------------------------
// callers

async fn callers_contract(db: &TestDb) {
    let d: Arc<dyn CallerDirectory> = db.store.callers();
    let ada = CallerIdentity::from_wire(
        IdentityId::parse("u-ada").unwrap(),
        CallerClass::User,
        vec![org("beta"), org("acme")],
        Some("Ada".into()),
    )
    .unwrap();
    let svc = CallerIdentity::from_wire(
        IdentityId::parse("svc-ci").unwrap(),
        CallerClass::Service,
        vec![org("acme")],
        None,
    )
    .unwrap();

    let k1 = d.add(&ada, ts(1_000)).await.unwrap();
    let k2 = d.add(&svc, ts(2_000)).await.unwrap();
    assert!(k1.expose().starts_with("sk_") && k1.expose().len() >= 3 + 43);
    assert_ne!(k1, k2);
    assert!(!format!("{k1:?} {k1}").contains(&k1.expose()[3..]));
    assert_eq!(d.authenticate(&k1).await.unwrap(), Some(ada.clone()));
    assert_eq!(d.authenticate(&k2).await.unwrap(), Some(svc.clone()));
    assert_eq!(d.authenticate(&CallerKey::new("sk_nope")).await.unwrap(), None);
    let mut near = k1.expose().to_owned();
    let last = near.pop();
    near.push(if last == Some('A') { 'B' } else { 'A' });
    assert_eq!(d.authenticate(&CallerKey::new(near)).await.unwrap(), None);

    assert_eq!(d.add(&ada, ts(3_000)).await, Err(DirectoryError::Exists(ada.identity_id().clone())));
    assert_eq!(d.add(&CallerIdentity::internal(), ts(3_000)).await, Err(DirectoryError::InternalRefused));

    // Only the SHA-256 of the key is stored.
    let stored: Vec<Vec<u8>> = with_pool!(read db.store.backend(), p => {
        sqlx::query_scalar("SELECT key_hash FROM callers ORDER BY created_at").fetch_all(p).await
    })
    .unwrap();
    let expected: Vec<Vec<u8>> =
        [&k1, &k2].iter().map(|k| Sha256::digest(k.expose().as_bytes()).to_vec()).collect();
    assert_eq!(stored, expected);
    let dump: Vec<String> = with_pool!(read db.store.backend(), p => {
        sqlx::query_scalar("SELECT identity_id || class || orgs FROM callers").fetch_all(p).await
    })
    .unwrap();
    assert!(dump.iter().all(|row| !row.contains(&k1.expose()[3..])));

    let listed = d.list().await.unwrap();
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[0].identity, ada);
    assert_eq!((listed[0].created_at, listed[0].revoked_at), (ts(1_000), None));
    assert_eq!(listed[1].identity, svc);

    d.revoke(ada.identity_id(), ts(4_000)).await.unwrap();
    d.revoke(ada.identity_id(), ts(5_000)).await.unwrap();
    assert_eq!(d.authenticate(&k1).await.unwrap(), None);
    assert_eq!(d.authenticate(&k2).await.unwrap(), Some(svc));
    assert_eq!(d.list().await.unwrap()[0].revoked_at, Some(ts(4_000)));
    let ghost = IdentityId::parse("ghost").unwrap();
    assert_eq!(d.revoke(&ghost, ts(1)).await, Err(DirectoryError::NotFound(ghost)));
}

// ---------------------------------------------------------------------------------------
// audit

async fn audit_contract(db: &TestDb) {
    let log: Arc<dyn AuditLog> = db.store.audit();
    let empty = log.verify().await.unwrap();
    assert!(empty.is_intact());
    assert_eq!((empty.rows, empty.seals), (0, 0));
    assert_eq!(log.seal().await.unwrap(), ports::SealReport::default());

    let mut seqs = Vec::new();
    for n in 0..6 {
        let o = if n % 2 == 0 { "acme" } else { "beta" };
        seqs.push(log.append(&event(o, n)).await.unwrap());
    }
    assert!(seqs.windows(2).all(|w| w[0] < w[1]));
    let status = log.seal_status().await.unwrap();
    assert_eq!(status.unsealed, 6);
    assert!(status.oldest_unsealed.is_some());

    let page = log.page(&org("acme"), 0, 10).await.unwrap();
    let got: Vec<_> = page.entries.iter().map(|e| e.event.clone()).collect();
    assert_eq!(got, vec![event("acme", 0), event("acme", 2), event("acme", 4)]);
    assert!(page.entries.iter().all(|e| !e.sealed));
    // A short page saw everything of the org up to the watermark: the last append.
    assert_eq!(page.next, seqs[5]);
    // Paging: limit and `after`.
    let first = log.page(&org("acme"), 0, 2).await.unwrap();
    assert_eq!(first.entries.len(), 2);
    let rest = log.page(&org("acme"), first.next, 2).await.unwrap();
    assert_eq!(rest.entries.len(), 1);
    assert_eq!(rest.entries[0].seq, seqs[4]);
    assert_eq!(rest.next, seqs[5]);
    let done = log.page(&org("acme"), rest.next, 2).await.unwrap();
    assert_eq!((done.entries.len(), done.next), (0, rest.next));
    assert_eq!(log.page(&org("acme"), 0, 0).await.unwrap().next, 0, "limit 0 moves nothing");

    let unsealed = log.verify().await.unwrap();
    assert!(unsealed.is_intact(), "{unsealed:?}");
    assert_eq!((unsealed.rows, unsealed.unsealed), (6, 6));

    let sealed = log.seal().await.unwrap();
    assert_eq!((sealed.rows, sealed.seals), (6, 1));
    assert_eq!(log.seal().await.unwrap().rows, 0);
    assert_eq!(log.seal_status().await.unwrap(), ports::SealStatus::default());
    assert!(log.page(&org("beta"), 0, 10).await.unwrap().entries.iter().all(|e| e.sealed));

    log.append(&event("acme", 6)).await.unwrap();
    assert_eq!(log.seal().await.unwrap().rows, 1);
    let report = log.verify().await.unwrap();
    assert!(report.is_intact(), "{report:?}");
    assert_eq!((report.rows, report.seals, report.unsealed), (7, 2, 0));

    // The sealer loop seals within its interval and once more at shutdown.
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let sealer = super::spawn_sealer(log.clone(), Duration::from_millis(50), async move {
        let _ = stopped.await;
    });
    log.append(&event("acme", 7)).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while log.seal_status().await.unwrap().unsealed > 0 {
        assert!(Instant::now() < deadline, "the sealer did not seal within 5 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    log.append(&event("acme", 8)).await.unwrap();
    stop.send(()).unwrap();
    sealer.await.unwrap();
    assert_eq!(log.seal_status().await.unwrap().unsealed, 0);
    assert!(log.verify().await.unwrap().is_intact());
}

async fn concurrent_sealers_contract(db: &TestDb) {
    let other = db.replica().await;
    let logs = [db.store.audit(), other.audit()];
    let mut tasks = Vec::new();
    for w in 0..8i64 {
        let log = logs[(w % 2) as usize].clone();
        tasks.push(tokio::spawn(async move {
            for n in 0..50 {
                log.append(&event("acme", w * 1000 + n)).await.unwrap();
                if n % 10 == 0 {
                    log.seal().await.unwrap();
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // Both replicas' sealers finish the job; none seals a row twice.
    while logs[0].seal().await.unwrap().rows + logs[1].seal().await.unwrap().rows > 0 {}
    let report = logs[1].verify().await.unwrap();
    assert!(report.is_intact(), "{report:?}");
    assert_eq!((report.rows, report.unsealed), (400, 0));
    other.close().await;
}

async fn append_only_contract(db: &TestDb) {
    let log = db.store.audit();
    log.append(&event("acme", 1)).await.unwrap();
    log.seal().await.unwrap();
    for sql in [
        "UPDATE audit_events SET message = 'x'",
        "DELETE FROM audit_events",
        "UPDATE audit_seals SET sealed_at = 0",
        "DELETE FROM audit_seals",
    ] {
        let err = try_exec(&db.store, sql).await.expect_err(sql);
        assert!(err.contains("append-only"), "{sql}: {err}");
    }
    assert!(log.verify().await.unwrap().is_intact());
}

/// 20 rows in two seals (rows 1-10, 11-20).
async fn sealed_log(db: &TestDb) -> Arc<dyn AuditLog> {
    let log = db.store.audit();
    for n in 1..=20 {
        let seq = log.append(&event("acme", n)).await.unwrap();
        assert_eq!(seq, n);
        if n == 10 {
            assert_eq!(log.seal().await.unwrap().rows, 10);
        }
    }
    assert_eq!(log.seal().await.unwrap().rows, 10);
    assert!(log.verify().await.unwrap().is_intact());
    log
}

async fn first_bad(log: &Arc<dyn AuditLog>) -> ports::BadRecord {
    let report = log.verify().await.unwrap();
    report.first_bad.expect("verify must find the tampering")
}

async fn tamper_edited_row(db: &TestDb) {
    let log = sealed_log(db).await;
    tamper(&db.store, "UPDATE audit_events SET message = 'nothing happened' WHERE seq = 7").await;
    let bad = first_bad(&log).await;
    assert_eq!(bad.record, "row 7", "{bad:?}");
    assert!(bad.reason.contains("seal 1"), "{bad:?}");
}

async fn tamper_deleted_row(db: &TestDb) {
    let log = sealed_log(db).await;
    tamper(&db.store, "DELETE FROM audit_events WHERE seq = 12").await;
    let bad = first_bad(&log).await;
    assert_eq!(bad.record, "row 12", "{bad:?}");
    assert!(bad.reason.contains("missing"), "{bad:?}");
}

async fn tamper_inserted_row(db: &TestDb) {
    let log = sealed_log(db).await;
    // A forged row slipped in before the sealed history (seq 0: below every sealed seq).
    tamper(
        &db.store,
        "INSERT INTO audit_events (seq, org, action, kind, key, sandbox_id, caller_id, \
         caller_class, durability, driver, outcome, message, token_id, at, hash, appended_at) \
         SELECT 0, org, action, kind, key, sandbox_id, caller_id, caller_class, durability, \
         driver, outcome, 'forged', token_id, at, hash, appended_at \
         FROM audit_events WHERE seq = 5",
    )
    .await;
    let bad = first_bad(&log).await;
    assert_eq!(bad.record, "row 0", "{bad:?}");
    // The sealer refuses to seal it, so it stays visible.
    assert_eq!(log.seal().await.unwrap().rows, 0);
    assert_eq!(first_bad(&log).await.record, "row 0");
}

async fn tamper_swapped_rows(db: &TestDb) {
    let log = sealed_log(db).await;
    tamper(
        &db.store,
        "UPDATE audit_events SET seq = -seq WHERE seq IN (14, 15); \
         UPDATE audit_events SET seq = 15 WHERE seq = -14; \
         UPDATE audit_events SET seq = 14 WHERE seq = -15",
    )
    .await;
    let bad = first_bad(&log).await;
    assert_eq!(bad.record, "row 14", "{bad:?}");
}

async fn tamper_edited_seal(db: &TestDb) {
    let log = sealed_log(db).await;
    tamper(&db.store, "UPDATE audit_seals SET sealed_at = sealed_at - 1 WHERE id = 2").await;
    let bad = first_bad(&log).await;
    assert_eq!(bad.record, "seal 2", "{bad:?}");
}

async fn tamper_deleted_seal(db: &TestDb) {
    let log = sealed_log(db).await;
    tamper(&db.store, "DELETE FROM audit_seals WHERE id = 1").await;
    let bad = first_bad(&log).await;
    assert_eq!(bad.record, "seal 1", "{bad:?}");
}

/// A multi-row INSERT of well-formed audit rows (correct hashes), bypassing `append`.
macro_rules! insert_rows {
    ($events:expr) => {{
        let mut q = sqlx::QueryBuilder::new(
            "INSERT INTO audit_events (org, action, kind, key, sandbox_id, caller_id, \
             caller_class, durability, driver, outcome, message, token_id, at, hash, \
             appended_at) ",
        );
        q.push_values($events, |mut b, e: &AuditEvent| {
            b.push_bind(e.org().as_str().to_owned())
                .push_bind(e.action.as_str())
                .push_bind(e.key.kind().as_str())
                .push_bind(e.key.key().to_owned())
                .push_bind(e.sandbox_id.as_ref().map(|s| s.as_str().to_owned()))
                .push_bind(e.caller_id.as_str().to_owned())
                .push_bind(e.caller_class.as_str())
                .push_bind(e.durability.map(Durability::as_str))
                .push_bind(e.driver.clone())
                .push_bind(e.outcome.as_str())
                .push_bind(e.message.clone())
                .push_bind(e.token_id.as_ref().map(|s| s.as_str().to_owned()))
                .push_bind(e.at.unix_millis())
                .push_bind(e.hash().to_vec())
                .push_bind(super::now_ms());
        });
        q
    }};
}

/// Rows commit out of seq order in Postgres: a row whose insert commits after a later
/// row was sealed is sealed by the next pass (within the late grace), and the log stays
/// intact. Past the grace the sealer leaves such a row for verify to name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_commit_is_sealed_by_the_next_pass_postgres() {
    for (grace, late_is_sealed) in [(GRACE, true), (NO_GRACE, false)] {
        let Some(db) = postgres(grace).await else {
            return;
        };
        let log = db.store.audit();
        let Backend::Postgres(pool, _) = db.store.backend() else { unreachable!() };
        let mut slow = pool.begin().await.unwrap();
        let events = [event("acme", 1)];
        insert_rows!(&events).build().execute(&mut *slow).await.unwrap();
        let later = log.append(&event("acme", 2)).await.unwrap();
        assert_eq!(later, 2, "the uncommitted row holds seq 1");
        assert_eq!(log.seal().await.unwrap().rows, 1);
        slow.commit().await.unwrap();
        // Within the grace the late row is backlog; past it, it is verify's to name and
        // the (tail-only) status no longer counts it.
        let status = log.seal_status().await.unwrap();
        assert_eq!(status.unsealed, u64::from(late_is_sealed));
        let next = log.seal().await.unwrap().rows;
        let report = log.verify().await.unwrap();
        if late_is_sealed {
            assert_eq!(next, 1);
            assert!(report.is_intact(), "{report:?}");
            assert_eq!((report.rows, report.seals, report.unsealed), (2, 2, 0));
        } else {
            assert_eq!(next, 0);
            assert_eq!(report.first_bad.expect("flagged").record, "row 1");
        }
    }
}

/// Bulk-loads 100,000 well-formed rows (the append path is measured by the benchmark),
/// seals them, and times verify.
async fn verify_100k_contract(db: &TestDb) {
    const ROWS: i64 = 100_000;
    const CHUNK: i64 = 1_000;
    let t = Instant::now();
    for start in (0..ROWS).step_by(CHUNK as usize) {
        let events: Vec<AuditEvent> = (start..start + CHUNK).map(|n| event("acme", n)).collect();
        with_pool!(write db.store.backend(), p => {
            insert_rows!(&events).build().execute(p).await.map(|_| ())
        })
        .unwrap();
    }
    let load = t.elapsed();
    let log = db.store.audit();
    let t = Instant::now();
    let mut seals = 0;
    loop {
        let r = log.seal().await.unwrap();
        if r.rows == 0 {
            break;
        }
        seals += r.seals;
    }
    let seal = t.elapsed();
    let t = Instant::now();
    let report = log.verify().await.unwrap();
    let verify = t.elapsed();
    assert!(report.is_intact(), "{report:?}");
    assert_eq!((report.rows, report.unsealed), (ROWS as u64, 0));
    println!(
        "verify-100k [{}]: load {:.2} s, seal {:.2} s ({seals} seals), verify {:.3} s",
        db.store.backend_name(),
        load.as_secs_f64(),
        seal.as_secs_f64(),
        verify.as_secs_f64()
    );
}

// ---------------------------------------------------------------------------------------
// opening the store

#[tokio::test]
async fn sqlite_is_the_default_in_the_data_dir_and_keeps_the_key_outside() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::connect(None, dir.path()).await.unwrap();
    store.ping().await.unwrap();
    assert_eq!(store.backend_name(), "sqlite");
    assert!(dir.path().join(super::SQLITE_FILE).is_file());
    let key = dir.path().join(super::seal::AUDIT_KEY_FILE);
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(std::fs::metadata(&key).unwrap().permissions().mode() & 0o777, 0o600);
    let mode: String = with_pool!(read store.backend(), p => {
        sqlx::query_scalar("PRAGMA journal_mode").fetch_one(p).await
    })
    .unwrap();
    assert_eq!(mode, "wal");
    // Reopening applies no migration twice and keeps the same audit key.
    store.audit().append(&event("acme", 1)).await.unwrap();
    store.audit().seal().await.unwrap();
    store.close().await;
    let again = Store::connect(None, dir.path()).await.unwrap();
    assert!(again.audit().verify().await.unwrap().is_intact());
    // An explicit sqlite: URL works too.
    let url = format!("sqlite:{}", dir.path().join("other.db").display());
    let other = Store::connect(Some(&url), dir.path()).await.unwrap();
    other.ping().await.unwrap();
    // A verifier that must not mint a key refuses a data dir without one.
    let empty = tempfile::tempdir().unwrap();
    let mut opts = StoreOptions::new(empty.path());
    opts.create_audit_key = false;
    let err = Store::open(opts).await.unwrap_err();
    assert!(matches!(err, super::StoreError::AuditKey(_)), "{err}");
    assert!(!empty.path().join(super::seal::AUDIT_KEY_FILE).exists());
}

#[tokio::test]
async fn bad_urls_are_refused_without_echoing_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let err = Store::connect(Some("mysql://root:hunter2@db/x"), dir.path()).await.unwrap_err();
    assert!(matches!(err, super::StoreError::Url(_)), "{err}");
    assert!(!err.to_string().contains("hunter2"));
    let opts = StoreOptions::new(dir.path()).with_url(Some("postgres://u:hunter2@h/db"));
    assert!(!format!("{opts:?}").contains("hunter2"));
}

// ---------------------------------------------------------------------------------------
// ownership, lease renewal, revoked callers, the audit tail

async fn ownership_contract(db: &TestDb) {
    let r = db.store.registry();
    let key = session_key("acme", "owned");
    let t0 = 1_796_000_000_000;
    assert_eq!(r.owner(&key).await.unwrap(), None);
    let ada = caller("u-ada", CallerClass::User);
    let first = r.claim_owner(&key, &ada, ts(t0)).await.unwrap();
    assert_eq!(first.identity_id.as_str(), "u-ada");
    assert_eq!((first.class, first.since), (CallerClass::User, ts(t0)));
    // Later claimers get the first owner back, unchanged.
    let bob = caller("u-bob", CallerClass::User);
    assert_eq!(r.claim_owner(&key, &bob, ts(t0 + 5)).await.unwrap(), first);
    let svc = caller("svc", CallerClass::Service);
    assert_eq!(r.claim_owner(&key, &svc, ts(t0 + 6)).await.unwrap(), first);
    assert_eq!(r.owner(&key).await.unwrap(), Some(first.clone()));
    // Per key: the same session id in another org, or a workflow key, is another key.
    assert_eq!(r.owner(&session_key("beta", "owned")).await.unwrap(), None);
    let other = r.claim_owner(&session_key("beta", "owned"), &bob, ts(t0)).await.unwrap();
    assert_eq!(other.identity_id.as_str(), "u-bob");
    // Kept across deprovision and a fresh record for the key (recovery).
    let rec = r.claim(&claim_request(&key, 1, "replica-a", t0)).await.unwrap().record;
    r.mark_deprovisioned(&rec.id, ts(t0 + 10)).await.unwrap();
    let again = r.claim(&claim_request(&key, 2, "replica-a", t0 + 20)).await.unwrap();
    assert_eq!(again.outcome, ClaimOutcome::Created);
    assert_eq!(r.owner(&key).await.unwrap(), Some(first.clone()));
    // Read with a record: the record as `get` has it, with its key's owner.
    let again = again.record;
    assert_eq!(r.get_with_owner(&again.id).await.unwrap(), Some((again.clone(), Some(first.clone()))));
    let deprovisioned = r.get(&rec.id).await.unwrap().unwrap();
    assert_eq!(r.get_with_owner(&rec.id).await.unwrap(), Some((deprovisioned, Some(first.clone()))));
    // A record whose key nobody owns (a key of its own, one org over), and no record.
    let unowned_key = session_key("gamma", "owned");
    let unowned = r.claim(&claim_request(&unowned_key, 3, "replica-a", t0)).await.unwrap().record;
    assert_eq!(r.get_with_owner(&unowned.id).await.unwrap(), Some((unowned.clone(), None)));
    let owner = r.claim_owner(&unowned_key, &bob, ts(t0 + 30)).await.unwrap();
    assert_eq!(r.get_with_owner(&unowned.id).await.unwrap(), Some((unowned, Some(owner))));
    assert_eq!(r.get_with_owner(&sandbox_id(4242)).await.unwrap(), None);
    // Other replicas see it.
    let replica = db.replica().await;
    assert_eq!(replica.registry().owner(&key).await.unwrap().unwrap().identity_id.as_str(), "u-ada");
    let seen = replica.registry().get_with_owner(&again.id).await.unwrap().unwrap();
    assert_eq!(seen.1, Some(first));
}

/// 64 callers race to own one key from two pools: all get the same owner, one of them.
async fn concurrent_owners_contract(db: &TestDb) {
    let replica = db.replica().await;
    let pools = [db.store.registry(), replica.registry()];
    let key = session_key("acme", "contended-owner");
    let mut tasks = Vec::new();
    for n in 0..64 {
        let r = pools[n % 2].clone();
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            let me = caller(&format!("u-{n}"), CallerClass::User);
            r.claim_owner(&key, &me, ts(1_796_000_000_000 + n as i64)).await.unwrap()
        }));
    }
    let mut owners = Vec::new();
    for t in tasks {
        owners.push(t.await.unwrap().identity_id);
    }
    let first = owners[0].clone();
    assert!(owners.iter().all(|o| *o == first), "{owners:?}");
    assert!(first.as_str().starts_with("u-"));
}

async fn lease_renewal_contract(db: &TestDb) {
    let r = db.store.registry();
    let key = session_key("acme", "slow");
    let t0 = 1_796_000_000_000;
    let rec = r.claim(&claim_request(&key, 1, "replica-a", t0)).await.unwrap().record;
    r.renew_lease(&rec.id, 1, ts(t0 + 50_000), ts(t0 + 900)).await.unwrap();
    // Renewed: no take-over after the original 1 s lease.
    let later = r.claim(&claim_request(&key, 2, "replica-b", t0 + 10_000)).await.unwrap();
    assert_eq!(later.outcome, ClaimOutcome::Existing);
    assert_eq!(later.record.lease.expires_at, ts(t0 + 50_000));
    // A stale epoch is fenced: after a take-over the old holder cannot renew.
    let taken = r.claim(&claim_request(&key, 3, "replica-b", t0 + 60_000)).await.unwrap();
    assert_eq!((taken.outcome, taken.record.lease.epoch), (ClaimOutcome::TakenOver, 2));
    assert!(matches!(
        r.renew_lease(&rec.id, 1, ts(t0 + 120_000), ts(t0 + 60_001)).await,
        Err(RegistryError::Fenced { epoch: 1, .. })
    ));
    r.renew_lease(&rec.id, 2, ts(t0 + 120_000), ts(t0 + 60_002)).await.unwrap();
    // Not provisioning any more: fenced; unknown: not found.
    r.mark_ready(&rec.id, 2, &grant("jti-r", "u-1", t0 + 900_000), ts(t0 + 60_003)).await.unwrap();
    assert!(matches!(
        r.renew_lease(&rec.id, 2, ts(t0 + 180_000), ts(t0 + 60_004)).await,
        Err(RegistryError::Fenced { .. })
    ));
    assert_eq!(
        r.renew_lease(&sandbox_id(77), 1, ts(t0), ts(t0)).await,
        Err(RegistryError::NotFound(sandbox_id(77)))
    );
}

async fn revoked_callers_contract(db: &TestDb) {
    let d = db.store.callers();
    let ada = CallerIdentity::from_wire(
        IdentityId::parse("u-ada").unwrap(),
        CallerClass::User,
        vec![org("acme")],
        None,
    )
    .unwrap();
    d.add(&ada, ts(1)).await.unwrap();
    let id = ada.identity_id().clone();
    assert!(!d.is_revoked(&id).await.unwrap());
    // Identities the directory never issued a key for are not revoked (the server's own).
    assert!(!d.is_revoked(CallerIdentity::internal().identity_id()).await.unwrap());
    assert!(!d.is_revoked(&IdentityId::parse("nobody").unwrap()).await.unwrap());
    d.revoke(&id, ts(2)).await.unwrap();
    assert!(d.is_revoked(&id).await.unwrap());
    // At once, on another replica.
    let replica = db.replica().await;
    assert!(replica.callers().is_revoked(&id).await.unwrap());
}

/// Writers append concurrently from two pools while a reader follows `next`: the reader
/// sees every event of its org exactly once, in `seq` order.
async fn audit_tail_contract(db: &TestDb) {
    let replica = db.replica().await;
    let logs = [db.store.audit(), replica.audit()];
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let log = logs[w % 2].clone();
            tokio::spawn(async move {
                let mut mine = Vec::new();
                for n in 0..40 {
                    let o = if n % 4 == 0 { "beta" } else { "acme" };
                    let seq = log.append(&event(o, (w * 1000 + n) as i64)).await.unwrap();
                    if o == "acme" {
                        mine.push(seq);
                    }
                }
                mine
            })
        })
        .collect();
    let reader = logs[1].clone();
    let mut seen = Vec::new();
    let mut after = 0;
    let expected_total = 8 * 30;
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen.len() < expected_total {
        assert!(Instant::now() < deadline, "the reader saw {} of {expected_total}", seen.len());
        let page = reader.page(&org("acme"), after, 7).await.unwrap();
        assert!(page.next >= after, "next went back: {after} -> {}", page.next);
        seen.extend(page.entries.iter().map(|e| e.seq));
        after = page.next;
    }
    let mut written = Vec::new();
    for w in writers {
        written.extend(w.await.unwrap());
    }
    written.sort_unstable();
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "out of order or repeated: {seen:?}");
    assert_eq!(seen, written, "every acme event exactly once");
    let tail = reader.page(&org("acme"), after, 7).await.unwrap();
    assert!(tail.entries.is_empty());
}

/// Postgres: an append held open in its transaction holds a lower `seq` while a later
/// append commits. The reader's pages stop below the held one; once it commits, the reader
/// sees it on a later page, then the later one, each exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_commit_shows_on_a_later_page_exactly_once_postgres() {
    let Some(db) = postgres(GRACE).await else {
        return;
    };
    let log = db.store.audit();
    let Backend::Postgres(pool, _) = db.store.backend() else { unreachable!() };
    let first = log.append(&event("acme", 0)).await.unwrap();
    let page = log.page(&org("acme"), 0, 10).await.unwrap();
    assert_eq!(page.entries.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![first]);
    let mut after = page.next;
    assert_eq!(after, first);

    // The same statement `append` runs, held open in its transaction.
    let held_event = event("acme", 2);
    let mut held = pool.begin().await.unwrap();
    let held_seq: i64 = super::audit::bind_event!(
        sqlx::query_scalar(super::audit::PG_APPEND),
        held_event,
        held_event.hash(),
        super::now_ms()
    )
    .bind(super::audit::APPEND_BARRIER)
    .fetch_one(&mut *held)
    .await
    .unwrap();
    let later = log.append(&event("acme", 4)).await.unwrap();
    assert!(later > held_seq, "the held append drew its seq first");

    // While it is held, no page goes past it (each waits its bounded time, then falls
    // back to the last watermark).
    for _ in 0..3 {
        let page = log.page(&org("acme"), after, 10).await.unwrap();
        assert!(page.entries.is_empty(), "a page went past an uncommitted seq: {page:?}");
        assert!(page.next < held_seq, "next {} passed the held seq {held_seq}", page.next);
        after = page.next;
    }
    held.commit().await.unwrap();
    let mut seen = Vec::new();
    for _ in 0..3 {
        let page = log.page(&org("acme"), after, 10).await.unwrap();
        seen.extend(page.entries.iter().map(|e| (e.seq, e.event.clone())));
        after = page.next;
    }
    assert_eq!(seen, vec![(held_seq, event("acme", 2)), (later, event("acme", 4))]);
}

mod listing;
mod policy;
mod preview;
mod secrets;
mod snapshots;
mod tickets;
mod webhooks;
