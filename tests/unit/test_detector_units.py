"""Unit tests of the detector's pieces: windows, chunks, byte offsets, the canary rule, label
mapping, settings, the servicer called directly, the importer and CLI, and the base install
(no torch / gliner) still serving Classify."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Sequence

import pytest
from pydantic import ValidationError

from context_engine import errors
from inference.detector import gliner_pii, prompt_guard
from inference.detector.gliner_pii import Canary, PiiDetector, RawSpan
from inference.detector.service import DetectorServicer
from inference.detector.settings import DEFAULT_CANARY_EXPECT, DEFAULT_CANARY_TEXT, DetectorSettings
from tests.fixtures.detector_models import TinyModels, detector_models  # noqa: F401  (fixture)
from upsquad.ml.v1 import detector_pb2

REPO = pathlib.Path(__file__).resolve().parents[2]


# --- windows, chunks, offsets --------------------------------------------------------------------


@pytest.mark.parametrize(("n", "window", "stride", "starts"), [
    (0, 510, 256, [0]), (510, 510, 256, [0]), (511, 510, 256, [0, 1]), (1000, 510, 256, [0, 256, 490]),
    (1022, 510, 256, [0, 256, 512]), (20, 8, 4, [0, 4, 8, 12]),
])
def test_window_starts_cover_every_token_with_equal_windows(n, window, stride, starts) -> None:
    assert prompt_guard.window_starts(n, window, stride) == starts
    covered = {i for s in starts for i in range(s, min(s + window, n))}
    assert covered == set(range(n))


def test_chunks_cover_every_word_and_overlap() -> None:
    text = " ".join(f"w{i}" for i in range(100))
    chunks = gliner_pii.chunk_text(text, 30, 10)
    assert [text[o:o + len(c)] for o, c in chunks] == [c for _, c in chunks]
    words = [set(c.split()) for _, c in chunks]
    assert set().union(*words) == set(text.split())
    assert all(len(a & b) == 10 for a, b in zip(words, words[1:], strict=False))
    assert gliner_pii.chunk_text("short text", 30, 10) == [(0, "short text")]
    with pytest.raises(ValueError):
        gliner_pii.chunk_text(text, 10, 10)


def test_byte_offsets_match_utf8() -> None:
    text = "aé€😀 Ní ŝ\u0800\uffff\U00010000z"
    offsets = gliner_pii.byte_offsets(text)
    assert offsets == [len(text[:i].encode()) for i in range(len(text) + 1)]


# --- the canary rule and the label mapping -------------------------------------------------------


def _span(text: str, needle: str, label: str, score: float = 0.9) -> RawSpan:
    start = text.index(needle)
    return RawSpan(start, start + len(needle), label, score)


def test_canary_requires_each_class_on_its_span() -> None:
    canary = Canary(DEFAULT_CANARY_TEXT, DEFAULT_CANARY_EXPECT)
    t = DEFAULT_CANARY_TEXT
    good = [_span(t, "John Smith", "person"), _span(t, "12 March 1985", "date of birth"),
            _span(t, "221B Baker Street", "address")]  # partial address: IoU 17/25 >= 0.5
    assert canary.missing(good) == []
    assert canary.missing(good[:2]) == ["address"]
    assert canary.missing([]) == ["person", "dob", "address"]
    # the right span under an unmapped (national-id) label does not count
    assert canary.missing([_span(t, "John Smith", "passport number"), *good[1:]]) == ["person"]
    # a span swallowing the sentence overlaps everything but matches nothing
    everything = RawSpan(0, len(t), "person", 0.9)
    assert canary.missing([everything, *good[1:]]) == ["person"]


class _Fixed:
    def __init__(self, results: list[list[RawSpan]]) -> None:
        self.results = results

    def predict(self, texts: Sequence[str], labels: Sequence[str], threshold: float) -> list[list[RawSpan]]:
        return self.results


def _canary_hits() -> list[RawSpan]:
    t = DEFAULT_CANARY_TEXT
    return [_span(t, "John Smith", "person"), _span(t, "12 March 1985", "date of birth"),
            _span(t, "221B Baker Street, London", "address")]


def test_only_the_closed_enum_is_emitted_above_threshold() -> None:
    text = "Jo Bloggs 01/02/1990 AB123456C somewhere"
    found = [_span(text, "Jo Bloggs", "person", 0.7), _span(text, "01/02/1990", "date of birth", 0.4),
             _span(text, "AB123456C", "national id number", 0.99), _span(text, "somewhere", "location", 0.9)]
    detector = PiiDetector(_Fixed([found, _canary_hits()]), canary=Canary(DEFAULT_CANARY_TEXT, DEFAULT_CANARY_EXPECT),
                           threshold=0.5)
    result = detector.detect(text)
    assert result.canary_healthy
    assert [(s.pattern_class, s.start, s.end) for s in result.spans] == [("person", 0, 9)]
    assert {label for label, _ in gliner_pii.PROMPT_LABELS} >= {"national id number", "passport number"}
    assert set(gliner_pii.LABEL_TO_CLASS.values()) == set(gliner_pii.PATTERN_CLASSES) == {"person", "dob", "address"}


def test_detector_rejects_a_model_that_drops_results() -> None:
    detector = PiiDetector(_Fixed([[]]), canary=Canary(DEFAULT_CANARY_TEXT, DEFAULT_CANARY_EXPECT))
    with pytest.raises(RuntimeError):
        detector.detect("some text")


def test_label_columns_come_from_id2label() -> None:
    assert prompt_guard.label_indices({0: "JAILBREAK", 1: "benign", 2: "Injection"}) == {
        "BENIGN": 1, "INJECTION": 2, "JAILBREAK": 0}
    with pytest.raises(prompt_guard.ModelInvalid):
        prompt_guard.label_indices({0: "BENIGN", 1: "MALICIOUS"})


# --- settings ------------------------------------------------------------------------------------


def test_settings_defaults_and_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    monkeypatch.setenv("CONTEXT_ENGINE_HOME", str(tmp_path))
    s = DetectorSettings()
    assert s.models_root == tmp_path.resolve() / "models"
    assert s.prompt_guard_path == s.models_root / "prompt-guard-86m"
    assert s.gliner_path == s.models_root / "gliner-small-v2.1"
    assert (s.warn_threshold, s.block_threshold, s.pii_threshold) == (0.5, 0.9, 0.5)
    assert (s.soft_limit_bytes, s.hard_limit_bytes) == (32768, 65536)
    monkeypatch.setenv("CONTEXT_ENGINE_DETECTOR_TENANT_THRESHOLDS", '{"org-1": {"warn": 0.2, "block": 0.4}}')
    monkeypatch.setenv("CONTEXT_ENGINE_DETECTOR_GLINER_DIR", str(tmp_path / "g"))
    s = DetectorSettings()
    assert s.thresholds_for("org-1").block == 0.4 and s.thresholds_for("other").block == 0.9
    assert s.gliner_path == tmp_path.resolve() / "g"


@pytest.mark.parametrize("bad", [
    {"warn_threshold": 0.95}, {"block_threshold": 1.5}, {"tenant_thresholds": {"x": {"warn": 0.6, "block": 0.5}}},
    {"pii_chunk_words": 32, "pii_chunk_overlap_words": 32}, {"pii_canary_expect": {"person": "Nobody"}},
    {"pii_canary_expect": {"natid": "John Smith"}}, {"soft_limit_bytes": 70000},
])
def test_settings_reject_inconsistent_values(bad: dict, tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValidationError):
        DetectorSettings(models_dir=tmp_path, **bad)


# --- the servicer, called directly ---------------------------------------------------------------


async def test_tenant_thresholds_apply_when_the_request_has_none(detector_models: TinyModels) -> None:  # noqa: F811
    servicer = DetectorServicer(DetectorSettings(models_dir=detector_models.models_dir,
                                                 tenant_thresholds={"strict": {"warn": 0.0, "block": 0.0},
                                                                    "lax": {"warn": 1.0, "block": 1.0}}))
    await servicer.load()
    try:
        def req(tenant: str, **extra) -> detector_pb2.ClassifyRequest:
            return detector_pb2.ClassifyRequest(text="hello world", tenant_id=tenant, model_hint="prompt-guard-86m",
                                                **extra)

        assert (await servicer.Classify(req("strict"), None)).verdict == "block"
        assert (await servicer.Classify(req("lax"), None)).verdict == "allow"
        # request fields win over the tenant's configuration
        own = req("strict", warn_threshold=1.0, block_threshold=1.0)
        assert (await servicer.Classify(own, None)).verdict == "allow"
    finally:
        servicer.close()


async def test_oversized_text_is_logged_and_classify_truncates(detector_models: TinyModels) -> None:  # noqa: F811
    from structlog.testing import capture_logs

    seen: list[str] = []

    class Recorder:
        def predict(self, texts, labels, threshold):
            seen.extend(texts)
            return [[] for _ in texts[:-1]] + [_canary_hits()]

    settings = DetectorSettings(models_dir=detector_models.models_dir, pii_chunk_words=100_000,
                                pii_chunk_overlap_words=0)
    servicer = DetectorServicer(settings, pii_model=Recorder())
    await servicer.load()
    text = "hello world " * 3000  # 36,000 bytes: over the soft limit, under the hard one
    try:
        with capture_logs() as logs:
            await servicer.Classify(detector_pb2.ClassifyRequest(text=text, model_hint="prompt-guard-86m"), None)
            await servicer.DetectPII(detector_pb2.DetectPIIRequest(text=text, model_hint="gliner-small-v2.1"), None)
        events = {e["event"]: e for e in logs if e["event"].startswith("oversized")}
        assert events["oversized-but-truncated"]["rpc"] == "Classify"
        assert events["oversized-but-truncated"]["truncated_to_bytes"] == 32768
        assert events["oversized"]["rpc"] == "DetectPII" and events["oversized"]["bytes"] == 36000
        assert seen[-2] == text  # DetectPII scans the whole fragment: a cut would leave PII unredacted
    finally:
        servicer.close()


async def test_moderate_raises_unimplemented(tmp_path: pathlib.Path) -> None:
    servicer = DetectorServicer(DetectorSettings(models_dir=tmp_path))
    with pytest.raises(errors.Unimplemented):
        await servicer.Moderate(detector_pb2.ModerateRequest(), None)
    servicer.close()


def test_label_order_is_read_from_the_manifest(
        detector_models: TinyModels, tmp_path: pathlib.Path) -> None:  # noqa: F811
    original = prompt_guard.PromptGuard(detector_models.models_dir / "prompt-guard-86m")
    permuted = tmp_path / "pg"
    shutil.copytree(detector_models.models_dir / "prompt-guard-86m", permuted)
    manifest = json.loads((permuted / "manifest.json").read_text())
    manifest["id2label"] = {"0": "JAILBREAK", "1": "BENIGN", "2": "INJECTION"}
    (permuted / "manifest.json").write_text(json.dumps(manifest))
    a = original.classify("hello world")
    b = prompt_guard.PromptGuard(permuted).classify("hello world")
    assert sum(a) == pytest.approx(1.0, abs=1e-6)
    # column 0 was BENIGN and is now JAILBREAK, and so on
    assert (b.jailbreak, b.benign, b.injection) == pytest.approx((a.benign, a.injection, a.jailbreak))


# --- importer and CLI ----------------------------------------------------------------------------


def test_cli_imports_an_onnx_export_and_reports_status(
        detector_models: TinyModels, tmp_path: pathlib.Path) -> None:  # noqa: F811
    from typer.testing import CliRunner

    from entrypoints.detector.cli import models_app

    export = tmp_path / "export"
    (export / "onnx").mkdir(parents=True)
    shutil.copy(detector_models.models_dir / "prompt-guard-86m" / "model.onnx", export / "onnx" / "model.onnx")
    for name in ("tokenizer.json", "config.json"):
        shutil.copy(detector_models.classifier_hf_dir / name, export / name)
    models = tmp_path / "models"
    runner = CliRunner()
    result = runner.invoke(models_app, ["import", "prompt-guard", "--from", str(export), "--models-dir", str(models)])
    assert result.exit_code == 0, result.output
    manifest = json.loads((models / "prompt-guard-86m" / "manifest.json").read_text())
    assert manifest["mode"] == "copied-onnx" and manifest["revision"].startswith("sha256-")
    assert manifest["id2label"] == {"0": "BENIGN", "1": "INJECTION", "2": "JAILBREAK"}

    again = runner.invoke(models_app, ["import", "prompt-guard", "--from", str(export), "--models-dir", str(models)])
    assert again.exit_code == 1 and "--force" in again.output
    forced = runner.invoke(models_app, ["import", "prompt-guard", "--from", str(export), "--models-dir", str(models),
                                        "--revision", "r2", "--force"])
    assert forced.exit_code == 0, forced.output
    assert not [p for p in models.iterdir() if p.name.startswith(".")]  # no staging left behind

    bad = runner.invoke(models_app, ["import", "gliner", "--from", str(export), "--models-dir", str(models)])
    assert bad.exit_code == 1 and "gliner_config.json" in bad.output

    status = runner.invoke(models_app, ["status", "--models-dir", str(models)])
    rows = [json.loads(line) for line in status.output.splitlines()]
    assert rows[0]["installed"] and rows[0]["revision"] == "r2"
    assert not rows[1]["installed"] and rows[1]["directory"].endswith("gliner-small-v2.1")


def test_gliner_onnx_export_serves_like_torch(
        detector_models: TinyModels, tmp_path: pathlib.Path) -> None:  # noqa: F811
    from inference.detector.importer import import_gliner

    # the installed copy is itself a self-contained GLiNER directory, so it can be re-imported
    installed = import_gliner(detector_models.gliner_dir, tmp_path, revision="onnx-test", export_onnx=True)
    assert json.loads((installed / "manifest.json").read_text())["files"] == {"onnx": "model.onnx"}
    labels = [label for label, _ in gliner_pii.PROMPT_LABELS]
    texts = [DEFAULT_CANARY_TEXT, "My name is Aoife Ní Bhriain, born 4 March 1987."]
    by_torch = gliner_pii.GlinerModel(installed).predict(texts, labels, 0.5)
    by_onnx = gliner_pii.GlinerModel(installed, runtime="onnx").predict(texts, labels, 0.5)
    # random weights put scores near 0.5: compare what both backends found with a tolerance
    for a, b in zip(by_torch, by_onnx, strict=True):
        common = {(s.start, s.end, s.label): s.score for s in a}.keys() & {(s.start, s.end, s.label) for s in b}
        assert len(common) >= 0.8 * max(len(a), len(b), 1)
        scores_b = {(s.start, s.end, s.label): s.score for s in b}
        assert all(abs(s.score - scores_b[(s.start, s.end, s.label)]) < 1e-3
                   for s in a if (s.start, s.end, s.label) in common)
    with pytest.raises(gliner_pii.ModelNotFound):
        gliner_pii.GlinerModel(detector_models.gliner_dir, runtime="onnx")  # imported without --onnx


def test_gliner_save_naming_its_backbone_needs_backbone_dir(detector_models: TinyModels,  # noqa: F811
                                                            tmp_path: pathlib.Path) -> None:
    """Like the published gliner_small-v2.1: no encoder config or tokenizer inside, only a backbone name."""
    from inference.detector.importer import ImportFailed, import_gliner
    from inference.detector.tiny_models import _deberta_config, _save_tokenizer

    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(detector_models.gliner_dir / "pytorch_model.bin", bare / "pytorch_model.bin")
    config = json.loads((detector_models.gliner_dir / "gliner_config.json").read_text())
    config.pop("encoder_config")
    config["model_name"] = "example-org/not-on-this-machine"
    (bare / "gliner_config.json").write_text(json.dumps(config))
    with pytest.raises(ImportFailed, match="--backbone"):
        import_gliner(bare, tmp_path / "models")
    assert not (tmp_path / "models" / "gliner-small-v2.1").exists()

    backbone = tmp_path / "backbone"  # config + tokenizer only: the weights are in the GLiNER file
    _deberta_config(_save_tokenizer(backbone)).save_pretrained(backbone)
    installed = import_gliner(bare, tmp_path / "models", backbone=backbone)
    shutil.rmtree(backbone)
    manifest = gliner_pii.check_gliner_dir(installed)
    assert manifest.version.startswith("urchade/gliner_small-v2.1@sha256-")
    assert gliner_pii.GlinerModel(installed).predict(["Jo lives here"], ["person"], 0.5) is not None


def test_base_install_serves_classify_without_torch(detector_models: TinyModels) -> None:  # noqa: F811
    """With torch / transformers / gliner unimportable every module imports, Classify serves from
    onnxruntime + tokenizers alone, and the PII model reports the missing extra."""
    script = textwrap.dedent(f"""
        import sys, asyncio
        for name in ("torch", "transformers", "gliner"):
            sys.modules[name] = None
        import entrypoints.detector.cli, inference.detector.importer
        import entrypoints.detector.server
        from inference.detector.service import DetectorServicer
        from inference.detector.settings import DetectorSettings
        from upsquad.ml.v1 import detector_pb2

        async def main():
            s = DetectorServicer(DetectorSettings(models_dir={str(detector_models.models_dir)!r}))
            await s.load()
            r = await s.Classify(detector_pb2.ClassifyRequest(text="hi", model_hint="prompt-guard-86m"), None)
            try:
                await s.DetectPII(detector_pb2.DetectPIIRequest(text="hi", model_hint="gliner-small-v2.1"), None)
            except Exception as exc:
                print("PII", exc.reason, exc.message)
            print("HEALTH", s.health(), r.model_version)
            assert not any(m in sys.modules and sys.modules[m] for m in ("torch", "transformers", "gliner"))
            s.close()
        asyncio.run(main())
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "HEALTH {'prompt-guard-86m': True, 'gliner-small-v2.1': False} prompt-guard-86m@tiny-test" in done.stdout
    assert "PII DETECTOR_EXTRA_MISSING" in done.stdout and "detector" in done.stdout


