-- The PII redaction seam (ARCHITECTURE.md section 10; docs/pii.md).
--
-- A pushed memory is projected with pii_status 'pending' and its raw content; the PII scan job
-- (worker agent `pii-scanner`) runs natid + DetectPII over every string leaf and appends
-- `memory.scrubbed`, whose projection replaces the content with the redacted version and sets
-- the status: 'clear' (nothing found, or redacted by a healthy detector) or 'quarantined' (the
-- detector failed: regex fallback applied, and the memory is kept out of search and assembly
-- until `context-engine pii rescan` clears it). Only then does semantic memory become chunks.
-- Rows that existed before this migration were never scanned: they stay 'clear' as they were.
ALTER TABLE memory_versions
    ADD COLUMN pii_status text NOT NULL DEFAULT 'clear'
        CHECK (pii_status IN ('pending', 'clear', 'quarantined')),
    ADD COLUMN pii_spans jsonb NOT NULL DEFAULT '{}',         -- class -> count of redacted spans
    ADD COLUMN pii_detector_version text,
    ADD COLUMN pii_fallback_reason text,
    ADD COLUMN pii_scanned_by uuid;                             -- the memory.scrubbed event applied

CREATE INDEX memory_versions_pii_status ON memory_versions (org_id, pii_status)
    WHERE pii_status <> 'clear';

-- The worker finds scans to redo (a lost job, `pii rescan`) across orgs, read-only.
CREATE POLICY system_sweep ON memory_versions FOR SELECT
    USING (current_setting('app.org_id', true) = '_system');
