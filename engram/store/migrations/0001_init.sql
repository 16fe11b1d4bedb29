-- Engram's system of record: memories, their history, the job outbox, the graph, API keys.
-- Every statement is idempotent so a re-run after a partial failure converges.

CREATE EXTENSION IF NOT EXISTS vector;

CREATE TABLE IF NOT EXISTS memories (
    id                   uuid PRIMARY KEY,
    user_id              text,
    agent_id             text,
    run_id               text,
    -- Canonical text of (user_id, agent_id, run_id): the dedupe key's scope part.
    scope_key            text NOT NULL,
    content              text NOT NULL,
    normalized_content   text NOT NULL,
    content_hash         text NOT NULL,
    type                 text NOT NULL DEFAULT 'fact',
    category             text,
    tags                 text[] NOT NULL DEFAULT '{}',
    source_type          text,
    source_id            text,
    who                  text,
    session_id           text,
    metadata             jsonb NOT NULL DEFAULT '{}'::jsonb,
    pinned               boolean NOT NULL DEFAULT false,
    manual_override      boolean NOT NULL DEFAULT false,
    manual_override_until timestamptz,
    is_deleted           boolean NOT NULL DEFAULT false,
    deleted_at           timestamptz,
    confidence           real NOT NULL DEFAULT 1.0,
    update_count         integer NOT NULL DEFAULT 0,
    extraction_status    text NOT NULL DEFAULT 'pending'
        CHECK (extraction_status IN ('pending', 'unprocessed', 'done', 'skipped', 'failed')),
    extracted            jsonb,
    importance           real NOT NULL DEFAULT 0.5,
    access_count         bigint NOT NULL DEFAULT 0,
    last_accessed        timestamptz,
    -- Canonical embedding: Qdrant is rebuilt from this column.
    embedding            vector,
    embedding_model      text,
    extraction_model     text,
    token_count          integer NOT NULL DEFAULT 0,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    updated_by           text NOT NULL,
    version              integer NOT NULL DEFAULT 1,
    CHECK (user_id IS NOT NULL OR agent_id IS NOT NULL OR run_id IS NOT NULL)
);

CREATE UNIQUE INDEX IF NOT EXISTS memories_live_scope_hash_uq
    ON memories (scope_key, content_hash) WHERE NOT is_deleted;
CREATE INDEX IF NOT EXISTS memories_user_idx ON memories (user_id, created_at);
CREATE INDEX IF NOT EXISTS memories_agent_idx ON memories (agent_id, created_at);
CREATE INDEX IF NOT EXISTS memories_run_idx ON memories (run_id, created_at);
CREATE INDEX IF NOT EXISTS memories_is_deleted_idx ON memories (is_deleted);
CREATE INDEX IF NOT EXISTS memories_pinned_idx ON memories (pinned) WHERE pinned;
CREATE INDEX IF NOT EXISTS memories_type_idx ON memories (type);
CREATE INDEX IF NOT EXISTS memories_created_at_idx ON memories (created_at, id);
CREATE INDEX IF NOT EXISTS memories_source_idx ON memories (source_type, source_id);

-- BM25 postings, one row per (memory, term); scope columns copied so a scope's
-- postings are read without touching other scopes.
CREATE TABLE IF NOT EXISTS memory_terms (
    memory_id  uuid NOT NULL REFERENCES memories (id) ON DELETE CASCADE,
    term       text NOT NULL,
    tf         integer NOT NULL,
    user_id    text,
    agent_id   text,
    run_id     text,
    PRIMARY KEY (memory_id, term)
);
CREATE INDEX IF NOT EXISTS memory_terms_user_idx ON memory_terms (user_id, term);
CREATE INDEX IF NOT EXISTS memory_terms_agent_idx ON memory_terms (agent_id, term);
CREATE INDEX IF NOT EXISTS memory_terms_run_idx ON memory_terms (run_id, term);

