# First, before any test module or fixture imports grpc: importing the package turns gRPC core's
# fork handlers off, which only takes effect before gRPC initialises (context_engine/__init__.py).
import context_engine  # noqa: F401  isort: skip

pytest_plugins = ["tests.fixtures.infra", "tests.fixtures.engine"]
