"""What the command line leaves on the host (issue #41, item 5): a data directory and keys only
its user can read, a token lifetime the API accepts, and a looser directory named with its fix."""

from __future__ import annotations

import os
import subprocess
import sys

from context_engine.config import Settings
from entrypoints.capabilities import degraded_capabilities


def command(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXT_ENGINE_")}
    return subprocess.run([sys.executable, "-m", "context_engine", *args], capture_output=True, text=True,
                          timeout=60, env=env)


def test_token_mint_makes_a_data_directory_only_its_user_can_read(tmp_path):
    home = tmp_path / "fresh"
    minted = command("token", "mint", "--org", "acme", "--clearance", "2", "--data-dir", str(home))
    assert minted.returncode == 0, minted.stderr
    assert home.stat().st_mode & 0o777 == 0o700
    assert (home / "keys").stat().st_mode & 0o777 == 0o700
    assert all(p.stat().st_mode & 0o077 == 0 for p in (home / "keys").iterdir())


def test_token_mint_refuses_a_lifetime_the_api_would_refuse(tmp_path):
    refused = command("token", "mint", "--org", "acme", "--clearance", "2", "--ttl", "100000d",
                      "--data-dir", str(tmp_path))
    assert refused.returncode == 2 and "--ttl" in refused.stderr and "JWT_MAX_LIFETIME_SECONDS" in refused.stderr
    assert command("token", "mint", "--org", "acme", "--clearance", "2", "--ttl", "24h",
                   "--data-dir", str(tmp_path)).returncode == 0


def test_a_data_directory_others_can_read_is_named_with_its_fix(tmp_path):
    tmp_path.chmod(0o755)
    lines = degraded_capabilities(Settings(home=tmp_path), "context-engine")
    assert any(f"chmod 700 {tmp_path}" in line and "755" in line for line in lines)
    tmp_path.chmod(0o711)  # passing through only, as the embedded PostgreSQL's own user needs
    assert not any("chmod 700" in line for line in degraded_capabilities(Settings(home=tmp_path), "context-engine"))
