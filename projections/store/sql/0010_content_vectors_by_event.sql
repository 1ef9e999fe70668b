-- The worker gives chunks the vectors of an `embedding.recorded` event after the projector's
-- commit, in a transaction of its own (streams/vector_assigner.py); it finds them by the event
-- that last wrote them.
CREATE INDEX content_vectors_event ON content_vectors (org_id, event_id);
