-- Dynamic accounts: created through the accounts API, assigned to one agent
-- of their zone over its `Assignments` stream. The kubeconfig is sealed
-- with AES-256-GCM (never stored in clear). `agent_id` is the agent that
-- claimed the account (empty: none yet) and `agent_seen_at` when that
-- agent's stream last renewed the claim. A deleted account keeps its row,
-- without its kubeconfig, with `deleted_at` set (a tombstone), so the facade
-- answers 404 for it at once rather than "moving between sidecars".
-- Times are Unix milliseconds.
CREATE TABLE IF NOT EXISTS dynamic_accounts (
    name           TEXT PRIMARY KEY NOT NULL,
    zone           TEXT NOT NULL,
    namespaces     TEXT NOT NULL,
    context        TEXT NOT NULL,
    kubeconfig     BLOB NOT NULL,
    ca_fingerprint TEXT NOT NULL,
    agent_id       TEXT NOT NULL DEFAULT '',
    agent_seen_at  INTEGER NOT NULL DEFAULT 0,
    created_at     INTEGER NOT NULL,
    updated_at     INTEGER NOT NULL,
    deleted_at     INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS dynamic_accounts_by_zone ON dynamic_accounts (zone);
