"""What every gRPC service of ours serves with: the server (server.py), the interceptors both
install (interceptors.py) and the one mapping of domain errors to gRPC status (status.py).
Nothing here knows the ContextEngine API or the detector."""
