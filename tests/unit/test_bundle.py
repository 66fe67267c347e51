"""Policy bundles in OPA's format (sidecar/rego/bundle.py): reading, safety, signatures.

The helpers here build real ``.tar.gz`` bundles and sign them as ``opa sign``
does (a JWT over every file's SHA-256), with keys generated per test run; the
reload and Envoy tests use them too.
"""

from __future__ import annotations

import hashlib
import io
import tarfile

import jwt
import orjson
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from sidecar.rego import bundle as bundle_module
from sidecar.rego.bundle import BundleError, read_bundle
from sidecar.rego.bundle_signature import Verification
from tests.fixtures.bundles import make_bundle, policy_files, rsa_pair, signatures_for, tar_gz


@pytest.fixture(scope="module")
def keys() -> tuple[bytes, bytes]:
    return rsa_pair()


def _refused(
    reason: str, blob: bytes, public_key: bytes | None = None, **verifying: str
) -> BundleError:
    verification = None if public_key is None else Verification(public_key, **verifying)
    with pytest.raises(BundleError) as caught:
        read_bundle(blob, verification=verification)
    assert caught.value.reason == reason, str(caught.value)
    return caught.value


def test_reads_manifest_rego_and_data_at_their_paths() -> None:
    files = {
        **policy_files(),
        "data.json": b'{"retrieval_gate": {"routes": {"allow_writes": false}}}',
        "retrieval_gate/collections/data.json": b'{"sops": {"tenants": ["acme"]}}',
    }
    bundle = read_bundle(make_bundle(files, revision="2024-06-01.1", roots=["retrieval_gate"]))
    assert bundle.revision == "2024-06-01.1"
    assert bundle.roots == ("retrieval_gate",)
    assert set(bundle.rego) == set(policy_files())
    assert set(bundle.policy_sources()) == set(policy_files(with_tests=False))
    assert bundle.data == {
        "retrieval_gate": {
            "routes": {"allow_writes": False},
            "collections": {"sops": {"tenants": ["acme"]}},
        }
    }
    assert not bundle.signed


def test_members_without_opa_leading_slash_read_the_same() -> None:
    blob = make_bundle(policy_files(), leading_slash=False)
    assert set(read_bundle(blob).rego) == set(policy_files())


def test_without_manifest_the_revision_is_empty_and_roots_everything() -> None:
    bundle = read_bundle(make_bundle(policy_files(), revision=None))
    assert (bundle.revision, bundle.roots) == ("", ("",))


@pytest.mark.parametrize(
    "name", ["../evil.rego", "retrieval_gate/../../evil.rego", "a/./b.rego", "a//b.rego"]
)
def test_a_path_that_climbs_or_is_ambiguous_is_refused(name: str) -> None:
    _refused("unsafe_path", tar_gz({**policy_files(), name: b"package x"}, leading_slash=False))


def test_an_absolute_path_after_opas_slash_is_refused() -> None:
    _refused("unsafe_path", tar_gz({"/etc/x.rego": b"package x"}, leading_slash=True))


def test_a_symlink_is_refused() -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        info = tarfile.TarInfo("link.rego")
        info.type = tarfile.SYMTYPE
        info.linkname = "/etc/passwd"
        archive.addfile(info)
    _refused("unsafe_path", buffer.getvalue())


def test_oversize_bundles_and_members_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    blob = make_bundle({**policy_files(), "big/data.json": b'{"x": "' + b"a" * 5000 + b'"}'})
    monkeypatch.setattr(bundle_module, "MAX_FILE_BYTES", 4096)
    _refused("too_large", blob)
    monkeypatch.setattr(bundle_module, "MAX_BUNDLE_BYTES", len(blob) - 1)
    _refused("too_large", blob)


def test_a_gzip_bomb_is_refused_without_unpacking_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bundle_module, "MAX_UNPACKED_BYTES", 1024 * 1024)
    blob = make_bundle({**policy_files(), "zeros/data.json": b" " * (4 * 1024 * 1024) + b"{}"})
    assert len(blob) < 200_000
    _refused("too_large", blob)


def test_not_a_tar_gz_is_refused() -> None:
    _refused("format", b"not a bundle")


