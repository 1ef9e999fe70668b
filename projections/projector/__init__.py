"""The session projector's parts (the entry point and its public names: projections/session_projector.py).

- batch.py: one batch, one transaction: the opening and closing scripts, savepoints per org, offsets;
- archive.py: a record's envelope checked, and the batch's fresh events archived;
- rejections.py: what is an event's fault and is set aside, and what is the infrastructure's;
- org_applier.py: one org's fresh events applied in log order, rows written in bulk;
- appliers/: one function per event type, in a registry (type -> applier);
- version_chain.py: the sessions' chain state (genesis, next version, seq) and its rows;
- outcome.py: what one record did (Outcome, Applied); job_requests.py: the work it asks for.
"""
