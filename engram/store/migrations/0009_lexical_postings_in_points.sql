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
