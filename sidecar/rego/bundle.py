"""Policy bundles in OPA's bundle format: read a ``.tar.gz``, check it, verify its signature.

A bundle holds ``.rego`` files (unit tests, ``*_test.rego``, included), ``data.json``
files (each one's document sits at the path of its directory: ``a/b/data.json`` is
``data.a.b``), a ``.manifest`` (``revision``, ``roots``, ``rego_version``) and, when
signed, a ``.signatures.json`` (checked as OPA checks it:
``sidecar.rego.bundle_signature``). What ``opa build`` and ``opa sign`` write is
accepted: a policy-only bundle (``roots`` and a ``data.json`` of ``{}``, or no
data at all) included.

Nothing is extracted to disk: members are read in memory, within size limits, and
a path that is absolute after OPA's leading ``/``, climbs with ``..`` or is not a
regular file refuses the whole bundle. Every refusal is a BundleError whose
``reason`` is one of a closed set (a metric label).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import posixpath
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from sidecar.core.policy import PolicyError
from sidecar.rego.bundle_signature import SignatureError, Verification, verify_signatures
from sidecar.rego.policy_data import SCHEMA_FILE, read_schema
from sidecar.rego.regorus_engine import compile_sources, package_path

# Limits: a bundle is policy and small reference data, never a data set.
MAX_BUNDLE_BYTES = 16 * 1024 * 1024  # compressed, as fetched
MAX_UNPACKED_BYTES = 64 * 1024 * 1024  # all members together
MAX_FILE_BYTES = 16 * 1024 * 1024
MAX_FILES = 2000
MAX_REVISION_CHARS = 128

MANIFEST = ".manifest"
SIGNATURES = ".signatures.json"
_DATA_FILE = "data.json"
# OPA's other file kinds, which this gate cannot honour: refused, never ignored.
_UNSUPPORTED = frozenset({"data.yaml", "data.yml", "patch.json", "policy.wasm"})

# BundleError reasons, a closed set: the label of the refused-bundles metric.
FORMAT = "format"
TOO_LARGE = "too_large"
UNSAFE_PATH = "unsafe_path"
UNSIGNED = "unsigned"
SIGNATURE = "signature"
ROOTS = "roots"
BUNDLE_REASONS = (FORMAT, TOO_LARGE, UNSAFE_PATH, UNSIGNED, SIGNATURE, ROOTS)


class BundleError(PolicyError):
    """A bundle was refused; ``reason`` says why, from a closed set."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Bundle:
    """The checked contents of one bundle."""

    revision: str
    roots: tuple[str, ...]
    rego: Mapping[str, str]
    """Path in the bundle -> Rego text, unit tests included."""
    data: Mapping[str, Any]
    """Every ``data.json`` merged at its directory's path."""
    signed: bool
    digest: str = field(default="")
    """SHA-256 of the bundle file as fetched."""
    data_schema: Mapping[str, Any] | None = None
    """The bundle's ``data.schema.json`` (its policy's data contract), if it has one."""

    def policy_sources(self) -> dict[str, str]:
        """The Rego files without the unit tests (``*_test.rego``)."""
        return {name: text for name, text in self.rego.items() if not _is_test(name)}


def read_bundle(blob: bytes, *, verification: Verification | None = None) -> Bundle:
    """Read and check the bundle ``blob`` (a ``.tar.gz``).

    With ``verification`` the bundle must carry one signature, made with the
    configured key and algorithm, over exactly its files, and every file's
    digest must match. Without it, a bundle that carries a signature is
    refused too: OPA refuses to activate a signed bundle it cannot verify, and
    a signature nobody checks would only look like protection. Raises BundleError.
    """
    if len(blob) > MAX_BUNDLE_BYTES:
        raise BundleError(TOO_LARGE, f"bundle is over {MAX_BUNDLE_BYTES} bytes")
    files = _members(blob)
    signatures = files.pop(SIGNATURES, None)
    if verification is not None:
        if signatures is None:
            raise BundleError(UNSIGNED, f"bundle has no {SIGNATURES} and a public key is set")
        try:
            verify_signatures(files, signatures, verification)
        except SignatureError as exc:
            raise BundleError(SIGNATURE, str(exc)) from None
    elif signatures is not None:
        raise BundleError(
            SIGNATURE,
            f"bundle carries {SIGNATURES} but no policy.bundle_public_key is set to verify it",
        )
    revision, roots = _manifest(files.pop(MANIFEST, None))
    rego: dict[str, str] = {}
    data: dict[str, Any] = {}
    data_schema: dict[str, Any] | None = None
    for name, content in sorted(files.items()):
        base = posixpath.basename(name)
        if base in _UNSUPPORTED:
            raise BundleError(FORMAT, f"{name}: this gate does not support {base} in bundles")
        if name.endswith(".rego"):
            rego[name] = _text(name, content)
        elif name == SCHEMA_FILE:
            try:
                data_schema = read_schema(content, name)
            except PolicyError as exc:
                raise BundleError(FORMAT, str(exc)) from None
        elif base == _DATA_FILE:
            _merge(data, _directory_segments(name), _json(name, content), name)
    if not rego:
        raise BundleError(FORMAT, "bundle has no .rego file")
    _check_roots(roots, rego, data)
    return Bundle(
        revision=revision,
        roots=roots,
        rego=rego,
        data=data,
        signed=verification is not None,
        digest=hashlib.sha256(blob).hexdigest(),
        data_schema=data_schema,
    )


