"""`context-engine models fetch` against a local server speaking the Hub's file API (HF_ENDPOINT),
serving the tiny models the detector tests build: a fetch into an empty data directory, a gated
model without and with a token, a corrupted file, an interrupted download resumed, an unpinned
model, the detector extra missing. After every failure the models directory holds nothing."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import pytest

from inference.detector import gliner_pii, prompt_guard
from inference.detector.model_manifest import MANIFEST
from inference.detector.settings import GLINER_NAME, PROMPT_GUARD_NAME
from tests.fixtures.detector_models import require_detector_extra
from tests.fixtures.hub_server import HubServer
from tests.fixtures.up import Up

pytestmark = pytest.mark.integration

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOKEN = "hf_test_token_for_the_gated_model"
PG, GL, BB = (MANIFEST[k]["repo"] for k in ("prompt-guard", "gliner", "gliner-backbone"))


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    """The three repositories as the Hub holds them, with tiny models (tiny_models.build_tiny_hub_repos)."""
    require_detector_extra()
    from inference.detector.tiny_models import build_tiny_hub_repos

    return build_tiny_hub_repos(tmp_path_factory.mktemp("hub"))


@pytest.fixture
def hub(repos: dict[str, pathlib.Path]) -> Iterator[HubServer]:
    with HubServer() as server:
        server.add_directory(PG, repos[PG], gated_token=TOKEN)
        server.add_directory(GL, repos[GL])
        server.add_directory(BB, repos[BB])
        yield server


def pinned_manifest(hub: HubServer, path: pathlib.Path) -> pathlib.Path:
    path.write_text(json.dumps({
        "prompt-guard": hub.manifest_entry(PG),
        "gliner": hub.manifest_entry(GL, backbone="gliner-backbone"),
        "gliner-backbone": hub.manifest_entry(BB),
    }))
    return path


def fetch(endpoint: str, home: pathlib.Path, *args: str, env: dict[str, str] | None = None,
          ) -> subprocess.CompletedProcess[str]:
    # Not the offline switches the importer sets in this process (TRANSFORMERS_OFFLINE counts for the hub too).
    environment = {k: v for k, v in os.environ.items()
                   if not k.startswith(("HF_", "CONTEXT_ENGINE_")) and k != "TRANSFORMERS_OFFLINE"}
    environment.update({"HF_ENDPOINT": endpoint, "HF_HOME": str(home / "hf-home"),
                        "HF_HUB_DISABLE_TELEMETRY": "1", **(env or {})})
    return subprocess.run([sys.executable, "-m", "context_engine", "models", "fetch", *args,
                           "--models-dir", str(home / "models")],
                          env=environment, capture_output=True, text=True, timeout=600)


def installed(home: pathlib.Path) -> list[str]:
    """What the models directory holds, hidden staging entries included."""
    models = home / "models"
    return sorted(p.name for p in models.iterdir()) if models.exists() else []


def test_fetch_all_into_an_empty_data_directory(hub: HubServer, tmp_path: pathlib.Path) -> None:
    (tmp_path / "token").write_text(TOKEN + "\n")
    manifest = pinned_manifest(hub, tmp_path / "pins.json")
    done = fetch(hub.endpoint, tmp_path, "all", "--manifest", str(manifest), "--token-file", str(tmp_path / "token"))
    assert done.returncode == 0, done.stderr
    assert installed(tmp_path) == sorted([PROMPT_GUARD_NAME, GLINER_NAME])
    assert done.stdout.split() == [str(tmp_path / "models" / PROMPT_GUARD_NAME), str(tmp_path / "models" / GLINER_NAME)]
    assert "pii rescan" in done.stderr
    # What the service loads, named by the commit it came from.
    classifier = prompt_guard.PromptGuard(tmp_path / "models" / PROMPT_GUARD_NAME)
    assert classifier.revision == hub.repos[PG].commit
    assert gliner_pii.check_gliner_dir(tmp_path / "models" / GLINER_NAME).version == f"{GL}@{hub.repos[GL].commit}"
    recorded = json.loads((tmp_path / "models" / GLINER_NAME / "fetched.json").read_text())
    assert recorded["endpoint"] == hub.endpoint
    assert {k: (r["pinned"], r["revision"]) for k, r in recorded.items() if k != "endpoint"} == {
        "gliner": (True, hub.repos[GL].commit), "gliner-backbone": (True, hub.repos[BB].commit)}
    # Only the pinned commit was asked for, and the downloads sit beside the models directory.
    assert {r.path.split("/resolve/")[1].split("/")[0] for r in hub.requests} == {
        hub.repos[PG].commit, hub.repos[GL].commit, hub.repos[BB].commit}
    assert (tmp_path / "model-downloads" / f"{GL.replace('/', '--')}@{hub.repos[GL].commit}").is_dir()
    # Again without --force: refused before anything is downloaded.
    before = len(hub.requests)
    again = fetch(hub.endpoint, tmp_path, "gliner", "--manifest", str(manifest))
    assert again.returncode == 1 and "already exists; pass --force" in again.stderr
    # `all` again (as after a failure half way): what is installed is skipped, nothing downloaded.
    rest = fetch(hub.endpoint, tmp_path, "all", "--manifest", str(manifest))
    assert rest.returncode == 0 and rest.stderr.count("is installed; skipped") == 2, rest.stderr
    assert len(hub.requests) == before


def test_a_gated_model_without_a_token_says_where_to_accept_the_licence(hub: HubServer, tmp_path: pathlib.Path) -> None:
    manifest = pinned_manifest(hub, tmp_path / "pins.json")
    done = fetch(hub.endpoint, tmp_path, "prompt-guard", "--manifest", str(manifest))
    assert done.returncode == 1
    assert f"accept the licence at https://huggingface.co/{PG}" in done.stderr and "HF_TOKEN" in done.stderr
    assert installed(tmp_path) == []
    wrong = fetch(hub.endpoint, tmp_path, "prompt-guard", "--manifest", str(manifest), env={"HF_TOKEN": "hf_wrong"})
    assert wrong.returncode == 1 and "the token given was refused" in wrong.stderr, wrong.stderr
    assert installed(tmp_path) == []
    right = fetch(hub.endpoint, tmp_path, "prompt-guard", "--manifest", str(manifest), env={"HF_TOKEN": TOKEN})
    assert right.returncode == 0, right.stderr
    assert installed(tmp_path) == [PROMPT_GUARD_NAME]


def test_a_corrupted_file_is_refused_and_deleted(hub: HubServer, tmp_path: pathlib.Path) -> None:
    manifest = pinned_manifest(hub, tmp_path / "pins.json")
    hub.corrupt.add("pytorch_model.bin")
    done = fetch(hub.endpoint, tmp_path, "gliner", "--manifest", str(manifest))
    assert done.returncode == 1
    assert "pytorch_model.bin: SHA-256" in done.stderr and "is not the manifest's" in done.stderr, done.stderr
    assert installed(tmp_path) == []
    assert not list((tmp_path / "model-downloads").rglob("pytorch_model.bin"))


def test_an_interrupted_download_resumes_where_it_stopped(hub: HubServer, tmp_path: pathlib.Path) -> None:
    """huggingface_hub writes what it receives in 10 MiB pieces, so the interrupted file is larger
    than that: a 24 MiB file the GLiNER repository holds beside its weights."""
    big = bytes(range(256)) * (24 * 4096)
    hub.repos[GL].files["notes.bin"] = big
    entry = hub.manifest_entry(GL, backbone="gliner-backbone")
    manifest = pinned_manifest(hub, tmp_path / "pins.json")
    pins = json.loads(manifest.read_text())
    pins["gliner"] = entry
    manifest.write_text(json.dumps(pins))
    hub.drop_after["notes.bin"] = 15 << 20
    cut = fetch(hub.endpoint, tmp_path, "gliner", "--manifest", str(manifest))
    assert cut.returncode == 1 and "cannot download" in cut.stderr, cut.stderr
    assert installed(tmp_path) == []
    (partial,) = (tmp_path / "model-downloads").rglob("*.incomplete")  # huggingface_hub names it by the file's id
    kept = partial.stat().st_size
    assert 0 < kept < len(big)
    hub.drop_after.clear()
    hub.requests.clear()
    done = fetch(hub.endpoint, tmp_path, "gliner", "--manifest", str(manifest))
    assert done.returncode == 0, done.stderr
    ranges = [r.range for r in hub.requests if r.method == "GET" and r.path.endswith("/notes.bin")]
    assert ranges == [f"bytes={kept}-"]  # the second run asked only for the rest
    assert installed(tmp_path) == [GLINER_NAME]


def test_an_unpinned_model_needs_unpinned_and_prints_its_pins(hub: HubServer, tmp_path: pathlib.Path) -> None:
    """This build's manifest pins nothing it could not read from the Hub (model_manifest.py): refused
    before any request without --unpinned; with it, fetched from main, and the pins printed are what
    was served."""
    refused = fetch(hub.endpoint, tmp_path, "gliner")
    assert refused.returncode == 1 and "pass --unpinned" in refused.stderr and not hub.requests
    done = fetch(hub.endpoint, tmp_path, "gliner", "--unpinned", "--print-pins")
    assert done.returncode == 0, done.stderr
    pins = json.loads(done.stdout[done.stdout.index("{"):])
    assert pins["gliner"]["revision"] == hub.repos[GL].commit
    assert pins["gliner-backbone"]["files"] == hub.manifest_entry(BB)["files"]
    assert {n: p["sha256"] for n, p in pins["gliner"]["files"].items()} == {
        n: hashlib.sha256(b).hexdigest() for n, b in hub.repos[GL].files.items()}
    recorded = json.loads((tmp_path / "models" / GLINER_NAME / "fetched.json").read_text())
    assert recorded["gliner"]["pinned"] is False and recorded["gliner"]["revision"] == hub.repos[GL].commit
    # What --print-pins printed is a manifest: the same bytes fetched again, pinned this time.
    (tmp_path / "printed.json").write_text(json.dumps(pins))
    again = fetch(hub.endpoint, tmp_path, "gliner", "--force", "--manifest", str(tmp_path / "printed.json"))
    assert again.returncode == 0, again.stderr
    assert json.loads((tmp_path / "models" / GLINER_NAME / "fetched.json").read_text())["gliner"]["pinned"] is True


def test_no_server_is_a_clear_error(tmp_path: pathlib.Path) -> None:
    with HubServer() as hub:
        gone = hub.endpoint  # a port nothing listens on once the server has stopped
    done = fetch(gone, tmp_path, "gliner", "--unpinned")
    assert done.returncode == 1 and "cannot download" in done.stderr and "--from DIR" in done.stderr, done.stderr
    assert installed(tmp_path) == []


def sh_blocks(heading: str) -> list[list[str]]:
    """The commands of each ```sh block under a README heading, comments dropped."""
    readme = (ROOT / "README.md").read_text()
    section = re.search(rf"## {heading}\n(.*?)\n## ", readme, flags=re.S)
    assert section, f"the README has no '{heading}'"
    return [[line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]
            for block in re.findall(r"```sh\n(.*?)```", section[1], flags=re.S)]


def a_canary_the_tiny_gliner_finds(installed_gliner: pathlib.Path) -> dict[str, str]:
    """Detector settings under which the tiny, randomly initialised GLiNER passes the anti-collapse
    canary: the one word it gives a PII class (tiny_models.CANARY_WORD) as the canary, expected as
    that class, the threshold just under its score. A real GLiNER passes the default canary."""
    from inference.detector.tiny_models import CANARY_WORD

    model = gliner_pii.GlinerModel(installed_gliner)
    best = max(model.predict([CANARY_WORD], gliner_pii.PROMPT_LABEL_NAMES, 0.0)[0], key=lambda s: s.score)
    expect = {gliner_pii.LABEL_TO_CLASS[best.label]: CANARY_WORD}
    return {"CONTEXT_ENGINE_DETECTOR_PII_CANARY_TEXT": CANARY_WORD,
            "CONTEXT_ENGINE_DETECTOR_PII_CANARY_EXPECT": json.dumps(expect),
            "CONTEXT_ENGINE_DETECTOR_PII_THRESHOLD": f"{best.score - 0.02:.4f}"}


def banner_line(up: Up, needle: str) -> str:
    """The banner's line holding `needle`, once `up` has printed the banner's last line; "" when it has none."""
    deadline = time.monotonic() + 120  # bounds a hang; the banner follows SERVING at once
    while not any("Ctrl-C or SIGTERM stops everything" in line for line in up.lines):
        assert time.monotonic() < deadline, "".join(up.lines)
        time.sleep(0.1)
    return next((line for line in up.lines if needle in line), "")


def test_the_readme_memory_on_a_fresh_machine_runs_as_written(hub: HubServer) -> None:
    """README "Memory on a fresh machine" against the local Hub: a stack without models quarantines a
    push; with it stopped, the paragraph's commands (`make install-detector` as a dry run: the suite's
    environment has the extra), `up` again, `pii rescan`, and the push is searchable."""
    fetch_block, rescan_block = sh_blocks("Memory on a fresh machine")
    binary = str(pathlib.Path(sys.executable).parent / "context-engine")
    with tempfile.TemporaryDirectory(prefix="context-engine-test-") as path:
        here = pathlib.Path(path)
        home = here / ".context-engine"

        def run(command: str, env: dict[str, str]) -> str:
            done = subprocess.run(command.replace(".venv/bin/context-engine", binary), shell=True, cwd=here,
                                  env=env, capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, f"{command}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
            return done.stdout + done.stderr

        scope = "--org acme --pillar sales --team emea"
        push = ('.venv/bin/context-engine call PushContext \'{"session_id": "s1", "memory_type": "semantic", '
                f'"content": {{"text": "Favourite tea: oolong, brewed at 85 degrees."}}}}\' {scope}')
        search = f'.venv/bin/context-engine call Search \'{{"query": "favourite tea", "min_score": 1e-6}}\' {scope}'
        up = Up(home, cwd=here)
        try:
            up.wait_serving()
            assert banner_line(up, "no PII model"), "".join(up.lines)
            assert "models fetch gliner --unpinned" in banner_line(up, "no PII model")
            run(push, up.env)
            assert "engine.quarantined_matches: 1" in run(search, up.env)
        finally:
            up.stop()

        # A user's shell: not the offline switches the importer sets in this process for the tests before.
        env = {**{k: v for k, v in up.env.items() if not k.startswith("HF_") and k != "TRANSFORMERS_OFFLINE"},
               "HF_ENDPOINT": hub.endpoint, "HF_HOME": str(here / "hf-home")}
        for command in fetch_block:
            if command.startswith("make "):
                dry = subprocess.run(["make", "-n", command.split()[1]], cwd=ROOT, capture_output=True, text=True)
                assert dry.returncode == 0 and ".[detector]" in dry.stdout, dry.stdout + dry.stderr
            elif command.startswith("export HF_TOKEN="):
                env["HF_TOKEN"] = TOKEN
            else:
                run(command, env)
        assert installed(here / ".context-engine") == sorted([PROMPT_GUARD_NAME, GLINER_NAME])

        up = Up(home, cwd=here, env=a_canary_the_tiny_gliner_finds(home / "models" / GLINER_NAME))
        try:
            up.wait_serving()
            assert not banner_line(up, "no PII model"), "".join(up.lines)
            (rescan,) = rescan_block
            assert "cleared 1, still quarantined 0" in run(rescan, up.env)
            # Searchable once its chunk has a vector (the text may be all redactions: the random model
            # takes words for names), nothing held back. The wait bounds a hang; the answer is the verdict.
            deadline = time.monotonic() + 120
            while '"source": "memory:' not in (found := run(search, up.env)) and time.monotonic() < deadline:
                time.sleep(0.5)
            assert '"source": "memory:' in found and "quarantined_matches: 1" not in found, found
        finally:
            up.stop()
