-- Ownership: a sandbox key belongs to the identity whose ensure first created it, kept
-- across deprovision and recovery (a durable workspace is its owner's data).
CREATE TABLE sandbox_owners (
    org         TEXT   NOT NULL,
    kind        TEXT   NOT NULL CHECK (kind IN ('session', 'workflow')),
    key         TEXT   NOT NULL,
    owner_id    TEXT   NOT NULL,
    owner_class TEXT   NOT NULL,
    created_at  BIGINT NOT NULL,
    PRIMARY KEY (org, kind, key)
);

-- Keys ensured before ownership was recorded belong to the creator of their first record.
INSERT INTO sandbox_owners (org, kind, key, owner_id, owner_class, created_at)
SELECT s.org, s.kind, s.key, s.caller_id, s.caller_class, s.created_at
FROM sandboxes s
WHERE NOT EXISTS (
    SELECT 1 FROM sandboxes t
    WHERE t.org = s.org AND t.kind = s.kind AND t.key = s.key
      AND (t.created_at < s.created_at OR (t.created_at = s.created_at AND t.id < s.id))
);

-- The caller the current token was minted for (the latest ensurer): the refresher
-- re-mints for this caller. Until a token is minted it is the record's creator.
ALTER TABLE sandboxes ADD COLUMN token_caller_id TEXT NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN token_caller_class TEXT NOT NULL DEFAULT '';
UPDATE sandboxes SET token_caller_id = caller_id, token_caller_class = caller_class;

-- The list of ensurers was the old authorization rule; ownership replaces it.
DROP TABLE sandbox_callers;
