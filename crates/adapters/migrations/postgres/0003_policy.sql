-- Org policy (issue 14): suspended sandboxes, activity, per-org policies, warm pools and
-- quota leases.

-- A suspended sandbox holds its key (the live index covers it) but runs nothing.
ALTER TABLE sandboxes DROP CONSTRAINT sandboxes_state_check;
ALTER TABLE sandboxes ADD CONSTRAINT sandboxes_state_check
    CHECK (state IN ('provisioning', 'ready', 'suspended', 'failed', 'deprovisioned'));
DROP INDEX sandboxes_live_key;
CREATE UNIQUE INDEX sandboxes_live_key ON sandboxes (org, kind, key)
    WHERE state IN ('provisioning', 'ready', 'suspended');
DROP INDEX sandboxes_live_created;
CREATE INDEX sandboxes_live_created ON sandboxes (created_at, id)
    WHERE state IN ('provisioning', 'ready', 'suspended');
-- The quota of running sandboxes counts these, per org.
CREATE INDEX sandboxes_running_org ON sandboxes (org) WHERE state IN ('provisioning', 'ready');

-- When a command, ensure or file operation last touched the sandbox (replicas report it
-- at most every few hundred ms, not per command).
ALTER TABLE sandboxes ADD COLUMN last_active_at BIGINT NOT NULL DEFAULT 0;
UPDATE sandboxes SET last_active_at = updated_at;

-- An org's changes to the default policy: a JSON object of the fields `org set` named.
CREATE TABLE org_policies (
    org        TEXT   PRIMARY KEY,
    overrides  TEXT   NOT NULL,
    version    BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);

-- Warm sandboxes: provisioned ahead for an org, bound to no key until a claim adopts one
-- (the row moves into `sandboxes` under the same id).
CREATE TABLE warm_sandboxes (
    id               TEXT   PRIMARY KEY,
    org              TEXT   NOT NULL,
    workspace_bytes  BIGINT,
    driver           TEXT   NOT NULL,
    state            TEXT   NOT NULL CHECK (state IN ('provisioning', 'ready')),
    lease_holder     TEXT   NOT NULL,
    lease_expires_at BIGINT NOT NULL,
    lease_epoch      BIGINT NOT NULL,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL
);
CREATE INDEX warm_sandboxes_org ON warm_sandboxes (org, state, created_at);

-- Leases on shared concurrency quotas: each replica's slots of a scope (`org:ORG`,
-- `sandbox:ID`), until it renews them or they expire.
CREATE TABLE quota_leases (
    scope      TEXT   NOT NULL,
    holder     TEXT   NOT NULL,
    slots      BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    PRIMARY KEY (scope, holder)
);
