"""`call`: a gRPC client in the box. It learns the services from the server's reflection, reads
the request as JSON (proto3 JSON names), and prints the reply as JSON. Without `--token` it
mints a development token for the scope given, from the data directory's key. The request's
`scope` is that scope unless the JSON sets one. The engine's trailing metadata (`engine.*`, e.g.
`engine.quarantined_matches`) goes to stderr, one `key: value` line each (a count of 0 left out)."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from entrypoints.cli.options import DataDir


def call(
    method: Annotated[str, typer.Argument(help="a method name (Search, Classify...) or Service/Method")],
    request: Annotated[Optional[str], typer.Argument(help="the request as JSON ('-': read stdin; default {})")] = None,
    org: Annotated[str, typer.Option(help="the caller's org (the token's, and the request's scope)")] = "acme",
    pillar: Annotated[str, typer.Option(help="the caller's pillar")] = "",
    team: Annotated[str, typer.Option(help="the caller's team")] = "",
    agent: Annotated[str, typer.Option(help="the caller's agent")] = "",
    clearance: Annotated[int, typer.Option(min=1, max=4, help="the minted token's clearance")] = 3,
    token: Annotated[Optional[str], typer.Option(help="a bearer token to send instead of minting one")] = None,
    address: Annotated[Optional[str], typer.Option(help="host:port (default: the data directory's running API, "
                                                        "or its detector for MLDetectorService)")] = None,
    timeout: Annotated[float, typer.Option(help="seconds to wait for the reply")] = 30.0,
    data_dir: DataDir = None,
) -> None:
    """Call a ContextEngine (or MLDetectorService) method and print the reply as JSON. A gRPC error
    prints its status, message and reason, and exits 1."""
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
        message = json_format.Parse(text, request_cls())
    except json_format.ParseError as exc:
        raise typer.BadParameter(f"not a {found.input_type.full_name} in JSON: {exc}", param_hint="REQUEST") from None
    scope = dict(org_id=org, pillar_id=pillar, team_id=team, agent_id=agent)
    if "scope" in found.input_type.fields_by_name and not message.HasField("scope"):
        json_format.ParseDict({"scope": {k: v for k, v in scope.items() if v}}, message)
    if found.containing_service.full_name == "upsquad.ml.v1.MLDetectorService":
        from inference.detector.token import bearer, service_token

        metadata = bearer(token or service_token(settings))
    else:
        metadata = (("authorization", "Bearer " + (token or mint_token(
            ensure_dev_key(settings.hs256_key_path), org=org, pillar=pillar, team=team, agent=agent,
            clearance=clearance))),)
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
    typer.echo(json_format.MessageToJson(reply, preserving_proto_field_name=False, indent=2))
