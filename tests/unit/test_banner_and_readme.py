"""The banner `up` prints once SERVING and the README's examples name the same scope (issue #39,
item 2): a token reads what its own scope and the scopes above it wrote, so a banner token of the
org alone found nothing the README's examples (acme/sales/emea) write."""

from __future__ import annotations

import pathlib
import re
import shlex

from entrypoints.supervisor import EXAMPLE_CLEARANCE, EXAMPLE_SCOPE, banner_commands

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"
SCOPE_OPTIONS = ("--org", "--pillar", "--team", "--agent")


def scope_of(words: list[str]) -> dict[str, str]:
    return {words[i][2:]: words[i + 1] for i in range(len(words) - 1) if words[i] in SCOPE_OPTIONS}


def readme_commands() -> list[list[str]]:
    """Each `context-engine call` and `token mint` command of the README's shell blocks, its
    continuation lines joined."""
    blocks = re.findall(r"```sh\n(.*?)```", README.read_text(), flags=re.S)
    commands = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\$\((.*)\)", r"\1", line)  # TOKEN=$(... token mint ...)
            words = shlex.split(line, comments=True)
            if "context-engine" in " ".join(words) and ("call" in words or "mint" in words):
                commands.append(words)
    return commands


def test_the_banner_token_and_call_use_the_readme_scope(tmp_path):
    token, call, note = banner_commands(tmp_path)
    token_words = shlex.split(token.split("get a token:", 1)[1])
    assert scope_of(token_words) == EXAMPLE_SCOPE == {"org": "acme", "pillar": "sales", "team": "emea"}
    assert token_words[token_words.index("--clearance") + 1] == str(EXAMPLE_CLEARANCE)
    call_words = shlex.split(call.split("or call it:", 1)[1])
    assert "call" in call_words and scope_of(call_words) == EXAMPLE_SCOPE
    assert "--org/--pillar/--team" in note

    written = readme_commands()
    assert len(written) >= 3, written  # IngestEvent, Search, token mint
    for words in written:
        if "NoSuchMethod" in words:
            continue
        assert scope_of(words) == EXAMPLE_SCOPE, words
    minted = [w for w in written if "mint" in w]
    assert [w[w.index("--clearance") + 1] for w in minted] == [str(EXAMPLE_CLEARANCE)]