def _is_test(name: str) -> bool:
    return name.endswith("_test.rego")


def _members(blob: bytes) -> dict[str, bytes]:
    """Every regular file of the archive by its normalised path; refuses unsafe members."""
    files: dict[str, bytes] = {}
    total = 0
    try:
        # The gzip stream is read with a bound, so a small bomb cannot fill memory.
        with gzip.GzipFile(fileobj=io.BytesIO(blob)) as stream:
            raw = stream.read(MAX_UNPACKED_BYTES + 1)
        if len(raw) > MAX_UNPACKED_BYTES:
            raise BundleError(TOO_LARGE, f"bundle unpacks to over {MAX_UNPACKED_BYTES} bytes")
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as archive:
            for number, member in enumerate(archive):
                if number >= MAX_FILES:
                    raise BundleError(TOO_LARGE, f"bundle has over {MAX_FILES} members")
                if member.isdir():
                    continue
                name = _safe_name(member.name)
                if not member.isfile():
                    raise BundleError(UNSAFE_PATH, f"{name}: not a regular file")
                if member.size > MAX_FILE_BYTES:
                    raise BundleError(TOO_LARGE, f"{name}: over {MAX_FILE_BYTES} bytes")
                total += member.size
                if total > MAX_UNPACKED_BYTES:
                    raise BundleError(TOO_LARGE, f"bundle unpacks to over {MAX_UNPACKED_BYTES}")
                if name in files:
                    raise BundleError(FORMAT, f"{name}: appears twice in the bundle")
                extracted = archive.extractfile(member)
                if extracted is None:
                    raise BundleError(FORMAT, f"{name}: cannot be read")
                files[name] = extracted.read()
    except (OSError, EOFError, tarfile.TarError, gzip.BadGzipFile) as exc:
        raise BundleError(FORMAT, f"not a tar.gz bundle: {type(exc).__name__}") from None
    return files


def _safe_name(name: str) -> str:
    # OPA writes members as "/data.json"; one leading slash is its convention.
    stripped = name[1:] if name.startswith("/") else name
    stripped = stripped.removeprefix("./")
    parts = stripped.split("/")
    if (
        not stripped
        or stripped.startswith("/")
        or "\\" in stripped
        or "\x00" in stripped
        or any(part in ("", ".", "..") for part in parts)
    ):
        raise BundleError(UNSAFE_PATH, f"unsafe member path {name!r}")
    return stripped


def _manifest(content: bytes | None) -> tuple[str, tuple[str, ...]]:
    if content is None:
        return "", ("",)
    manifest = _json(MANIFEST, content)
    if not isinstance(manifest, dict):
        raise BundleError(FORMAT, f"{MANIFEST} must be a JSON object")
    revision = manifest.get("revision", "")
    if (
        not isinstance(revision, str)
        or len(revision) > MAX_REVISION_CHARS
        or not revision.isprintable()
    ):
        raise BundleError(
            FORMAT, f"{MANIFEST}: revision must be printable text of {MAX_REVISION_CHARS} or less"
        )
    roots = manifest.get("roots", [""])
    if not isinstance(roots, list) or not all(isinstance(root, str) for root in roots):
        raise BundleError(FORMAT, f"{MANIFEST}: roots must be a list of strings")
    stripped = tuple(root.strip("/") for root in roots)
    _check_no_overlap(stripped)
    _check_rego_versions(manifest)
    return revision, stripped


