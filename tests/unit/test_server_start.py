"""A hosted gRPC server freezes what startup built before it serves, so the collector's full
passes under load do not traverse the process's long-lived objects."""

import gc

from entrypoints.serving.server import build_server


async def test_starting_a_server_freezes_the_startup_objects():
    gc.unfreeze()
    server = build_server("127.0.0.1:0", [])
    try:
        assert gc.get_freeze_count() == 0
        await server.start()
        assert gc.get_freeze_count() > 1000
        assert not any(o is server for o in gc.get_objects(generation=2))  # frozen, not in any generation
    finally:
        await server.stop(0)
        gc.unfreeze()
