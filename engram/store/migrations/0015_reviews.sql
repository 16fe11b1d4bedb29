-- Contradictions under review (issue 19): when a model says a new fact opposes a stored one,
-- both are kept and a review item waits for a person (a ReviewWorkflow, started through the
-- outbox as a job of type `review` whose id is the review's).
CREATE TABLE IF NOT EXISTS memory_reviews (
    id                 uuid PRIMARY KEY,
    decision_id        bigint REFERENCES memory_decisions (id),
    user_id            text,
    agent_id           text,
    run_id             text,
    new_memory_id      uuid NOT NULL REFERENCES memories (id),
    existing_memory_id uuid NOT NULL REFERENCES memories (id),
    reason             text,             -- the model's
    status             text NOT NULL DEFAULT 'open'
                       CHECK (status = ANY (ARRAY['open', 'escalated', 'resolved', 'expired'])),
    resolution         text CHECK (resolution = ANY (ARRAY['keep_existing', 'replace', 'keep_both', 'merge'])),
    merged_content     text,
    resolved_by        text,
    resolved_reason    text,
    detail             text,             -- what applying the resolution did, or why it could not
    expires_at         timestamptz NOT NULL,
    created_at         timestamptz NOT NULL DEFAULT now(),
    resolved_at        timestamptz
);
CREATE INDEX IF NOT EXISTS memory_reviews_waiting_idx ON memory_reviews (created_at) WHERE status IN ('open', 'escalated');

-- One live memory per content in a scope, per kind: a fact may say exactly what a raw memory
-- said (an agent's note is often the fact itself), and both must exist, the fact for decisions.
DROP INDEX IF EXISTS memories_live_scope_hash_uq;
CREATE UNIQUE INDEX IF NOT EXISTS memories_live_scope_kind_hash_uq ON memories (scope_key, kind, content_hash)
    WHERE NOT is_deleted;

-- The tokens a remember job's model calls took, by "provider/model": {"calls", "in", "out"}.
ALTER TABLE memory_jobs ADD COLUMN IF NOT EXISTS usage jsonb;

ALTER TABLE memory_jobs DROP CONSTRAINT IF EXISTS memory_jobs_job_type_check;
ALTER TABLE memory_jobs ADD CONSTRAINT memory_jobs_job_type_check
    CHECK (job_type = ANY (ARRAY['extract', 'decision', 'graph', 'reembed', 'import', 'review']));
