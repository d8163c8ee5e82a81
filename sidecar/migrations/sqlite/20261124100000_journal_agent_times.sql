-- The agent's part of a relayed operation: when it began on the request
-- and when it had the answer, as the relaying sidecar placed them on its
-- own clock (inside the window between sending the request and the
-- answer's arrival). Unix milliseconds like the journal's other times;
-- NULL when the agent reported none (an agent older than `AgentTiming`, no
-- answer) and in entries journaled before these columns existed.
ALTER TABLE operations ADD COLUMN agent_started_at INTEGER;
ALTER TABLE operations ADD COLUMN agent_finished_at INTEGER;
