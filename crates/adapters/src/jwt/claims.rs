//! The token's wire format: the claims minted, and the strict checks of a presented
//! token's header and claims (exact key sets, exact JSON types, no echo of the input).

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use domain::{ExecutionId, IdentityId, MintRequest, OrgId, SandboxId, SessionId, TokenId};
use ports::{TokenClaims, VerifyError};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::TOKEN_TYPE;

/// The claims of a sandbox token, in the order they are minted. Nothing else.
#[derive(Debug, Serialize)]
pub(crate) struct MintedClaims<'a> {
    pub(crate) iss: &'a str,
    pub(crate) aud: &'a str,
    pub(crate) sub: &'a IdentityId,
    pub(crate) org_id: &'a OrgId,
    pub(crate) session_id: &'a str,
    pub(crate) execution_id: &'a ExecutionId,
    pub(crate) sandbox_id: &'a SandboxId,
    pub(crate) iat: i64,
    pub(crate) nbf: i64,
    pub(crate) exp: i64,
    pub(crate) jti: &'a TokenId,
}

impl<'a> MintedClaims<'a> {
    pub(crate) fn new(
        iss: &'a str,
        aud: &'a str,
        request: &'a MintRequest,
        iat: i64,
        exp: i64,
        jti: &'a TokenId,
    ) -> Self {
        Self {
            iss,
            aud,
            sub: request.subject(),
            org_id: request.org(),
            session_id: request.session_claim(),
            execution_id: request.execution_id(),
            sandbox_id: request.sandbox_id(),
            iat,
            nbf: iat,
            exp,
            jti,
        }
    }
}

/// Every claim a token carries, and only these.
pub(crate) const CLAIM_NAMES: [&str; 11] =
    ["iss", "aud", "sub", "org_id", "session_id", "execution_id", "sandbox_id", "iat", "nbf", "exp", "jti"];

/// Header parameters refused outright (key or trust material from the token itself).
const REFUSED_HEADERS: [&str; 4] = ["jku", "x5u", "jwk", "crit"];

fn invalid(reason: impl Into<String>) -> VerifyError {
    VerifyError::Invalid(reason.into())
}

/// The header as it must be: these three parameters, all strings, nothing else.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StrictHeader {
    alg: String,
    typ: String,
    kid: String,
}

/// Checks the encoded header strictly and returns its `kid`: exactly `alg` = `EdDSA`,
/// `typ` = `sbx+jwt` and a string `kid`; `jku`, `x5u`, `jwk`, `crit` and anything else
/// refused; duplicate parameters refused.
pub(crate) fn check_header(encoded: &str) -> Result<String, VerifyError> {
    let bytes = URL_SAFE_NO_PAD.decode(encoded).map_err(|_| invalid("header is not base64url"))?;
    let map: Map<String, Value> =
        serde_json::from_slice(&bytes).map_err(|_| invalid("header is not a JSON object"))?;
    for name in REFUSED_HEADERS {
        if map.contains_key(name) {
            return Err(invalid(format!("header parameter {name} is refused")));
        }
    }
    if map.keys().any(|k| !matches!(k.as_str(), "alg" | "typ" | "kid")) {
        return Err(invalid("header has an unexpected parameter"));
    }
    // The typed parse also refuses duplicated parameters, which the map would merge.
    let header: StrictHeader = serde_json::from_slice(&bytes)
        .map_err(|_| invalid("header must hold exactly string alg, typ and kid"))?;
    if header.alg != "EdDSA" {
        return Err(invalid("algorithm is not EdDSA"));
    }
    if header.typ != TOKEN_TYPE {
        return Err(invalid(format!("typ is not {TOKEN_TYPE}")));
    }
    Ok(header.kid)
}

fn string_claim<'m>(map: &'m Map<String, Value>, name: &str) -> Result<&'m str, VerifyError> {
    match map.get(name) {
        Some(Value::String(s)) => Ok(s),
        Some(Value::Array(_)) if name == "aud" => Err(invalid("aud must be a single string")),
        Some(_) => Err(invalid(format!("claim {name} must be a string"))),
        None => Err(invalid(format!("claim {name} is missing"))),
    }
}

fn integer_claim(map: &Map<String, Value>, name: &str) -> Result<i64, VerifyError> {
    match map.get(name) {
        Some(Value::Number(n)) => {
            n.as_i64().ok_or_else(|| invalid(format!("claim {name} must be an integer")))
        }
        Some(_) => Err(invalid(format!("claim {name} must be a JSON number"))),
        None => Err(invalid(format!("claim {name} is missing"))),
    }
}

fn id_claim<T>(
    map: &Map<String, Value>,
    name: &str,
    parse: impl FnOnce(String) -> Result<T, domain::IdError>,
) -> Result<T, VerifyError> {
    parse(string_claim(map, name)?.to_owned()).map_err(|_| invalid(format!("claim {name} is not a valid id")))
}

/// Reads the claim set strictly: exactly [`CLAIM_NAMES`], strings where strings are due,
/// JSON integers for `iat`, `nbf`, `exp` (a string `"1700000000"` is refused), valid ids.
/// Issuer, audience and times are checked by the caller.
pub(crate) fn parse_claims(map: &Map<String, Value>) -> Result<TokenClaims, VerifyError> {
    if let Some(missing) = CLAIM_NAMES.iter().find(|n| !map.contains_key(**n)) {
        return Err(invalid(format!("claim {missing} is missing")));
    }
    if map.len() != CLAIM_NAMES.len() {
        return Err(invalid("token carries a claim outside the sbx+jwt claim set"));
    }
    let session_id = string_claim(map, "session_id")?;
    if !session_id.is_empty() && SessionId::parse(session_id).is_err() {
        return Err(invalid("claim session_id is not a valid id"));
    }
    Ok(TokenClaims {
        iss: string_claim(map, "iss")?.to_owned(),
        aud: string_claim(map, "aud")?.to_owned(),
        sub: id_claim(map, "sub", IdentityId::parse)?,
        org_id: id_claim(map, "org_id", OrgId::parse)?,
        session_id: session_id.to_owned(),
        execution_id: id_claim(map, "execution_id", ExecutionId::parse)?.as_str().to_owned(),
        sandbox_id: id_claim(map, "sandbox_id", SandboxId::parse)?,
        iat: integer_claim(map, "iat")?,
        nbf: integer_claim(map, "nbf")?,
        exp: integer_claim(map, "exp")?,
        jti: id_claim(map, "jti", TokenId::parse)?,
    })
}

/// The claims as RFC 7662 reports them for an active token.
pub(crate) fn claims_json(claims: &TokenClaims) -> Map<String, Value> {
    let mut map = Map::new();
    map.insert("iss".into(), claims.iss.clone().into());
    map.insert("aud".into(), claims.aud.clone().into());
    map.insert("sub".into(), claims.sub.as_str().into());
    map.insert("org_id".into(), claims.org_id.as_str().into());
    map.insert("session_id".into(), claims.session_id.clone().into());
    map.insert("execution_id".into(), claims.execution_id.clone().into());
    map.insert("sandbox_id".into(), claims.sandbox_id.as_str().into());
    map.insert("iat".into(), claims.iat.into());
    map.insert("nbf".into(), claims.nbf.into());
    map.insert("exp".into(), claims.exp.into());
    map.insert("jti".into(), claims.jti.as_str().into());
    map
}
