-- Issue 20: provenance and trust, memory types with lifetimes, and approvals of risky writes
-- (engram.domain.provenance). Additive: `type` keeps its free text; `memory_type` is new.

ALTER TABLE memories ADD COLUMN IF NOT EXISTS trust text NOT NULL DEFAULT 'SEMI_TRUSTED'
    CHECK (trust = ANY (ARRAY['UNTRUSTED', 'SEMI_TRUSTED', 'TRUSTED']));
ALTER TABLE memories ADD COLUMN IF NOT EXISTS memory_type text NOT NULL DEFAULT 'FACT'
    CHECK (memory_type = ANY (ARRAY['FACT', 'PATTERN', 'PREFERENCE', 'DECISION', 'STATE', 'CONTEXT', 'LEARNED']));
ALTER TABLE memories ADD COLUMN IF NOT EXISTS expires_at timestamptz;   -- null: never
ALTER TABLE memories ADD COLUMN IF NOT EXISTS created_by text;          -- who wrote version 1
ALTER TABLE memories ADD COLUMN IF NOT EXISTS agent_chain text[] NOT NULL DEFAULT '{}'::text[];
ALTER TABLE memories ADD COLUMN IF NOT EXISTS origin jsonb;             -- the original source, if relayed
-- A write that needed approval: where that stands. Null: it needed none.
ALTER TABLE memories ADD COLUMN IF NOT EXISTS approval text
    CHECK (approval = ANY (ARRAY['pending', 'approved', 'rejected', 'quarantined', 'withdrawn']));

-- `pending`: a write waiting for approval, out of recall until approved.
ALTER TABLE memories DROP CONSTRAINT IF EXISTS memories_status_check;
ALTER TABLE memories ADD CONSTRAINT memories_status_check
    CHECK (status = ANY (ARRAY['active', 'superseded', 'deleted', 'quarantined', 'pending']));

-- Existing rows, once: their type from the label they carry; their trust from the default
-- classification of their source type (facts: the lowest of their sources'), UNTRUSTED
-- confidence capped; who wrote them from their first event. Their lifetimes do not start now:
-- a memory written before lifetimes existed stays permanent.
UPDATE memories SET memory_type = CASE lower(type)
        WHEN 'pattern' THEN 'PATTERN' WHEN 'habit' THEN 'PATTERN' WHEN 'preference' THEN 'PREFERENCE'
        WHEN 'decision' THEN 'DECISION' WHEN 'plan' THEN 'DECISION' WHEN 'state' THEN 'STATE'
        WHEN 'context' THEN 'CONTEXT' WHEN 'learned' THEN 'LEARNED' WHEN 'lesson' THEN 'LEARNED'
        ELSE 'FACT' END,
    trust = CASE
        WHEN source_type IN ('user', 'operator', 'system') THEN 'TRUSTED'
        WHEN source_type IN ('web', 'email', 'document', 'external') THEN 'UNTRUSTED'
        ELSE 'SEMI_TRUSTED' END,
    created_by = coalesce((SELECT h.actor_id FROM memory_history h WHERE h.memory_id = memories.id
                           ORDER BY h.id LIMIT 1), updated_by)
WHERE created_by IS NULL;
UPDATE memories f SET trust = 'UNTRUSTED'
WHERE f.kind = 'fact' AND f.trust <> 'UNTRUSTED'
  AND EXISTS (SELECT 1 FROM memories s WHERE s.id = ANY (f.derived_from) AND s.trust = 'UNTRUSTED');
UPDATE memories f SET trust = 'SEMI_TRUSTED'
WHERE f.kind = 'fact' AND f.trust = 'TRUSTED'
  AND EXISTS (SELECT 1 FROM memories s WHERE s.id = ANY (f.derived_from) AND s.trust = 'SEMI_TRUSTED');
UPDATE memories SET confidence = 0.5 WHERE trust = 'UNTRUSTED' AND confidence > 0.5;

CREATE INDEX IF NOT EXISTS memories_expires_at_idx ON memories (expires_at) WHERE expires_at IS NOT NULL;
-- A scope's STATE memories, which its next session expires.
CREATE INDEX IF NOT EXISTS memories_state_idx ON memories (scope_key) WHERE memory_type = 'STATE';

-- A write waiting for approval (an ApprovalWorkflow, started through the outbox as a job of
-- type `approval` whose id is the approval's).
CREATE TABLE IF NOT EXISTS memory_approvals (
    id             uuid PRIMARY KEY,
    memory_id      uuid NOT NULL REFERENCES memories (id),
    user_id        text,
    agent_id       text,
    run_id         text,
    reason         text NOT NULL,      -- why it needs approval
    requested_by   text NOT NULL,      -- who wrote it: never its approver
    status         text NOT NULL DEFAULT 'pending'
                   CHECK (status = ANY (ARRAY['pending', 'approved', 'rejected', 'quarantined', 'withdrawn'])),
    decided_by     text,
    decided_reason text,
    timed_out      boolean NOT NULL DEFAULT false,
    expires_at     timestamptz NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    decided_at     timestamptz
);
CREATE INDEX IF NOT EXISTS memory_approvals_pending_idx ON memory_approvals (created_at) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS memory_approvals_memory_idx ON memory_approvals (memory_id);

ALTER TABLE memory_history DROP CONSTRAINT IF EXISTS memory_history_event_check;
ALTER TABLE memory_history ADD CONSTRAINT memory_history_event_check
    CHECK (event = ANY (ARRAY['ADD', 'UPDATE', 'DELETE', 'RECOVER', 'ROLLBACK', 'MERGE', 'NONE',
                              'QUARANTINE', 'CONFIRM', 'APPROVE', 'REJECT']));

ALTER TABLE memory_jobs DROP CONSTRAINT IF EXISTS memory_jobs_job_type_check;
ALTER TABLE memory_jobs ADD CONSTRAINT memory_jobs_job_type_check
    CHECK (job_type = ANY (ARRAY['extract', 'decision', 'graph', 'reembed', 'import', 'review', 'approval']));
