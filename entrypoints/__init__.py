"""The faces of the engine: every process's entry point (the `context-engine` command line, the API
and detector servers, serving, the supervisor of `up`, the embedded PostgreSQL and broker). They
stand above everything they start or serve; nothing below imports them."""
