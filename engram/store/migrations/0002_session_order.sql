-- Context expansion reads a memory's neighbours in its scope and session, in write order.
CREATE INDEX IF NOT EXISTS memories_session_order_idx
    ON memories (scope_key, session_id, created_at, id) WHERE session_id IS NOT NULL;
