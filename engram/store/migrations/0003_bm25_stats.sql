-- BM25 statistics per exact scope, kept up to date by the write path, so a search reads a
-- handful of rows instead of counting the scope's memories and postings on every query.
-- A search's scope may span several exact scopes (user_id alone covers every agent and run
-- of that user): it sums their rows.
CREATE TABLE IF NOT EXISTS bm25_scope_stats (
    scope_key  text PRIMARY KEY,
    user_id    text,
    agent_id   text,
    run_id     text,
    doc_count  bigint NOT NULL DEFAULT 0,
    total_len  bigint NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS bm25_scope_stats_user_idx ON bm25_scope_stats (user_id);
CREATE INDEX IF NOT EXISTS bm25_scope_stats_agent_idx ON bm25_scope_stats (agent_id);
CREATE INDEX IF NOT EXISTS bm25_scope_stats_run_idx ON bm25_scope_stats (run_id);

CREATE TABLE IF NOT EXISTS bm25_term_stats (
    scope_key  text NOT NULL,
    term       text NOT NULL,
    df         bigint NOT NULL,
    PRIMARY KEY (scope_key, term)
);

-- Backfill from what is already stored (a no-op on a database that has the rows). From 0006 on
-- Postgres derives scope_key itself and refuses a value for it, and 0006 recounts the rows:
-- then there is nothing to backfill here.
DO $$
BEGIN
    IF (SELECT attgenerated FROM pg_attribute
        WHERE attrelid = 'bm25_scope_stats'::regclass AND attname = 'scope_key') = '' THEN
        INSERT INTO bm25_scope_stats (scope_key, user_id, agent_id, run_id, doc_count, total_len)
        SELECT scope_key, min(user_id), min(agent_id), min(run_id), count(*), sum(token_count)
        FROM memories WHERE NOT is_deleted GROUP BY scope_key
        ON CONFLICT (scope_key) DO NOTHING;
    END IF;
END $$;

INSERT INTO bm25_term_stats (scope_key, term, df)
SELECT m.scope_key, t.term, count(*)
FROM memory_terms t JOIN memories m ON m.id = t.memory_id
WHERE NOT m.is_deleted GROUP BY m.scope_key, t.term
ON CONFLICT (scope_key, term) DO NOTHING;
