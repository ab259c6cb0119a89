//! Tests of the JWT minter, verifier, key store and introspection.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use domain::sandbox::Lease;
use domain::split::{RecordSubject, split_caller};
use domain::{
    CallerClass, CallerIdentity, CallerKey, Durability, ExecutionId, IdentityId, MintRequest, OrgId,
    SandboxCaller, SandboxId, SandboxKey, SandboxRecord, SandboxState, SandboxToken, SessionId, Timestamp,
};
use ed25519_dalek::{Signer, SigningKey};
use ports::{
    CallerDirectory, CallerEntry, Claim, ClaimRequest, Clock, CredentialMinter, CredentialVerifier,
    DirectoryError, KeyOwner, RegistryError, SandboxRegistry, TokenGrant, VerifyError,
};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::*;

// ---------------------------------------------------------------- fakes

/// A clock the test sets.
struct TestClock(AtomicI64);

impl TestClock {
    fn at_secs(secs: i64) -> Arc<Self> {
        Arc::new(Self(AtomicI64::new(secs * 1000)))
    }
    fn advance_secs(&self, secs: i64) {
        self.0.fetch_add(secs * 1000, Ordering::SeqCst);
    }
    fn secs(&self) -> i64 {
        self.now().unix_secs()
    }
}

impl Clock for TestClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_unix_millis(self.0.load(Ordering::SeqCst))
    }
}

/// An in-memory registry: only what the minter reads and writes is implemented.
#[derive(Default)]
struct MemRegistry {
    records: Mutex<HashMap<SandboxId, SandboxRecord>>,
    fail_reads: AtomicBool,
}

impl MemRegistry {
    fn insert(&self, record: SandboxRecord) {
        self.records.lock().unwrap().insert(record.id.clone(), record);
    }
    fn remove(&self, id: &SandboxId) {
        self.records.lock().unwrap().remove(id);
    }
}

fn unused() -> RegistryError {
    RegistryError::Store("not used by the minter".into())
}

#[async_trait]
impl SandboxRegistry for MemRegistry {
    async fn claim(&self, _: &ClaimRequest) -> Result<Claim, RegistryError> {
        Err(unused())
    }
    async fn adopt_as_owner(&self, _: &ClaimRequest) -> Result<Option<SandboxRecord>, RegistryError> {
        Err(unused())
    }
    async fn mark_ready(
        &self,
        _: &SandboxId,
        _: i64,
        _: &TokenGrant,
        _: Timestamp,
    ) -> Result<SandboxRecord, RegistryError> {
        Err(unused())
    }
    async fn mark_ready_audited(
        &self,
        _: &SandboxId,
        _: i64,
        _: &TokenGrant,
        _: &domain::AuditEvent,
        _: Timestamp,
    ) -> Result<SandboxRecord, RegistryError> {
        Err(unused())
    }
    async fn mark_failed(&self, _: &SandboxId, _: i64, _: &str, _: Timestamp) -> Result<(), RegistryError> {
        Err(unused())
    }
    async fn record_token<'a>(
        &self,
        _: &SandboxId,
        _: Option<&'a domain::TokenId>,
        _: &TokenGrant,
        _: Timestamp,
    ) -> Result<(), RegistryError> {
        Err(unused())
    }
    async fn mark_deprovisioned(
        &self,
        sandbox: &SandboxId,
        now: Timestamp,
    ) -> Result<Option<SandboxRecord>, RegistryError> {
        let mut records = self.records.lock().unwrap();
        Ok(records.get_mut(sandbox).map(|r| {
            let before = r.clone();
            r.state = SandboxState::Deprovisioned;
            r.tokens_revoked_at.get_or_insert(now);
            before
        }))
    }
    async fn revoke_tokens(&self, sandbox: &SandboxId, now: Timestamp) -> Result<(), RegistryError> {
        let mut records = self.records.lock().unwrap();
        let record = records.get_mut(sandbox).ok_or_else(|| RegistryError::NotFound(sandbox.clone()))?;
        record.tokens_revoked_at.get_or_insert(now);
        Ok(())
    }
    async fn get(&self, sandbox: &SandboxId) -> Result<Option<SandboxRecord>, RegistryError> {
        if self.fail_reads.load(Ordering::SeqCst) {
            return Err(RegistryError::Store("connection refused".into()));
        }
        Ok(self.records.lock().unwrap().get(sandbox).cloned())
    }
    async fn get_with_owner(
        &self,
        _: &SandboxId,
    ) -> Result<Option<(SandboxRecord, Option<KeyOwner>)>, RegistryError> {
        Err(unused())
    }
    async fn list_org(
        &self,
        _: &ports::OrgListing,
    ) -> Result<Vec<(SandboxRecord, Option<KeyOwner>)>, RegistryError> {
        Err(unused())
    }
    async fn get_live(&self, _: &SandboxKey) -> Result<Option<SandboxRecord>, RegistryError> {
        Err(unused())
    }
    async fn live_ids(&self) -> Result<Vec<ports::LiveId>, RegistryError> {
        Err(unused())
    }
    async fn list_token_expiring(&self, _: Timestamp) -> Result<Vec<SandboxRecord>, RegistryError> {
        Err(unused())
    }
    async fn list_lease_expired(&self, _: Timestamp) -> Result<Vec<SandboxRecord>, RegistryError> {
        Err(unused())
    }
    async fn list_idle(&self, _: Timestamp) -> Result<Vec<SandboxRecord>, RegistryError> {
        Err(unused())
    }
    async fn list_created_before(&self, _: Timestamp) -> Result<Vec<SandboxRecord>, RegistryError> {
        Err(unused())
    }
    async fn ready_ids_since(&self, _: Timestamp) -> Result<Vec<SandboxId>, RegistryError> {
        Err(unused())
    }
    async fn ready_ids(&self) -> Result<Vec<SandboxId>, RegistryError> {
        Err(unused())
    }
    async fn renew_lease(
        &self,
        _: &SandboxId,
        _: i64,
        _: Timestamp,
        _: Timestamp,
    ) -> Result<(), RegistryError> {
        Err(unused())
    }
    async fn claim_owner(
        &self,
        _: &SandboxKey,
        _: &SandboxCaller,
        _: Timestamp,
    ) -> Result<KeyOwner, RegistryError> {
        Err(unused())
    }
    async fn owner(&self, _: &SandboxKey) -> Result<Option<KeyOwner>, RegistryError> {
        Err(unused())
    }
    async fn resume(&self, _: &ports::ResumeRequest) -> Result<SandboxRecord, RegistryError> {
        Err(unused())
    }
    async fn suspend(&self, _: &SandboxId, _: Timestamp, _: Timestamp) -> Result<bool, RegistryError> {
        Err(unused())
    }
    async fn touch(&self, _: &[(SandboxId, Timestamp)]) -> Result<(), RegistryError> {
        Err(unused())
    }
    async fn live_counts(&self) -> Result<Vec<ports::StateCount>, RegistryError> {
        Err(unused())
    }
    async fn claim_warm_slot(
        &self,
        _: &ports::WarmSlotRequest,
    ) -> Result<Option<ports::WarmSandbox>, RegistryError> {
        Err(unused())
    }
    async fn renew_warm_lease(
        &self,
        _: &SandboxId,
        _: i64,
        _: Timestamp,
        _: Timestamp,
    ) -> Result<(), RegistryError> {
        Err(unused())
    }
    async fn mark_warm_ready(&self, _: &SandboxId, _: i64, _: Timestamp) -> Result<(), RegistryError> {
        Err(unused())
    }
    async fn remove_warm(&self, _: &SandboxId) -> Result<bool, RegistryError> {
        Err(unused())
    }
    async fn list_warm(&self) -> Result<Vec<ports::WarmSandbox>, RegistryError> {
        Err(unused())
    }
}

