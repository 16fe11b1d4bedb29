-- Issue 19: the entities an extraction found, kept on the fact that mentions them (source,
-- relationship, target, confidence), for the graph to be built from later. A constant default:
-- adding the column rewrites no row.
ALTER TABLE memories ADD COLUMN IF NOT EXISTS entities jsonb NOT NULL DEFAULT '[]'::jsonb;
