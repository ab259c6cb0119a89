//! An independent check of a sandbox token: the signature verified with ed25519-dalek
//! against the JWKS key, the claims read as plain JSON.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ed25519_dalek::{Signature, Verifier, VerifyingKey};
use serde_json::Value;

/// Verifies `token` against `jwks` and returns its claims.
pub fn verify_with_jwks(token: &str, jwks: &Value) -> Value {
    let parts: Vec<&str> = token.trim().split('.').collect();
    assert_eq!(parts.len(), 3, "a compact JWS");
    let header: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[0]).unwrap()).unwrap();
    assert_eq!(header["alg"], "EdDSA");
    assert_eq!(header["typ"], "sbx+jwt");
    let kid = header["kid"].as_str().expect("kid");
    let jwk =
        jwks["keys"].as_array().unwrap().iter().find(|k| k["kid"] == kid).expect("the kid is in the JWKS");
    assert_eq!(jwk["kty"], "OKP");
    assert_eq!(jwk["crv"], "Ed25519");
    let x: [u8; 32] = URL_SAFE_NO_PAD.decode(jwk["x"].as_str().unwrap()).unwrap().try_into().unwrap();
    let key = VerifyingKey::from_bytes(&x).unwrap();
    let sig: [u8; 64] = URL_SAFE_NO_PAD.decode(parts[2]).unwrap().try_into().unwrap();
    key.verify(format!("{}.{}", parts[0], parts[1]).as_bytes(), &Signature::from_bytes(&sig))
        .expect("the signature verifies against the published key");
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap()
}
