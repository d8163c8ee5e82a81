-- The relayed-operation journal is what the accounts API serves (any
-- sidecar of the store, the owner or not, before and after a failover), so
-- it keeps what the API shows: the query string, kubectl's command, when
-- the request went down the relay stream and why it failed. Never a body,
-- a header value or a credential. Times are Unix milliseconds; 0 is none.
ALTER TABLE operations ADD COLUMN query TEXT NOT NULL DEFAULT '';
ALTER TABLE operations ADD COLUMN kubectl_command TEXT NOT NULL DEFAULT '';
ALTER TABLE operations ADD COLUMN sent_at BIGINT NOT NULL DEFAULT 0;
ALTER TABLE operations ADD COLUMN message TEXT NOT NULL DEFAULT '';
