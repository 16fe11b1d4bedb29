-- The operational switches (issue 18), held by the ControlWorkflow and mirrored here, where
-- every mutating path reads them (at most a second old): a global mutation freeze, freezes per
-- scope (a memory is frozen when its scope holds every part a freeze names), and the kill
-- switch of autonomous mutations. control_events is their audit: every change, by whom, why.
CREATE TABLE IF NOT EXISTS control_state (
    id          boolean PRIMARY KEY DEFAULT true CHECK (id),
    frozen      boolean NOT NULL DEFAULT false,
    kill_switch boolean NOT NULL DEFAULT false,
    updated_at  timestamptz NOT NULL DEFAULT now()
);
INSERT INTO control_state (id) VALUES (true) ON CONFLICT DO NOTHING;

CREATE TABLE IF NOT EXISTS frozen_scopes (
    scope_key  text PRIMARY KEY,
    user_id    text,
    agent_id   text,
    run_id     text,
    reason     text NOT NULL,
    frozen_by  text NOT NULL,
    frozen_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS control_events (
    id         bigserial PRIMARY KEY,
    switch     text NOT NULL,
    scope      jsonb,
    value      boolean NOT NULL,
    actor      text NOT NULL,
    role       text NOT NULL,
    reason     text NOT NULL,
    at         timestamptz NOT NULL DEFAULT now()
);

-- Recent deletes per scope, for the delete-spike check (batch forgets' own deletes excluded).
CREATE INDEX IF NOT EXISTS memory_history_deletes_idx ON memory_history (scope_key, created_at)
    WHERE event = 'DELETE';
