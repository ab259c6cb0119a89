//! [`JwtMinter`]: mints sandbox tokens, verifies them (signature, header, claims, time,
//! revocation through the sandbox registry, and the revocation of the caller each token
//! was minted for through the caller directory), revokes them and answers RFC 7662
//! introspection.

use std::sync::Arc;

use async_trait::async_trait;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use domain::{MintRequest, OrgId, SandboxId, SandboxToken, Timestamp, TokenId};
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, Header, Validation};
use ports::{
    CallerDirectory, Cause, Clock, CredentialMinter, CredentialVerifier, MintError, MintedCredential,
    RegistryError, SandboxRegistry, TokenClaims, VerifyError,
};
use serde_json::{Map, Value};

use super::claims::{self, MintedClaims};
use super::{
    JwtConfig, JwtError, KeyStore, LEEWAY_SECS, MAX_TOKEN_BYTES, TOKEN_TYPE, assert_crypto_provider,
};

/// The Ed25519 JWT minter and verifier: implements [`CredentialMinter`] and
/// [`CredentialVerifier`].
pub struct JwtMinter {
    config: JwtConfig,
    keys: Arc<KeyStore>,
    registry: Arc<dyn SandboxRegistry>,
    callers: Arc<dyn CallerDirectory>,
    clock: Arc<dyn Clock>,
    validation: Validation,
}

impl std::fmt::Debug for JwtMinter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtMinter")
            .field("config", &self.config)
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

fn invalid(reason: impl Into<String>) -> VerifyError {
    VerifyError::Invalid(reason.into())
}

/// jsonwebtoken's verdicts, in words that never quote the token.
fn library_error(kind: &ErrorKind) -> VerifyError {
    invalid(match kind {
        ErrorKind::InvalidSignature => "signature does not verify".to_owned(),
        ErrorKind::InvalidAlgorithm | ErrorKind::MissingAlgorithm => "algorithm is not EdDSA".to_owned(),
        ErrorKind::InvalidAudience => "wrong audience".to_owned(),
        ErrorKind::InvalidIssuer => "wrong issuer".to_owned(),
        ErrorKind::MissingRequiredClaim(name) | ErrorKind::InvalidClaimFormat(name) => {
            let known = claims::CLAIM_NAMES.iter().find(|n| **n == name.as_str());
            format!("claim {} is missing or malformed", known.unwrap_or(&"(spec claim)"))
        }
        ErrorKind::Base64(_) => "token is not base64url".to_owned(),
        ErrorKind::Json(_) | ErrorKind::Utf8(_) => "token part is not JSON".to_owned(),
        ErrorKind::InvalidToken => "token is not a compact JWS".to_owned(),
        _ => "token refused by the JWT library".to_owned(),
    })
}

