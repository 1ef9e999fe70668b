"""Issue #39, "the first-hour defects", against the shared engine (real gRPC, broker, worker and
PostgreSQL), through `context-engine call` and `replay` as a user runs them:
- `call` refuses text in a bytes field (protobuf's parser decoded it into garbage the engine kept),
  sends `{"text": ...}` as UTF-8, sends --idempotency-key, and prints fields at their defaults;
- VERSION_NOT_FOUND says which hashes are rollback targets and names `context-engine history`;
- a bad grantee_scope_id is answered with the accepted form (a scope path) and an example;
- `replay` prints no password, and names the database it leaves with the SQL that drops it.
The banner's scope is tests/unit/test_banner_and_readme.py's; two `up`s, tests/integration/test_up.py's."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import sys
import uuid
from urllib.parse import urlsplit

import asyncpg
import pytest

from tests.fixtures.calls import admin_fetch
from tests.fixtures.engine import unique

pytestmark = pytest.mark.integration

GLOBEX = "user: hi, I want to talk about the Globex renewal"


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


async def call(engine, *args: str) -> tuple[int, str, str]:
    """`context-engine call ARGS` at the engine's API: exit status, stdout, stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "context_engine", "call", *args, "--address", engine.address,
        env=engine.cli_env(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def stored_contents(engine, org: str, session: str) -> list[bytes]:
    rows = await admin_fetch(engine, "SELECT content FROM session_events WHERE org_id = $1 AND session_id = $2 "
                                     "ORDER BY seq", org, session)
    return [bytes(r["content"]) for r in rows]


async def test_call_refuses_text_in_a_bytes_field_and_sends_the_text_form(engine):
    org = unique("first-hour")
    request = {"session_id": "deal-42", "event_type": "message", "content": GLOBEX}
    code, out, err = await call(engine, "IngestEvent", json.dumps(request), "--org", org)
    assert code == 2, out + err
    assert err.startswith("invalid REQUEST: content: ") and "is not base64" in err, err
    assert f'"content": {{"text": "{GLOBEX}"}}' in err, err  # the form to write instead, whole
    assert await stored_contents(engine, org, "deal-42") == []  # nothing sent

    request["content"] = {"text": GLOBEX}
    code, out, err = await call(engine, "IngestEvent", json.dumps(request), "--org", org)
    assert code == 0, out + err
    assert json.loads(out)["eventId"]
    assert await stored_contents(engine, org, "deal-42") == [GLOBEX.encode()]


async def test_call_sends_the_idempotency_key(engine):
    org = unique("first-hour")
    request = json.dumps({"session_id": "s", "event_type": "message", "content": b64("user: once")})
    key = f"retry-{uuid.uuid4().hex}"
    first = await call(engine, "IngestEvent", request, "--org", org, "--idempotency-key", key)
    again = await call(engine, "IngestEvent", request, "--org", org, "--idempotency-key", key)
    assert first[0] == 0 and again[0] == 0, first[1:] + again[1:]
    assert json.loads(again[1])["eventId"] == json.loads(first[1])["eventId"]
    assert await stored_contents(engine, org, "s") == [b"user: once"]  # written once
    reused = await call(engine, "IngestEvent", request.replace(b64("user: once"), b64("user: twice")), "--org", org,
                        "--idempotency-key", key)
    assert reused[0] == 1 and reused[2].startswith("FAILED_PRECONDITION: ") and key in reused[2], reused


async def test_call_prints_fields_at_their_default(engine):
    code, out, err = await call(engine, "ValidatePrompt", '{"prompt": "hello", "layer_hashes": ["not-a-hash"]}',
                                "--org", unique("first-hour"))
    assert code == 0, out + err
    reply = json.loads(out)
    assert reply["valid"] is False and reply["violationCode"], reply


async def test_version_not_found_names_the_rollback_targets_and_history(engine):
    org = unique("first-hour")
    scope = ("--org", org, "--pillar", "sales", "--team", "emea")
    code, out, err = await call(engine, "IngestEvent", json.dumps(
        {"session_id": "s1", "event_type": "message", "content": b64("user: one")}), *scope)
    assert code == 0, out + err
    content_hash = json.loads(out)["versionHash"]
    code, out, err = await call(engine, "RollbackContext", json.dumps(
        {"session_id": "s1", "target_version_hash": content_hash}), *scope, "--clearance", "3")
    assert code == 1 and err.startswith("NOT_FOUND: ") and "(reason VERSION_NOT_FOUND)" in err, out + err
    assert f"`context-engine history --org {org} --session s1`" in err, err
    assert "not IngestEvent's or PushContext's version_hash" in err and "CreateSnapshot" in err, err


async def test_a_bad_grantee_scope_id_is_answered_with_the_scope_path_form(engine):
    org = unique("first-hour")
    request = {"resource_id": str(uuid.uuid4()), "resource_type": "chunk", "grantee_scope": "team",
               "grantee_scope_id": str(uuid.uuid4()), "permissions": ["read"]}  # the spec's "UUID of the grantee"
    code, out, err = await call(engine, "CreateShare", json.dumps(request), "--org", org, "--pillar", "sales",
                                "--team", "emea", "--clearance", "3")
    assert code == 1 and err.startswith("INVALID_ARGUMENT: grantee_scope_id: "), out + err
    assert "scope path" in err and f"e.g. '{org}/sales/apac' for a team" in err, err


async def test_replay_hides_the_password_and_names_the_database_it_leaves(engine):
    password = urlsplit(engine.settings.database_url).password
    code, out = await engine.cli("replay", timeout=300)
    assert code == 0, out
    assert not password or password not in out, out
    created = re.search(r"database (context_engine_replay_\w+) is new and stays", out)
    assert created, out
    drop = f'DROP DATABASE IF EXISTS "{created[1]}" WITH (FORCE);'
    assert drop in out, out
    conn = await asyncpg.connect(engine.settings.database_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM pg_database WHERE datname = $1", created[1]) == 1
        await conn.execute(drop)  # as printed
        assert await conn.fetchval("SELECT count(*) FROM pg_database WHERE datname = $1", created[1]) == 0
    finally:
        await conn.close()
