-- Lexical points carry what their BM25 weights were computed from (issue 22): search recovers an
-- indexed memory's exact score from the vector the index returns instead of reading its postings
-- from Postgres. Points written before carry none (search scores those in Postgres meanwhile);
-- the indexer rewrites every one.
--
-- lexical_terms: every term id the lexical index holds, with the term it stands for; `shared`
-- when two terms hash to the same id. A query holding a shared id is scored in Postgres, so a
-- hash collision never changes a score. Written by the lexical indexer before it writes points.
CREATE TABLE IF NOT EXISTS lexical_terms (
    term_id bigint PRIMARY KEY,
    term    text NOT NULL,
    shared  boolean NOT NULL DEFAULT false
);
UPDATE memories SET lexical_indexed = false WHERE lexical_indexed;

-- One average length per scope for its points' weights (lexical_avgdl), moved when the scope's
-- own average drifts, with the points weighed with the old one marked to rewrite
-- (lexical_reweigh): the index's order by stored weights then stays that of exact BM25, up to
-- the drift, however a scope grew. Reweighing does not make a memory unindexed: its old point
-- still gives its exact score.
ALTER TABLE bm25_scope_stats ADD COLUMN IF NOT EXISTS lexical_avgdl float8;
ALTER TABLE memories ADD COLUMN IF NOT EXISTS lexical_reweigh boolean NOT NULL DEFAULT false;
CREATE INDEX IF NOT EXISTS memories_lexical_reweigh_idx ON memories (created_at, id) WHERE lexical_reweigh;
