"""The API's authentication frame, driven through gRPC with real tokens."""

import datetime as dt

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from context_engine.auth import ensure_dev_key, mint_token
from entrypoints.api.app import SERVICE_NAME
from entrypoints.api.context_servicer import PENDING
from entrypoints.serving.status import error_info
from upsquad.context.v1 import context_pb2 as pb
from upsquad.context.v1 import context_pb2_grpc

pytestmark = pytest.mark.integration


@pytest.fixture
def api(engine):
    return engine.settings, engine.channel


def token(settings, **claims):
    return mint_token(ensure_dev_key(settings.hs256_key_path), **claims)


def auth(tok):
    return (("authorization", f"Bearer {tok}"),)


def scope(org="acme", pillar="", team="", agent=""):
    return pb.ScopePath(org_id=org, pillar_id=pillar, team_id=team, agent_id=agent)


async def call(channel, metadata=None, request=None):
    stub = context_pb2_grpc.ContextEngineStub(channel)
    request = request if request is not None else pb.SearchRequest(scope=scope(), query="q")
    return await stub.Search(request, metadata=metadata)


async def test_no_token_is_unauthenticated(api):
    _, channel = api
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call(channel)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert error_info(err.value).reason == "TOKEN_MISSING"


@pytest.mark.parametrize("header, reason", [
    ("Basic abc", "TOKEN_MALFORMED"),
    ("Bearer ", "TOKEN_MALFORMED"),
    ("Bearer not.a.jwt", "TOKEN_MALFORMED"),
])
async def test_malformed_authorization(api, header, reason):
    _, channel = api
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call(channel, metadata=(("authorization", header),))
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert error_info(err.value).reason == reason


async def test_bad_signature_is_unauthenticated(api):
    _, channel = api
    forged = mint_token(b"f" * 64, org="acme", clearance=4)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call(channel, metadata=auth(forged))
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert error_info(err.value).reason == "TOKEN_BAD_SIGNATURE"


async def test_expired_token_is_unauthenticated(api):
    settings, channel = api
    old = token(settings, org="acme", clearance=2, now=dt.datetime.now(dt.UTC) - dt.timedelta(days=1))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call(channel, metadata=auth(old))
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert error_info(err.value).reason == "TOKEN_EXPIRED"


@pytest.mark.parametrize("claimed", [
    scope(org="other-org"),
    scope(org="acme", pillar="sales"),  # a descendant is not the token's scope either
])
async def test_scope_other_than_tokens_is_permission_denied(api, claimed):
    settings, channel = api
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call(channel, metadata=auth(token(settings, org="acme", clearance=4)),
                   request=pb.SearchRequest(scope=claimed, query="q"))
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    info = error_info(err.value)
    assert info.reason == "SCOPE_MISMATCH" and info.metadata["field"] == "scope"


async def test_missing_scope_is_invalid_argument(api):
    settings, channel = api
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call(channel, metadata=auth(token(settings, org="acme", clearance=1)),
                   request=pb.SearchRequest(query="q"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "scope" in err.value.details()


async def test_authenticated_call_reaches_the_handler(api):
    settings, channel = api
    tok = token(settings, org="acme", pillar="sales", team="emea", agent="bot", clearance=1)
    reply = await call(channel, metadata=auth(tok),
                       request=pb.SearchRequest(scope=scope("acme", "sales", "emea", "bot"), query="q"))
    assert reply.outcome == pb.RETRIEVAL_OUTCOME_NO_RESULTS and reply.effective_min_score > 0


async def test_every_method_is_registered(api):
    """Every method of the contract is served: built ones answer, the rest say which issue brings them."""
    settings, channel = api
    tok = token(settings, org="acme", clearance=4)
    descriptor = pb.DESCRIPTOR.services_by_name["ContextEngine"]
    assert set(PENDING) < {m.name for m in descriptor.methods}
    for method in descriptor.methods:
        rpc = channel.unary_unary(f"/{SERVICE_NAME}/{method.name}",
                                  request_serializer=lambda m: m.SerializeToString(),
                                  response_deserializer=lambda b: b)
        request_class = getattr(pb, method.input_type.name)
        if method.name in ("ResolveGuardrailLayers", "ListShares"):  # the scope alone (page 1 of 100): valid
            assert await rpc(request_class(scope=scope()), metadata=auth(tok)) is not None
            continue
        with pytest.raises(grpc.aio.AioRpcError) as err:  # empty requests are otherwise never valid
            await rpc(request_class(scope=scope()), metadata=auth(tok))
        if method.name in PENDING:
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED, method.name
            assert method.name in err.value.details()
        else:
            assert err.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND), \
                (method.name, err.value.details())


async def test_health_overall_and_per_service_without_token(api):
    _, channel = api
    stub = health_pb2_grpc.HealthStub(channel)
    for name in ("", SERVICE_NAME):
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=name))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_reflection_lists_the_service(api):
    _, channel = api
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)

    async def requests():
        yield reflection_pb2.ServerReflectionRequest(list_services="")

    names = []
    async for reply in stub.ServerReflectionInfo(requests()):
        names = [s.name for s in reply.list_services_response.service]
    assert SERVICE_NAME in names and "grpc.health.v1.Health" in names


async def test_oversized_message_is_refused(api):
    settings, channel = api
    tok = token(settings, org="acme", clearance=1)
    big = pb.SearchRequest(scope=scope(), query="x" * (settings.grpc_max_message_bytes + 10))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call(channel, metadata=auth(tok), request=big)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
