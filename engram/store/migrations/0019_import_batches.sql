-- Issue 16: a bulk remember's items, staged by the API in one statement and written by a worker
-- (engram.store.import_batches says how), so that the API process keeps its CPU and its event
-- loop for searches while an import is written. A row lives from the request until the API
-- has read the answer; one nobody read is purged a while after it was written.
CREATE TABLE IF NOT EXISTS import_batches (
    id uuid PRIMARY KEY,                 -- the import job's id
    principal jsonb NOT NULL,            -- who sent it: id, name, role, grants
    items jsonb NOT NULL,                -- the request's items, as sent
    request_id text,
    path text NOT NULL,
    model jsonb NOT NULL,                -- the caller's declared model (ModelAttribution)
    response jsonb,                      -- the RememberBatchResponse, once written
    failures integer NOT NULL DEFAULT 0, -- writes of it that failed (rolled back)
    created_at timestamptz NOT NULL DEFAULT now(),
    written_at timestamptz
);
CREATE INDEX IF NOT EXISTS import_batches_unwritten ON import_batches (created_at) WHERE response IS NULL;
