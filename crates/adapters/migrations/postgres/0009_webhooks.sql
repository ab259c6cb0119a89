-- Webhooks (issue 39): per org, a receiver's URL and its signing secret (sealed as the
-- brokered secrets are, under a key of the data dir that `key_id` names), and a cursor
-- over the org's audit log: deliveries are derived from the audit events past it, so
-- an event is delivered iff it was audited, with no second write on the request path.
CREATE TABLE webhooks (
    org         TEXT    PRIMARY KEY,
    url         TEXT    NOT NULL,
    key_id      TEXT    NOT NULL,
    -- the 12-byte nonce, then the ciphertext and its 16-byte tag
    sealed      BYTEA   NOT NULL,
    -- the last audit seq of the org turned into deliveries (or skipped)
    audit_cursor BIGINT NOT NULL,
    created_at  BIGINT  NOT NULL,
    updated_at  BIGINT  NOT NULL
);

-- The outbox: one row per event to deliver, made once per (org, audit seq) whichever
-- replica reads the event first; attempted by whichever replica leases it.
CREATE TABLE webhook_deliveries (
    -- the Standard Webhooks message id (webhook-id), stable across attempts
    id              TEXT    PRIMARY KEY,
    org             TEXT    NOT NULL,
    audit_seq       BIGINT  NOT NULL,
    event_type      TEXT    NOT NULL,
    -- the JSON body sent, as sent
    payload         TEXT    NOT NULL,
    status          TEXT    NOT NULL CHECK (status IN ('pending', 'delivered', 'failed')),
    attempts        BIGINT  NOT NULL,
    next_attempt_at BIGINT  NOT NULL,
    -- held by one replica's attempt until then (0: free)
    lease_until     BIGINT  NOT NULL,
    last_status     BIGINT,
    last_error      TEXT,
    created_at      BIGINT  NOT NULL,
    updated_at      BIGINT  NOT NULL,
    UNIQUE (org, audit_seq)
);
-- The sender's look for deliveries due.
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (status, next_attempt_at);
-- An org's deliveries, newest first.
CREATE INDEX webhook_deliveries_org ON webhook_deliveries (org, created_at);