def _check_no_overlap(roots: tuple[str, ...]) -> None:
    """OPA refuses roots of which one contains another: two bundles could claim one path."""
    for index, root in enumerate(roots):
        for other in roots[index + 1 :]:
            if "" in (root, other) or _under_roots(root, (other,)) or _under_roots(other, (root,)):
                raise BundleError(
                    ROOTS, f"{MANIFEST}: roots {root or '/'!r} and {other or '/'!r} overlap"
                )


def _check_rego_versions(manifest: dict[str, Any]) -> None:
    """The gate evaluates Rego v1; a bundle that declares v0 files is refused, not misread."""
    declared = manifest.get("rego_version", 1)
    per_file = manifest.get("file_rego_versions", {})
    if not isinstance(per_file, dict):
        raise BundleError(FORMAT, f"{MANIFEST}: file_rego_versions must be an object")
    for where, version in [("rego_version", declared), *per_file.items()]:
        if type(version) is not int or version not in (0, 1):
            raise BundleError(FORMAT, f"{MANIFEST}: {where}: the Rego version must be 0 or 1")
        if version == 0:
            raise BundleError(
                FORMAT,
                f"{MANIFEST}: {where} declares Rego v0, which this gate does not evaluate; "
                "convert the policy with `opa fmt --v0-v1` and rebuild the bundle",
            )


def _text(name: str, content: bytes) -> str:
    try:
        return content.decode("utf-8")
    except UnicodeDecodeError:
        raise BundleError(FORMAT, f"{name}: not UTF-8") from None


def _json(name: str, content: bytes) -> Any:
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError:
        raise BundleError(FORMAT, f"{name}: not valid JSON") from None


def _directory_segments(name: str) -> list[str]:
    directory = posixpath.dirname(name)
    return directory.split("/") if directory else []


def _merge(data: dict[str, Any], segments: list[str], document: Any, name: str) -> None:
    # The root data.json must be an object; one deeper may hold any JSON value.
    if not segments and not isinstance(document, dict):
        raise BundleError(FORMAT, f"{name}: the root data file must be a JSON object")
    node = data
    for segment in segments[:-1]:
        child = node.setdefault(segment, {})
        if not isinstance(child, dict):
            raise BundleError(FORMAT, f"{name}: its path is a value in another data file")
        node = child
    _merge_objects(node, document if not segments else {segments[-1]: document}, name)


def _merge_objects(target: dict[str, Any], source: Mapping[str, Any], name: str) -> None:
    for key, value in source.items():
        if key in target:
            if isinstance(target[key], dict) and isinstance(value, dict):
                _merge_objects(target[key], value, name)
                continue
            raise BundleError(FORMAT, f"{name}: {key!r} is also set by another data file")
        target[key] = value


def _check_roots(roots: tuple[str, ...], rego: Mapping[str, str], data: Mapping[str, Any]) -> None:
    """Every package and every data path must lie under one of the manifest's roots."""
    if "" in roots:
        return
    try:
        modules = orjson.loads(compile_sources(rego).get_ast_as_json())
        packages = ["/".join(package_path(module)) for module in modules]
    except (KeyError, TypeError, IndexError, orjson.JSONDecodeError) as exc:
        raise BundleError(FORMAT, f"cannot read the packages: {exc!r}") from None
    except PolicyError as exc:
        raise BundleError(FORMAT, str(exc)) from None
    for package in packages:
        if not _under_roots(package, roots):
            raise BundleError(ROOTS, f"package {package.replace('/', '.')} is outside the roots")
    for path in _data_leaves(data, ""):
        if not _under_roots(path, roots):
            raise BundleError(ROOTS, f"data at {path or '/'} is outside the roots")


def _under_roots(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == root or path.startswith(root + "/") for root in roots)


def _data_leaves(node: Any, prefix: str) -> list[str]:
    """The paths to check against the roots: descend while an object could still
    hold a root deeper down. An empty root object is no data at all: it is what
    ``opa build`` writes for a policy-only bundle."""
    if not isinstance(node, dict) or not node:
        return [prefix] if prefix or node != {} else []
    paths = []
    for key, value in node.items():
        path = f"{prefix}/{key}" if prefix else key
        paths.extend(_data_leaves(value, path))
    return paths
