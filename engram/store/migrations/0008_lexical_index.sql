-- The lexical index: BM25 candidates from sparse vectors in the vector engine (issue 22).
--
-- lexical_indexed is its outbox: false from the remember transaction (or whenever a memory's
-- text changes) until the index owner's indexer has written the memory's sparse point. A new,
-- empty lexical index resets it everywhere, and the same indexer rebuilds the index from the
-- postings. Search scores a scope's not yet indexed memories in Postgres, so BM25 finds a
-- memory from the moment it is committed. Every existing memory starts unindexed.
ALTER TABLE memories ADD COLUMN IF NOT EXISTS lexical_indexed boolean NOT NULL DEFAULT false;
CREATE INDEX IF NOT EXISTS memories_lexical_todo_idx ON memories (created_at, id) WHERE NOT lexical_indexed;
CREATE INDEX IF NOT EXISTS memories_lexical_todo_user_idx ON memories (user_id) WHERE NOT lexical_indexed;
CREATE INDEX IF NOT EXISTS memories_lexical_todo_agent_idx ON memories (agent_id) WHERE NOT lexical_indexed;
CREATE INDEX IF NOT EXISTS memories_lexical_todo_run_idx ON memories (run_id) WHERE NOT lexical_indexed;
