-- Batch forget (issue 18): each operation (one BatchForgetWorkflow), the exact set it previewed,
-- and what became of each item. An item's row is written, `pending`, before anything is deleted
-- (the audit record of the intent); its delete and its move to `deleted` share a transaction,
-- so a resumed run never deletes twice.
CREATE TABLE IF NOT EXISTS forget_operations (
    id           text PRIMARY KEY,               -- the workflow id
    requester    text NOT NULL,                  -- key:<uuid>
    role         text NOT NULL,
    scope        jsonb NOT NULL,
    reason       text NOT NULL,
    force        boolean NOT NULL DEFAULT false,
    needs_approval boolean NOT NULL,
    status       text NOT NULL,
    total        integer NOT NULL,
    expires_at   timestamptz NOT NULL,           -- the confirm token's
    approver     text,
    receipt      jsonb,
    created_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz
);

CREATE TABLE IF NOT EXISTS forget_items (
    operation_id text NOT NULL REFERENCES forget_operations (id),
    memory_id    uuid NOT NULL REFERENCES memories (id),
    version      integer NOT NULL,               -- as previewed; a different one at execution is `changed`
    content_hash text NOT NULL,
    state        text NOT NULL DEFAULT 'pending'
                 CHECK (state = ANY (ARRAY['pending', 'deleted', 'changed', 'gone', 'recovered'])),
    deleted_version integer,
    event_hash   text,                           -- the DELETE event's hash (for the receipt)
    PRIMARY KEY (operation_id, memory_id)
);

-- Secrets the service signs with (confirm tokens, receipts): made once, at first use.
CREATE TABLE IF NOT EXISTS service_secrets (
    name  text PRIMARY KEY,
    value bytea NOT NULL
);
