"""Client adapters for applications outside a mesh: they call the gate's ``Gate/Filter``.

A client library, not part of the gate: these modules import only the
generated stubs (``sidecar.wire.gate_pb2``) and gRPC, never the gate's
internals (an import-linter contract in pyproject.toml). ``langchain`` needs
the ``retrieval-gate[langchain]`` extra, ``llamaindex`` the ``[llamaindex]``
one; ``client`` needs neither.
"""
