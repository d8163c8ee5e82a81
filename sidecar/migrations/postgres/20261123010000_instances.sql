-- Sidecar instances sharing the store, and where their facades answer, so a
-- request for an account another instance owns is forwarded there (once).
-- Times are Unix milliseconds.
CREATE TABLE IF NOT EXISTS instances (
    id         TEXT PRIMARY KEY NOT NULL,
    facade_url TEXT NOT NULL,
    last_seen  BIGINT NOT NULL
);
