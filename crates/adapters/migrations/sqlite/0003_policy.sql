-- Org policy (issue 14): suspended sandboxes, activity, per-org policies, warm pools and
-- quota leases.

-- A suspended sandbox holds its key (the live index covers it) but runs nothing. SQLite
-- cannot change a CHECK constraint: the table is rebuilt with the new state and the
-- activity column, then its indexes.
CREATE TABLE sandboxes_next (
    id                 TEXT    PRIMARY KEY,
    org                TEXT    NOT NULL,
    kind               TEXT    NOT NULL CHECK (kind IN ('session', 'workflow')),
    key                TEXT    NOT NULL,
    durability         TEXT    NOT NULL,
    state              TEXT    NOT NULL
        CHECK (state IN ('provisioning', 'ready', 'suspended', 'failed', 'deprovisioned')),
    driver             TEXT    NOT NULL,
    caller_id          TEXT    NOT NULL,
    caller_class       TEXT    NOT NULL,
    execution_id       TEXT    NOT NULL,
    token_id           TEXT,
    token_expires_at   INTEGER,
    lease_holder       TEXT    NOT NULL,
    lease_expires_at   INTEGER NOT NULL,
    lease_epoch        INTEGER NOT NULL,
    -- the candidate id of the claim that created the record or last took it over
    claim_nonce        TEXT    NOT NULL,
    tokens_revoked_at  INTEGER,
    message            TEXT,
    created_at         INTEGER NOT NULL,
    updated_at         INTEGER NOT NULL,
    token_caller_id    TEXT    NOT NULL DEFAULT '',
    token_caller_class TEXT    NOT NULL DEFAULT '',
    -- when a command, ensure or file operation last touched the sandbox (replicas report
    -- it at most every few hundred ms, not per command)
    last_active_at     INTEGER NOT NULL DEFAULT 0
);
INSERT INTO sandboxes_next (id, org, kind, key, durability, state, driver, caller_id, caller_class,
    execution_id, token_id, token_expires_at, lease_holder, lease_expires_at, lease_epoch,
    claim_nonce, tokens_revoked_at, message, created_at, updated_at, token_caller_id,
    token_caller_class, last_active_at)
SELECT id, org, kind, key, durability, state, driver, caller_id, caller_class, execution_id,
    token_id, token_expires_at, lease_holder, lease_expires_at, lease_epoch, claim_nonce,
    tokens_revoked_at, message, created_at, updated_at, token_caller_id, token_caller_class,
    updated_at
FROM sandboxes;
DROP TABLE sandboxes;
ALTER TABLE sandboxes_next RENAME TO sandboxes;
CREATE UNIQUE INDEX sandboxes_live_key ON sandboxes (org, kind, key)
    WHERE state IN ('provisioning', 'ready', 'suspended');
CREATE INDEX sandboxes_live_created ON sandboxes (created_at, id)
    WHERE state IN ('provisioning', 'ready', 'suspended');
-- The quota of running sandboxes counts these, per org.
CREATE INDEX sandboxes_running_org ON sandboxes (org) WHERE state IN ('provisioning', 'ready');

-- An org's changes to the default policy: a JSON object of the fields `org set` named.
CREATE TABLE org_policies (
    org        TEXT    PRIMARY KEY,
    overrides  TEXT    NOT NULL,
    version    INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);

-- Warm sandboxes: provisioned ahead for an org, bound to no key until a claim adopts one
-- (the row moves into `sandboxes` under the same id).
CREATE TABLE warm_sandboxes (
    id               TEXT    PRIMARY KEY,
    org              TEXT    NOT NULL,
    workspace_bytes  INTEGER,
    driver           TEXT    NOT NULL,
    state            TEXT    NOT NULL CHECK (state IN ('provisioning', 'ready')),
    lease_holder     TEXT    NOT NULL,
    lease_expires_at INTEGER NOT NULL,
    lease_epoch      INTEGER NOT NULL,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL
);
CREATE INDEX warm_sandboxes_org ON warm_sandboxes (org, state, created_at);

-- Leases on shared concurrency quotas: each replica's slots of a scope (`org:ORG`,
-- `sandbox:ID`), until it renews them or they expire.
CREATE TABLE quota_leases (
    scope      TEXT    NOT NULL,
    holder     TEXT    NOT NULL,
    slots      INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (scope, holder)
);
