-- Accounts the sidecars have served: who serves them and whether a cache
-- stream is open. Times are Unix milliseconds.
CREATE TABLE IF NOT EXISTS accounts (
    name           TEXT PRIMARY KEY NOT NULL,
    agent_identity TEXT NOT NULL,
    state          TEXT NOT NULL,
    first_seen     BIGINT NOT NULL,
    last_seen      BIGINT NOT NULL
);
