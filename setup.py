"""Build hook: compile the .proto files in proto/ into sidecar/wire/ with grpcio-tools.

The generated modules are not committed; every build (wheel, sdist, editable
install) regenerates them from proto/ with the grpcio-tools version pinned in
pyproject.toml's build requirements, so the output is reproducible.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
PROTO_ROOT = ROOT / "proto"


def compile_protos() -> None:
    import grpc_tools
    from grpc_tools import protoc

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    for proto in sorted(PROTO_ROOT.rglob("*.proto")):
        args = [
            "grpc_tools.protoc",
            f"--proto_path={PROTO_ROOT}",
            f"--proto_path={well_known}",
            f"--python_out={ROOT}",
            f"--pyi_out={ROOT}",
            f"--grpc_python_out={ROOT}",
            str(proto),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {proto.relative_to(ROOT)}")


class BuildPyWithProtos(build_py):
    def run(self) -> None:
        compile_protos()
        super().run()


setup(cmdclass={"build_py": BuildPyWithProtos})
