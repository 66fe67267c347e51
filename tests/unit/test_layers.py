"""The layers of docs/architecture.md, checked by import-linter (``lint-imports``).

The contracts live in pyproject.toml. These tests show that the check passes
on the code as it is, that it fails when a module imports a layer above its
own, and that importing the decision core loads no adapter.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint_imports(project: Path) -> subprocess.CompletedProcess[str]:
    # The copy comes first on the path, so the package analysed is the one in ``project``.
    env = {**os.environ, "PYTHONPATH": str(project)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _copy_project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    shutil.copytree(
        ROOT / "sidecar",
        project / "sidecar",
        ignore=shutil.ignore_patterns("__pycache__", "policies"),
    )
    shutil.copy(ROOT / "pyproject.toml", project / "pyproject.toml")
    return project


def test_the_layers_hold() -> None:
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_an_upward_import_breaks_the_layer_contract(tmp_path: Path) -> None:
    project = _copy_project(tmp_path)
    core = project / "sidecar" / "core" / "decision_core.py"
    core.write_text(core.read_text() + "\nfrom sidecar.formats import qdrant  # noqa: E402\n")

    result = _lint_imports(project)

    assert result.returncode == 1, result.stdout + result.stderr
    assert "Layers: cli on top, the decision core at the bottom BROKEN" in result.stdout
    assert "sidecar.core.decision_core -> sidecar.formats.qdrant" in result.stdout


def test_sibling_packages_may_not_import_each_other(tmp_path: Path) -> None:
    project = _copy_project(tmp_path)
    jwt = project / "sidecar" / "identity" / "jwt.py"
    jwt.write_text(jwt.read_text() + "\nfrom sidecar.store import cache  # noqa: E402\n")

    result = _lint_imports(project)

    assert result.returncode == 1, result.stdout + result.stderr
    assert "sidecar.identity.jwt -> sidecar.store.cache" in result.stdout


def test_the_request_path_may_not_import_the_servicers(tmp_path: Path) -> None:
    project = _copy_project(tmp_path)
    plans = project / "sidecar" / "request" / "plans.py"
    plans.write_text(plans.read_text() + "\nfrom sidecar.envoy import messages  # noqa: E402\n")

    result = _lint_imports(project)

    assert result.returncode == 1, result.stdout + result.stderr
    assert "sidecar.request.plans -> sidecar.envoy.messages" in result.stdout


def test_a_servicer_may_not_make_a_decision_itself(tmp_path: Path) -> None:
    project = _copy_project(tmp_path)
    servicer = project / "sidecar" / "envoy" / "ext_proc.py"
    servicer.write_text(servicer.read_text() + "\nfrom sidecar import metrics  # noqa: E402\n")

    result = _lint_imports(project)

    assert result.returncode == 1, result.stdout + result.stderr
    assert "The servicers hold no decision BROKEN" in result.stdout
    assert "Layers: cli on top, the decision core at the bottom KEPT" in result.stdout


def test_importing_the_core_loads_no_adapter() -> None:
    probe = (
        "import sys, sidecar.core.decision_core, sidecar.core.hits, sidecar.core.policy\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('sidecar.')"
        " and not m.startswith('sidecar.core'))\n"
        "print(','.join(loaded))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == ""


def test_importing_the_formats_skeleton_loads_no_adapter() -> None:
    # The registry imports adapters; the package and its shared skeleton do not.
    skeleton = ["base", "body", "hits", "options", "rewriter", "grpc_adapter"]
    probe = (
        "import sys, importlib\n"
        f"for name in {skeleton!r}: importlib.import_module('sidecar.formats.' + name)\n"
        "databases = ('qdrant', 'chroma', 'weaviate', 'elasticsearch', 'pinecone', 'milvus',"
        " 'generic')\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[2:3] and"
        " m.startswith('sidecar.formats.') and m.split('.')[2] in databases)\n"
        "print(','.join(loaded))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == ""


def test_no_test_module_imports_another() -> None:
    # Helpers live in tests/fixtures/ (docs/architecture.md, "Testing"): a test
    # module that imports another runs that module's tests' imports and
    # fixtures too, and ties the two together.
    offenders = [
        f"{path.relative_to(ROOT)}: {line.strip()}"
        for folder in ("unit", "envoy", "servers")
        for path in sorted((ROOT / "tests" / folder).glob("*.py"))
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.lstrip().startswith(("from tests.unit", "from tests.envoy", "from tests.servers"))
        or line.lstrip().startswith(
            ("import tests.unit", "import tests.envoy", "import tests.servers")
        )
    ]
    assert offenders == []
