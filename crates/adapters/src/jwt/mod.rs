//! The Ed25519 JWT credential minter and verifier (issue 3).
