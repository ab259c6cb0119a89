-- Brokered secrets (issue 35): per org, a binding and a value sealed with AES-256-GCM
-- under a key kept in the data dir (never here); `key_id` names it.
CREATE TABLE secrets (
    org         TEXT    NOT NULL,
    name        TEXT    NOT NULL,
    -- who it is for: ('identity', ID), ('class', 'user'|'service') or ('org', '')
    scope_kind  TEXT    NOT NULL CHECK (scope_kind IN ('identity', 'class', 'org')),
    scope_value TEXT    NOT NULL,
    -- the rest of the binding, JSON: hosts, header, format, methods, paths
    binding     TEXT    NOT NULL,
    key_id      TEXT    NOT NULL,
    -- the 12-byte nonce, then the ciphertext and its 16-byte tag
    sealed      BYTEA   NOT NULL,
    created_at  BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL,
    PRIMARY KEY (org, name)
);
-- A key rotation finds the values still sealed under an old key.
CREATE INDEX secrets_key_id ON secrets (key_id);
