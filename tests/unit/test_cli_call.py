"""`context-engine call`'s request checks (issue #39, item 1): a `bytes` field's value must be strict
base64, or `{"text": "..."}` (sent as UTF-8); an empty --token or --idempotency-key is refused.
The calls through a running engine are in tests/integration/test_first_hour.py."""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import sys

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool

from entrypoints.cli.call import NotBase64, is_base64, text_bytes
from upsquad.context.v1 import context_pb2 as pb

GLOBEX = "user: hi, I want to talk about the Globex renewal"


@pytest.mark.parametrize("text", ["", "dXNlcjogaGk=", "dXNlcjogaGk", "QQ==", "QQ", "+/+/", "-_-_", "-_8"])
def test_base64_as_proto3_json_allows_it(text):
    assert is_base64(text)


@pytest.mark.parametrize("text", [GLOBEX, "hello", "dXNlcj ogaGk=", "dXNlcjogaGk=\n", "QQ=", "Q===", "+_+_",
                                  "QQ==QQ==", "a"])
def test_text_that_is_not_strict_base64(text):
    assert not is_base64(text)


def test_a_text_content_is_refused_naming_the_field_and_the_text_form():
    with pytest.raises(NotBase64) as refused:
        text_bytes({"session_id": "deal-42", "event_type": "message", "content": GLOBEX},
                   pb.IngestEventRequest.DESCRIPTOR)
    assert refused.value.path == "content"
    assert str(refused.value).startswith('content: "user: hi, I want')
    assert f'"content": {{"text": "{GLOBEX}"}}' in str(refused.value)
    with pytest.raises(NotBase64) as refused:
        text_bytes({"content": "user: héllo"}, pb.IngestEventRequest.DESCRIPTOR)
    assert str(refused.value).endswith('write "content": {"text": "user: héllo"}')  # as typed, not \u-escaped


def test_the_text_form_is_sent_as_utf8():
    request = text_bytes({"content": {"text": "user: héllo"}, "metadata": {"role": "user"}},
                         pb.IngestEventRequest.DESCRIPTOR)
    assert base64.b64decode(request["content"]) == "user: héllo".encode()
    assert request["metadata"] == {"role": "user"}  # a string map is no bytes field
    kept = text_bytes({"content": "dXNlcjogaGk="}, pb.IngestEventRequest.DESCRIPTOR)
    assert kept == {"content": "dXNlcjogaGk="}


def _nested_descriptor():
    """A message with bytes inside a nested message, a repeated field, a map and a BytesValue."""
    from google.protobuf import wrappers_pb2

    pool = descriptor_pool.DescriptorPool()
    wrappers = descriptor_pb2.FileDescriptorProto()
    wrappers_pb2.DESCRIPTOR.CopyToProto(wrappers)
    pool.Add(wrappers)
    f = descriptor_pb2.FileDescriptorProto(name="t.proto", package="t", syntax="proto3",
                                           dependency=["google/protobuf/wrappers.proto"])
    inner = f.message_type.add(name="Inner")
    inner.field.add(name="data", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_BYTES,
                    label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL, json_name="data")
    outer = f.message_type.add(name="Outer")
    entry = outer.nested_type.add(name="BlobsEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
                    label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL, json_name="key")
    entry.field.add(name="value", number=2, type=descriptor_pb2.FieldDescriptorProto.TYPE_BYTES,
                    label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL, json_name="value")
    for name, number, label, kind, type_name, json_name in [
        ("items", 1, "LABEL_REPEATED", "TYPE_MESSAGE", ".t.Inner", "items"),
        ("chunks", 2, "LABEL_REPEATED", "TYPE_BYTES", "", "chunks"),
        ("blobs", 3, "LABEL_REPEATED", "TYPE_MESSAGE", ".t.Outer.BlobsEntry", "blobs"),
        ("wrapped", 4, "LABEL_OPTIONAL", "TYPE_MESSAGE", ".google.protobuf.BytesValue", "wrapped"),
        ("single_inner", 5, "LABEL_OPTIONAL", "TYPE_MESSAGE", ".t.Inner", "singleInner"),
    ]:
        added = outer.field.add(name=name, number=number, json_name=json_name,
                                label=getattr(descriptor_pb2.FieldDescriptorProto, label),
                                type=getattr(descriptor_pb2.FieldDescriptorProto, kind))
        if type_name:
            added.type_name = type_name
    pool.Add(f)
    return pool.FindMessageTypeByName("t.Outer")


@pytest.mark.parametrize("request_json, path", [
    ({"items": [{"data": "QQ=="}, {"data": "not base64!"}]}, "items[1].data"),
    ({"chunks": ["QQ==", "a b"]}, "chunks[1]"),
    ({"blobs": {"k": "a b"}}, 'blobs["k"]'),
    ({"wrapped": "a b"}, "wrapped"),
    ({"singleInner": {"data": "a b"}}, "single_inner.data"),
    ({"single_inner": {"data": "a b"}}, "single_inner.data"),
])
def test_every_bytes_field_is_checked_nested_repeated_and_mapped(request_json, path):
    with pytest.raises(NotBase64) as refused:
        text_bytes(request_json, _nested_descriptor())
    assert refused.value.path == path
    assert str(refused.value).startswith(f"{path}: ") and '{"text": "' in str(refused.value)


def test_the_text_form_works_at_every_depth():
    done = text_bytes({"items": [{"data": {"text": "a"}}], "chunks": [{"text": "b"}], "blobs": {"k": {"text": "c"}},
                       "wrapped": {"text": "d"}, "singleInner": {"data": {"text": "e"}}}, _nested_descriptor())
    assert done == {"items": [{"data": "YQ=="}], "chunks": ["Yg=="], "blobs": {"k": "Yw=="}, "wrapped": "ZA==",
                    "singleInner": {"data": "ZQ=="}}


def _call(*args: str) -> subprocess.CompletedProcess:
    with socket.socket() as s:  # a port nobody listens on: a refused option never gets that far
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXT_ENGINE_")}
    return subprocess.run([sys.executable, "-m", "context_engine", "call", *args, "--address", f"127.0.0.1:{closed}"],
                          capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.parametrize("token", ["", "  "])
def test_an_empty_token_is_refused_not_replaced_by_a_minted_one(token, tmp_path):
    ran = _call("Search", '{"query": "q"}', "--token", token, "--data-dir", str(tmp_path))
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert "--token" in ran.stderr and "is empty" in ran.stderr, ran.stderr
    assert not (tmp_path / "keys").exists()  # nothing minted


def test_an_empty_idempotency_key_is_refused(tmp_path):
    ran = _call("IngestEvent", "{}", "--idempotency-key", "", "--data-dir", str(tmp_path))
    assert ran.returncode == 2 and "--idempotency-key" in ran.stderr, ran.stdout + ran.stderr
