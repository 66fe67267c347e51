"""An application installs the LangChain adapter as docs/outside-a-mesh.md says, and it works.

The wheel is built from this checkout, installed with its ``langchain`` extra
into a new virtual environment (the application's, not the test's), and a
script run there filters documents through a real ``retrieval-gate serve``.
This is what proves the wheel carries the generated stubs the adapters import
and that the extra pulls what they need.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.gate_service import ADMITTED_IDS, COLLECTION, INDEX, jwt, start_gate
from tests.fixtures.harness import GateStack

ROOT = Path(__file__).resolve().parents[2]

# Runs in the application's environment: only what the wheel and its extra installed.
APPLICATION = """
import json, sys
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from sidecar.integrations.client import GateClient
from sidecar.integrations.langchain import GatedRetriever

given = json.load(sys.stdin)

class ListRetriever(BaseRetriever):
    documents: list[Document]
    def _get_relevant_documents(self, query, *, run_manager):
        return list(self.documents)

documents = [
    Document(page_content=text, metadata={"chunk_id": cid}) for cid, text in given["index"]
]
gate = GateClient(given["address"], timeout_seconds=10)
retriever = GatedRetriever(
    retriever=ListRetriever(documents=documents),
    gate=gate,
    credential=given["token"],
    collection=given["collection"],
)
print(json.dumps([d.metadata["chunk_id"] for d in retriever.invoke("pump reset")]))
"""


@pytest.fixture(scope="module")
def application_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Python of a new environment holding the wheel with its ``langchain`` extra."""
    workdir = tmp_path_factory.mktemp("application")
    wheels = workdir / "dist"
    pip = [sys.executable, "-m", "pip", "--quiet"]
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(wheels), str(ROOT)], check=True)
    (wheel,) = wheels.glob("retrieval_gate-*.whl")
    subprocess.run([sys.executable, "-m", "venv", str(workdir / "venv")], check=True)
    python = workdir / "venv" / "bin" / "python"
    install = [str(python), "-m", "pip", "--quiet", "install", f"{wheel}[langchain]"]
    subprocess.run(install, check=True)
    return python


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GateStack]:
    yield from start_gate(Path(tmp_path_factory.mktemp("installed-adapter")))


def test_the_installed_adapter_releases_only_admitted_documents(
    application_python: Path, stack: GateStack
) -> None:
    given = {
        "index": INDEX,
        "address": f"unix:{stack.gate_socket}",
        "token": jwt(),
        "collection": COLLECTION,
    }
    done = subprocess.run(
        [str(application_python), "-c", APPLICATION],
        cwd=application_python.parents[2],
        input=json.dumps(given),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ADMITTED_IDS


def test_the_application_environment_is_not_the_checkout(application_python: Path) -> None:
    # Importing from the checkout would prove nothing about the wheel (``-c`` puts
    # the working directory first on sys.path: the scripts run outside it).
    where = subprocess.run(
        [str(application_python), "-c", "import sidecar; print(sidecar.__file__)"],
        cwd=application_python.parents[2],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert str(ROOT) not in where
    assert "site-packages" in where
