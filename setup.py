"""Build hook: compile the .proto files in proto/ with grpcio-tools.

- ``proto/sidecar/``: Envoy's messages and the gate's own, as Python modules
  in ``sidecar/wire/``.
- ``proto/vendor/``: the gate's trimmed copies of the vector databases' gRPC
  messages, as one FileDescriptorSet (``sidecar/formats/vendor_protos.binpb``)
  that ``sidecar.formats.grpc_messages`` loads into a private descriptor pool.
  No Python modules are generated for them: the databases' own client packages
  register the same names in the default pool, and both can live in one process.

The generated files are not committed; every build (wheel, sdist, editable
install) regenerates them with the grpcio-tools version pinned in
pyproject.toml's build requirements, so the output is reproducible.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
PROTO_ROOT = ROOT / "proto"
VENDOR_ROOT = PROTO_ROOT / "vendor"
VENDOR_DESCRIPTORS = ROOT / "sidecar" / "formats" / "vendor_protos.binpb"


def _protoc(args: list[str], what: str) -> None:
    from grpc_tools import protoc

    if protoc.main(["grpc_tools.protoc", *args]) != 0:
        raise RuntimeError(f"protoc failed on {what}")


def compile_protos() -> None:
    import grpc_tools

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    for proto in sorted((PROTO_ROOT / "sidecar").rglob("*.proto")):
        _protoc(
            [
                f"--proto_path={PROTO_ROOT}",
                f"--proto_path={well_known}",
                f"--python_out={ROOT}",
                f"--pyi_out={ROOT}",
                f"--grpc_python_out={ROOT}",
                str(proto),
            ],
            str(proto.relative_to(ROOT)),
        )
    vendor = sorted(str(p.relative_to(VENDOR_ROOT)) for p in VENDOR_ROOT.rglob("*.proto"))
    if vendor:
        _protoc(
            [
                f"--proto_path={VENDOR_ROOT}",
                f"--proto_path={well_known}",
                "--include_imports",
                f"--descriptor_set_out={VENDOR_DESCRIPTORS}",
                *vendor,
            ],
            "proto/vendor",
        )


class BuildPyWithProtos(build_py):
    def run(self) -> None:
        compile_protos()
        super().run()


# setuptools runs this file as __main__; importing it (``python -c "import setup;
# setup.compile_protos()"``) regenerates the files after a .proto edit, without
# reinstalling.
if __name__ == "__main__":
    setup(cmdclass={"build_py": BuildPyWithProtos})
