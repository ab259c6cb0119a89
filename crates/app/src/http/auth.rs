//! Authentication: a `Bearer` caller key becomes the chain's `CallerIdentity`; a `Bearer`
//! sandbox token becomes its verified claims. Either is a [`domain::Actor`], which the
//! use cases authorise (who may touch which sandbox is decided there, not here).

use std::sync::Arc;

use axum::extract::{FromRequestParts, OptionalFromRequestParts};
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use domain::{Actor, CallerClass, CallerIdentity, CallerKey, OrgId, SandboxToken};
use ports::VerifyError;

use super::AppState;
use super::error::ApiError;

/// Who is calling: the authenticated [`Actor`].
#[derive(Debug, Clone)]
pub struct Principal(pub Actor);

/// A compact JWS has three base64url parts; caller keys have none of its dots.
fn looks_like_jws(value: &str) -> bool {
    value.split('.').count() == 3
}

impl FromRequestParts<Arc<AppState>> for Principal {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> Result<Self, ApiError> {
        let header = parts
            .headers
            .get(AUTHORIZATION)
            .ok_or_else(|| ApiError::unauthenticated("missing Authorization: Bearer <key>"))?;
        let value = header
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| ApiError::unauthenticated("the Authorization header must be `Bearer <key>`"))?;
        authenticate(state, value).await.map(Self)
    }
}

/// The actor a bearer credential (a caller key or a sandbox token) authenticates.
///
/// # Errors
/// 401 when it does not authenticate; 503 when it cannot be checked now.
pub(crate) async fn authenticate(state: &AppState, value: &str) -> Result<Actor, ApiError> {
    if looks_like_jws(value) {
        return match state.verifier.verify(&SandboxToken::new(value)).await {
            Ok(claims) => Ok(Actor::SandboxToken {
                org: claims.org_id,
                sandbox_id: claims.sandbox_id,
                subject: claims.sub,
            }),
            Err(e @ VerifyError::Unavailable(_)) => {
                Err(ApiError::dependency("cannot check the sandbox token now", &e))
            }
            Err(e) => Err(ApiError::unauthenticated(format!("sandbox token not accepted: {e}"))),
        };
    }
    match state.directory.authenticate(&CallerKey::new(value)).await {
        Ok(Some(identity)) if identity.class() != CallerClass::Internal => Ok(Actor::Caller(identity)),
        Ok(_) => Err(ApiError::unauthenticated("unknown or revoked caller key")),
        Err(e) => Err(ApiError::dependency("cannot check the caller key now", &e)),
    }
}

/// `Option<Principal>`: `None` without an `Authorization` header; a header that does not
/// authenticate is refused as for [`Principal`].
impl OptionalFromRequestParts<Arc<AppState>> for Principal {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> Result<Option<Self>, ApiError> {
        if parts.headers.contains_key(AUTHORIZATION) {
            <Self as FromRequestParts<Arc<AppState>>>::from_request_parts(parts, state).await.map(Some)
        } else {
            Ok(None)
        }
    }
}

impl Principal {
    /// The caller, if it may act in `org`: sandbox tokens are refused (403), and so are
    /// callers outside the org. (For routes outside the ownership rule: the audit log.)
    fn caller_in(&self, org: &OrgId) -> Result<&CallerIdentity, ApiError> {
        match &self.0 {
            Actor::SandboxToken { .. } => {
                Err(ApiError::denied("a sandbox token is not accepted here; use a caller key"))
            }
            Actor::Caller(identity) if identity.may_act_in(org) => Ok(identity),
            Actor::Caller(identity) => {
                Err(ApiError::denied(format!("caller {} may not act in org {org}", identity.identity_id())))
            }
        }
    }

    /// A `service` caller of `org` (403 otherwise).
    pub fn service_in(&self, org: &OrgId) -> Result<&CallerIdentity, ApiError> {
        let identity = self.caller_in(org)?;
        if identity.class() == CallerClass::Service {
            Ok(identity)
        } else {
            Err(ApiError::denied(format!("only service callers of org {org} may do this")))
        }
    }

    /// A `service` caller of any org (403 otherwise).
    pub fn service_caller(&self) -> Result<&CallerIdentity, ApiError> {
        match &self.0 {
            Actor::Caller(identity) if identity.class() == CallerClass::Service => Ok(identity),
            _ => Err(ApiError::denied("only a service caller's key may be given here")),
        }
    }

    /// Any caller key (sandbox tokens refused).
    pub fn any_caller(&self) -> Result<&CallerIdentity, ApiError> {
        match &self.0 {
            Actor::Caller(identity) => Ok(identity),
            Actor::SandboxToken { .. } => {
                Err(ApiError::denied("a caller key is required here, not a sandbox token"))
            }
        }
    }
}
