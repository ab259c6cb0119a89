-- sandlane's SQLite schema: sandboxes, their ensurers, callers, and the sealed audit log.
-- Times are integer unix milliseconds.

CREATE TABLE sandboxes (
    id                TEXT    PRIMARY KEY,
    org               TEXT    NOT NULL,
    kind              TEXT    NOT NULL CHECK (kind IN ('session', 'workflow')),
    key               TEXT    NOT NULL,
    durability        TEXT    NOT NULL,
    state             TEXT    NOT NULL
        CHECK (state IN ('provisioning', 'ready', 'failed', 'deprovisioned')),
    driver            TEXT    NOT NULL,
    caller_id         TEXT    NOT NULL,
    caller_class      TEXT    NOT NULL,
    execution_id      TEXT    NOT NULL,
    token_id          TEXT,
    token_expires_at  INTEGER,
    lease_holder      TEXT    NOT NULL,
    lease_expires_at  INTEGER NOT NULL,
    lease_epoch       INTEGER NOT NULL,
    -- the candidate id of the claim that created the record or last took it over
    claim_nonce       TEXT    NOT NULL,
    tokens_revoked_at INTEGER,
    message           TEXT,
    created_at        INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL
);

-- At most one live record per (org, kind, key): the database holds the invariant.
CREATE UNIQUE INDEX sandboxes_live_key ON sandboxes (org, kind, key)
    WHERE state IN ('provisioning', 'ready');
CREATE INDEX sandboxes_live_created ON sandboxes (created_at, id)
    WHERE state IN ('provisioning', 'ready');

-- Callers a token was minted for (the creator is on the sandbox row itself).
CREATE TABLE sandbox_callers (
    sandbox_id TEXT NOT NULL REFERENCES sandboxes (id),
    caller_id  TEXT NOT NULL,
    PRIMARY KEY (sandbox_id, caller_id)
);

CREATE TABLE callers (
    identity_id  TEXT    PRIMARY KEY,
    class        TEXT    NOT NULL CHECK (class IN ('user', 'service')),
    orgs         TEXT    NOT NULL,
    display_name TEXT,
    -- SHA-256 of the key; key_lookup is its first 8 bytes, for the index
    key_lookup   BLOB    NOT NULL,
    key_hash     BLOB    NOT NULL,
    created_at   INTEGER NOT NULL,
    revoked_at   INTEGER
);
CREATE INDEX callers_key_lookup ON callers (key_lookup);
CREATE INDEX callers_created ON callers (created_at, identity_id);

CREATE TABLE audit_events (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    org          TEXT    NOT NULL,
    action       TEXT    NOT NULL,
    kind         TEXT    NOT NULL,
    key          TEXT    NOT NULL,
    sandbox_id   TEXT,
    caller_id    TEXT    NOT NULL,
    caller_class TEXT    NOT NULL,
    durability   TEXT,
    driver       TEXT    NOT NULL,
    outcome      TEXT    NOT NULL,
    message      TEXT    NOT NULL,
    token_id     TEXT,
    at           INTEGER NOT NULL,
    hash         BLOB    NOT NULL,
    appended_at  INTEGER NOT NULL
);
CREATE INDEX audit_events_org_seq ON audit_events (org, seq);

-- Signed seals, chained: each covers the rows listed in `entries` (seq, row hash pairs).
CREATE TABLE audit_seals (
    id        INTEGER PRIMARY KEY,
    prev_hash BLOB    NOT NULL,
    sealed_at INTEGER NOT NULL,
    through   INTEGER NOT NULL,
    row_count INTEGER NOT NULL,
    entries   BLOB    NOT NULL,
    key_id    TEXT    NOT NULL,
    hash      BLOB    NOT NULL,
    signature BLOB    NOT NULL
);

-- Which seal covers which row: an index for "what is unsealed"; verify trusts only the
-- signed `entries`.
CREATE TABLE audit_sealed (
    seq     INTEGER PRIMARY KEY,
    seal_id INTEGER NOT NULL
);

-- Append-only, as a second line behind the seals.
CREATE TRIGGER audit_events_no_update BEFORE UPDATE ON audit_events
BEGIN SELECT RAISE(ABORT, 'audit log is append-only: UPDATE refused'); END;
CREATE TRIGGER audit_events_no_delete BEFORE DELETE ON audit_events
BEGIN SELECT RAISE(ABORT, 'audit log is append-only: DELETE refused'); END;
CREATE TRIGGER audit_seals_no_update BEFORE UPDATE ON audit_seals
BEGIN SELECT RAISE(ABORT, 'audit log is append-only: UPDATE refused'); END;
CREATE TRIGGER audit_seals_no_delete BEFORE DELETE ON audit_seals
BEGIN SELECT RAISE(ABORT, 'audit log is append-only: DELETE refused'); END;
