-- Contents are written to TOAST uncompressed (EXTERNAL). pglz, the only TOAST compression this
-- PostgreSQL build has (no lz4), cost the projector more than half of its time on a 1 MiB
-- content (bench: 69 -> 24 ms for ordinary text, 50 -> 24 ms for base64-like bytes), inside the
-- transaction that every event batched with it waits for. Values under ~2 KB (a conversation
-- turn) are stored inline as before; what this trades is disk for compressible large contents.
ALTER TABLE event_archive ALTER COLUMN raw SET STORAGE EXTERNAL;
ALTER TABLE session_events ALTER COLUMN content SET STORAGE EXTERNAL;
ALTER TABLE memory_versions ALTER COLUMN content SET STORAGE EXTERNAL;
ALTER TABLE rejected_events ALTER COLUMN raw SET STORAGE EXTERNAL;
