-- Issue 22: a memory's access count (how often it was a search result) moves out of its row
-- into a narrow table of its own. Every second a search is answered, access_counts.py adds the
-- results it gave to their counts; on the memory's row each such update wrote a new version of
-- a ~2.5 kB row (a full page left no room for it beside the old one) and inserted it into every
-- index of `memories`: at 100k memories in one scope, one flush of ~370 counts took 31-56 ms of
-- Postgres and 6,600-11,900 buffers, and the dead versions called autovacuum over the whole table and
-- its indexes about once a minute of steady searching. Here an update rewrites a ~50-byte row
-- whose pages keep room for its new version (fillfactor 70), so it touches no index: on the
-- same 100k memories a flush took 4.8-9.2 ms and 2,800-4,400 buffers, most of them the first
-- access of a memory (a new row, its foreign key checked).
-- A memory that was never a result has no row: its count is 0.
CREATE TABLE IF NOT EXISTS memory_access (
    memory_id uuid PRIMARY KEY REFERENCES memories(id) ON DELETE CASCADE,
    access_count bigint NOT NULL,
    last_accessed timestamptz NOT NULL
) WITH (fillfactor = 70);

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema()
               AND table_name = 'memories' AND column_name = 'access_count') THEN
        INSERT INTO memory_access (memory_id, access_count, last_accessed)
        SELECT id, access_count, coalesce(last_accessed, updated_at) FROM memories WHERE access_count > 0
        ON CONFLICT (memory_id) DO NOTHING;
        ALTER TABLE memories DROP COLUMN access_count, DROP COLUMN last_accessed;
    END IF;
END $$;