/// An in-memory caller directory: only revocation is read by the verifier.
#[derive(Default)]
struct MemCallers {
    revoked: Mutex<HashSet<IdentityId>>,
    fail_reads: AtomicBool,
}

impl MemCallers {
    fn revoke(&self, id: &IdentityId) {
        self.revoked.lock().unwrap().insert(id.clone());
    }
}

fn directory_unused() -> DirectoryError {
    DirectoryError::Store("not used by the minter".into())
}

#[async_trait]
impl CallerDirectory for MemCallers {
    async fn authenticate(&self, _: &CallerKey) -> Result<Option<CallerIdentity>, DirectoryError> {
        Err(directory_unused())
    }
    async fn add(&self, _: &CallerIdentity, _: Timestamp) -> Result<CallerKey, DirectoryError> {
        Err(directory_unused())
    }
    async fn is_revoked(&self, caller: &IdentityId) -> Result<bool, DirectoryError> {
        if self.fail_reads.load(Ordering::SeqCst) {
            return Err(DirectoryError::Store("connection refused".into()));
        }
        Ok(self.revoked.lock().unwrap().contains(caller))
    }
    async fn revoke(&self, _: &IdentityId, _: Timestamp) -> Result<(), DirectoryError> {
        Err(directory_unused())
    }
    async fn list(&self) -> Result<Vec<CallerEntry>, DirectoryError> {
        Err(directory_unused())
    }
}

// ---------------------------------------------------------------- fixtures

const T0: i64 = 1_796_207_883; // 2026-12-02T10:38:03Z

fn org() -> OrgId {
    OrgId::parse("acme").unwrap()
}
fn caller() -> IdentityId {
    IdentityId::parse("user:alice@example.com").unwrap()
}
fn sandbox_id(n: u128) -> SandboxId {
    SandboxId::generate(1_796_207_883_000, n)
}

fn session_key(org: &OrgId) -> SandboxKey {
    SandboxKey::Session { org: org.clone(), session_id: SessionId::parse("sess-1").unwrap() }
}
fn workflow_key(org: &OrgId) -> SandboxKey {
    SandboxKey::Workflow { org: org.clone(), execution_id: ExecutionId::parse("wf-exec-9").unwrap() }
}

fn record(id: &SandboxId, key: SandboxKey) -> SandboxRecord {
    let now = Timestamp::from_unix_secs(T0);
    SandboxRecord {
        id: id.clone(),
        key,
        durability: Durability::Durable,
        state: SandboxState::Ready,
        driver: "bubblewrap".to_owned(),
        caller_id: caller(),
        caller_class: CallerClass::User,
        token_caller: SandboxCaller::from_record(caller(), CallerClass::User),
        execution_id: ExecutionId::parse("exec-1").unwrap(),
        token_id: None,
        token_expires_at: None,
        lease: Lease { holder: "replica-1".to_owned(), expires_at: now, epoch: 1 },
        tokens_revoked_at: None,
        message: None,
        created_at: now,
        updated_at: now,
        last_active_at: now,
    }
}

fn request(key: &SandboxKey, sandbox: &SandboxId) -> MintRequest {
    let execution = match key {
        SandboxKey::Session { .. } => ExecutionId::parse("exec-1").unwrap(),
        SandboxKey::Workflow { execution_id, .. } => execution_id.clone(),
    };
    mint_for(key, &execution, &caller(), sandbox)
}

/// The mint request of `subject` for a record's key and execution, cut by the caller split.
fn mint_for(
    key: &SandboxKey,
    execution: &ExecutionId,
    subject: &IdentityId,
    sandbox: &SandboxId,
) -> MintRequest {
    let caller = domain::SandboxCaller::from_record(subject.clone(), CallerClass::User);
    split_caller(&RecordSubject::new(key, execution), &caller, sandbox).0
}

struct Env {
    dir: tempfile::TempDir,
    clock: Arc<TestClock>,
    registry: Arc<MemRegistry>,
    callers: Arc<MemCallers>,
    keys: Arc<KeyStore>,
    minter: JwtMinter,
    /// A ready session sandbox in org `acme`.
    a: SandboxId,
    /// Another ready session-less (workflow) sandbox in org `acme`.
    w: SandboxId,
}

impl Env {
    fn new() -> Self {
        Self::with_config(JwtConfig::default())
    }

    fn with_config(config: JwtConfig) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let clock = TestClock::at_secs(T0);
        let registry = Arc::new(MemRegistry::default());
        let callers = Arc::new(MemCallers::default());
        let keys = Arc::new(KeyStore::load_or_create(dir.path(), clock.clone()).unwrap());
        let minter =
            JwtMinter::new(config, keys.clone(), registry.clone(), callers.clone(), clock.clone()).unwrap();
        let (a, w) = (sandbox_id(1), sandbox_id(2));
        registry.insert(record(&a, session_key(&org())));
        registry.insert(record(&w, workflow_key(&org())));
        Self { dir, clock, registry, callers, keys, minter, a, w }
    }

    /// Another minter over the same key dir and registry: a restart, or another replica.
    fn replica(&self) -> JwtMinter {
        let keys = Arc::new(KeyStore::load_or_create(self.dir.path(), self.clock.clone()).unwrap());
        JwtMinter::new(
            JwtConfig::default(),
            keys,
            self.registry.clone(),
            self.callers.clone(),
            self.clock.clone(),
        )
        .unwrap()
    }

    async fn mint_a(&self) -> SandboxToken {
        self.minter.mint(&request(&session_key(&org()), &self.a)).await.unwrap().token
    }

    async fn verify(&self, token: &str) -> Result<ports::TokenClaims, VerifyError> {
        self.minter.verify(&SandboxToken::new(token)).await
    }

    /// A valid claim set for sandbox A at the clock's now, as JSON.
    fn claims_a(&self) -> Value {
        let now = self.clock.secs();
        json!({
            "iss": "sandlane", "aud": "sandlane-sandbox", "sub": caller().as_str(),
            "org_id": "acme", "session_id": "sess-1", "execution_id": "exec-1",
            "sandbox_id": self.a.as_str(), "iat": now, "nbf": now, "exp": now + 900,
            "jti": "forged-jti-1",
        })
    }

    fn header(&self) -> Value {
        json!({ "typ": "sbx+jwt", "alg": "EdDSA", "kid": self.keys.current_kid() })
    }

    /// Signs arbitrary header and claims with the real current key.
    fn forge(&self, header: &Value, claims: &Value) -> String {
        forge_with(&self.keys.current_signing_key(), header, claims)
    }

    /// Refused, and the error quotes no part of the token.
    async fn assert_refused(&self, token: &str, reason: &str) -> VerifyError {
        let err = self.verify(token).await.expect_err(reason);
        let text = format!("{err} {err:?}");
        for part in token.split('.').filter(|p| p.len() > 8) {
            assert!(!text.contains(part), "{reason}: error quotes the token: {text}");
        }
        assert_eq!(self.minter.introspect(token).await, json!({"active": false}), "{reason}");
        err
    }
}

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

