-- Where each sidecar serves its account caches to its peers (the warm
-- handover of a planned move: a new owner loads the old owner's snapshot
-- instead of having the agent list again). Empty: not registered.
ALTER TABLE instances ADD COLUMN peer_url TEXT NOT NULL DEFAULT '';
