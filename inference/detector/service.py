"""`upsquad.ml.v1.MLDetectorService`: Classify (Prompt-Guard-86M), DetectPII (GLiNER small v2.1)
and the Moderate placeholder.

Every request is checked in the same order: size (over the hard limit is INVALID_ARGUMENT before
any other work), then `model_hint`, then the other arguments, then whether the model is loaded.
A model whose weights are absent leaves the service running: its health name is NOT_SERVING and
its RPC answers UNAVAILABLE naming the directory that was searched and the import command.
Inference runs on a dedicated thread pool per model, never on the event loop.
"""

from __future__ import annotations

import asyncio
import math
import pathlib
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import structlog
from google.protobuf.timestamp_pb2 import Timestamp

from context_engine import errors
from inference.detector import gliner_pii, prompt_guard
from inference.detector.settings import GLINER_NAME, PROMPT_GUARD_NAME, DetectorSettings
from upsquad.ml.v1 import detector_pb2, detector_pb2_grpc

log = structlog.get_logger("context_engine.detector")

SERVICE_NAME = detector_pb2.DESCRIPTOR.services_by_name["MLDetectorService"].full_name
MODEL_NAMES = (PROMPT_GUARD_NAME, GLINER_NAME)
IMPORT_COMMANDS = {
    PROMPT_GUARD_NAME: "context-engine models fetch prompt-guard --unpinned (or models import prompt-guard --from DIR)",
    GLINER_NAME: "context-engine models fetch gliner --unpinned (or models import gliner --from DIR)",
}

HealthListener = Callable[[str, bool], Awaitable[None]]


@dataclass
class ModelSlot:
    """What the service knows about one model: the loaded object, or why there is none."""

    name: str
    directory: pathlib.Path
    model: Any = None
    version: str = ""
    problem: str = "not loaded yet"
    reason: str = "MODEL_LOADING"
    healthy: bool = False

    def unavailable(self) -> errors.Unavailable:
        if self.reason == "CANARY_FAILED":
            message = (f"{self.name} is unavailable: {self.problem} (model {self.version} loaded from "
                       f"{self.directory}); fall back to regex detection")
        else:
            message = (f"{self.name} is unavailable: {self.problem}. Looked in {self.directory}. "
                       f"Import weights with: {IMPORT_COMMANDS[self.name]} (or point "
                       f"CONTEXT_ENGINE_DETECTOR_MODELS_DIR at a directory holding {self.name}/)")
        return errors.Unavailable(
            message,
            reason=self.reason,
            metadata={"model": self.name, "directory": str(self.directory)},
        )


def _now() -> Timestamp:
    stamp = Timestamp()
    stamp.GetCurrentTime()
    return stamp