# --- the service token (inference/detector/token.py) ------------------------------------------------


def test_without_a_set_token_the_homes_token_file_is_made_once_0600(tmp_path: pathlib.Path) -> None:
    from context_engine.config import Settings
    from inference.detector.token import service_token

    settings = Settings(home=tmp_path)
    token = service_token(settings)
    path = tmp_path / "keys" / "detector-service.token"
    assert path.read_text().strip() == token and len(token) == 64
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o077 == 0
    assert service_token(Settings(home=tmp_path)) == token  # every process of the home agrees
    assert service_token(Settings(home=tmp_path, detector_service_token="set-one")) == "set-one"
    assert service_token(Settings(home=tmp_path, detector_service_token_file=tmp_path / "t")) != token


@pytest.mark.parametrize("token", ["", " ", "two words", "tab\there", "naïve"])
def test_a_set_token_that_could_not_be_sent_fails_the_start(tmp_path: pathlib.Path, token: str) -> None:
    from context_engine.config import Settings
    from entrypoints.detector.server import build_detector_server
    from inference.detector.token import service_token

    settings = Settings(home=tmp_path, detector_service_token=token)
    with pytest.raises(ValueError, match="visible ASCII"):
        service_token(settings)
    with pytest.raises(ValueError, match="visible ASCII"):  # an empty one would let an empty bearer in
        build_detector_server(settings, DetectorSettings(models_dir=tmp_path), address="127.0.0.1:0")
