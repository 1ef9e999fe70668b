"""Context Engine: the context and memory service LLM agents call before every model call.

Importing the package does nothing: each process's entry point (context_engine/__main__.py, the
test suite's conftest, the bench scripts) configures the process before anything imports gRPC."""
