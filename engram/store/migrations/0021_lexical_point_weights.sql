-- Issue 22: the lexical index's points are weighed with BM25's k1 and b (engram.domain.text.
-- bm25_document_vector). Recorded here, so a start-up with other values has every point
-- reweighed (engram.lexical_steps.settle) instead of ranking candidates by the old ones. NULL
-- until the index owner's next start records the values it runs with.
ALTER TABLE bm25_state ADD COLUMN IF NOT EXISTS point_weights text;
