"""Prometheus metrics, so where the service spends its time is read from the running service,
not reconstructed by a benchmark.

- The API process: every RPC's duration and status, and the time of each stage of the two query
  paths (Search and AssembleContext); at `metrics_port`.
- The stream worker: the projector's batches (time, events), the vector assignments after its
  commits, the embedder's batches, and the records refused as not authentic; at `worker_metrics_port`.

Exposed over HTTP (`/metrics`, the Prometheus text format); docs/operations.md.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from prometheus_client import Counter, Gauge, Histogram, Info, start_http_server

# Sub-millisecond to seconds: the stages of one query are fractions of a millisecond to tens.
_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.004, 0.006, 0.008, 0.012, 0.016, 0.025, 0.035, 0.05,
            0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0)

RPC_SECONDS = Histogram(
    "context_engine_rpc_seconds", "Handler time of each RPC, by method and status code.",
    ["method", "code"], buckets=_BUCKETS)

STAGE_SECONDS = Histogram(
    "context_engine_stage_seconds",
    "Wall time of each stage of a query path (operation = search | assemble).",
    ["operation", "stage"], buckets=_BUCKETS)

RETRIEVAL_PASSES = Counter(
    "context_engine_retrieval_passes_total",
    "Retrieval passes run; broadened = the confidence gate's second, wider pass.", ["pass"])

QUERY_VECTORS = Counter(
    "context_engine_query_vectors_total",
    "Query embeddings of Search and AssembleContext: computed by the model, remembered (same org, same "
    "text), or shared (waited for the same org and text being computed).",
    ["source"])

AUDIT_EVENTS = Counter(
    "context_engine_audit_events",
    "AuditAccessEvents of cross-scope accesses (streams/audit.py): published on the audit:access stream, "
    "dropped (the pending queue was full, or still pending at shutdown: lost), or failed (one publish "
    "attempt of one event that failed and is retried).",
    ["result"])

AUDIT_EVENTS_PENDING = Gauge(
    "context_engine_audit_events_pending",
    "AuditAccessEvents recorded and not yet on the audit:access stream (queued or being retried).")

COMPACTIONS = Counter(
    "context_engine_compactions",
    "Compactions attempted (docs/compaction.md), by trigger (rpc = the Compact RPC, in the API process; job = "
    "a CompactionJob or a request found open at start, in the worker) and outcome: compacted, "
    "nothing_to_compact, quality_guardrail_triggered, summary_too_large, summarizer_unavailable, "
    "session_changed (another write came first); for jobs also already_closed (compacted, rolled back or "
    "fallen below the threshold since: a no-op), duplicate (a message_id already handled) and failed.",
    ["trigger", "outcome"])


# -- the stream worker ----------------------------------------------------------------------

PROJECTOR_BATCH_SECONDS = Histogram(
    "context_engine_projector_batch_seconds",
    "Time of one projector batch: its transaction (archive, read models, offsets, NOTIFY) to the commit.",
    buckets=_BUCKETS)

PROJECTOR_REJECTED_EVENTS = Counter(
    "context_engine_projector_rejected_events",
    "Records of the domain topic the projector set aside (rejected_events): undecodable, or not applicable.")

LOG_RECORDS_REFUSED = Counter(
    "context_engine_log_records_refused",
    "Records of the log a worker agent dropped unread: no valid authenticator from a trusted writer "
    "(streams/record_auth.py), by stream (events, embedding, pii, ...) and reason (missing, malformed, "
    "unknown_key, bad_mac, wrong_partition).",
    ["stream", "reason"])

PROJECTOR_BATCH_EVENTS = Histogram(
    "context_engine_projector_batch_events", "Events in one projector batch.",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512))

GUARDRAIL_LAYERS_REFUSED = Counter(
    "context_engine_guardrail_layers_refused",
    "guardrail.published events the projector refused, writing nothing (projections/projector/guardrail_layers.py), "
    "by outcome (REJECTED_UNTRUSTED_KEY, REJECTED_BAD_SIGNATURE, REJECTED_STALE, ...); a redelivery counts again.",
    ["outcome"])

VECTOR_ASSIGNMENT_SECONDS = Histogram(
    "context_engine_vector_assignment_seconds",
    "Time to give one embedding.recorded event's vectors to the chunks already written.",
    buckets=_BUCKETS)

VECTOR_ASSIGNMENTS_WAITING = Gauge(
    "context_engine_vector_assignments_waiting",
    "embedding.recorded events committed whose vectors the worker has yet to give to chunks.")

EMBEDDING_BATCH_SECONDS = Histogram(
    "context_engine_embedding_batch_seconds", "Time of one batch of the worker's embedder.",
    buckets=_BUCKETS)

EMBEDDED_TEXTS = Counter(
    "context_engine_embedded_texts_total", "Contents the worker's embedder computed (not reused).")


# -- the local embedder (every process that starts one: the API, the worker) ----------------

EMBEDDER_MATMUL = Info(
    "context_engine_embedder_matmul",
    "How the local MiniLM computes its weight products: requested (CONTEXT_ENGINE_MINILM_MATMUL), in use "
    "(float32 when the int8 self-check at start disagreed with float32 on this CPU), and its model_version.")

EMBEDDER_INT8_CHECK_MIN_COSINE = Gauge(
    "context_engine_embedder_int8_check_min_cosine",
    "The int8 self-check at the embedder's start: lowest cosine between the int8 and float32 products' vectors "
    "over its texts (int8 is kept at >= INT8_MIN_COSINE, inference/int8_check.py); NaN when no check ran.")


def record_embedder_matmul(*, requested: str, in_use: str, model_version: str, min_cosine: float | None) -> None:
    """What the local embedder started with (the last one started in this process)."""
    EMBEDDER_MATMUL.info({"requested": requested, "in_use": in_use, "model_version": model_version})
    EMBEDDER_INT8_CHECK_MIN_COSINE.set(float("nan") if min_cosine is None else min_cosine)


@contextlib.contextmanager
def timed(operation: str, stage: str) -> Iterator[None]:
    started = time.perf_counter()
    try:
        yield
    finally:
        STAGE_SECONDS.labels(operation, stage).observe(time.perf_counter() - started)


def serve_metrics(host: str, port: int) -> int:
    """Start the /metrics endpoint on a daemon thread; returns the bound port (0 picks one)."""
    server, _thread = start_http_server(port, addr=host)
    return server.server_port
