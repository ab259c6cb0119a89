-- sandlane's Postgres schema: sandboxes, their ensurers, callers, and the sealed audit log.
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
    token_expires_at  BIGINT,
    lease_holder      TEXT    NOT NULL,
    lease_expires_at  BIGINT NOT NULL,
    lease_epoch       BIGINT NOT NULL,
    -- the candidate id of the claim that created the record or last took it over
    claim_nonce       TEXT    NOT NULL,
    tokens_revoked_at BIGINT,
    message           TEXT,
    created_at        BIGINT NOT NULL,
    updated_at        BIGINT NOT NULL
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
    key_lookup   BYTEA   NOT NULL,
    key_hash     BYTEA   NOT NULL,
    created_at   BIGINT NOT NULL,
    revoked_at   BIGINT
);
CREATE INDEX callers_key_lookup ON callers (key_lookup);
CREATE INDEX callers_created ON callers (created_at, identity_id);

CREATE TABLE audit_events (
    seq          BIGSERIAL PRIMARY KEY,
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
    at           BIGINT NOT NULL,
    hash         BYTEA   NOT NULL,
    appended_at  BIGINT NOT NULL
);
CREATE INDEX audit_events_org_seq ON audit_events (org, seq);

-- Signed seals, chained: each covers the rows listed in `entries` (seq, row hash pairs).
CREATE TABLE audit_seals (
    id        BIGINT  PRIMARY KEY,
    prev_hash BYTEA   NOT NULL,
    sealed_at BIGINT NOT NULL,
    through   BIGINT NOT NULL,
    row_count BIGINT NOT NULL,
    entries   BYTEA   NOT NULL,
    key_id    TEXT    NOT NULL,
    hash      BYTEA   NOT NULL,
    signature BYTEA   NOT NULL
);

-- Which seal covers which row: an index for "what is unsealed"; verify trusts only the
-- signed `entries`.
CREATE TABLE audit_sealed (
    seq     BIGINT PRIMARY KEY,
    seal_id BIGINT NOT NULL
);

-- Append-only, as a second line behind the seals: no UPDATE or DELETE of audit rows,
-- seals or seal membership.
CREATE FUNCTION audit_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit log is append-only: % on % refused', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END
$$;
CREATE TRIGGER audit_events_append_only BEFORE UPDATE OR DELETE ON audit_events
    FOR EACH ROW EXECUTE FUNCTION audit_refuse_change();
CREATE TRIGGER audit_events_no_truncate BEFORE TRUNCATE ON audit_events
    FOR EACH STATEMENT EXECUTE FUNCTION audit_refuse_change();
CREATE TRIGGER audit_seals_append_only BEFORE UPDATE OR DELETE ON audit_seals
    FOR EACH ROW EXECUTE FUNCTION audit_refuse_change();
CREATE TRIGGER audit_sealed_append_only BEFORE UPDATE OR DELETE ON audit_sealed
    FOR EACH ROW EXECUTE FUNCTION audit_refuse_change();