fn forge_with(key: &SigningKey, header: &Value, claims: &Value) -> String {
    let input = format!("{}.{}", b64(header.to_string().as_bytes()), b64(claims.to_string().as_bytes()));
    let signature = key.sign(input.as_bytes());
    format!("{input}.{}", b64(&signature.to_bytes()))
}

fn segment_json(token: &str, index: usize) -> Value {
    let part = token.split('.').nth(index).unwrap();
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(part).unwrap()).unwrap()
}

fn invalid_reason(err: VerifyError) -> String {
    match err {
        VerifyError::Invalid(reason) => reason,
        other => panic!("expected Invalid, got {other:?}"),
    }
}

// ---------------------------------------------------------------- format

#[tokio::test]
async fn minted_token_has_exactly_the_designed_header_and_claims() {
    let env = Env::new();
    let minted = env.minter.mint(&request(&session_key(&org()), &env.a)).await.unwrap();
    let token = minted.token.expose();

    let header = segment_json(token, 0);
    assert_eq!(header, json!({"alg": "EdDSA", "typ": "sbx+jwt", "kid": env.keys.current_kid()}));

    let claims = segment_json(token, 1);
    let keys: HashSet<&str> = claims.as_object().unwrap().keys().map(String::as_str).collect();
    let expected: HashSet<&str> = [
        "iss",
        "aud",
        "sub",
        "org_id",
        "session_id",
        "execution_id",
        "sandbox_id",
        "iat",
        "nbf",
        "exp",
        "jti",
    ]
    .into_iter()
    .collect();
    assert_eq!(keys, expected);
    for forbidden in ["class", "caller_class", "role", "roles", "name", "display_name", "scope"] {
        assert!(claims.get(forbidden).is_none(), "{forbidden} must not be a claim");
    }
    assert_eq!(claims["iss"], "sandlane");
    assert_eq!(claims["aud"], "sandlane-sandbox", "aud is one string, not an array");
    assert_eq!(claims["sub"], "user:alice@example.com");
    assert_eq!(claims["org_id"], "acme");
    assert_eq!(claims["session_id"], "sess-1");
    assert_eq!(claims["execution_id"], "exec-1");
    assert_eq!(claims["sandbox_id"], env.a.as_str());
    assert_eq!(claims["iat"], T0);
    assert_eq!(claims["nbf"], T0);
    assert_eq!(claims["exp"], T0 + 900);
    assert_eq!(claims["jti"], minted.token_id.as_str());
    // 128 random bits, base64url without padding.
    assert_eq!(URL_SAFE_NO_PAD.decode(minted.token_id.as_str()).unwrap().len(), 16);
    assert_eq!(minted.issued_at, Timestamp::from_unix_secs(T0));
    assert_eq!(minted.expires_at, Timestamp::from_unix_secs(T0 + 900));
}

#[tokio::test]
async fn round_trip_for_a_session_sandbox() {
    let env = Env::new();
    let minted = env.minter.mint(&request(&session_key(&org()), &env.a)).await.unwrap();
    let claims = env.minter.verify(&minted.token).await.unwrap();
    assert_eq!(claims.sub, caller());
    assert_eq!(claims.org_id, org());
    assert_eq!(claims.session_id, "sess-1");
    assert_eq!(claims.execution_id, "exec-1");
    assert_eq!(claims.sandbox_id, env.a);
    assert_eq!(claims.jti, minted.token_id);
    assert_eq!((claims.iat, claims.nbf, claims.exp), (T0, T0, T0 + 900));
    assert_eq!((claims.iss.as_str(), claims.aud.as_str()), ("sandlane", "sandlane-sandbox"));
}

#[tokio::test]
async fn round_trip_for_a_workflow_sandbox_has_an_empty_session_id() {
    let env = Env::new();
    let minted = env.minter.mint(&request(&workflow_key(&org()), &env.w)).await.unwrap();
    assert_eq!(segment_json(minted.token.expose(), 1)["session_id"], "");
    let claims = env.minter.verify(&minted.token).await.unwrap();
    assert_eq!(claims.session_id, "");
    assert_eq!(claims.execution_id, "wf-exec-9");
    assert_eq!(claims.sandbox_id, env.w);
}

#[tokio::test]
async fn introspection_answers_rfc7662_with_the_claims_when_active() {
    let env = Env::new();
    let minted = env.minter.mint(&request(&session_key(&org()), &env.a)).await.unwrap();
    let answer = env.minter.introspect(minted.token.expose()).await;
    let mut expected = segment_json(minted.token.expose(), 1);
    expected["active"] = json!(true);
    expected["token_type"] = json!("sbx+jwt");
    assert_eq!(answer, expected);
    assert_eq!(env.minter.introspect("garbage").await, json!({"active": false}));
}

