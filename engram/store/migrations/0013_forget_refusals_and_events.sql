-- Batch forget (issue 18), continued.
-- An item the service refuses to delete for a reason other than a new version (a quarantined
-- memory, a person's lock against an agent's request, a pin) is settled `refused` with why: it
-- used to roll its chunk back, and the chunk was retried for ever.
ALTER TABLE forget_items ADD COLUMN IF NOT EXISTS refusal text;
ALTER TABLE forget_items DROP CONSTRAINT IF EXISTS forget_items_state_check;
ALTER TABLE forget_items ADD CONSTRAINT forget_items_state_check
    CHECK (state = ANY (ARRAY['pending', 'deleted', 'changed', 'gone', 'recovered', 'refused']));

-- Each move of an operation (previewed, confirmed, awaiting approval, approved, rejected,
-- expired, stale, dry run, executing, done), by whom and why: the audit the receipt's times
-- come from, and what an operator reads for an operation that ended without deleting.
CREATE TABLE IF NOT EXISTS forget_events (
    id           bigserial PRIMARY KEY,
    operation_id text NOT NULL REFERENCES forget_operations (id),
    event        text NOT NULL,                  -- previewed, confirmed, approved, rejected, or the status it ended in
    actor        text NOT NULL,
    reason       text,
    at           timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS forget_events_operation_idx ON forget_events (operation_id, id);
