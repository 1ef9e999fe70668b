"""`call`: a gRPC client in the box. It learns the services from the server's reflection, reads
the request as JSON (proto3 JSON names), and prints the reply as JSON, every field included (a
false `valid`, an empty `results`). Without `--token` it mints a development token for the scope
given, from the data directory's key. The request's `scope` is that scope unless the JSON sets
one. The engine's trailing metadata (`engine.*`, e.g. `engine.quarantined_matches`) goes to
stderr, one `key: value` line each (a count of 0 left out).

A `bytes` field (IngestEvent's `content`…) takes base64 in proto3 JSON, and protobuf's parser
decodes any text leniently, into garbage the engine would keep. So `call` refuses a bytes value
that is not strict base64 (standard or URL-safe, padded or not), naming the field, and takes
`{"text": "..."}` in its place: the text, sent as its UTF-8 bytes."""

from __future__ import annotations

import base64
import binascii
import json
import re
import sys
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from entrypoints.cli.options import DataDir

if TYPE_CHECKING:
    from google.protobuf.descriptor import Descriptor, FieldDescriptor

_STANDARD = re.compile(r"[A-Za-z0-9+/]*={0,2}")
_URL_SAFE = re.compile(r"[A-Za-z0-9_-]*={0,2}")
_SHOWN = 200  # characters of a refused value the refusal quotes


