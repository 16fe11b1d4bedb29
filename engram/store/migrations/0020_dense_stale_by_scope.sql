-- Issue 22: search scores a memory whose vector points a change left stale by its row
-- (memories.stale_dense), reading the stale memories of the searched scope on every search.
-- These find them by a scope's parts, as the lexical to-do indexes do, so a mass change in
-- one scope costs no other scope's searches anything.
CREATE INDEX IF NOT EXISTS memories_dense_stale_user_idx ON memories (user_id) WHERE dense_stale;
CREATE INDEX IF NOT EXISTS memories_dense_stale_agent_idx ON memories (agent_id) WHERE dense_stale;
CREATE INDEX IF NOT EXISTS memories_dense_stale_run_idx ON memories (run_id) WHERE dense_stale;