class DetectorServicer(detector_pb2_grpc.MLDetectorServiceServicer):
    def __init__(self, settings: DetectorSettings, *, pii_model: gliner_pii.EntityModel | None = None,
                 pii_version: str = "stub@test") -> None:
        """`pii_model` replaces the GLiNER directory with an object at the model seam (tests)."""
        self.settings = settings
        self._classifier = ModelSlot(PROMPT_GUARD_NAME, settings.prompt_guard_path)
        self._pii = ModelSlot(GLINER_NAME, settings.gliner_path)
        self._pii_override = pii_model
        self._pii_override_version = pii_version
        self._classify_pool = ThreadPoolExecutor(settings.classify_workers, thread_name_prefix="prompt-guard")
        self._pii_pool = ThreadPoolExecutor(settings.pii_workers, thread_name_prefix="gliner")
        self._listeners: list[HealthListener] = []

    # --- lifecycle ---------------------------------------------------------------------------

    def add_health_listener(self, listener: HealthListener) -> None:
        """Called with (model name, serving) whenever a model's health changes after load()."""
        self._listeners.append(listener)

    def health(self) -> dict[str, bool]:
        return {slot.name: slot.healthy for slot in (self._classifier, self._pii)}

    def problems(self) -> dict[str, str]:
        return {slot.name: slot.problem for slot in (self._classifier, self._pii) if not slot.healthy}

    async def load(self) -> None:
        """Load whatever weights exist, each model's health published as soon as it is loaded
        (Prompt Guard does not wait for GLiNER). Never raises for missing or broken weights: it
        records why. The loading threads leave the slots unhealthy; here, on the event loop, health
        goes SERVING before the slot takes calls, so no call is answered while health says otherwise."""
        loop = asyncio.get_running_loop()
        classifier = await loop.run_in_executor(self._classify_pool, self._load_classifier)
        if classifier is not None:
            await self._notify(self._classifier.name, True)
            slot = self._classifier
            slot.model, slot.problem, slot.reason, slot.healthy = classifier, "", "", True
        self._log_load(self._classifier)
        pii = await loop.run_in_executor(self._pii_pool, self._load_pii)
        if pii is not None:
            detector, missing = pii
            if not missing:
                await self._notify(self._pii.name, True)
            self._pii.model = detector
            self._set_canary(self._pii, missing)
        self._log_load(self._pii)

    def _log_load(self, slot: ModelSlot) -> None:
        if slot.healthy:
            log.info("model loaded", model=slot.name, version=slot.version, directory=str(slot.directory))
        else:
            log.warning("model unavailable", model=slot.name, reason=slot.reason, problem=slot.problem,
                        directory=str(slot.directory), import_command=IMPORT_COMMANDS[slot.name])

    def close(self) -> None:
        self._classify_pool.shutdown(wait=False, cancel_futures=True)
        self._pii_pool.shutdown(wait=False, cancel_futures=True)

    def _load_classifier(self) -> prompt_guard.PromptGuard | None:
        """The loaded classifier, or None with the slot's problem recorded (on a loading thread)."""
        slot, s = self._classifier, self.settings
        try:
            model = prompt_guard.PromptGuard(slot.directory, max_tokens=s.classify_max_tokens,
                                             stride=s.classify_stride_tokens,
                                             batch_windows=s.classify_batch_windows,
                                             intra_op_threads=s.ort_intra_op_threads)
        except prompt_guard.ModelNotFound as exc:
            slot.problem, slot.reason = f"no weights ({exc})", "MODEL_NOT_LOADED"
        except prompt_guard.ModelInvalid as exc:
            slot.problem, slot.reason = f"weights could not be loaded ({exc})", "MODEL_LOAD_FAILED"
        except Exception as exc:  # a broken artifact must not take the service down
            log.exception("prompt guard load failed", directory=str(slot.directory))
            slot.problem, slot.reason = f"weights could not be loaded ({type(exc).__name__}: {exc})", \
                "MODEL_LOAD_FAILED"
        else:
            slot.version = f"{PROMPT_GUARD_NAME}@{model.revision}"
            return model  # the slot still says it is loading until load() makes it healthy
        return None

    def _load_pii(self) -> tuple[gliner_pii.PiiDetector, list[str]] | None:
        """The loaded detector and what its canary missed, or None with the slot's problem recorded
        (on a loading thread)."""
        slot, s = self._pii, self.settings
        canary = gliner_pii.Canary(s.pii_canary_text, s.pii_canary_expect, s.pii_canary_min_overlap)
        try:
            if self._pii_override is not None:
                model, version = self._pii_override, self._pii_override_version
            else:
                gliner_pii.check_gliner_dir(slot.directory)  # a missing dir is reported before imports
                loaded = gliner_pii.GlinerModel(slot.directory, runtime=s.pii_runtime,
                                                torch_threads=s.torch_threads, batch_size=s.pii_batch_size)
                model, version = loaded, loaded.manifest.version
        except gliner_pii.ModelNotFound as exc:
            slot.problem, slot.reason = f"no weights ({exc})", "MODEL_NOT_LOADED"
            return None
        except gliner_pii.DependencyMissing as exc:
            slot.problem, slot.reason = str(exc), "DETECTOR_EXTRA_MISSING"
            return None
        except Exception as exc:
            log.exception("gliner load failed", directory=str(slot.directory))
            slot.problem, slot.reason = f"weights could not be loaded ({type(exc).__name__}: {exc})", \
                "MODEL_LOAD_FAILED"
            return None
        words = min(s.pii_chunk_words, getattr(model, "max_words", s.pii_chunk_words))
        detector = gliner_pii.PiiDetector(model, canary=canary, threshold=s.pii_threshold, chunk_words=words,
                                          chunk_overlap=min(s.pii_chunk_overlap_words, words // 2))
        slot.version = version
        # The model is only healthy once it has proven it still detects the canary.
        try:
            return detector, detector.detect("").canary_missing
        except Exception as exc:
            log.exception("gliner canary run failed")
            return detector, [f"error: {type(exc).__name__}"]

    @staticmethod
    def _set_canary(slot: ModelSlot, missing: list[str]) -> bool:
        """Record the canary outcome; returns whether health changed."""
        healthy = not missing
        changed = healthy != slot.healthy
        slot.healthy = healthy
        if healthy:
            slot.problem, slot.reason = "", ""
        else:
            slot.problem = (f"the anti-collapse canary failed: the model no longer finds {missing} in the "
                            f"canary sentence, so its spans cannot be trusted")
            slot.reason = "CANARY_FAILED"
        return changed

    async def _notify(self, name: str, serving: bool) -> None:
        for listener in self._listeners:
            try:
                await listener(name, serving)
            except Exception:
                log.exception("health listener failed", model=name)

    # --- shared checks -----------------------------------------------------------------------

    def _check_text(self, text: str, rpc: str, request: Any) -> tuple[str, int]:
        size = len(text.encode("utf-8"))
        s = self.settings
        if size > s.hard_limit_bytes:
            raise errors.InvalidArgument(
                "text", f"is {size} bytes of UTF-8; the limit is {s.hard_limit_bytes} bytes "
                f"(callers must keep to {s.soft_limit_bytes})", reason="TEXT_TOO_LARGE")
        if size > s.soft_limit_bytes:
            truncate = rpc == "Classify" and s.classify_truncate_oversized
            log.warning("oversized-but-truncated" if truncate else "oversized", rpc=rpc, bytes=size,
                        soft_limit_bytes=s.soft_limit_bytes, hard_limit_bytes=s.hard_limit_bytes,
                        truncated_to_bytes=s.soft_limit_bytes if truncate else None,
                        tenant_id=request.tenant_id, session_id=request.session_id, agent_id=request.agent_id)
            if truncate:
                text = text.encode("utf-8")[: s.soft_limit_bytes].decode("utf-8", errors="ignore")
        return text, size

    @staticmethod
    def _check_hint(hint: str, expected: str) -> None:
        if hint != expected:
            raise errors.InvalidArgument("model_hint", f"must be exactly {expected!r}, got {hint!r}",
                                         reason="MODEL_HINT_REJECTED")

    def _thresholds(self, request: detector_pb2.ClassifyRequest) -> tuple[float, float]:
        base = self.settings.thresholds_for(request.tenant_id)
        warn = request.warn_threshold if request.HasField("warn_threshold") else base.warn
        block = request.block_threshold if request.HasField("block_threshold") else base.block
        for field, value in (("warn_threshold", warn), ("block_threshold", block)):
            if math.isnan(value) or not 0.0 <= value <= 1.0:
                raise errors.InvalidArgument(field, f"must be within [0, 1], got {value}",
                                             reason="THRESHOLD_INVALID")
        if warn > block:
            raise errors.InvalidArgument("warn_threshold", f"({warn:g}) must not exceed block_threshold "
                                         f"({block:g})", reason="THRESHOLD_INVALID")
        return warn, block

    # --- RPCs --------------------------------------------------------------------------------

    async def Classify(self, request: detector_pb2.ClassifyRequest, context) -> detector_pb2.ClassifyResponse:
        text, size = self._check_text(request.text, "Classify", request)
        self._check_hint(request.model_hint, PROMPT_GUARD_NAME)
        warn, block = self._thresholds(request)
        slot = self._classifier
        if not slot.healthy:
            raise slot.unavailable()
        model: prompt_guard.PromptGuard = slot.model

        def infer() -> tuple[Any, int, float]:
            started = time.perf_counter()
            probs = model.window_probabilities(text)
            return probs.max(axis=0), len(probs), time.perf_counter() - started

        top, windows, seconds = await asyncio.get_running_loop().run_in_executor(self._classify_pool, infer)
        benign, injection, jailbreak = (float(v) for v in top)
        score = jailbreak if self.settings.verdict_score == "jailbreak" else max(jailbreak, injection)
        verdict = "block" if score >= block else "warn" if score >= warn else "allow"
        latency_ms = round(seconds * 1000)
        log.info("classified", verdict=verdict, jailbreak=round(jailbreak, 4), injection=round(injection, 4),
                 windows=windows, bytes=size, latency_ms=latency_ms, tenant_id=request.tenant_id,
                 session_id=request.session_id, agent_id=request.agent_id)
        return detector_pb2.ClassifyResponse(
            jailbreak_score=jailbreak, indirect_injection_score=injection, verdict=verdict,
            latency_ms=latency_ms, model_version=slot.version, classified_at=_now())

    async def DetectPII(self, request: detector_pb2.DetectPIIRequest, context) -> detector_pb2.DetectPIIResponse:
        text, size = self._check_text(request.text, "DetectPII", request)
        self._check_hint(request.model_hint, GLINER_NAME)
        slot = self._pii
        if slot.model is None:
            raise slot.unavailable()
        detector: gliner_pii.PiiDetector = slot.model

        def infer() -> tuple[gliner_pii.Detection, float]:
            started = time.perf_counter()
            return detector.detect(text), time.perf_counter() - started

        detection, seconds = await asyncio.get_running_loop().run_in_executor(self._pii_pool, infer)
        if self._set_canary(slot, detection.canary_missing):
            await self._notify(slot.name, slot.healthy)
        if not detection.canary_healthy:
            log.error("canary failed", model=slot.name, version=slot.version, missing=detection.canary_missing,
                      tenant_id=request.tenant_id, session_id=request.session_id)
            raise slot.unavailable()
        latency_ms = round(seconds * 1000)
        log.info("pii detected", spans=len(detection.spans), chunks=detection.chunks, bytes=size,
                 latency_ms=latency_ms, tenant_id=request.tenant_id, session_id=request.session_id,
                 agent_id=request.agent_id)
        return detector_pb2.DetectPIIResponse(
            spans=[detector_pb2.PIISpan(pattern_class=s.pattern_class, start=s.start, end=s.end, score=s.score)
                   for s in detection.spans],
            latency_ms=latency_ms, model_version=slot.version, detected_at=_now(), canary_healthy=True)

    async def Moderate(self, request: detector_pb2.ModerateRequest, context) -> detector_pb2.ModerateResponse:
        raise errors.Unimplemented("Moderate is not implemented in this wave (LLD 23 defines it)",
                                   reason="NOT_YET_IMPLEMENTED")
