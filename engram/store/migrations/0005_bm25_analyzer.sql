-- Which analyzer (engram.text.bm25_analyzer: tokeniser version and stemmer) built the BM25
-- postings, memories.token_count and the BM25 statistics. Queries are tokenised with the
-- configured analyzer, so a start-up whose analyzer differs rebuilds all of them, in one
-- transaction, and records the new name here.
CREATE TABLE IF NOT EXISTS bm25_state (
    id          boolean PRIMARY KEY DEFAULT true CHECK (id),
    analyzer    text NOT NULL,
    -- When a start-up last rebuilt the postings; NULL if they were only ever written one by one.
    rebuilt_at  timestamptz,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- Until this version every posting was built by the default stemmer, english, with the first
-- tokeniser: that is what an existing database holds.
INSERT INTO bm25_state (id, analyzer) VALUES (true, 'v1/english') ON CONFLICT (id) DO NOTHING;
