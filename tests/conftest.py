# First, before any test module or fixture imports grpc: the suite is an entry point too, and gRPC
# core's fork handlers are turned off only before gRPC initialises (entrypoints/embedded/process.py).
from entrypoints.embedded.process import disable_grpc_fork_handlers

disable_grpc_fork_handlers()

pytest_plugins = ["tests.fixtures.infra", "tests.fixtures.engine", "tests.fixtures.pii_model"]
