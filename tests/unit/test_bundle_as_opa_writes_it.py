"""Bundles laid out and signed as ``opa build`` and ``opa sign`` write them.

The digests in these tests' signatures are OPA's: ``data.json`` and
``.manifest`` are digested over Go's JSON encoding, produced by OPA's own
engine (tests/fixtures/opa_go.py), so a mismatch between the gate's
reimplementation (sidecar/rego/bundle_signature.py) and OPA shows here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.config import ConfigError, load_settings
from sidecar.rego.bundle import BundleError, read_bundle
from sidecar.rego.bundle_signature import SignatureError, Verification, file_digest
from sidecar.rego.reloading import prepare_revision
from tests.fixtures.bundles import make_bundle, policy_files, rsa_pair, signatures_for, tar_gz
from tests.fixtures.opa_go import go_json_encoding


@pytest.fixture(scope="module")
def keys() -> tuple[bytes, bytes]:
    return rsa_pair()


def signed(
    members: dict[str, bytes],
    private: bytes,
    *,
    algorithm: str = "RS256",
    claims: dict[str, object] | None = None,
    headers: dict[str, object] | None = None,
) -> bytes:
    with_signature = dict(members)
    with_signature[".signatures.json"] = signatures_for(
        members, private, algorithm, claims=claims, headers=headers
    )
    return tar_gz(with_signature)


def refusal(blob: bytes, verification: Verification | None) -> BundleError:
    with pytest.raises(BundleError) as caught:
        read_bundle(blob, verification=verification)
    return caught.value


MANIFEST = b'{"revision": "r1", "roots": ["retrieval_gate"]}'


# --- layout -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [None, b"{}", b"{\n}\n"],
    ids=["no data file", "empty data.json", "empty data.json, spaced"],
)
def test_a_policy_only_bundle_is_accepted(data: bytes | None) -> None:
    # `opa build` of a policy directory writes roots and a data.json of {}.
    members = {**policy_files(), ".manifest": MANIFEST}
    if data is not None:
        members["data.json"] = data
    bundle = read_bundle(tar_gz(members))
    assert bundle.data == {}
    assert prepare_revision(bundle).tests_run > 0


def test_data_outside_the_roots_is_still_refused() -> None:
    members = {**policy_files(), ".manifest": MANIFEST, "data.json": b'{"other": {}}'}
    assert refusal(tar_gz(members), None).reason == "roots"


@pytest.mark.parametrize(
    "roots",
    [["retrieval_gate", "retrieval_gate/chunks"], ["a", "a"], ["", "retrieval_gate"]],
)
def test_overlapping_roots_are_refused(roots: list[str]) -> None:
    blob = make_bundle(policy_files(), roots=roots)
    error = refusal(blob, None)
    assert error.reason == "roots" and "overlap" in str(error)


def test_rego_version_1_is_accepted_and_0_is_refused_not_misread() -> None:
    members = {**policy_files()}
    v1 = {**members, ".manifest": b'{"revision": "r1", "rego_version": 1}'}
    assert read_bundle(tar_gz(v1)).revision == "r1"
    for manifest in (
        b'{"rego_version": 0}',
        b'{"file_rego_versions": {"retrieval_gate/chunks.rego": 0}}',
    ):
        error = refusal(tar_gz({**members, ".manifest": manifest}), None)
        assert error.reason == "format" and "opa fmt --v0-v1" in str(error)
    error = refusal(tar_gz({**members, ".manifest": b'{"rego_version": "1"}'}), None)
    assert "must be 0 or 1" in str(error)


def test_the_readme_recipe_with_tests_and_example_data_is_accepted() -> None:
    # policies/README.md, "Bundles": the policies and their tests under
    # retrieval_gate/, the README's example collection data, roots
    # ["retrieval_gate"]. Every test must pass with that data present.
    members = {
        **policy_files(),
        "retrieval_gate/collections/data.json": b'{"sops": {"tenants": ["acme"]}}',
        ".manifest": b'{"revision": "2024-06-01.1", "roots": ["retrieval_gate"]}',
    }
    revision = prepare_revision(read_bundle(tar_gz(members)))
    assert revision.tests_run > 100


# --- signatures ---------------------------------------------------------------------


def test_data_that_go_encodes_differently_is_accepted(keys: tuple[bytes, bytes]) -> None:
    # U+2028 is escaped by Go's encoder; 1e3 and 2.50 keep their spelling.
    private, public = keys
    data = '{"retrieval_gate": {"note": "line\u2028break <&>", "limits": [1e3, 2.50, -0]}}'
    members = {**policy_files(), ".manifest": MANIFEST, "data.json": data.encode()}
    bundle = read_bundle(signed(members, private), verification=Verification(public))
    assert bundle.data["retrieval_gate"]["limits"] == [1000.0, 2.5, 0]


@pytest.mark.parametrize("algorithm", ["SHA-224", "SHA-384", "SHA-512", "SHA-512-256"])
def test_every_strong_digest_opa_names_is_accepted(
    algorithm: str, keys: tuple[bytes, bytes]
) -> None:
    private, public = keys
    members = {**policy_files(), ".manifest": MANIFEST}
    listed = [
        {"name": n, "hash": file_digest(n, c, algorithm), "algorithm": algorithm}
        for n, c in sorted(members.items())
    ]
    blob = tar_gz({**members, ".signatures.json": _token(listed, private)})
    assert read_bundle(blob, verification=Verification(public)).signed


@pytest.mark.parametrize(
    ("algorithm", "message"),
    [
        (None, "no digest algorithm"),
        ("", "no digest algorithm"),
        ("sha256", "unknown digest algorithm"),
        ("SHA256", "unknown digest algorithm"),
        ("MD5", "refused as weak"),
        ("SHA-1", "refused as weak"),
    ],
)
def test_a_missing_misspelled_or_weak_digest_algorithm_is_refused(
    algorithm: str | None, message: str, keys: tuple[bytes, bytes]
) -> None:
    private, public = keys
    members = {**policy_files(), ".manifest": MANIFEST}
    listed: list[dict[str, object]] = []
    for name, content in sorted(members.items()):
        entry: dict[str, object] = {"name": name, "hash": hashlib.sha256(content).hexdigest()}
        if algorithm is not None:
            entry["algorithm"] = algorithm
        listed.append(entry)
    blob = tar_gz({**members, ".signatures.json": _token(listed, private)})
    error = refusal(blob, Verification(public))
    assert error.reason == "signature" and message in str(error)


def test_the_scope_must_match(keys: tuple[bytes, bytes]) -> None:
    private, public = keys
    members = {**policy_files(), ".manifest": MANIFEST}
    blob = signed(members, private, claims={"scope": "write"})
    assert read_bundle(blob, verification=Verification(public, scope="write")).signed
    assert "scope" in str(refusal(blob, Verification(public)))
    unscoped = signed(members, private)
    assert "scope" in str(refusal(unscoped, Verification(public, scope="write")))


def test_a_signature_naming_another_key_id_is_refused(keys: tuple[bytes, bytes]) -> None:
    private, public = keys
    members = {**policy_files(), ".manifest": MANIFEST}
    named = signed(members, private, headers={"kid": "default"})
    assert read_bundle(named, verification=Verification(public)).signed
    for blob in (
        signed(members, private, headers={"kid": "other"}),
        signed(members, private, claims={"keyid": "other"}),
    ):
        error = refusal(blob, Verification(public))
        assert error.reason == "signature" and "key id" in str(error)
    custom = Verification(public, key_id="global_key")
    assert read_bundle(signed(members, private, headers={"kid": "global_key"}), verification=custom)


def test_only_the_configured_algorithm_is_accepted() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    blob = signed({**policy_files(), ".manifest": MANIFEST}, private, algorithm="ES256")
    assert read_bundle(blob, verification=Verification(public, algorithm="ES256")).signed
    # The default, RS256, as OPA's key config: an ES256 signature is refused.
    assert refusal(blob, Verification(public)).reason == "signature"


def test_a_signed_bundle_without_a_configured_key_is_refused(keys: tuple[bytes, bytes]) -> None:
    blob = make_bundle(policy_files(), private_key=keys[0])
    error = refusal(blob, None)
    assert error.reason == "signature" and "bundle_public_key" in str(error)


def test_a_json_file_other_than_data_json_is_digested_as_bytes(
    keys: tuple[bytes, bytes],
) -> None:
    # OPA digests only data.json and .manifest over their structure.
    name = "retrieval_gate/notes.json"
    content = b'{ "b": 1, "a": 2 }'
    assert file_digest(name, content, "SHA-256") == hashlib.sha256(content).hexdigest()
    assert file_digest("data.json", content, "SHA-256") != hashlib.sha256(content).hexdigest()


def _token(listed: Sequence[Mapping[str, object]], private: bytes) -> bytes:
    import jwt

    return json.dumps({"signatures": [jwt.encode({"files": listed}, private, "RS256")]}).encode()


# --- the structural digest against Go's encoder --------------------------------------

_TRICKY = st.sampled_from(
    ["\u2028", "\u2029", "\x00", "\x1f", "\b", "\f", "\n", "\t", '"', "\\", "<", ">", "&", "é"]
)
_text = st.lists(st.one_of(_TRICKY, st.characters(codec="utf-8")), max_size=8).map("".join)
_number_literals = st.sampled_from(
    ["0", "-0", "1e3", "1E+2", "2.50", "0.1e-7", "12345678901234567890"]
)
_json_values = st.recursive(
    st.one_of(st.sampled_from(["null", "true", "false"]), _number_literals, _text.map(json.dumps)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4).map(lambda items: "[" + ",".join(items) + "]"),
        st.dictionaries(_text, inner, max_size=4).map(
            lambda d: "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in d.items()) + "}"
        ),
    ),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(raw=_json_values)
def test_structural_digest_is_the_digest_of_gos_encoding(raw: str) -> None:
    expected = hashlib.sha256(go_json_encoding(raw).encode()).hexdigest()
    assert file_digest("data.json", raw.encode(), "SHA-256") == expected


def test_a_structured_file_that_is_not_json_is_refused() -> None:
    with pytest.raises(SignatureError, match="not valid JSON"):
        file_digest("data.json", b"{nope", "SHA-256")
    with pytest.raises(SignatureError, match="not valid JSON"):
        file_digest("data.json", b'{"x": NaN}', "SHA-256")


def test_a_verification_setting_without_a_key_is_refused() -> None:
    values = {"identity": "trusted-headers", "policy_bundle": "b.tar.gz"}
    with pytest.raises(ConfigError, match=r"policy\.bundle_scope needs policy\.bundle_public_key"):
        load_settings(None, {**values, "policy_bundle_scope": "write"})
    with pytest.raises(ConfigError, match=r"'HS256' is not one of RS256"):
        load_settings(None, {**values, "policy_bundle_key_algorithm": "HS256"})