#[tokio::test]
async fn the_format_is_proven_by_an_independent_implementation() {
    let env = Env::new();
    let token = env.mint_a().await;
    let token = token.expose();
    let (signing_input, signature) = token.rsplit_once('.').unwrap();

    // The JWKS as a client sees it, parsed as plain JSON.
    let jwks: Value = serde_json::from_str(&env.minter.jwks_json()).unwrap();
    let header = segment_json(token, 0);
    let jwk = jwks["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["kid"] == header["kid"])
        .expect("the token's kid is in the JWKS");
    assert_eq!((jwk["kty"].as_str(), jwk["crv"].as_str()), (Some("OKP"), Some("Ed25519")));

    // kid is the RFC 7638 thumbprint, computed here from the JWK's members.
    let canonical = format!(
        "{{\"crv\":\"{}\",\"kty\":\"{}\",\"x\":\"{}\"}}",
        jwk["crv"].as_str().unwrap(),
        jwk["kty"].as_str().unwrap(),
        jwk["x"].as_str().unwrap()
    );
    assert_eq!(header["kid"].as_str().unwrap(), b64(&Sha256::digest(canonical.as_bytes())));

    // The signature, checked with ed25519-dalek directly (strict verification).
    let x: [u8; 32] = URL_SAFE_NO_PAD.decode(jwk["x"].as_str().unwrap()).unwrap().try_into().unwrap();
    let public = ed25519_dalek::VerifyingKey::from_bytes(&x).unwrap();
    let sig: [u8; 64] = URL_SAFE_NO_PAD.decode(signature).unwrap().try_into().unwrap();
    public
        .verify_strict(signing_input.as_bytes(), &ed25519_dalek::Signature::from_bytes(&sig))
        .expect("an independent Ed25519 verifier accepts the signature");
    assert!(public.verify_strict(b"something else", &ed25519_dalek::Signature::from_bytes(&sig)).is_err());

    // The claims, as plain JSON.
    let claims = segment_json(token, 1);
    assert_eq!(claims["sandbox_id"], env.a.as_str());
    assert_eq!(claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap(), 900);
}

#[test]
fn thumbprint_matches_the_rfc_8037_example() {
    // RFC 8037 Appendix A.3.
    assert_eq!(
        keys::thumbprint("11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"),
        "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k"
    );
}

#[tokio::test]
async fn jti_is_unique_across_100_000_mints() {
    let env = Env::new();
    let req = request(&session_key(&org()), &env.a);
    let mut seen = HashSet::with_capacity(100_000);
    for _ in 0..100_000 {
        let minted = env.minter.mint(&req).await.unwrap();
        assert!(seen.insert(minted.token_id), "a jti repeated");
    }
    assert_eq!(seen.len(), 100_000);
}

// ---------------------------------------------------------------- header attacks

#[tokio::test]
async fn alg_none_is_refused() {
    let env = Env::new();
    let header = json!({"alg": "none", "typ": "sbx+jwt", "kid": env.keys.current_kid()});
    let unsigned =
        format!("{}.{}.", b64(header.to_string().as_bytes()), b64(env.claims_a().to_string().as_bytes()));
    let reason = invalid_reason(env.assert_refused(&unsigned, "alg none").await);
    assert!(reason.contains("EdDSA"), "{reason}");
    // Also with a real signature appended.
    let signed = env.forge(&header, &env.claims_a());
    env.assert_refused(&signed, "alg none, signed").await;
}

#[tokio::test]
async fn hs256_signed_with_the_public_key_bytes_is_refused() {
    let env = Env::new();
    let jwks: Value = serde_json::from_str(&env.minter.jwks_json()).unwrap();
    let x = jwks["keys"][0]["x"].as_str().unwrap().to_owned();
    let raw = URL_SAFE_NO_PAD.decode(&x).unwrap();
    for secret in [raw.as_slice(), x.as_bytes()] {
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
        header.typ = Some("sbx+jwt".to_owned());
        header.kid = Some(env.keys.current_kid());
        let key = jsonwebtoken::EncodingKey::from_secret(secret).unwrap();
        let token = jsonwebtoken::encode(&header, &env.claims_a(), &key).unwrap();
        let reason = invalid_reason(env.assert_refused(&token, "HS256").await);
        assert!(reason.contains("EdDSA"), "{reason}");
    }
}

/// jsonwebtoken's P-256 test key (PKCS#8 DER), public test material.
const ES256_TEST_KEY_HEX: &str = concat!(
    "308187020100301306072a8648ce3d020106082a8648ce3d030107046d306b020101042059315f08",
    "696363a6b0dc7aed90798f4626b3ba4c4f2dbea29694407b08d6f278a14403420004c3b240a14fe0",
    "25b649bd5fb308ebd4f72149ab414d0bf79d08c44cefc3fc7904c10835132b5cb04986accef419be",
    "77a25ba80db561099dd4ab784732c94755be",
);

#[tokio::test]
async fn es256_is_refused() {
    let env = Env::new();
    let der: Vec<u8> = (0..ES256_TEST_KEY_HEX.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&ES256_TEST_KEY_HEX[i..i + 2], 16).unwrap())
        .collect();
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
    header.typ = Some("sbx+jwt".to_owned());
    header.kid = Some(env.keys.current_kid());
    let token = jsonwebtoken::encode(&header, &env.claims_a(), &jsonwebtoken::EncodingKey::from_ec_der(&der))
        .unwrap();
    let reason = invalid_reason(env.assert_refused(&token, "ES256").await);
    assert!(reason.contains("EdDSA"), "{reason}");
}

#[tokio::test]
async fn wrong_or_missing_typ_is_refused() {
    let env = Env::new();
    let kid = env.keys.current_kid();
    for header in [
        json!({"typ": "JWT", "alg": "EdDSA", "kid": kid}),
        json!({"typ": "SBX+JWT", "alg": "EdDSA", "kid": kid}),
        json!({"alg": "EdDSA", "kid": kid}),
        json!({"typ": ["sbx+jwt"], "alg": "EdDSA", "kid": kid}),
    ] {
        env.assert_refused(&env.forge(&header, &env.claims_a()), &header.to_string()).await;
    }
    // The control: the same forge with the right header verifies.
    env.verify(&env.forge(&env.header(), &env.claims_a())).await.unwrap();
}

#[tokio::test]
async fn jku_x5u_jwk_and_crit_headers_are_refused() {
    let env = Env::new();
    let extra = [
        ("jku", json!("https://evil.example/jwks.json")),
        ("x5u", json!("https://evil.example/cert.pem")),
        ("jwk", json!({"kty": "OKP", "crv": "Ed25519", "x": "AAAA"})),
        ("crit", json!(["exp"])),
        ("cty", json!("JWT")),
    ];
    for (name, value) in extra {
        let mut header = env.header();
        header[name] = value;
        let reason = invalid_reason(env.assert_refused(&env.forge(&header, &env.claims_a()), name).await);
        assert!(reason.contains("header"), "{name}: {reason}");
    }
}

