-- The semantic write pipeline (issue 19): extracted facts become memories, and what a model
-- decided about each fact is recorded.
--
-- kind: `raw` is what a caller remembered, as said; `fact` is one statement a model extracted
-- from raw memories. derived_from: a fact's source memories (its lineage); empty for a raw one.
ALTER TABLE memories ADD COLUMN IF NOT EXISTS kind text NOT NULL DEFAULT 'raw';
ALTER TABLE memories DROP CONSTRAINT IF EXISTS memories_kind_check;
ALTER TABLE memories ADD CONSTRAINT memories_kind_check CHECK (kind = ANY (ARRAY['raw', 'fact']));
ALTER TABLE memories ADD COLUMN IF NOT EXISTS derived_from uuid[] NOT NULL DEFAULT '{}';
-- The facts of a raw memory (lineage).
CREATE INDEX IF NOT EXISTS memories_derived_from_idx ON memories USING gin (derived_from) WHERE kind = 'fact';
-- A raw memory a fact was taken from: search ranks it below its facts (rank_raw_with_facts).
ALTER TABLE memories ADD COLUMN IF NOT EXISTS has_facts boolean NOT NULL DEFAULT false;
-- The secrets a model only ever saw as placeholders that a fact holds again (restored): a later
-- call that shows the fact redacts them too, though in prose no pattern would find them.
ALTER TABLE memories ADD COLUMN IF NOT EXISTS sensitive text[] NOT NULL DEFAULT '{}';

-- One row per extracted fact of a source memory: the action proposed (by the model, or MERGE
-- by similarity alone), what became of it, and why. Unique per (source, fact): a step run
-- again after a crash finds the fact decided and leaves it.
CREATE TABLE IF NOT EXISTS memory_decisions (
    id               bigserial PRIMARY KEY,
    source_memory_id uuid NOT NULL REFERENCES memories (id),
    job_id           uuid,
    fact             text NOT NULL,
    fact_hash        text NOT NULL,
    fact_type        text NOT NULL,
    fact_confidence  real NOT NULL,
    action           text NOT NULL CHECK (action = ANY (ARRAY['ADD', 'UPDATE', 'DELETE', 'NONE', 'MERGE', 'CONTRADICT'])),
    target_id        uuid,            -- the existing memory the decision names
    memory_id        uuid,            -- the memory it wrote: a new fact, or the target it changed
    content          text,            -- an UPDATE's new content
    confidence       real,
    reason           text,
    outcome          text NOT NULL,   -- applied, shadow, held, below_threshold, refused, review_needed
    detail           text,
    mode             text NOT NULL,   -- the rollout switch it ran under: shadow, add_only or full
    provider         text,
    model            text,
    prompt_version   text,
    scope_key        text NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    UNIQUE (source_memory_id, fact_hash)
);
CREATE INDEX IF NOT EXISTS memory_decisions_target_idx ON memory_decisions (target_id) WHERE target_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS memory_decisions_memory_idx ON memory_decisions (memory_id) WHERE memory_id IS NOT NULL;
