"""The recipes in docs/identity.md work as written: a key pair, a test token, the gate accepts it.

The two shell blocks under "Recipes" are run verbatim (the gate's own Python
in place of ``.venv/bin/python``), and the token they mint is identified by
the identity provider that ``--identity jwt --jwt-public-key`` builds.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.config.load import load_settings
from sidecar.identity import AuthRequest
from sidecar.runtime.server import build_identity

ROOT = Path(__file__).resolve().parents[2]
IDENTITY_DOC = ROOT / "docs" / "identity.md"


def _recipe_blocks() -> list[str]:
    section = IDENTITY_DOC.read_text().split("## Recipes", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)```", section, flags=re.DOTALL)


def test_the_recipe_has_a_key_block_and_a_token_block() -> None:
    blocks = _recipe_blocks()
    assert len(blocks) == 2
    assert "openssl genpkey" in blocks[0]
    assert "jwt.encode" in blocks[1]


@pytest.mark.skipif(shutil.which("openssl") is None, reason="the recipe uses openssl")
def test_a_token_minted_by_the_recipe_is_accepted_by_jwt_mode(tmp_path: Path) -> None:
    for block in _recipe_blocks():
        script = block.replace(".venv/bin/python", sys.executable)
        subprocess.run(["bash", "-euc", script], cwd=tmp_path, check=True, timeout=60)
    settings = load_settings(
        None,
        {
            "identity": "jwt",
            "jwt_public_key": str(tmp_path / "gate-test.pub"),
            "issuer": "https://issuer.example",
            "audience": "retrieval-gate",
        },
    )
    token = (tmp_path / "alice.jwt").read_text().strip()
    request = AuthRequest(
        "POST", "/collections/sops/points/query", {"authorization": f"Bearer {token}"}
    )
    caller = asyncio.run(build_identity(settings).identify(request))
    assert caller.tenant == "acme"
    assert set(caller.principals) == {"user:alice", "group:qa"}
    # The private half stays with whoever mints tokens; the gate reads only the public one.
    assert "PRIVATE" not in (tmp_path / "gate-test.pub").read_text()
