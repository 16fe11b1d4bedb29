-- The write path in batches, and outages that cost O(1).
--
-- 1. A job's workflow is now a batch's: many remember jobs share one IngestWorkflow, so the
--    workflow id is no longer unique, and it is NULL until the dispatcher puts the job in a
--    batch. Old rows keep theirs ("remember-<job>").
-- 2. 'parked': an extraction waiting for its provider (no timer runs for it); the drain
--    workflow takes parked jobs when a provider answers again.
-- 3. 'import': the job of a bulk remember, whose items' jobs point to it (parent_id); its
--    progress is counted from them.
-- 4. provider_health: what the service last learned of each LLM provider, so that every
--    process skips a provider known to be down instead of finding out once per memory.
ALTER TABLE memory_jobs DROP CONSTRAINT IF EXISTS memory_jobs_workflow_id_key;
ALTER TABLE memory_jobs ALTER COLUMN workflow_id DROP NOT NULL;
CREATE INDEX IF NOT EXISTS memory_jobs_workflow_idx ON memory_jobs (workflow_id);

ALTER TABLE memory_jobs DROP CONSTRAINT IF EXISTS memory_jobs_status_check;
ALTER TABLE memory_jobs ADD CONSTRAINT memory_jobs_status_check
    CHECK (status IN ('pending', 'leased', 'retry_scheduled', 'parked', 'done', 'dead'));
ALTER TABLE memory_jobs DROP CONSTRAINT IF EXISTS memory_jobs_job_type_check;
ALTER TABLE memory_jobs ADD CONSTRAINT memory_jobs_job_type_check
    CHECK (job_type IN ('extract', 'decision', 'graph', 'reembed', 'import'));

ALTER TABLE memory_jobs ADD COLUMN IF NOT EXISTS parent_id uuid REFERENCES memory_jobs (id);
CREATE INDEX IF NOT EXISTS memory_jobs_parent_idx ON memory_jobs (parent_id) WHERE parent_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS memory_jobs_parked_idx ON memory_jobs (created_at) WHERE status = 'parked';
CREATE INDEX IF NOT EXISTS memory_jobs_unbatched_idx ON memory_jobs (created_at)
    WHERE workflow_id IS NULL AND status = 'pending';

CREATE TABLE IF NOT EXISTS provider_health (
    provider   text PRIMARY KEY,               -- "<name>/<model>", as the chain names it
    state      text NOT NULL CHECK (state IN ('up', 'down')),
    detail     text,
    changed_at timestamptz NOT NULL DEFAULT now(),
    checked_at timestamptz NOT NULL DEFAULT now()
);