def test_a_package_outside_the_roots_is_refused() -> None:
    files = {**policy_files(), "other/x.rego": b"package other.x\nallow := true\n"}
    _refused("roots", make_bundle(files, roots=["retrieval_gate"]))


def test_data_outside_the_roots_is_refused() -> None:
    files = {**policy_files(), "data.json": b'{"elsewhere": {"x": 1}}'}
    _refused("roots", make_bundle(files, roots=["retrieval_gate"]))


def test_unsupported_file_kinds_are_refused_not_ignored() -> None:
    _refused("format", make_bundle({**policy_files(), "data.yaml": b"x: 1"}))


def test_conflicting_data_files_are_refused() -> None:
    files = {
        **policy_files(),
        "data.json": b'{"retrieval_gate": {"collections": 1}}',
        "retrieval_gate/collections/data.json": b'{"sops": {}}',
    }
    _refused("format", make_bundle(files))


def test_a_valid_signature_is_accepted(keys: tuple[bytes, bytes]) -> None:
    private, public = keys
    bundle = read_bundle(
        make_bundle(policy_files(), private_key=private), verification=Verification(public)
    )
    assert bundle.signed and bundle.revision == "r1"


def test_an_es256_signature_is_accepted() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    blob = make_bundle(policy_files(), private_key=private, algorithm="ES256")
    assert read_bundle(blob, verification=Verification(public, algorithm="ES256")).signed


def test_json_hashed_as_opa_does_is_accepted(keys: tuple[bytes, bytes]) -> None:
    private, public = keys
    data = b'{ "retrieval_gate" : { "b": 1, "a": 2 } }'
    members = {**policy_files(), "data.json": data, ".manifest": b'{"revision": "r1"}'}
    signed = dict(members)
    # OPA hashes JSON files in their compact, key-sorted form.
    canonical = orjson.dumps(orjson.loads(data), option=orjson.OPT_SORT_KEYS)
    token_members = {**members, "data.json": canonical}
    signed[".signatures.json"] = signatures_for(token_members, private, "RS256")
    assert read_bundle(tar_gz(signed), verification=Verification(public)).data == {
        "retrieval_gate": {"a": 2, "b": 1}
    }


def test_an_unsigned_bundle_is_refused_when_a_key_is_set(keys: tuple[bytes, bytes]) -> None:
    _refused("unsigned", make_bundle(policy_files()), keys[1])


def test_a_tampered_file_is_refused(keys: tuple[bytes, bytes]) -> None:
    private, public = keys
    members = {**policy_files(), ".manifest": b'{"revision": "r1"}'}
    members[".signatures.json"] = signatures_for(members, private, "RS256")
    name = "retrieval_gate/chunks.rego"
    members[name] = members[name].replace(b'"approved", ', b'"approved", "draft", ', 1)
    error = _refused("signature", tar_gz(members), public)
    assert name in str(error)


def test_an_added_file_is_refused(keys: tuple[bytes, bytes]) -> None:
    private, public = keys
    members = {**policy_files(), ".manifest": b'{"revision": "r1"}'}
    members[".signatures.json"] = signatures_for(members, private, "RS256")
    members["data.json"] = b'{"retrieval_gate": {"routes": {"allow_writes": true}}}'
    _refused("signature", tar_gz(members), public)


def test_a_signature_by_another_key_is_refused(keys: tuple[bytes, bytes]) -> None:
    other_private, _ = rsa_pair()
    _refused("signature", make_bundle(policy_files(), private_key=other_private), keys[1])


def test_a_symmetric_signature_is_refused(keys: tuple[bytes, bytes]) -> None:
    members = {**policy_files(), ".manifest": b'{"revision": "r1"}'}
    listed = [
        {"name": n, "hash": hashlib.sha256(c).hexdigest()} for n, c in sorted(members.items())
    ]
    # A shared-secret algorithm is never accepted, whatever the secret.
    token = jwt.encode({"files": listed}, "k" * 32, algorithm="HS256")
    members[".signatures.json"] = orjson.dumps({"signatures": [token]})
    _refused("signature", tar_gz(members), keys[1])