CREATE TABLE IF NOT EXISTS memory_history (
    id                  bigserial PRIMARY KEY,
    memory_id           uuid NOT NULL REFERENCES memories (id),
    event               text NOT NULL CHECK (event IN ('ADD', 'UPDATE', 'DELETE', 'RECOVER', 'MERGE', 'NONE')),
    version             integer NOT NULL,
    old_content         text,
    new_content         text,
    old_metadata        jsonb,
    new_metadata        jsonb,
    actor_type          text NOT NULL,
    actor_id            text NOT NULL,
    provider            text,
    model               text,
    prompt_version      text,
    decision_confidence real,
    decision_reason     text,
    request_id          text,
    session_id          text,
    created_at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS memory_history_memory_idx ON memory_history (memory_id, id);

CREATE TABLE IF NOT EXISTS memory_jobs (
    id                  uuid PRIMARY KEY,
    memory_id           uuid NOT NULL REFERENCES memories (id),
    job_type            text NOT NULL CHECK (job_type IN ('extract', 'decision', 'graph', 'reembed')),
    payload             jsonb NOT NULL DEFAULT '{}'::jsonb,
    status              text NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'leased', 'retry_scheduled', 'done', 'dead')),
    attempt_count       integer NOT NULL DEFAULT 0,
    max_attempts        integer NOT NULL,
    next_attempt_at     timestamptz,
    lease_owner         text,
    lease_expires_at    timestamptz,
    last_error          text,
    last_error_code     text,
    workflow_id         text NOT NULL UNIQUE,
    -- Transactional outbox: NULL until the dispatcher (or the request) has started the workflow.
    workflow_started_at timestamptz,
    -- What the first pass of the pipeline concluded: processed or raw_saved.
    outcome             text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS memory_jobs_unstarted_idx ON memory_jobs (created_at) WHERE workflow_started_at IS NULL;
CREATE INDEX IF NOT EXISTS memory_jobs_status_idx ON memory_jobs (status, next_attempt_at);
CREATE INDEX IF NOT EXISTS memory_jobs_memory_idx ON memory_jobs (memory_id);

CREATE TABLE IF NOT EXISTS idempotency_keys (
    principal   text NOT NULL,
    key         text NOT NULL,
    request_hash text NOT NULL,
    -- No foreign key: the key is claimed first in the remember transaction, then the memory is written.
    memory_id   uuid NOT NULL,
    job_id      uuid,
    response    jsonb,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (principal, key)
);

CREATE TABLE IF NOT EXISTS api_keys (
    id          uuid PRIMARY KEY,
    name        text NOT NULL,
    key_hash    text NOT NULL UNIQUE,
    role        text NOT NULL CHECK (role IN ('reader', 'writer', 'admin')),
    scopes      text[] NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);

-- The graph: filled by the semantic pipeline (a later issue).
CREATE TABLE IF NOT EXISTS entities (
    id          uuid PRIMARY KEY,
    user_id     text,
    agent_id    text,
    run_id      text,
    name        text NOT NULL,
    entity_type text,
    embedding   vector,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS entities_name_idx ON entities (user_id, agent_id, run_id, name);

CREATE TABLE IF NOT EXISTS relations (
    id          uuid PRIMARY KEY,
    source_id   uuid NOT NULL REFERENCES entities (id),
    target_id   uuid NOT NULL REFERENCES entities (id),
    relationship text NOT NULL,
    confidence  real NOT NULL DEFAULT 1.0,
    memory_id   uuid REFERENCES memories (id),
    is_deleted  boolean NOT NULL DEFAULT false,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS relations_source_idx ON relations (source_id);
CREATE INDEX IF NOT EXISTS relations_target_idx ON relations (target_id);

CREATE TABLE IF NOT EXISTS memory_entity_mentions (
    memory_id   uuid NOT NULL REFERENCES memories (id),
    entity_id   uuid NOT NULL REFERENCES entities (id),
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (memory_id, entity_id)
);