impl JwtMinter {
    /// Builds the minter after checking the settings and the crypto provider. Tokens verify
    /// only while their sandbox's record (in `registry`) is live and unrevoked, and the
    /// caller they were minted for (in `callers`) is not revoked.
    ///
    /// # Errors
    /// [`JwtError::InvalidConfig`] naming a bad setting; [`JwtError::CryptoProvider`] when
    /// jsonwebtoken has no usable backend.
    pub fn new(
        config: JwtConfig,
        keys: Arc<KeyStore>,
        registry: Arc<dyn SandboxRegistry>,
        callers: Arc<dyn CallerDirectory>,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, JwtError> {
        config.validate()?;
        assert_crypto_provider()?;
        let mut validation = Validation::new(Algorithm::EdDSA);
        // Times are checked against the injected clock below, not the system clock.
        validation.validate_exp = false;
        validation.validate_nbf = false;
        validation.leeway = LEEWAY_SECS;
        validation.set_required_spec_claims(&["exp", "nbf", "iss", "aud", "sub"]);
        validation.set_audience(&[config.audience.as_str()]);
        validation.set_issuer(&[config.issuer.as_str()]);
        Ok(Self { config, keys, registry, callers, clock, validation })
    }

    /// The settings.
    pub fn config(&self) -> &JwtConfig {
        &self.config
    }

    /// The keys (for rotation and reload).
    pub fn keys(&self) -> &Arc<KeyStore> {
        &self.keys
    }

    /// Verifies `token` (as [`CredentialVerifier::verify`]) and that it was minted for
    /// `sandbox` in `org`: the check for a request that acts on one sandbox with a
    /// sandbox token.
    ///
    /// # Errors
    /// As [`CredentialVerifier::verify`]; [`VerifyError::Invalid`] when the token is for
    /// another sandbox or another org.
    pub async fn verify_for(
        &self,
        token: &SandboxToken,
        org: &OrgId,
        sandbox: &SandboxId,
    ) -> Result<TokenClaims, VerifyError> {
        let claims = self.verify(token).await?;
        if &claims.org_id != org {
            return Err(invalid("token is for another org"));
        }
        if &claims.sandbox_id != sandbox {
            return Err(invalid("token is for another sandbox"));
        }
        Ok(claims)
    }

    /// RFC 7662 introspection: `{"active":false}`, or `{"active":true,` the claims`,
    /// "token_type":"sbx+jwt"}` when the token verifies now (revocation included). A
    /// revocation state that cannot be read answers inactive.
    pub async fn introspect(&self, token: &str) -> Value {
        match self.verify(&SandboxToken::new(token)).await {
            Ok(claims) => {
                let mut map = Map::new();
                map.insert("active".into(), true.into());
                map.extend(claims::claims_json(&claims));
                map.insert("token_type".into(), TOKEN_TYPE.into());
                Value::Object(map)
            }
            Err(_) => serde_json::json!({ "active": false }),
        }
    }

    /// Everything but revocation: size, shape, header, key, signature, claims, times.
    fn verify_signed(&self, token: &str, now: Timestamp) -> Result<TokenClaims, VerifyError> {
        if token.len() > MAX_TOKEN_BYTES {
            return Err(invalid("token is too long"));
        }
        let mut parts = token.split('.');
        let (Some(header), Some(_payload), Some(_signature), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(invalid("token is not a compact JWS"));
        };
        let kid = claims::check_header(header)?;
        let key = self.keys.verifying_key(&kid, now).ok_or_else(|| invalid("unknown or retired key id"))?;
        let data = jsonwebtoken::decode::<Map<String, Value>>(token, &key.decoding, &self.validation)
            .map_err(|e| library_error(e.kind()))?;
        let claims = claims::parse_claims(&data.claims)?;
        self.check_claims(&claims, now)?;
        Ok(claims)
    }

    fn check_claims(&self, claims: &TokenClaims, now: Timestamp) -> Result<(), VerifyError> {
        if claims.iss != self.config.issuer {
            return Err(invalid("wrong issuer"));
        }
        if claims.aud != self.config.audience {
            return Err(invalid("wrong audience"));
        }
        let leeway = i64::try_from(LEEWAY_SECS).unwrap_or(0);
        let cap = i64::try_from(self.config.ttl_secs).unwrap_or(0);
        let lifetime = claims.exp.checked_sub(claims.iat).unwrap_or(i64::MAX);
        if lifetime <= 0 || lifetime > cap {
            return Err(invalid(format!("lifetime exp - iat is not within 1..={cap} s")));
        }
        if claims.nbf < claims.iat || claims.nbf >= claims.exp {
            return Err(invalid("nbf is not within iat..exp"));
        }
        let now = now.unix_secs();
        if claims.iat > now.saturating_add(leeway) {
            return Err(invalid("issued in the future"));
        }
        if claims.nbf > now.saturating_add(leeway) {
            return Err(invalid("not yet valid"));
        }
        if now >= claims.exp.saturating_add(leeway) {
            return Err(invalid("expired"));
        }
        Ok(())
    }

    fn new_jti() -> Result<TokenId, MintError> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes)
            .map_err(|e| MintError::KeyUnavailable(format!("no entropy for a jti: {e}").into()))?;
        TokenId::parse(URL_SAFE_NO_PAD.encode(bytes))
            .map_err(|_| MintError::KeyUnavailable("jti encoding failed".into()))
    }
}

#[async_trait]
impl CredentialMinter for JwtMinter {
    async fn mint(&self, request: &MintRequest) -> Result<MintedCredential, MintError> {
        let iat = self.clock.now().unix_secs();
        let ttl = i64::try_from(self.config.ttl_secs).unwrap_or(0);
        let exp = iat.saturating_add(ttl);
        let jti = Self::new_jti()?;
        let claims = MintedClaims::new(&self.config.issuer, &self.config.audience, request, iat, exp, &jti);
        let token = self
            .keys
            .with_signer(|kid, key| {
                let mut header = Header::new(Algorithm::EdDSA);
                header.typ = Some(TOKEN_TYPE.to_owned());
                header.kid = Some(kid.to_owned());
                jsonwebtoken::encode(&header, &claims, key)
            })
            .map_err(|e| MintError::KeyUnavailable(format!("EdDSA signing failed: {:?}", e.kind()).into()))?;
        Ok(MintedCredential {
            token: SandboxToken::new(token),
            token_id: jti,
            issued_at: Timestamp::from_unix_secs(iat),
            expires_at: Timestamp::from_unix_secs(exp),
        })
    }

    async fn revoke(&self, sandbox: &SandboxId) -> Result<(), MintError> {
        match self.registry.revoke_tokens(sandbox, self.clock.now()).await {
            // No record: no token of it can verify (verify needs the record), so done.
            Ok(()) | Err(RegistryError::NotFound(_)) => Ok(()),
            Err(e) => Err(MintError::Revocation(Cause::new(e))),
        }
    }
}

#[async_trait]
impl CredentialVerifier for JwtMinter {
    async fn verify(&self, token: &SandboxToken) -> Result<TokenClaims, VerifyError> {
        let claims = self.verify_signed(token.expose(), self.clock.now())?;
        let record = self
            .registry
            .get(&claims.sandbox_id)
            .await
            .map_err(|e| VerifyError::Unavailable(Cause::new(e)))?
            .ok_or_else(|| VerifyError::Revoked(claims.sandbox_id.clone()))?;
        if record.key.org() != &claims.org_id {
            return Err(invalid("token's org does not hold its sandbox"));
        }
        if !record.tokens_active() {
            return Err(VerifyError::Revoked(claims.sandbox_id));
        }
        let revoked = self
            .callers
            .is_revoked(&claims.sub)
            .await
            .map_err(|e| VerifyError::Unavailable(Cause::new(e)))?;
        if revoked {
            return Err(VerifyError::CallerRevoked(claims.sub));
        }
        Ok(claims)
    }

    fn jwks_json(&self) -> String {
        self.keys.jwks().to_string()
    }
}
