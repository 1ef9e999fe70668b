-- Records of the domain topic that the projector could not apply, set aside so that they never
-- take another event with them and never stop a partition (projections/session_projector.py).
-- A rejected record is not archived and changes no read model; the rest of its batch commits.
-- Keyed by the SHA-256 of the record's bytes: a redelivery of the same record is rejected again
-- and changes nothing. org_id is the org the record names when it can be decoded that far, else
-- '_system' (a record that names no org belongs to nobody).
CREATE TABLE rejected_events (
    record_sha256  text PRIMARY KEY,
    org_id         text NOT NULL CHECK (org_id <> ''),
    event_id       uuid,                    -- NULL: the record is not a decodable event
    topic          text NOT NULL,
    partition      integer NOT NULL,
    "offset"       bigint NOT NULL,
    reason         text NOT NULL,           -- the error class and its message, bounded
    raw            bytea NOT NULL,          -- the record's value, verbatim
    rejected_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX rejected_events_event ON rejected_events (event_id) WHERE event_id IS NOT NULL;
SELECT enable_org_isolation('rejected_events');
-- verify and the operator read every org's rejections under app.org_id '_system'.
CREATE POLICY system_reads ON rejected_events FOR SELECT
    USING (current_setting('app.org_id', true) = '_system');
-- The API looks up its own org's rejections (an acknowledgement whose NOTIFY was missed).
GRANT SELECT ON rejected_events TO context_engine_api;