#[tokio::test]
async fn duplicated_header_parameters_are_refused() {
    let env = Env::new();
    let kid = env.keys.current_kid();
    let header = format!(r#"{{"typ":"sbx+jwt","alg":"none","alg":"EdDSA","kid":"{kid}"}}"#);
    let input = format!("{}.{}", b64(header.as_bytes()), b64(env.claims_a().to_string().as_bytes()));
    let sig = env.keys.current_signing_key().sign(input.as_bytes());
    env.assert_refused(&format!("{input}.{}", b64(&sig.to_bytes())), "duplicate alg").await;
}

#[tokio::test]
async fn unknown_kid_is_refused() {
    let env = Env::new();
    // A key the server never had, with its own (correct) thumbprint as kid.
    let stranger = SigningKey::from_bytes(&[9u8; 32]);
    let x = b64(stranger.verifying_key().as_bytes());
    let header = json!({"typ": "sbx+jwt", "alg": "EdDSA", "kid": keys::thumbprint(&x)});
    let reason = invalid_reason(
        env.assert_refused(&forge_with(&stranger, &header, &env.claims_a()), "stranger").await,
    );
    assert!(reason.contains("key id"), "{reason}");
    // The real key, but a kid that names no key.
    let header = json!({"typ": "sbx+jwt", "alg": "EdDSA", "kid": "no-such-key"});
    env.assert_refused(&env.forge(&header, &env.claims_a()), "unknown kid").await;
    // The stranger's token under the real kid: the signature does not verify.
    let token = forge_with(&stranger, &env.header(), &env.claims_a());
    let reason = invalid_reason(env.assert_refused(&token, "wrong key").await);
    assert!(reason.contains("signature"), "{reason}");
}

// ---------------------------------------------------------------- claim attacks

#[tokio::test]
async fn wrong_missing_and_multi_valued_aud_and_wrong_iss_are_refused() {
    let env = Env::new();
    type Mutation = Box<dyn Fn(&mut Value)>;
    let cases: Vec<(&str, Mutation)> = vec![
        ("wrong aud", Box::new(|c| c["aud"] = json!("another-audience"))),
        ("missing aud", Box::new(|c| drop(c.as_object_mut().unwrap().remove("aud")))),
        ("multi-valued aud", Box::new(|c| c["aud"] = json!(["sandlane-sandbox", "another-audience"]))),
        ("aud as a one-element array", Box::new(|c| c["aud"] = json!(["sandlane-sandbox"]))),
        ("wrong iss", Box::new(|c| c["iss"] = json!("someone-else"))),
        ("missing iss", Box::new(|c| drop(c.as_object_mut().unwrap().remove("iss")))),
    ];
    for (name, mutate) in cases {
        let mut claims = env.claims_a();
        mutate(&mut claims);
        env.assert_refused(&env.forge(&env.header(), &claims), name).await;
    }
}

#[tokio::test]
async fn expiry_is_honoured_with_a_30_second_leeway() {
    let env = Env::new();
    let token = env.mint_a().await;
    let verify = || env.minter.verify(&token);
    env.clock.advance_secs(899);
    verify().await.expect("before exp");
    env.clock.advance_secs(1 + 29); // exp + 29: inside the leeway
    verify().await.expect("inside the leeway");
    env.clock.advance_secs(1); // exp + 30
    let reason = invalid_reason(verify().await.unwrap_err());
    assert_eq!(reason, "expired");
    env.clock.advance_secs(3600);
    assert_eq!(invalid_reason(verify().await.unwrap_err()), "expired");
}

#[tokio::test]
async fn future_iat_and_nbf_are_refused_beyond_the_leeway() {
    let env = Env::new();
    let now = env.clock.secs();
    // iat/nbf 29 s ahead: clock skew inside the leeway is accepted.
    let mut claims = env.claims_a();
    claims["iat"] = json!(now + 29);
    claims["nbf"] = json!(now + 29);
    claims["exp"] = json!(now + 29 + 900);
    env.verify(&env.forge(&env.header(), &claims)).await.unwrap();
    // iat 31 s ahead.
    claims["iat"] = json!(now + 31);
    claims["nbf"] = json!(now + 31);
    claims["exp"] = json!(now + 31 + 900);
    let reason = invalid_reason(env.assert_refused(&env.forge(&env.header(), &claims), "iat").await);
    assert_eq!(reason, "issued in the future");
    // nbf in the future, iat now.
    let mut claims = env.claims_a();
    claims["nbf"] = json!(now + 120);
    let reason = invalid_reason(env.assert_refused(&env.forge(&env.header(), &claims), "nbf").await);
    assert_eq!(reason, "not yet valid");
    // nbf before iat is not what the minter makes.
    let mut claims = env.claims_a();
    claims["nbf"] = json!(now - 10);
    env.assert_refused(&env.forge(&env.header(), &claims), "nbf < iat").await;
}

#[tokio::test]
async fn an_over_long_lifetime_is_refused() {
    let env = Env::new();
    let now = env.clock.secs();
    let mut claims = env.claims_a();
    claims["exp"] = json!(now + 900);
    env.verify(&env.forge(&env.header(), &claims)).await.expect("exactly the cap");
    claims["exp"] = json!(now + 901);
    let reason = invalid_reason(env.assert_refused(&env.forge(&env.header(), &claims), "901").await);
    assert!(reason.contains("lifetime"), "{reason}");
    claims["exp"] = json!(now + 86_400 * 365);
    env.assert_refused(&env.forge(&env.header(), &claims), "a year").await;
    claims["exp"] = json!(now);
    env.assert_refused(&env.forge(&env.header(), &claims), "zero lifetime").await;
}

#[tokio::test]
async fn string_typed_and_fractional_numeric_claims_are_refused() {
    let env = Env::new();
    let now = env.clock.secs();
    for (name, value) in [
        ("exp", json!((now + 900).to_string())),
        ("iat", json!(now.to_string())),
        ("nbf", json!(now.to_string())),
        ("exp", json!(now as f64 + 900.5)),
        ("exp", json!(null)),
    ] {
        let mut claims = env.claims_a();
        claims[name] = value.clone();
        let token = env.forge(&env.header(), &claims);
        let reason = invalid_reason(env.assert_refused(&token, name).await);
        assert!(reason.contains(name), "{name}={value}: {reason}");
    }
}

#[tokio::test]
async fn unknown_and_missing_claims_are_refused() {
    let env = Env::new();
    for extra in ["class", "role", "name", "scope", "x"] {
        let mut claims = env.claims_a();
        claims[extra] = json!("service");
        let reason = invalid_reason(env.assert_refused(&env.forge(&env.header(), &claims), extra).await);
        assert!(reason.contains("claim set"), "{reason}");
    }
    for missing in ["org_id", "session_id", "execution_id", "sandbox_id", "jti", "sub"] {
        let mut claims = env.claims_a();
        claims.as_object_mut().unwrap().remove(missing);
        env.assert_refused(&env.forge(&env.header(), &claims), missing).await;
    }
    let mut claims = env.claims_a();
    claims["sandbox_id"] = json!("not-a-sandbox");
    env.assert_refused(&env.forge(&env.header(), &claims), "bad sandbox id").await;
}

#[tokio::test]
async fn any_flipped_bit_in_header_payload_or_signature_is_refused() {
    let env = Env::new();
    let token = env.mint_a().await;
    let text = token.expose().as_bytes().to_vec();
    env.verify(token.expose()).await.unwrap();
    let mut checked = 0;
    for i in 0..text.len() {
        for bit in 0..8 {
            let mut flipped = text.clone();
            flipped[i] ^= 1 << bit;
            let flipped = String::from_utf8_lossy(&flipped).into_owned();
            assert!(env.verify(&flipped).await.is_err(), "byte {i} bit {bit} still verifies");
            checked += 1;
        }
    }
    assert_eq!(checked, text.len() * 8);
    // And every bit of the decoded parts, re-encoded.
    let parts: Vec<Vec<u8>> = token.expose().split('.').map(|p| URL_SAFE_NO_PAD.decode(p).unwrap()).collect();
    for part in 0..3 {
        for i in 0..parts[part].len() {
            for bit in 0..8 {
                let mut p = parts.clone();
                p[part][i] ^= 1 << bit;
                let forged = p.iter().map(|x| b64(x)).collect::<Vec<_>>().join(".");
                assert!(env.verify(&forged).await.is_err(), "part {part} byte {i} bit {bit}");
            }
        }
    }
}

#[tokio::test]
async fn oversized_and_malformed_tokens_are_refused() {
    let env = Env::new();
    let token = env.mint_a().await;
    let padded = format!("{}{}", token.expose(), "A".repeat(MAX_TOKEN_BYTES));
    env.assert_refused(&padded, "oversized").await;
    for bad in ["", ".", "..", "a.b.c", "a.b.c.d", &format!("{}.", token.expose())] {
        assert!(env.verify(bad).await.is_err(), "{bad:?}");
    }
}

// ---------------------------------------------------------------- binding and revocation

#[tokio::test]
async fn a_token_of_sandbox_a_is_refused_for_sandbox_b_and_for_another_org() {
    let env = Env::new();
    let token = env.mint_a().await;
    let other_org = OrgId::parse("globex").unwrap();
    env.minter.verify_for(&token, &org(), &env.a).await.expect("its own sandbox");
    let err = env.minter.verify_for(&token, &org(), &env.w).await.unwrap_err();
    assert_eq!(invalid_reason(err), "token is for another sandbox");
    let err = env.minter.verify_for(&token, &other_org, &env.a).await.unwrap_err();
    assert_eq!(invalid_reason(err), "token is for another org");

    // A token (validly signed) claiming sandbox A but another org: the record disagrees.
    let mut claims = env.claims_a();
    claims["org_id"] = json!("globex");
    env.assert_refused(&env.forge(&env.header(), &claims), "org mismatch").await;
}

/// A replica as deployed: its own store (its own connection pool) on the shared database,
/// and the shared key dir.
async fn sql_replica(options: &crate::sql::StoreOptions, clock: &Arc<TestClock>) -> JwtMinter {
    let store = crate::sql::Store::open(options.clone()).await.expect("a store on the shared database");
    assert_eq!(store.backend_name(), "postgres");
    let keys = Arc::new(KeyStore::load_or_create(&options.data_dir, clock.clone()).unwrap());
    JwtMinter::new(JwtConfig::default(), keys, store.registry(), store.callers(), clock.clone()).unwrap()
}

/// Claims `key` for sandbox `id` and marks it ready, through a real registry.
async fn ready_in(registry: &dyn SandboxRegistry, key: &SandboxKey, id: &SandboxId, now: Timestamp) {
    let execution_id = ExecutionId::parse("exec-1").unwrap();
    let claim = registry
        .claim(&ClaimRequest {
            key: key.clone(),
            candidate_id: id.clone(),
            durability: Durability::Durable,
            driver: "bubblewrap".to_owned(),
            caller: domain::SandboxCaller::from_record(caller(), CallerClass::User),
            execution_id: execution_id.clone(),
            holder: "replica-1".to_owned(),
            lease_ms: 60_000,
            now,
            max_running: None,
            warm: None,
        })
        .await
        .unwrap();
    assert_eq!(&claim.record.id, id);
    let grant = TokenGrant {
        token_id: domain::TokenId::parse("jti-at-ensure").unwrap(),
        expires_at: Timestamp::from_unix_secs(now.unix_secs() + 900),
        execution_id,
        caller: domain::SandboxCaller::from_record(caller(), CallerClass::User),
    };
    registry.mark_ready(id, claim.record.lease.epoch, &grant, now).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_token_is_refused_before_its_exp_on_every_replica_and_after_restart() {
    // Two replicas: two stores (two pools) on one Postgres database, one key dir.
    let Some(url) = crate::sql::contract::fresh_postgres_url().await else { return };
    let dir = tempfile::tempdir().unwrap();
    let options = crate::sql::StoreOptions::new(dir.path()).with_url(Some(&url));
    let clock = TestClock::at_secs(T0);
    let one = sql_replica(&options, &clock).await;
    let two = sql_replica(&options, &clock).await;
    let (a, w) = (sandbox_id(1), sandbox_id(2));
    let registry = crate::sql::Store::open(options.clone()).await.unwrap().registry();
    ready_in(registry.as_ref(), &session_key(&org()), &a, clock.now()).await;
    ready_in(registry.as_ref(), &workflow_key(&org()), &w, clock.now()).await;

    let token = one.mint(&request(&session_key(&org()), &a)).await.unwrap().token;
    let claims = two.verify(&token).await.expect("the other replica verifies it");
    assert_eq!(claims.sandbox_id, a);

    one.revoke(&a).await.unwrap();
    one.revoke(&a).await.expect("idempotent");
    clock.advance_secs(1);
    assert_eq!(one.verify(&token).await, Err(VerifyError::Revoked(a.clone())));
    assert_eq!(two.verify(&token).await, Err(VerifyError::Revoked(a.clone())), "the other replica refuses");
    let restarted = sql_replica(&options, &clock).await;
    assert_eq!(restarted.verify(&token).await, Err(VerifyError::Revoked(a.clone())), "after a restart");
    assert_eq!(two.introspect(token.expose()).await, json!({"active": false}));
    assert!(registry.get(&a).await.unwrap().unwrap().tokens_revoked_at.is_some(), "in the database");
    // The other sandbox's tokens are untouched, on either replica.
    let w_token = two.mint(&request(&workflow_key(&org()), &w)).await.unwrap().token;
    one.verify(&w_token).await.unwrap();
    two.verify(&w_token).await.unwrap();
    // Revoking a sandbox the registry does not know is a no-op.
    two.revoke(&sandbox_id(77)).await.unwrap();
}

#[tokio::test]
async fn deprovisioned_replaced_or_unknown_sandboxes_refuse_their_tokens() {
    let env = Env::new();
    let token = env.mint_a().await;
    env.registry.mark_deprovisioned(&env.a, env.clock.now()).await.unwrap();
    assert_eq!(env.minter.verify(&token).await, Err(VerifyError::Revoked(env.a.clone())));

    // A record that is not live, even without tokens_revoked_at, refuses.
    let mut failed = record(&env.w, workflow_key(&org()));
    failed.state = SandboxState::Failed;
    env.registry.insert(failed);
    let w = env.minter.mint(&request(&workflow_key(&org()), &env.w)).await.unwrap();
    assert_eq!(env.minter.verify(&w.token).await, Err(VerifyError::Revoked(env.w.clone())));

    let ghost = sandbox_id(99);
    let g = env.minter.mint(&request(&session_key(&org()), &ghost)).await.unwrap();
    assert_eq!(env.minter.verify(&g.token).await, Err(VerifyError::Revoked(ghost.clone())));
    env.registry.insert(record(&ghost, session_key(&org())));
    env.minter.verify(&g.token).await.unwrap();
    env.registry.remove(&ghost);
    assert!(env.minter.verify(&g.token).await.is_err());
}

#[tokio::test]
async fn an_unreadable_revocation_state_means_inactive() {
    let env = Env::new();
    let token = env.mint_a().await;
    env.registry.fail_reads.store(true, Ordering::SeqCst);
    assert!(matches!(env.minter.verify(&token).await, Err(VerifyError::Unavailable(_))));
    assert_eq!(env.minter.introspect(token.expose()).await, json!({"active": false}));
}

// ---------------------------------------------------------------- keys

#[tokio::test]
async fn the_previous_key_verifies_during_the_overlap_and_not_after() {
    let env = Env::new();
    let old_kid = env.keys.current_kid();
    let old_key = env.keys.current_signing_key();
    let old_token = env.mint_a().await;

    env.clock.advance_secs(60);
    let new_kid = env.keys.rotate().unwrap();
    assert_ne!(new_kid, old_kid);
    assert_eq!(env.keys.verifying_kids(), vec![new_kid.clone(), old_kid.clone()]);
    env.minter.verify(&old_token).await.expect("previous key during the overlap");
    let new_token = env.mint_a().await;
    assert_eq!(segment_json(new_token.expose(), 0)["kid"], new_kid.as_str());
    env.minter.verify(&new_token).await.unwrap();

    let old_header = json!({"typ": "sbx+jwt", "alg": "EdDSA", "kid": old_kid});
    // Just inside the overlap (retired + 3629 s): a fresh token of the old key verifies.
    env.clock.advance_secs(i64::try_from(KEY_OVERLAP_SECS).unwrap() - 1);
    env.verify(&forge_with(&old_key, &old_header, &env.claims_a())).await.unwrap();
    // At the end of the overlap the old key is gone: refused for its key alone.
    env.clock.advance_secs(1);
    assert_eq!(env.keys.verifying_kids(), vec![new_kid.clone()]);
    let reason = invalid_reason(
        env.assert_refused(&forge_with(&old_key, &old_header, &env.claims_a()), "retired").await,
    );
    assert!(reason.contains("key id"), "{reason}");
    let jwks: Value = serde_json::from_str(&env.minter.jwks_json()).unwrap();
    assert_eq!(jwks["keys"].as_array().unwrap().len(), 1);
    assert_eq!(jwks["keys"][0]["kid"], new_kid.as_str());
}

#[tokio::test]
async fn keys_are_created_once_with_mode_0600_and_loaded_after_a_restart() {
    let env = Env::new();
    let path = env.dir.path().join(KEYS_FILE);
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let token = env.mint_a().await;

    let restarted = env.replica();
    assert_eq!(restarted.keys().current_kid(), env.keys.current_kid());
    restarted.verify(&token).await.expect("the same key after a restart");

    // Rotation is persisted: a restart sees both keys and signs with the new one.
    let new_kid = env.keys.rotate().unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let restarted = env.replica();
    assert_eq!(restarted.keys().current_kid(), new_kid);
    restarted.verify(&token).await.expect("the previous key, after a restart");
    // The seed of the retired key is not kept on disk.
    let file: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let stored = file["keys"].as_array().unwrap();
    assert_eq!(stored.len(), 2);
    assert!(stored[0]["d"].is_string());
    assert!(stored[1].get("d").is_none());
    // A process that loaded earlier picks the rotation up on reload.
    let stale = env.replica();
    let newer = env.keys.rotate().unwrap();
    assert_ne!(stale.keys().current_kid(), newer);
    stale.keys().reload().unwrap();
    assert_eq!(stale.keys().current_kid(), newer);
}

#[test]
fn processes_starting_together_end_up_with_one_key() {
    for _ in 0..20 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        let kids: Vec<String> = std::thread::scope(|scope| {
            let starts: Vec<_> = (0..4)
                .map(|_| {
                    scope.spawn(|| {
                        let clock: Arc<dyn Clock> = TestClock::at_secs(T0);
                        KeyStore::load_or_create(&path, clock).unwrap().current_kid()
                    })
                })
                .collect();
            starts.into_iter().map(|s| s.join().unwrap()).collect()
        });
        assert!(kids.iter().all(|k| *k == kids[0]), "{kids:?}");
        let clock: Arc<dyn Clock> = TestClock::at_secs(T0);
        assert_eq!(KeyStore::load_or_create(&path, clock).unwrap().current_kid(), kids[0]);
        let leftovers = std::fs::read_dir(&path).unwrap().count();
        assert_eq!(leftovers, 1, "only the key file remains");
    }
}

#[test]
fn a_key_file_readable_by_others_or_corrupt_is_refused_without_quoting_it() {
    let dir = tempfile::tempdir().unwrap();
    let clock: Arc<dyn Clock> = TestClock::at_secs(T0);
    let store = KeyStore::load_or_create(dir.path(), clock.clone()).unwrap();
    let path = store.path().to_owned();
    let text = std::fs::read_to_string(&path).unwrap();
    let file: Value = serde_json::from_str(&text).unwrap();
    let seed = file["keys"][0]["d"].as_str().unwrap().to_owned();
    assert!(!format!("{store:?}").contains(&seed));

    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = KeyStore::load_or_create(dir.path(), clock.clone()).unwrap_err();
    assert!(matches!(err, KeyError::Permissions { mode: 0o644, .. }), "{err}");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();

    // A seed that does not match its key, and a file that is not JSON.
    let mut tampered = file.clone();
    tampered["keys"][0]["d"] = json!(b64(&[1u8; 32]));
    for bad in [tampered.to_string(), text.replace('}', "")] {
        std::fs::write(&path, &bad).unwrap();
        let err = KeyStore::load_or_create(dir.path(), clock.clone()).unwrap_err();
        assert!(matches!(err, KeyError::Corrupt { .. }), "{err}");
        let shown = format!("{err} {err:?}");
        assert!(!shown.contains(&seed) && !shown.contains(&b64(&[1u8; 32])), "{shown}");
    }
}

// ---------------------------------------------------------------- config, secrets, setup

#[test]
fn ttl_is_900_by_default_configurable_and_never_above_3600() {
    assert_eq!(JwtConfig::default().ttl_secs, 900);
    for ttl in [1, 900, 3600] {
        JwtConfig { ttl_secs: ttl, ..JwtConfig::default() }.validate().unwrap();
    }
    for ttl in [0, 3601, u64::MAX] {
        let err = JwtConfig { ttl_secs: ttl, ..JwtConfig::default() }.validate().unwrap_err();
        assert!(matches!(err, JwtError::InvalidConfig { setting: "ttl_secs", .. }));
        assert!(err.to_string().contains("ttl_secs"), "{err}");
    }
    let env = Env::new();
    let err = JwtMinter::new(
        JwtConfig { ttl_secs: 7200, ..JwtConfig::default() },
        env.keys.clone(),
        env.registry.clone(),
        env.callers.clone(),
        env.clock.clone(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("ttl_secs"));
}

#[tokio::test]
async fn a_configured_ttl_is_minted_and_is_the_verifier_cap() {
    let env = Env::with_config(JwtConfig { ttl_secs: 120, ..JwtConfig::default() });
    let minted = env.minter.mint(&request(&session_key(&org()), &env.a)).await.unwrap();
    let claims = env.minter.verify(&minted.token).await.unwrap();
    assert_eq!(claims.exp - claims.iat, 120);
    let mut forged = env.claims_a();
    forged["exp"] = json!(env.clock.secs() + 121);
    env.assert_refused(&env.forge(&env.header(), &forged), "over the configured cap").await;
}

#[tokio::test]
async fn the_token_never_shows_in_debug_or_display() {
    let env = Env::new();
    let minted = env.minter.mint(&request(&session_key(&org()), &env.a)).await.unwrap();
    let token = minted.token.expose().to_owned();
    let shown = format!("{minted:?} {} {:?} {:?}", minted.token, env.minter, env.keys);
    for part in token.split('.') {
        assert!(!shown.contains(part), "{shown}");
    }
    // The seed is not in the minter's Debug either.
    let seed = b64(env.keys.current_signing_key().as_bytes());
    assert!(!shown.contains(&seed));
}

#[test]
fn the_crypto_provider_is_installed_and_works() {
    assert_crypto_provider().unwrap();
    // The process default is the rust_crypto backend (with both backends compiled in there
    // would be no default at all, and this would fail).
    let provider = jsonwebtoken::crypto::CryptoProvider::try_get_default().unwrap();
    assert!(std::ptr::eq(provider, &jsonwebtoken::crypto::rust_crypto::DEFAULT_PROVIDER));
}

// ---------------------------------------------------------------- fuzz

mod fuzz {
    use proptest::prelude::*;

    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().build().unwrap()
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let env = Env::new();
        let rt = runtime();
        proptest!(ProptestConfig::with_cases(3000), |(
            bytes in proptest::collection::vec(any::<u8>(), 0..700),
        )| {
            let token = String::from_utf8_lossy(&bytes).into_owned();
            prop_assert!(rt.block_on(env.verify(&token)).is_err());
            prop_assert_eq!(rt.block_on(env.minter.introspect(&token)), json!({"active": false}));
        });
    }

    #[test]
    fn arbitrary_json_parts_never_panic() {
        let env = Env::new();
        let rt = runtime();
        proptest!(ProptestConfig::with_cases(3000), |(
            header in proptest::option::of("[ -~]{0,80}"),
            payload in "[ -~]{0,200}",
            signature in proptest::collection::vec(any::<u8>(), 0..80),
        )| {
            let header = header.unwrap_or_else(|| env.header().to_string());
            let token = format!(
                "{}.{}.{}",
                b64(header.as_bytes()),
                b64(payload.as_bytes()),
                b64(&signature)
            );
            prop_assert!(rt.block_on(env.verify(&token)).is_err());
        });
    }

    #[test]
    fn any_claim_set_signed_with_the_real_key_never_panics() {
        let env = Env::new();
        let rt = runtime();
        let names = prop_oneof![
            Just("iss".to_owned()),
            Just("aud".to_owned()),
            Just("exp".to_owned()),
            Just("iat".to_owned()),
            Just("nbf".to_owned()),
            Just("sandbox_id".to_owned()),
            "[a-z_]{1,8}",
        ];
        let values = prop_oneof![
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_map(|f| json!(f)),
            "[ -~]{0,20}".prop_map(Value::from),
            Just(json!(null)),
            Just(json!(["a", 1])),
        ];
        proptest!(ProptestConfig::with_cases(500), |(
            claims in proptest::collection::hash_map(names, values, 0..14),
        )| {
            let claims = Value::Object(claims.into_iter().collect());
            let token = env.forge(&env.header(), &claims);
            prop_assert!(rt.block_on(env.verify(&token)).is_err());
        });
    }
}

// ---------------------------------------------------------------- revoked callers

#[tokio::test]
async fn a_revoked_callers_tokens_stop_verifying_at_once_on_every_replica() {
    let env = Env::new();
    let token = env.mint_a().await;
    let replica = env.replica();
    assert!(env.minter.verify(&token).await.is_ok());
    assert!(replica.verify(&token).await.is_ok());
    assert_eq!(env.minter.introspect(token.expose()).await["active"], true);
    env.callers.revoke(&caller());
    for verifier in [&env.minter, &replica] {
        assert_eq!(verifier.verify(&token).await, Err(VerifyError::CallerRevoked(caller())));
        assert_eq!(verifier.introspect(token.expose()).await, json!({ "active": false }));
    }
    // The sandbox's record is untouched: the sandbox stays, only the caller's tokens go.
    assert!(env.registry.get(&env.a).await.unwrap().unwrap().tokens_active());
    // Another caller's token for the same sandbox still verifies.
    let other = IdentityId::parse("user:bob@example.com").unwrap();
    let minted = env
        .minter
        .mint(&mint_for(&session_key(&org()), &ExecutionId::parse("exec-2").unwrap(), &other, &env.a))
        .await
        .unwrap();
    assert_eq!(env.minter.verify(&minted.token).await.unwrap().sub, other);
}

#[tokio::test]
async fn an_unreadable_caller_revocation_state_means_inactive() {
    let env = Env::new();
    let token = env.mint_a().await;
    env.callers.fail_reads.store(true, Ordering::SeqCst);
    assert!(matches!(env.minter.verify(&token).await, Err(VerifyError::Unavailable(_))));
    assert_eq!(env.minter.introspect(token.expose()).await, json!({ "active": false }));
}
