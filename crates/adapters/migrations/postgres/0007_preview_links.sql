-- Preview links (issue 37): who may open one port of one sandbox without a caller key. Only
-- the SHA-256 of a link's token is kept; every preview request finds its link by it, so a
-- revocation holds at once on every replica.
CREATE TABLE preview_links (
    org          TEXT    NOT NULL,
    id           TEXT    NOT NULL,
    sandbox      TEXT    NOT NULL,
    port         INTEGER NOT NULL CHECK (port BETWEEN 1 AND 65535),
    created_by   TEXT    NOT NULL,
    created_by_class TEXT NOT NULL CHECK (created_by_class IN ('user', 'service')),
    created_at   BIGINT  NOT NULL,
    expires_at   BIGINT  NOT NULL,
    revoked_at   BIGINT,
    token_sha256 TEXT    NOT NULL UNIQUE,
    PRIMARY KEY (org, id)
);
CREATE INDEX preview_links_sandbox ON preview_links (org, sandbox, port);