def is_base64(text: str) -> bool:
    """Whether `text` is base64 as proto3 JSON carries bytes: the standard or the URL-safe
    alphabet (not both), padded to a multiple of 4 or not padded at all, nothing else (no
    whitespace, no stray character)."""
    if not (_STANDARD.fullmatch(text) or _URL_SAFE.fullmatch(text)):
        return False
    body = text.rstrip("=")
    if len(body) % 4 == 1 or (len(body) != len(text) and len(text) % 4):
        return False
    try:
        base64.b64decode(body.replace("-", "+").replace("_", "/") + "=" * (-len(body) % 4), validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


class NotBase64(ValueError):
    def __init__(self, path: str, key: str | None, value: str) -> None:
        shown = json.dumps(value if len(value) <= _SHOWN else value[:_SHOWN] + "…", ensure_ascii=False)
        form = f'"{key}": {{"text": {shown}}}' if key else f'{{"text": {shown}}} in place of the string'
        excerpt = json.dumps(value[:40] + ("…" if len(value) > 40 else ""), ensure_ascii=False)
        super().__init__(f"{path}: {excerpt} is not base64, "
                         f"and a bytes field takes base64 in JSON (protobuf would decode this text into garbage); "
                         f"to send text, write {form}")
        self.path = path


def text_bytes(request: Any, descriptor: Descriptor, path: str = "") -> Any:
    """`request` (parsed JSON) with every bytes field of `descriptor`'s message, nested
    messages, repeated fields and map values included, checked: a value `{"text": "..."}` becomes
    the base64 of the text's UTF-8; a string that is not strict base64 (`is_base64`) raises
    NotBase64 naming the field's path (`content`, `items[2].data`, `blobs["k"]`). Anything else is
    left for protobuf's parser to judge."""
    if not isinstance(request, dict):
        return request
    fields = {**{f.name: f for f in descriptor.fields}, **{f.json_name: f for f in descriptor.fields}}
    for key, value in request.items():
        field = fields.get(key)
        if field is None or value is None:
            continue
        here = f"{path}.{field.name}" if path else field.name
        entry = field.message_type
        if entry is not None and entry.GetOptions().map_entry:
            if isinstance(value, dict):
                value_field = entry.fields_by_name["value"]
                for k, v in value.items():
                    value[k] = _field_value(v, value_field, f"{here}[{json.dumps(k)}]", None)
        elif field.is_repeated:
            if isinstance(value, list):
                request[key] = [_field_value(v, field, f"{here}[{i}]", None) for i, v in enumerate(value)]
        else:
            request[key] = _field_value(value, field, here, key)
    return request


def _field_value(value: Any, field: FieldDescriptor, path: str, key: str | None) -> Any:
    message = field.message_type
    if field.type == field.TYPE_BYTES or (message is not None
                                                    and message.full_name == "google.protobuf.BytesValue"):
        if isinstance(value, dict) and set(value) == {"text"} and isinstance(value["text"], str):
            return base64.b64encode(value["text"].encode()).decode()
        if isinstance(value, str) and not is_base64(value):
            raise NotBase64(path, key, value)
        return value
    if message is not None:
        return text_bytes(value, message, path)
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("a key repeats")  # protobuf's parser names it
    return dict(pairs)


def call(
    method: Annotated[str, typer.Argument(help="a method name (Search, Classify...) or Service/Method")],
    request: Annotated[Optional[str], typer.Argument(
        help='the request as JSON (\'-\': read stdin; default {}); a bytes field takes base64, or {"text": "..."}')]
    = None,
    org: Annotated[str, typer.Option(help="the caller's org (the token's, and the request's scope)")] = "acme",
    pillar: Annotated[str, typer.Option(help="the caller's pillar")] = "",
    team: Annotated[str, typer.Option(help="the caller's team")] = "",
    agent: Annotated[str, typer.Option(help="the caller's agent")] = "",
    clearance: Annotated[int, typer.Option(min=1, max=4, help="the minted token's clearance")] = 3,
    token: Annotated[Optional[str], typer.Option(help="a bearer token to send instead of minting one")] = None,
    idempotency_key: Annotated[Optional[str], typer.Option(
        "--idempotency-key", help="sent as the idempotency-key header: a write retried with the key its first "
                                  "try used (or the one a NOT_DURABLE_YET answer names) is applied once")] = None,
    address: Annotated[Optional[str], typer.Option(help="host:port (default: the data directory's running API, "
                                                        "or its detector for MLDetectorService)")] = None,
    timeout: Annotated[float, typer.Option(help="seconds to wait for the reply")] = 30.0,
    data_dir: DataDir = None,
) -> None:
    """Call a ContextEngine (or MLDetectorService) method and print the reply as JSON, every field
    included. A gRPC error prints its status, message and reason, and exits 1. A bytes field takes
    base64, or {"text": "..."} (sent as UTF-8): text in its place is refused (exit 2)."""
    if token is not None and not token.strip():
        raise typer.BadParameter("is empty: give a token, or leave --token out to mint one for --org/--pillar/--team",
                                 param_hint="--token")
    if idempotency_key is not None and not idempotency_key.strip():
        raise typer.BadParameter("is empty: give a key, or leave --idempotency-key out", param_hint="--idempotency-key")
    import grpc
    from google.protobuf import descriptor_pool, json_format, message_factory
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    from context_engine.auth import ensure_dev_key, mint_token
    from entrypoints.cli.settings import command_settings
    from entrypoints.serving.status import error_info
    from entrypoints.supervisor import read_stack_file

    settings = command_settings(home=data_dir)
    running = read_stack_file(settings.home_dir)
    api = address or running.get("api_address") or settings.api_address
    text = sys.stdin.read() if request == "-" else (request or "{}")

    def methods(target: str):
        """Every method the server at `target` reflects (health and reflection aside)."""
        with grpc.insecure_channel(target) as channel:
            database = ProtoReflectionDescriptorDatabase(channel)
            pool = descriptor_pool.DescriptorPool(database)
            try:
                names = [n for n in database.get_services() if not n.startswith("grpc.")]
            except grpc.RpcError as err:
                raise typer.BadParameter(f"no gRPC server answers reflection at {target}: {err.code().name}",
                                         param_hint="--address") from None
            return [m for n in names for m in pool.FindServiceByName(n).methods]

    detector = running.get("detector_address") or settings.detector_address
    targets = [address] if address else [api, detector]
    known: list[str] = []
    found, target = None, ""
    for target in targets:
        offered = methods(target)
        known += [f"{m.containing_service.full_name}/{m.name}" for m in offered]
        hits = [m for m in offered if method in (m.name, f"{m.containing_service.full_name}/{m.name}",
                                                 f"{m.containing_service.name}/{m.name}")]
        if hits:
            found = hits[0]
            break
    if found is None:
        raise typer.BadParameter(f"no method {method!r} at {', '.join(targets)}; known: {', '.join(sorted(known))}",
                                 param_hint="METHOD")
    request_cls = message_factory.GetMessageClass(found.input_type)
    reply_cls = message_factory.GetMessageClass(found.output_type)
    try:
        text = json.dumps(text_bytes(json.loads(text, object_pairs_hook=_unique_keys), found.input_type))
    except NotBase64 as exc:  # on one line, unwrapped: the text form it shows is to be copied
        typer.echo(f"invalid REQUEST: {exc}", err=True)
        raise typer.Exit(2) from None
    except ValueError:
        pass  # not JSON, or a key repeats: protobuf's parser below says which
    try:
        message = json_format.Parse(text, request_cls())
    except json_format.ParseError as exc:
        raise typer.BadParameter(f"not a {found.input_type.full_name} in JSON: {exc}", param_hint="REQUEST") from None
    scope = dict(org_id=org, pillar_id=pillar, team_id=team, agent_id=agent)
    if "scope" in found.input_type.fields_by_name and not message.HasField("scope"):
        json_format.ParseDict({"scope": {k: v for k, v in scope.items() if v}}, message)
    metadata: tuple[tuple[str, str], ...]
    if found.containing_service.full_name == "upsquad.ml.v1.MLDetectorService":
        from inference.detector.token import bearer, service_token

        metadata = bearer(token or service_token(settings))
    else:
        metadata = (("authorization", "Bearer " + (token or mint_token(
            ensure_dev_key(settings.hs256_key_path), org=org, pillar=pillar, team=team, agent=agent,
            clearance=clearance))),)
    if idempotency_key is not None:
        from commands.idempotency import IDEMPOTENCY_HEADER

        metadata += ((IDEMPOTENCY_HEADER, idempotency_key),)
    path = f"/{found.containing_service.full_name}/{found.name}"
    with grpc.insecure_channel(target) as channel:
        stub = channel.unary_unary(path, request_serializer=lambda m: m.SerializeToString(),
                                   response_deserializer=reply_cls.FromString)
        try:
            reply, answered = stub.with_call(message, metadata=metadata, timeout=timeout)
        except grpc.RpcError as err:
            info = error_info(err)
            typer.echo(f"{err.code().name}: {err.details()}" + (f" (reason {info.reason})" if info else ""),
                       err=True)
            raise typer.Exit(1) from None
    for key, value in answered.trailing_metadata() or ():  # what the engine says beside the reply
        if key.startswith("engine.") and value != "0":
            typer.echo(f"{key}: {value}", err=True)
    # Every field, those at their default too: proto3 JSON leaves out a false `valid` otherwise.
    typer.echo(json_format.MessageToJson(reply, preserving_proto_field_name=False, indent=2,
                                         always_print_fields_with_no_presence=True))
