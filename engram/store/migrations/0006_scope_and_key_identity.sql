-- Two identities that could be mistaken for others.
--
-- 1. A scope's key. It was 'u:<user>|a:<agent>|r:<run>' unescaped, so {user_id: "v|a:g"} and
--    {user_id: "v", agent_id: "g|a:"} shared one key, and a remember into the second was
--    dropped as a "duplicate" of the first's memory. Each part is now written with its length
--    ('-' when absent), which no value can forge, and Postgres derives the key from the parts,
--    so no writer can compute it differently.
CREATE OR REPLACE FUNCTION engram_scope_key(user_id text, agent_id text, run_id text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN 'u' || coalesce(length(user_id)::text || ':' || user_id, '-')
        || '|a' || coalesce(length(agent_id)::text || ':' || agent_id, '-')
        || '|r' || coalesce(length(run_id)::text || ':' || run_id, '-');

DO $$
BEGIN
    IF (SELECT attgenerated FROM pg_attribute
        WHERE attrelid = 'memories'::regclass AND attname = 'scope_key') = '' THEN
        -- Dropping the column drops the two indexes on it; they are made again below.
        ALTER TABLE memories DROP COLUMN scope_key;
        ALTER TABLE memories ADD COLUMN scope_key text NOT NULL
            GENERATED ALWAYS AS (engram_scope_key(user_id, agent_id, run_id)) STORED;
    END IF;
    IF (SELECT attgenerated FROM pg_attribute
        WHERE attrelid = 'bm25_scope_stats'::regclass AND attname = 'scope_key') = '' THEN
        ALTER TABLE bm25_scope_stats DROP COLUMN scope_key;
        ALTER TABLE bm25_scope_stats ADD COLUMN scope_key text NOT NULL
            GENERATED ALWAYS AS (engram_scope_key(user_id, agent_id, run_id)) STORED PRIMARY KEY;
    END IF;
END $$;

CREATE UNIQUE INDEX IF NOT EXISTS memories_live_scope_hash_uq
    ON memories (scope_key, content_hash) WHERE NOT is_deleted;
CREATE INDEX IF NOT EXISTS memories_session_order_idx
    ON memories (scope_key, session_id, created_at, id) WHERE session_id IS NOT NULL;

-- Statistics kept under a colliding key mixed two scopes: count them again, per exact scope.
DELETE FROM bm25_scope_stats;
DELETE FROM bm25_term_stats;
INSERT INTO bm25_scope_stats (user_id, agent_id, run_id, doc_count, total_len)
SELECT user_id, agent_id, run_id, count(*), sum(token_count)
FROM memories WHERE NOT is_deleted GROUP BY user_id, agent_id, run_id;
INSERT INTO bm25_term_stats (scope_key, term, df)
SELECT m.scope_key, t.term, count(*)
FROM memory_terms t JOIN memories m ON m.id = t.memory_id
WHERE NOT m.is_deleted GROUP BY m.scope_key, t.term;

-- 2. A caller. Actors and idempotency namespaces were 'key:<name>', and names need not be
--    unique, so a key named like the admin's wrote as the admin and shared its idempotency
--    keys. They are now 'key:<id>'. Where a name belonged to one key only, what it wrote is
--    attributed to that key's id; a name several keys shared stays as it was (it cannot be
--    told apart).
CREATE TEMP TABLE sole_key_names ON COMMIT DROP AS
SELECT 'key:' || name AS old, 'key:' || min(id::text) AS new
FROM api_keys GROUP BY name HAVING count(*) = 1;
UPDATE memories m SET updated_by = s.new FROM sole_key_names s WHERE m.updated_by = s.old;
UPDATE memory_history h SET actor_id = s.new FROM sole_key_names s WHERE h.actor_id = s.old;
UPDATE idempotency_keys i SET principal = s.new FROM sole_key_names s WHERE i.principal = s.old;

-- Names are unique among active keys: the oldest keeps its name, later ones get their id's
-- first eight characters appended.
UPDATE api_keys k SET name = k.name || '-' || left(k.id::text, 8)
FROM (
    SELECT id, row_number() OVER (PARTITION BY name ORDER BY created_at, id) AS n
    FROM api_keys WHERE revoked_at IS NULL
) ranked
WHERE k.id = ranked.id AND ranked.n > 1;
CREATE UNIQUE INDEX IF NOT EXISTS api_keys_active_name_uq ON api_keys (name) WHERE revoked_at IS NULL;
