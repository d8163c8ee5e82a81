-- Scale-out state shared by the sidecars (see the store module docs).
-- Times are Unix milliseconds.

-- The CA fingerprint of the cluster an account names, so a name already
-- held for one cluster is refused for another.
ALTER TABLE accounts ADD COLUMN ca_fingerprint TEXT NOT NULL DEFAULT '';

-- Which sidecar instance owns (caches and serves) an account. The epoch
-- grows with every change of owner, so a stale owner can tell.
CREATE TABLE IF NOT EXISTS leases (
    account    TEXT PRIMARY KEY NOT NULL,
    owner      TEXT NOT NULL,
    epoch      BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);

-- The journal of relayed operations.
CREATE TABLE IF NOT EXISTS operations (
    id          BIGSERIAL PRIMARY KEY,
    account     TEXT NOT NULL,
    instance    TEXT NOT NULL,
    request_id  BIGINT NOT NULL,
    method      TEXT NOT NULL,
    path        TEXT NOT NULL,
    status      BIGINT NOT NULL,
    outcome     TEXT NOT NULL,
    received_at BIGINT NOT NULL,
    answered_at BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS operations_by_account ON operations (account, id);

-- The last resourceVersion held per account and kind: where a new owner
-- resumes the agent's watches without listing again.
CREATE TABLE IF NOT EXISTS resource_versions (
    account          TEXT NOT NULL,
    api_group        TEXT NOT NULL,
    version          TEXT NOT NULL,
    resource         TEXT NOT NULL,
    resource_version TEXT NOT NULL,
    updated_at       BIGINT NOT NULL,
    PRIMARY KEY (account, api_group, version, resource)
);
