"""Python client for Context Engine: `Client` (blocking) and `AsyncClient` (asyncio), text in
and out, for every RPC of upsquad.context.v1.ContextEngine and upsquad.ml.v1.MLDetectorService.

    from context_engine_client import Client

    with Client.from_data_dir(".context-engine", scope="acme/sales/emea") as engine:
        engine.ingest("deal-42", "user: hi, I want to talk about the Globex renewal")
        print(engine.assemble_context("deal-42", "answer the user", token_budget=2000).assembled_prompt)
"""

from context_engine_client._proto.upsquad.context.v1 import context_pb2 as messages
from context_engine_client._proto.upsquad.ml.v1 import detector_pb2 as detector_messages
from context_engine_client.aio import AsyncClient, BatchError, Turn
from context_engine_client.errors import EngineError
from context_engine_client.replies import Reply
from context_engine_client.scope import Scope
from context_engine_client.sync import Client
from context_engine_client.tokens import DevTokens

__all__ = ["AsyncClient", "BatchError", "Client", "DevTokens", "EngineError", "Reply", "Scope", "Turn", "messages",
           "detector_messages"]
