-- Changing the embedding model without going dark: the active model serves search from
-- memories.embedding; while a re-embed runs, the target model's canonical vectors fill
-- memory_embeddings, and one transaction swaps them in.
CREATE TABLE IF NOT EXISTS embedding_state (
    id            integer PRIMARY KEY CHECK (id = 1),
    active_model  text,
    target_model  text,
    reembed_job   uuid,
    updated_at    timestamptz NOT NULL DEFAULT now()
);
INSERT INTO embedding_state (id, active_model)
SELECT 1, (SELECT embedding_model FROM memories WHERE embedding_model IS NOT NULL
           GROUP BY embedding_model ORDER BY count(*) DESC LIMIT 1)
ON CONFLICT (id) DO NOTHING;

CREATE TABLE IF NOT EXISTS memory_embeddings (
    memory_id  uuid NOT NULL REFERENCES memories (id) ON DELETE CASCADE,
    model      text NOT NULL,
    embedding  vector NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (memory_id, model)
);

-- A re-embed job belongs to no single memory.
ALTER TABLE memory_jobs ALTER COLUMN memory_id DROP NOT NULL;
