-- Accounts the sidecar has served: who serves them and whether a cache
-- stream is open. Times are Unix milliseconds.
CREATE TABLE IF NOT EXISTS accounts (
    name           TEXT PRIMARY KEY NOT NULL,
    agent_identity TEXT NOT NULL,
    state          TEXT NOT NULL,
    first_seen     INTEGER NOT NULL,
    last_seen      INTEGER NOT NULL
);
