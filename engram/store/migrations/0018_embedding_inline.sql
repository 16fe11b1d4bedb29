-- Issue 22: a memory's row keeps its canonical embedding inline. pgvector stores a vector
-- EXTERNAL, and a row of ~2.4 kB (384 floats are 1.5 kB of it) passes the 2 kB toast target, so
-- every embedding sat in the toast table: search's candidate read (`candidate_rows`, ~170 rows)
-- fetched each one through the toast index, a second random read per candidate that grew with
-- the table (fetch 2.3 -> 3.6 ms p50 from 10k to 100k memories in one scope). With a target of
-- 4080 bytes a typical row stays whole; a long content is still toasted, largest value first.
-- Rows written before keep their toasted embedding until they are rewritten.
ALTER TABLE memories SET (toast_tuple_target = 4080);
