-- The `embedding.recorded` events whose vectors the worker has yet to give to the chunks already
-- written (streams/vector_assigner.py). The projector adds a row in the transaction that records
-- the vectors; the assigner removes it in the transaction that assigns them; a worker that starts
-- again resumes what is left. Not a read model of the log: replay assigns every vector at its end
-- and writes no rows here.
CREATE TABLE vector_assignments (
    org_id   text NOT NULL CHECK (org_id <> ''),
    event_id uuid NOT NULL,
    PRIMARY KEY (org_id, event_id)
);
SELECT enable_org_isolation('vector_assignments'::regclass);
-- The worker reads every org's rows at start under app.org_id '_system', like the backlog sweep.
CREATE POLICY system_sweep ON vector_assignments FOR SELECT
    USING (current_setting('app.org_id', true) = '_system');
