"""Context Engine: the context and memory service LLM agents call before every model call."""

import os

# gRPC core's fork handlers restart its epoll poller thread in a forked child; when
# subprocess then closes inherited descriptors before exec, that thread hits EBADF and
# aborts the child (grpc/grpc#43055). We fork only to exec (the embedded PostgreSQL, the
# broker, workers), so the handlers buy nothing. Read once, when gRPC initialises, so this
# must run before anything imports grpc; an explicit setting in the environment wins.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
