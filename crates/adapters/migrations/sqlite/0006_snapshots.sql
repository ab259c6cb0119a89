-- Snapshots of workspaces (issue 36): the records; the files are the driver's. `owner` is
-- the owner of the source key when the snapshot was taken (who may fork from it).
CREATE TABLE snapshots (
    org         TEXT    NOT NULL,
    id          TEXT    NOT NULL,
    source      TEXT    NOT NULL,
    source_kind TEXT    NOT NULL CHECK (source_kind IN ('session', 'workflow')),
    source_key  TEXT    NOT NULL,
    owner       TEXT    NOT NULL,
    created_by  TEXT    NOT NULL,
    name        TEXT,
    created_at  BIGINT  NOT NULL,
    bytes       BIGINT  NOT NULL,
    PRIMARY KEY (org, id)
);
CREATE INDEX snapshots_owner ON snapshots (org, owner);
