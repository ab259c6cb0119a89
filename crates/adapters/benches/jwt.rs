//! Benchmark of the JWT minter: mint and verify per second, beside raw Ed25519 sign and
//! verify (ed25519-dalek) of a message the size of a token's signing input, in one run.
//!
//! `cargo bench -p adapters --bench jwt -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::sync::Arc;

use adapters::jwt::{JwtConfig, JwtMinter, KeyStore};
use criterion::{Criterion, Throughput, criterion_main};
use domain::sandbox::{Lease, SandboxRecord};
use domain::split::{RecordSubject, split_caller};
use domain::{
    CallerClass, Durability, ExecutionId, IdentityId, OrgId, SandboxCaller, SandboxId, SandboxKey,
    SandboxState, SessionId, Timestamp,
};
use ed25519_dalek::{Signer, SigningKey, Verifier};
use ports::{
    Clock, CredentialMinter, CredentialVerifier, MockCallerDirectory, MockSandboxRegistry, SystemClock,
};

fn ready_record(id: &SandboxId, key: &SandboxKey, now: Timestamp) -> SandboxRecord {
    SandboxRecord {
        id: id.clone(),
        key: key.clone(),
        durability: Durability::Ephemeral,
        state: SandboxState::Ready,
        driver: "bubblewrap".to_owned(),
        caller_id: IdentityId::parse("svc:bench").expect("valid id"),
        caller_class: CallerClass::Service,
        token_caller: SandboxCaller::from_record(
            IdentityId::parse("svc:bench").expect("valid id"),
            CallerClass::Service,
        ),
        execution_id: ExecutionId::parse("exec-bench").expect("valid id"),
        token_id: None,
        token_expires_at: None,
        lease: Lease { holder: "bench".to_owned(), expires_at: now, epoch: 1 },
        tokens_revoked_at: None,
        message: None,
        created_at: now,
        updated_at: now,
        last_active_at: now,
    }
}

fn bench_jwt(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
    let dir = tempfile::tempdir().expect("temp dir");
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let now = clock.now();
    let keys = Arc::new(KeyStore::load_or_create(dir.path(), clock.clone()).expect("keys"));

    let org = OrgId::parse("acme").expect("valid id");
    let key = SandboxKey::Session { org, session_id: SessionId::parse("sess-bench").expect("valid id") };
    let sandbox = SandboxId::generate(u64::try_from(now.unix_millis()).unwrap_or(0), 42);
    let record = ready_record(&sandbox, &key, now);
    // The registry read is an in-memory stub: the figure is the minter's own cost.
    let mut registry = MockSandboxRegistry::new();
    registry.expect_get().returning(move |_| Ok(Some(record.clone())));

    let mut callers = MockCallerDirectory::new();
    callers.expect_is_revoked().returning(|_| Ok(false));
    let minter = JwtMinter::new(JwtConfig::default(), keys, Arc::new(registry), Arc::new(callers), clock)
        .expect("minter");
    let execution = ExecutionId::parse("exec-bench").expect("valid id");
    let caller = IdentityId::parse("user:alice@example.com").expect("valid id");
    let caller = SandboxCaller::from_record(caller, CallerClass::User);
    let (request, _) = split_caller(&RecordSubject::new(&key, &execution), &caller, &sandbox);
    let token = rt.block_on(minter.mint(&request)).expect("mint").token;

    // Raw Ed25519 over a message as long as the token's signing input.
    let signing_input_len = token.expose().rfind('.').unwrap_or(0);
    let message = vec![b'e'; signing_input_len];
    let raw_key = SigningKey::from_bytes(&[7u8; 32]);
    let raw_public = raw_key.verifying_key();
    let raw_signature = raw_key.sign(&message);

    let mut group = c.benchmark_group("jwt");
    group.throughput(Throughput::Elements(1));
    group.bench_function("mint", |b| {
        b.iter(|| rt.block_on(minter.mint(black_box(&request))).expect("mint"));
    });
    group.bench_function("verify", |b| {
        b.iter(|| rt.block_on(minter.verify(black_box(&token))).expect("verify"));
    });
    group.bench_function("ed25519_sign", |b| {
        b.iter(|| raw_key.sign(black_box(&message)));
    });
    group.bench_function("ed25519_verify", |b| {
        b.iter(|| raw_public.verify(black_box(&message), black_box(&raw_signature)).expect("verify"));
    });
    group.finish();
}

/// A private module, so the function `criterion_group!` generates needs no doc.
mod groups {
    criterion::criterion_group!(benches, super::bench_jwt);
}
criterion_main!(groups::benches);
