"""The messages of issue #39 items 5 and 6 (the same answers through gRPC and `call` are in
tests/integration/test_first_hour.py): a refused grantee_scope_id says it is a scope path and
gives one of the level asked for (the spec says "the UUID of the grantee entity"); VERSION_NOT_FOUND
says which hashes are rollback targets and where `context-engine history` lists them."""

from __future__ import annotations

import uuid

import pytest

from commands.create_share import grantee
from commands.rollback_context import RollbackContext, version_not_found
from context_engine.errors import InvalidArgument, PermissionDenied


@pytest.mark.parametrize("level, scope_id, example", [
    ("team", str(uuid.uuid4()), "e.g. 'acme/sales/apac' for a team in org 'acme'"),
    ("agent", "acme/sales", "e.g. 'acme/sales/apac/bot-7' for an agent in org 'acme'"),
    ("pillar", "", "e.g. 'acme/sales' for a pillar in org 'acme'"),
    ("team", "acme/sa les/emea", "e.g. 'acme/sales/apac' for a team in org 'acme'"),
])
def test_a_refused_grantee_scope_id_names_the_scope_path_form(level, scope_id, example):
    with pytest.raises(InvalidArgument) as refused:
        grantee(level, scope_id, "acme")
    assert refused.value.message.startswith("grantee_scope_id: ")
    assert "scope path" in refused.value.message and example in refused.value.message, refused.value.message


def test_a_grantee_outside_the_org_is_still_permission_denied_with_the_form():
    with pytest.raises(PermissionDenied) as refused:
        grantee("org", str(uuid.uuid4()), "acme")
    assert refused.value.reason == "GRANTEE_OUTSIDE_ORG"
    assert "scope path" in refused.value.message and "e.g. 'acme' for the org itself" in refused.value.message
    assert grantee("team", "acme/sales/apac", "acme").path == "acme/sales/apac"  # the accepted form, unchanged


def test_version_not_found_names_the_targets_and_history():
    error = version_not_found("acme", RollbackContext("s1", "ab" * 32))
    assert error.reason == "VERSION_NOT_FOUND" and error.metadata == {"field": "target_version_hash"}
    assert "`context-engine history --org acme --session s1`" in error.message
    assert "CreateSnapshot" in error.message and "not IngestEvent's or PushContext's version_hash" in error.message
