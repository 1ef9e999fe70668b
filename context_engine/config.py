"""Settings, read once from the environment (prefix CONTEXT_ENGINE_) and the CLI.

Every field is documented in docs/configuration.md; keep the two in step.
"""

from __future__ import annotations

import pathlib
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_PREFIX = "CONTEXT_ENGINE_"


def required(value: str | None, setting: str) -> str:
    """The value of a setting (a `Settings` field name) the caller cannot go on without; a
    ValueError naming its environment variable when it is unset."""
    if value is None:
        raise ValueError(f"{ENV_PREFIX}{setting.upper()} is not set")
    return value


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    # Where every embedded part keeps its state: PostgreSQL data, keys, models, logs.
    home: pathlib.Path = Field(default=pathlib.Path(".context-engine"))

    api_host: str = "127.0.0.1"
    api_port: int = 50051
    detector_host: str = "127.0.0.1"
    detector_port: int = 50052
    # Prometheus /metrics of the API (context_engine/metrics.py): 0 picks a free port, -1 turns
    # it off. With api_processes > 1, process i listens on metrics_port + i.
    metrics_port: int = Field(default=9464, ge=-1)
    # Prometheus /metrics of the stream worker (projector batches, vector assignments, embedding):
    # -1 = off (the default: `up` and the tests run workers beside each other), 0 = a free port.
    worker_metrics_port: int = Field(default=-1, ge=-1)
    # API processes sharing api_port (SO_REUSEPORT; the kernel spreads connections over them),
    # so the API's Python work is not bound to one core. A channel stays on one process.
    api_processes: int = Field(default=1, ge=1, le=64)
    # How long `up` waits for the worker to join its group and the API and detector to answer
    # SERVING before it gives up and stops what it started (a loaded machine needs longer).
    ready_timeout_s: float = Field(default=60.0, gt=0)

    # Existing infrastructure. When set, the embedded part is not started.
    database_url: str | None = None
    # The API's own connection: a role without BYPASSRLS. Default: database_url with the
    # credentials of the app role that migrations create.
    api_database_url: str | None = None
    # PostgreSQL passwords (docs/security.md, "PostgreSQL"). The app role's password: `up`
    # generates it into this file (default <home>/keys/postgres-app.password, 0600) unless it
    # exists, sets it (migrate) and the API connects with it. Not used when api_database_url is
    # given. The embedded superuser's is <home>/keys/postgres-superuser.password.
    database_app_password_file: pathlib.Path | None = None
    kafka_bootstrap: str | None = None

    # Ports of the embedded PostgreSQL and broker (0 = pick a free port at start).
    embedded_postgres_port: int = 0
    # The embedded server's buffer cache. PostgreSQL's default, 128 MB, holds an eighth of what a
    # 100,000-chunk org's queries touch (~730 MB of HNSW graph, chunk rows and postings): every
    # query then copied its pages in from the OS cache again (docs/benchmarks.md). 0 = a quarter
    # of the machine's memory, at most 1 GB.
    embedded_postgres_shared_buffers_mb: int = Field(default=0, ge=0)
    embedded_kafka_port: int = 0

    # The log. One domain-event topic keyed by aggregate, one topic per job stream.
    topic_prefix: str = "context-engine"
    # 4 is also what the bundled broker gives a topic a client auto-creates after a restart,
    # so a consumer that races the engine's re-creation cannot leave a topic mis-partitioned.
    events_topic_partitions: int = 4
    job_topic_partitions: int = 4
    # Copies of each topic the engine creates: 1 for one broker; 3 on a three-broker cluster
    # (compose.kafka-cluster.yaml) so a broker's loss loses no acknowledged record.
    topic_replication_factor: int = Field(default=1, ge=1, le=16)
    # Consumers' fetch wait: the bundled broker holds every fetch for the full wait even when
    # data is there, so this bounds projection latency.
    consumer_fetch_max_wait_ms: int = 5
    # ... and once ~1 s of fetches brought nothing: empty fetches at 5 ms cost an idle stack a
    # third of a core (streams/fetch_wait.py); the first event after a quiet spell waits longer.
    consumer_idle_fetch_max_wait_ms: int = 50
    # A command is acknowledged once its event is archived (and projected): how long to wait.
    ack_timeout_seconds: float = 5.0
    # Read-your-writes: how long a query waits for this process's appends to be projected.
    freshness_timeout_seconds: float = 2.0
    # Restore the broker from the PostgreSQL archive when it holds less (memory-only brokers).
    restore_log_from_archive: bool = True

    # Who may write the log (docs/security.md, "The log"). Every record carries an HMAC-SHA256 by a
    # key of this keyring (streams/record_auth.py); the default <home>/keys/log-hmac.keyring is made
    # (0600) on first use. Set it on every host of a multi-host deployment, to a copy of one file.
    log_keyring_file: pathlib.Path | None = None
    # An external Kafka's own authentication, given to every client of it (streams/kafka_security.py).
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "SCRAM-SHA-512"
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    kafka_ssl_cafile: pathlib.Path | None = None  # default: the system's CAs
    kafka_ssl_certfile: pathlib.Path | None = None  # a client certificate (mutual TLS), with its key:
    kafka_ssl_keyfile: pathlib.Path | None = None
    kafka_ssl_key_password: SecretStr | None = None

    # Limits. Every content up to this many bytes is accepted end to end; the log's record limits
    # follow from it (streams/log.py), within the 16 MiB its topics are created to take.
    max_content_bytes: int = Field(default=1024 * 1024, ge=1, le=8 * 1024 * 1024)
    # Each org's write budget in each API process (commands/write_budget.py): content + metadata
    # bytes of IngestEvent and PushContext, sustained per second, and the most in one burst (at
    # least max_content_bytes, or the largest content could never be written). 0 = no budget.
    org_write_bytes_per_second: int = Field(default=1024 * 1024, ge=0)
    org_write_burst_bytes: int = Field(default=8 * 1024 * 1024, ge=1)
    # Calls per token answered NOT_FOUND or PERMISSION_DENIED (commands/refusal_budget.py), sustained
    # per second and in one burst; past them the token's calls are RESOURCE_EXHAUSTED, counted in
    # summary audit rows. 0 = no budget.
    refused_calls_per_second: int = Field(default=20, ge=0)
    refused_calls_burst: int = Field(default=200, ge=1)

    # JWT verification. HS256 uses a key file generated under `home` on first `up`;
    # RS256 / EdDSA verify with a configured public key (PEM).
    jwt_algorithms: list[Literal["HS256", "RS256", "EdDSA"]] = ["HS256"]
    jwt_hs256_key_file: pathlib.Path | None = None
    jwt_public_key_file: pathlib.Path | None = None
    jwt_issuer: str | None = None
    jwt_audience: str | None = None
    jwt_leeway_seconds: int = 10
    # The longest a token may live (exp - iat, or exp - now without iat); 0 = no maximum. A token
    # minted for 100,000 days is a password that never expires.
    jwt_max_lifetime_seconds: int = Field(default=24 * 3600, ge=0)

    # gRPC servers.
    grpc_max_message_bytes: int = 8 * 1024 * 1024
    # No call may hang: a handler still running after this is cancelled (DEADLINE_EXCEEDED).
    rpc_timeout_seconds: float = 30.0
    shutdown_grace_seconds: float = 5.0

    # No way in from the host (docs/security.md, "Guardrail layers and the detector").
    # The detector refuses every call without `authorization: Bearer <token>`: this token when set,
    # else the secret in detector_service_token_file (default <home>/keys/detector-service.token,
    # made 0600 by `up` or whichever of the detector and its clients needs it first).
    detector_service_token: SecretStr | None = None
    detector_service_token_file: pathlib.Path | None = None
    # The keys guardrail layers are accepted from and served by (context_engine/guardrails/trust.py):
    # fingerprints (64 hex) and/or public-key PEM files, JSON. Empty: <home>/keys/guardrail-ed25519.pub only.
    guardrail_trusted_keys: list[str] = []

    # Embeddings. "minilm" (all-MiniLM-L6-v2 int8, 384-d, offline) or "openai" (any
    # OpenAI-compatible /embeddings endpoint). The running embedder defines model_version.
    embedder: Literal["minilm", "openai"] = "minilm"
    embedder_url: str | None = None
    embedder_api_key: SecretStr | None = None
    embedder_model: str = "text-embedding-3-small"
    embedder_dimensions: int | None = None
    # How the local MiniLM computes its weight products: "int8" runs the packaged int8 weights on
    # the CPU's int8 instructions (a query ~2x faster, inference/int8_matmul.py); "float32" lets
    # onnxruntime expand them to float32, as releases before it did. The two give other vectors
    # (other model_version): switching needs `context-engine reindex` (docs/operations.md).
    minilm_matmul: Literal["int8", "float32"] = "int8"
    # Intra-op threads of the API's local query embedder. One query is ~5 ms of CPU on one thread
    # and ~6.5 ms spread over two (measured, docs/benchmarks.md); under load the API's SQL and
    # Python need the other core, so 1. The worker's batch embedder uses min(2, cpus).
    query_embedder_threads: int = Field(default=1, ge=1, le=64)
    # Query vectors each API process remembers, per (org, text), least recently used out
    # (inference/query_vectors.py); 0 = every query runs the model. ~2 KB each at 384-d.
    query_vectors_remembered: int = Field(default=10_000, ge=0, le=200_000)
    # How far below the worker's other work its batch embedder runs (a per-thread nice increment,
    # 0-19; 0 = same priority). Embedding is background work, ~5 ms of CPU per chunk, that took a
    # core beside the projections under an ingest burst (docs/operations.md).
    embedding_niceness: int = Field(default=10, ge=0, le=19)
    # Run it in Linux's SCHED_IDLE class: it gets a core only when no other thread wants one
    # (docs/operations.md, "Background embedding"). Ignored where the OS has no such class.
    embedding_idle_priority: bool = True
    embed_cache_ttl_days: int = 30
    embedding_batch_size: int = 64

    # Retrieval. The floor applied when a Search omits min_score (or sends 0): the strictest
    # floor the engine has. Fused scores of MiniLM-based retrieval sit far below 0.7
    # (docs/retrieval.md), so the default is calibrated on that scale. Per-tenant overrides:
    # {"org-id": 0.5} (JSON in CONTEXT_ENGINE_RETRIEVAL_MIN_SCORE_BY_ORG).
    retrieval_min_score: float = Field(default=0.25, gt=0.0, le=1.0)
    retrieval_min_score_by_org: dict[str, float] = {}

    # AssembleContext (docs/assembly.md).
    max_token_budget: int = 2_000_000
    history_window: int = 2000  # most recent session events considered for the history section
    # The share of the budget the recent window (the newest turn and those before it) may take
    # before retrieval; the newest turn is always in the prompt. Per call: hints["recent_share"].
    assembly_recent_share: float = Field(default=0.05, ge=0.0, le=1.0)
    compaction_threshold: float = Field(default=0.8, gt=0.0, le=1.0)
    # Share of calls that also count the naive prompt (baseline_tokens, savings_ratio, a
    # BaselineMetricEvent); per-org overrides as JSON {"acme": 1.0}.
    savings_sample_rate: float = Field(default=0.05, ge=0.0, le=1.0)
    savings_sample_rate_by_org: dict[str, float] = {}

    # Compaction's summarizer (docs/compaction.md): "extractive" (offline, no model) or
    # "chat_completions" (an OpenAI-compatible /chat/completions at compaction_llm_url).
    compaction_summarizer: Literal["extractive", "chat_completions"] = "extractive"
    # Whether the worker compacts the sessions AssembleContext finds above compaction_threshold
    # (their CompactionJobs); off, only the Compact RPC compacts.
    compaction_on_threshold: bool = True
    # sliding_window keeps this many of the session's most recent turns verbatim.
    compaction_keep_recent_turns: int = Field(default=10, ge=1, le=100_000)
    # A compaction must cut at least this share of the session's active tokens, or it is refused
    # (INSUFFICIENT_SAVINGS) and nothing is written.
    compaction_min_savings: float = Field(default=0.1, gt=0.0, le=1.0)
    # The worker closes a compaction request it could not serve for this long (the summarizer
    # down, no verdict) as refused, reason 'expired'; the next crossing opens a new one.
    compaction_request_expiry_seconds: float = Field(default=3600.0, gt=0.0)
    compaction_llm_url: str | None = None
    compaction_llm_model: str = "gemini-2.5-flash-lite"
    compaction_llm_api_key: SecretStr | None = None
    compaction_llm_timeout_seconds: float = Field(default=30.0, gt=0.0, le=600.0)
    compaction_llm_max_attempts: int = Field(default=4, ge=1, le=10)

    # PII redaction of pushed memory (docs/pii.md): the detector the worker calls, per call.
    pii_detector_timeout_seconds: float = 2.0
    # PullContext waits this long for a just-pushed version's scan before UNAVAILABLE.
    pii_scan_wait_seconds: float = 5.0

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @model_validator(mode="after")
    def _largest_content_fits_the_write_budget(self) -> "Settings":
        if self.org_write_bytes_per_second and self.org_write_burst_bytes < self.max_content_bytes:
            raise ValueError(f"org_write_burst_bytes ({self.org_write_burst_bytes}) must be at least "
                             f"max_content_bytes ({self.max_content_bytes}): the largest content "
                             "could never be written")
        return self

    @model_validator(mode="after")
    def _an_llm_summarizer_has_an_url(self) -> "Settings":
        if self.compaction_summarizer == "chat_completions" and not self.compaction_llm_url:
            raise ValueError("compaction_summarizer 'chat_completions' needs compaction_llm_url "
                             "(CONTEXT_ENGINE_COMPACTION_LLM_URL), the API's base URL")
        return self

    def tenant_min_score(self, org_id: str) -> float:
        """The tenant knob retrieval_min_score: the org's override, else the default."""
        value = self.retrieval_min_score_by_org.get(org_id, self.retrieval_min_score)
        if not 0.0 < value <= 1.0:
            raise ValueError(f"retrieval_min_score for {org_id!r} must be in (0, 1], got {value}")
        return value

    def tenant_sample_rate(self, org_id: str) -> float:
        return self.savings_sample_rate_by_org.get(org_id, self.savings_sample_rate)

    @property
    def home_dir(self) -> pathlib.Path:
        return self.home.expanduser().resolve()

    @property
    def hs256_key_path(self) -> pathlib.Path:
        return self.jwt_hs256_key_file or self.home_dir / "keys" / "jwt-hs256.key"

    @property
    def log_keyring_path(self) -> pathlib.Path:
        return self.log_keyring_file or self.home_dir / "keys" / "log-hmac.keyring"

    @property
    def app_password_path(self) -> pathlib.Path:
        return self.database_app_password_file or self.home_dir / "keys" / "postgres-app.password"

    @property
    def detector_service_token_path(self) -> pathlib.Path:
        return self.detector_service_token_file or self.home_dir / "keys" / "detector-service.token"

    @property
    def api_address(self) -> str:
        return f"{self.api_host}:{self.api_port}"

    @property
    def detector_address(self) -> str:
        return f"{self.detector_host}:{self.detector_port}"
