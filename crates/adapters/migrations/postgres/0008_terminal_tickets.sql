-- Terminal tickets (issue 37): short-lived, single-use credentials that attach one caller
-- to one terminal over a WebSocket. Only the ticket's SHA-256 (hex) is kept; a ticket is
-- deleted as it is taken, and expired ones as new ones are written.
CREATE TABLE terminal_tickets (
    digest      TEXT    NOT NULL PRIMARY KEY,
    org         TEXT    NOT NULL,
    sandbox     TEXT    NOT NULL,
    terminal    TEXT    NOT NULL,
    identity    TEXT    NOT NULL,
    class       TEXT    NOT NULL CHECK (class IN ('user', 'service')),
    expires_at  BIGINT  NOT NULL
);
CREATE INDEX terminal_tickets_expiry ON terminal_tickets (expires_at);
