"""`errors.unavailable_cause`: the one place PostgreSQL or the broker going away becomes
UNAVAILABLE, and through the API's outermost interceptor over real gRPC (in-process server):
never INTERNAL for a dependency that is gone, still INTERNAL for a bug."""

from __future__ import annotations

import contextlib
import socket

import aiokafka.errors as kafka_errors
import asyncpg
import asyncpg.exceptions as pg
import grpc
import pytest

from context_engine import errors
from entrypoints.embedded.process import free_port
from entrypoints.serving.interceptors import ErrorsAndAccessLog
from entrypoints.serving.status import error_info
from upsquad.context.v1 import context_pb2 as pb
from upsquad.context.v1 import context_pb2_grpc

DB, BROKER = errors.DATABASE_UNAVAILABLE, errors.BROKER_UNAVAILABLE


def reason_of(exc: BaseException) -> str | None:
    found = errors.unavailable_cause(exc)
    return found.reason if found is not None else None


@pytest.mark.parametrize("exc, reason", [
    (pg.AdminShutdownError("terminating connection due to administrator command"), DB),
    (pg.CrashShutdownError("terminating connection because of crash of another server process"), DB),
    (pg.CannotConnectNowError("the database system is shutting down"), DB),
    (pg.CannotConnectNowError("the database system is starting up"), DB),
    (pg.DatabaseDroppedError("terminating connection due to database drop"), DB),
    (pg.TooManyConnectionsError("sorry, too many clients already"), DB),
    (pg.ConnectionDoesNotExistError("connection was closed in the middle of operation"), DB),
    (pg.ConnectionFailureError("connection failure"), DB),
    (pg.ClientCannotConnectError("could not connect"), DB),
    (pg.PostgresConnectionError("connection exception"), DB),
    (pg.InterfaceError("cannot perform operation: connection is closed"), DB),
    (pg.InterfaceError("pool is closing"), DB),
    (pg.InternalClientError("cannot switch to state 15; another operation (2) is in progress"), DB),
    (kafka_errors.KafkaConnectionError("Unable to bootstrap from [('127.0.0.1', 9092)]"), BROKER),
    (kafka_errors.NodeNotReadyError("node not ready"), BROKER),
    (kafka_errors.RequestTimedOutError(), BROKER),
    # Not a dependency going away: bugs and refusals stay what they are.
    (pg.QueryCanceledError("canceling statement due to statement timeout"), None),
    (pg.UniqueViolationError("duplicate key value violates unique constraint"), None),
    (pg.UndefinedTableError('relation "nope" does not exist'), None),
    (pg.InterfaceError("cannot perform operation: another operation is in progress"), None),
    (kafka_errors.MessageSizeTooLargeError(), None),
    (ConnectionRefusedError(111, "Connection refused"), None),  # not raised inside a driver
    (TimeoutError(), None),
    (KeyError("x"), None),
    (ValueError("connection is closed"), None),                 # the text alone proves nothing
])
def test_classification(exc, reason):
    assert reason_of(exc) == reason


def test_a_cause_or_context_counts():
    try:
        try:
            raise pg.AdminShutdownError("terminating connection due to administrator command")
        except pg.PostgresError as inner:
            raise RuntimeError("while reading the session") from inner
    except RuntimeError as outer:
        assert reason_of(outer) == DB
    try:
        try:
            raise pg.ConnectionDoesNotExistError("connection was closed in the middle of operation")
        except pg.PostgresError:
            raise KeyError("during cleanup")  # noqa: B904  # implicit context: the case under test
    except KeyError as outer:
        assert reason_of(outer) == DB


def test_the_message_names_the_dependency_not_the_driver_text():
    found = errors.unavailable_cause(pg.CannotConnectNowError("the database system is shutting down"))
    assert found.message == "the database is unavailable; retry shortly"
    assert "shutting down" not in found.message


async def refused_connect() -> None:
    """A real asyncpg connect to a port nothing listens on."""
    await asyncpg.connect(f"postgresql://nobody@127.0.0.1:{free_port()}/nothing", timeout=10)


@contextlib.asynccontextmanager
async def silent_listener():
    """A port that accepts TCP connections and never answers: a connect to it times out."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


async def test_a_refused_connection_raised_inside_asyncpg_is_the_database():
    with pytest.raises(OSError) as err:
        await refused_connect()
    assert reason_of(err.value) == DB


async def test_a_connect_timeout_inside_asyncpg_is_the_database():
    async with silent_listener() as port:
        with pytest.raises(TimeoutError) as err:
            await asyncpg.connect(f"postgresql://nobody@127.0.0.1:{port}/nothing", timeout=0.2)
    assert reason_of(err.value) == DB


# -- through the interceptor, over real gRPC ---------------------------------------------------------

class Failing(context_pb2_grpc.ContextEngineServicer):
    """Each RPC fails one way (no Authentication here: this is the outer interceptor alone)."""

    def __init__(self, listener_port: int) -> None:
        self.listener_port = listener_port

    async def IngestEvent(self, request, context):
        await refused_connect()

    async def PushContext(self, request, context):
        await asyncpg.connect(f"postgresql://nobody@127.0.0.1:{self.listener_port}/nothing", timeout=0.2)

    async def PullContext(self, request, context):
        raise pg.AdminShutdownError("terminating connection due to administrator command")

    async def Search(self, request, context):
        raise kafka_errors.KafkaConnectionError("Unable to bootstrap from [('10.1.2.3', 9092)]")

    async def Embed(self, request, context):
        raise KeyError("a bug")


@pytest.fixture
async def failing_stub():
    async with silent_listener() as port:
        server = grpc.aio.server(interceptors=[ErrorsAndAccessLog()])
        context_pb2_grpc.add_ContextEngineServicer_to_server(Failing(port), server)
        bound = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{bound}")
        try:
            yield context_pb2_grpc.ContextEngineStub(channel)
        finally:
            await channel.close()
            await server.stop(0)


@pytest.mark.parametrize("method, request_, reason", [
    ("IngestEvent", pb.IngestEventRequest(session_id="s"), DB),
    ("PushContext", pb.PushContextRequest(session_id="s"), DB),   # a connect timeout, not HANDLER_TIMEOUT
    ("PullContext", pb.PullContextRequest(agent_id="a"), DB),
    ("Search", pb.SearchRequest(query="q"), BROKER),
])
async def test_dependency_gone_is_unavailable_over_grpc(failing_stub, method, request_, reason):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await getattr(failing_stub, method)(request_)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value.details()
    assert error_info(err.value).reason == reason
    for leaked in ("127.0.0.1", "10.1.2.3", "administrator", "Errno", "Error"):
        assert leaked not in err.value.details()


async def test_a_bug_is_still_internal_over_grpc(failing_stub):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await failing_stub.Embed(pb.EmbedRequest(texts=["x"]))
    assert err.value.code() == grpc.StatusCode.INTERNAL
    assert error_info(err.value).reason == "INTERNAL"
    assert "a bug" not in err.value.details()
