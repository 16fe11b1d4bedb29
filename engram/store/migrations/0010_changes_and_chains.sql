-- Modify, forget, recover and roll back by id (issue 17): roles, a status per memory, and two
-- hash chains over history.
--
-- Roles: agent (a model acting for a user) and operator join reader, writer and admin.
ALTER TABLE api_keys DROP CONSTRAINT IF EXISTS api_keys_role_check;
ALTER TABLE api_keys ADD CONSTRAINT api_keys_role_check
    CHECK (role = ANY (ARRAY['reader', 'agent', 'writer', 'operator', 'admin']));

-- A memory's status. `deleted` goes with is_deleted (which every read path filters on);
-- `quarantined`: its row no longer matches its history, so it left recall until an operator
-- rolls it back or confirms it; `superseded` is the semantic pipeline's.
ALTER TABLE memories ADD COLUMN IF NOT EXISTS status text NOT NULL DEFAULT 'active';
UPDATE memories SET status = 'deleted' WHERE is_deleted AND status = 'active';
ALTER TABLE memories DROP CONSTRAINT IF EXISTS memories_status_check;
ALTER TABLE memories ADD CONSTRAINT memories_status_check
    CHECK (status = ANY (ARRAY['active', 'superseded', 'deleted', 'quarantined']));
CREATE INDEX IF NOT EXISTS memories_status_idx ON memories (status) WHERE status <> 'active';

-- The hash of the memory's latest history event (the head of its chain). Null for memories
-- written before this migration until the chain sealer seals their history.
ALTER TABLE memories ADD COLUMN IF NOT EXISTS chain_hash text;
CREATE INDEX IF NOT EXISTS memories_unsealed_idx ON memories (created_at, id) WHERE chain_hash IS NULL;

-- The vector index's point of a memory changed after its write (a delete, a recover, new
-- content or labels) is rewritten from its canonical vector by the index owner's sync loop.
-- Search never depends on it: every candidate is re-read from its row.
ALTER TABLE memories ADD COLUMN IF NOT EXISTS dense_stale boolean NOT NULL DEFAULT false;
CREATE INDEX IF NOT EXISTS memories_dense_stale_idx ON memories (updated_at, id) WHERE dense_stale;

-- History: who (actor_type holds the role, or 'system'), why (reason), by which way (path:
-- http, cli, grpc, mcp, agent, system:<loop>), the state the event left (for rollback and for
-- verifying the row), and the chains:
--   hash / prev_hash: per memory, each event's SHA-256 over its canonical encoding and the
--     previous event's hash (engram.domain.chain); memories.chain_hash is the newest;
--   scope_seq / scope_hash: per scope, in the order the sealer sealed them, each
--     scope_hash = sha256(previous scope_hash || hash), so a deleted or edited row shows.
ALTER TABLE memory_history ADD COLUMN IF NOT EXISTS path text;
ALTER TABLE memory_history ADD COLUMN IF NOT EXISTS reason text;
ALTER TABLE memory_history ADD COLUMN IF NOT EXISTS state jsonb;
ALTER TABLE memory_history ADD COLUMN IF NOT EXISTS hash text;
ALTER TABLE memory_history ADD COLUMN IF NOT EXISTS prev_hash text;
ALTER TABLE memory_history ADD COLUMN IF NOT EXISTS scope_key text;
ALTER TABLE memory_history ADD COLUMN IF NOT EXISTS scope_seq bigint;
ALTER TABLE memory_history ADD COLUMN IF NOT EXISTS scope_hash text;
ALTER TABLE memory_history DROP CONSTRAINT IF EXISTS memory_history_event_check;
ALTER TABLE memory_history ADD CONSTRAINT memory_history_event_check
    CHECK (event = ANY (ARRAY['ADD', 'UPDATE', 'DELETE', 'RECOVER', 'ROLLBACK', 'MERGE', 'NONE',
                              'QUARANTINE', 'CONFIRM']));
UPDATE memory_history h SET scope_key = m.scope_key FROM memories m WHERE h.memory_id = m.id AND h.scope_key IS NULL;
CREATE UNIQUE INDEX IF NOT EXISTS memory_history_scope_seq_uq ON memory_history (scope_key, scope_seq);
CREATE INDEX IF NOT EXISTS memory_history_unsealed_idx ON memory_history (id)
    WHERE scope_seq IS NULL AND hash IS NOT NULL;

-- The head of each scope's chain: its last sealed event's seq and scope_hash.
CREATE TABLE IF NOT EXISTS scope_chains (
    scope_key  text PRIMARY KEY,
    seq        bigint NOT NULL,
    head       text NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
