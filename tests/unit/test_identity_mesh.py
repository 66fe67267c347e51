"""Identity mode mesh-mtls without Envoy: SPIFFE ids, the workload table, the provider, settings.

Through a real Envoy that terminates mTLS: tests/envoy/test_envoy_mtls.py.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.config import ConfigError, load_settings
from sidecar.core.caller import Caller, IdentityError
from sidecar.identity import AuthRequest
from sidecar.identity.mesh import MTLS_ATTRIBUTE, URI_SAN_ATTRIBUTE, MeshMtls
from sidecar.identity.spiffe import (
    Pattern,
    SpiffeId,
    WorkloadMap,
    parse_pattern,
    parse_spiffe_id,
)
from sidecar.runtime.bootstrap import Upstream, build_bootstrap

RAG = "spiffe://cluster.local/ns/acme/sa/rag"
TABLE: dict[str, Any] = {
    RAG: {"tenant": "acme", "principals": ["service:rag"]},
    "spiffe://cluster.local/ns/{namespace}/sa/*": {"tenant": "{namespace}"},
    "spiffe://cluster.local/ns/{namespace}/sa/{sa}/drafts": {
        "tenant": "{namespace}",
        "principals": ["service:{sa}", "team:{namespace}-authors"],
        "drafts": True,
    },
}


def lookup(table: Mapping[str, Any], spiffe_id: str) -> Caller | None:
    return WorkloadMap.parse(table).lookup(parse_spiffe_id(spiffe_id))


# --- SPIFFE ids ---------------------------------------------------------------------------------

TRUST_DOMAIN_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789.-_"
SEGMENT_CHARS = TRUST_DOMAIN_CHARS + "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
trust_domains = st.text(TRUST_DOMAIN_CHARS, min_size=1, max_size=40)
segments = st.text(SEGMENT_CHARS, min_size=1, max_size=12).filter(lambda s: s not in (".", ".."))


@given(trust_domains, st.lists(segments, min_size=1, max_size=6))
def test_a_valid_id_parses_and_prints_as_written(trust_domain: str, path: list[str]) -> None:
    text = "spiffe://" + trust_domain + "".join("/" + s for s in path)
    spiffe_id = parse_spiffe_id(text)
    assert spiffe_id == SpiffeId(trust_domain, tuple(path))
    assert str(spiffe_id) == text


# What the SPIFFE specification allows, written independently of the parser.
_VALID = re.compile(r"spiffe://[a-z0-9._-]{1,255}(/[A-Za-z0-9._-]+)+")


def _valid(text: str) -> bool:
    return (
        _VALID.fullmatch(text) is not None
        and len(text.encode()) <= 2048
        and not any(s in (".", "..") for s in text.removeprefix("spiffe://").split("/")[1:])
    )


@given(
    st.one_of(
        st.text(max_size=60),
        st.builds(
            lambda td, rest: "spiffe://" + td + rest,
            st.text("abcXYZ019.-_:@%?#* ", max_size=8),
            st.text("abcAZ09.-_/%?#:@* \\", max_size=20),
        ),
    )
)
def test_the_parser_accepts_exactly_what_the_specification_allows(text: str) -> None:
    try:
        parse_spiffe_id(text)
    except ValueError:
        assert not _valid(text), text
    else:
        assert _valid(text), text


@pytest.mark.parametrize(
    "text",
    [
        "",
        "spiffe://",
        "spiffe://cluster.local",  # the trust domain's own id names no workload
        "spiffe://cluster.local/",
        "SPIFFE://cluster.local/ns/a",
        "spiffe://Cluster.local/ns/a",
        "spiffe://cluster.local:443/ns/a",
        "spiffe://user@cluster.local/ns/a",
        "spiffe:///ns/a",
        "spiffe://cluster.local/ns//a",
        "spiffe://cluster.local/ns/a/",
        "spiffe://cluster.local/ns/./a",
        "spiffe://cluster.local/ns/a/..",
        "spiffe://cluster.local/ns/a%2Fb",
        "spiffe://cluster.local/ns/a?x=1",
        "spiffe://cluster.local/ns/a#frag",
        "spiffe://cluster.local/ns/a b",
        "https://cluster.local/ns/a",
        "spiffe://" + "a" * 256 + "/ns/a",
        "spiffe://cluster.local/" + "a" * 2048,
    ],
)
def test_malformed_ids_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_spiffe_id(text)


def test_a_refusal_never_quotes_the_id() -> None:
    with pytest.raises(ValueError) as raised:
        parse_spiffe_id("spiffe://cluster.local/secret-looking value")
    assert "secret-looking" not in str(raised.value)


# --- The workload table -------------------------------------------------------------------------


def test_an_exact_id_gets_its_tenant_and_principals_plus_itself() -> None:
    assert lookup(TABLE, RAG) == Caller("acme", frozenset({"service:rag", RAG}))


def test_a_pattern_fills_its_placeholders() -> None:
    indexer = "spiffe://cluster.local/ns/globex/sa/indexer"
    assert lookup(TABLE, indexer) == Caller("globex", frozenset({indexer}))
    author = "spiffe://cluster.local/ns/globex/sa/editor/drafts"
    assert lookup(TABLE, author) == Caller(
        "globex",
        frozenset({author, "service:editor", "team:globex-authors"}),
        drafts_allowed=True,
    )


@pytest.mark.parametrize(
    "unmapped",
    [
        "spiffe://partner.example/ns/acme/sa/rag",  # another trust domain
        "spiffe://cluster.local/ns/acme",  # fewer segments
        "spiffe://cluster.local/ns/acme/sa/rag/extra",  # more segments
        "spiffe://cluster.local/namespace/acme/sa/rag",  # a literal differs
        "spiffe://cluster.local/ns/acme/SA/rag",  # paths are case-sensitive
    ],
)
def test_ids_no_entry_matches_are_unmapped(unmapped: str) -> None:
    assert lookup(TABLE, unmapped) is None


def test_the_most_specific_entry_wins_whatever_the_order() -> None:
    entries = {
        "spiffe://td/ns/*/sa/*": {"tenant": "any"},
        "spiffe://td/ns/acme/sa/*": {"tenant": "acme"},
        "spiffe://td/ns/*/sa/rag": {"tenant": "rag"},
        "spiffe://td/ns/acme/sa/rag": {"tenant": "exact"},
    }
    for order in itertools.permutations(entries):
        table = {key: entries[key] for key in order}
        tenants = [
            caller.tenant if (caller := lookup(table, f"spiffe://td/ns/{ns}/sa/{sa}")) else None
            for ns, sa in (("acme", "rag"), ("acme", "x"), ("x", "rag"), ("x", "x"))
        ]
        assert tenants == ["exact", "acme", "rag", "any"]


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"spiffe://*/ns/a": {"tenant": "t"}}, "trust domain is never a pattern"),
        ({"spiffe://{td}/ns/a": {"tenant": "t"}}, "trust domain is never a pattern"),
        ({"spiffe://td/ns/a*": {"tenant": "t"}}, "literal, '*' or '{name}', whole"),
        ({"spiffe://td/ns/{a}x": {"tenant": "t"}}, "literal, '*' or '{name}', whole"),
        ({"spiffe://td/ns/{Bad}": {"tenant": "t"}}, "literal, '*' or '{name}', whole"),
        ({"spiffe://td/{x}/{x}": {"tenant": "t"}}, "placeholder {x} appears twice"),
        ({"spiffe://td/ns/*": {"tenant": "{ns}"}}, "tenant uses {ns}"),
        ({"spiffe://td/ns/{ns}": {"tenant": "t", "principals": ["p:{sa}"]}}, "principal uses"),
        ({"spiffe://td/ns/{ns}": {"tenant": "{ns"}}, "braces only as a placeholder"),
        ({"spiffe://td/ns/a": {}}, "needs a tenant"),
        ({"spiffe://td/ns/a": {"tenant": " "}}, "needs a tenant"),
        ({"spiffe://td/ns/a": {"tenant": "t", "tenants": "x"}}, "unknown key 'tenants'"),
        ({"spiffe://td/ns/a": {"tenant": "t", "principals": "p"}}, "list of non-empty"),
        ({"spiffe://td/ns/a": {"tenant": "t", "principals": [""]}}, "list of non-empty"),
        ({"spiffe://td/ns/a": {"tenant": "t", "drafts": "yes"}}, "true or false"),
        ({"spiffe://td/ns/a": "acme"}, "must be a table"),
        ({"spiffe://td/ns/a/": {"tenant": "t"}}, "no empty path segment"),
        (
            {"spiffe://td/ns/*/sa/x": {"tenant": "a"}, "spiffe://td/ns/{n}/sa/x": {"tenant": "b"}},
            "match the same ids",
        ),
        (
            {
                "spiffe://td/ns/acme/sa/*": {"tenant": "a"},
                "spiffe://td/ns/*/sa/rag": {"tenant": "b"},
            },
            "add an entry for 'spiffe://td/ns/acme/sa/rag'",
        ),
    ],
)
def test_a_table_that_is_wrong_or_ambiguous_is_refused(table: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)) as raised:
        WorkloadMap.parse(table)
    assert str(raised.value).startswith("entr")  # names the entry or entries


def test_an_entry_for_the_overlap_resolves_an_ambiguity() -> None:
    table = {
        "spiffe://td/ns/acme/sa/*": {"tenant": "a"},
        "spiffe://td/ns/*/sa/rag": {"tenant": "b"},
        "spiffe://td/ns/acme/sa/rag": {"tenant": "both"},
    }
    assert [
        getattr(lookup(table, f"spiffe://td/ns/{ns}/sa/{sa}"), "tenant", None)
        for ns, sa in (("acme", "rag"), ("acme", "x"), ("x", "rag"), ("x", "x"))
    ] == ["both", "a", "b", None]


# A reference model over a tiny universe: the table is acceptable exactly when
# every id has one matching entry that is at least as specific as every other
# matching entry, and that entry is the one chosen. "c" appears in no key, so
# the universe also holds ids that only wildcards match.
_SEGMENT_VALUES = ("a", "b", "c")
keys = st.builds(
    lambda path: "spiffe://td/" + "/".join(path),
    st.lists(st.sampled_from(("a", "b", "*")), min_size=1, max_size=3),
)


def _covers(general: Pattern, specific: Pattern) -> bool:
    return len(general.segments) == len(specific.segments) and all(
        g is None or g == s for g, s in zip(general.segments, specific.segments, strict=True)
    )


@given(st.lists(keys, max_size=6, unique=True))
def test_the_table_agrees_with_a_reference_model(table_keys: list[str]) -> None:
    table = {key: {"tenant": key} for key in table_keys}
    patterns = {key: parse_pattern(key) for key in table_keys}
    universe = [
        SpiffeId("td", path)
        for length in (1, 2, 3)
        for path in itertools.product(_SEGMENT_VALUES, repeat=length)
    ]
    expected: dict[SpiffeId, str | None] = {}
    acceptable = len({p.shape for p in patterns.values()}) == len(patterns)
    for spiffe_id in universe:
        matching = [k for k, p in patterns.items() if p.match(spiffe_id) is not None]
        greatest = [k for k in matching if all(_covers(patterns[o], patterns[k]) for o in matching)]
        acceptable = acceptable and (not matching or len(greatest) == 1)
        expected[spiffe_id] = greatest[0] if greatest else None
    try:
        workloads = WorkloadMap.parse(table)
    except ValueError:
        assert not acceptable
        return
    assert acceptable
    for spiffe_id in universe:
        caller = workloads.lookup(spiffe_id)
        assert (caller.tenant if caller else None) == expected[spiffe_id]


# --- The provider -------------------------------------------------------------------------------

FORGED_HEADERS = {
    "x-gate-tenant": "acme",
    "x-gate-principals": "service:rag",
    "x-forwarded-client-cert": f"By=spiffe://cluster.local/ns/db/sa/db;URI={RAG}",
    "authorization": "Bearer forged",
}


def identify(attributes: Mapping[str, Any], headers: Mapping[str, str] | None = None) -> Caller:
    request = AuthRequest(
        "POST", "/collections/c/points/search", headers or {}, attributes=attributes
    )
    return asyncio.run(MeshMtls(WorkloadMap.parse(TABLE)).identify(request))


def test_the_peer_certificate_makes_the_caller() -> None:
    caller = identify({MTLS_ATTRIBUTE: True, URI_SAN_ATTRIBUTE: RAG})
    assert caller == Caller("acme", frozenset({"service:rag", RAG}))


@pytest.mark.parametrize(
    ("attributes", "code"),
    [
        ({}, "client_certificate_missing"),  # Envoy not asked for the attributes
        ({MTLS_ATTRIBUTE: False}, "client_certificate_missing"),
        ({MTLS_ATTRIBUTE: "true", URI_SAN_ATTRIBUTE: RAG}, "client_certificate_missing"),
        ({MTLS_ATTRIBUTE: True}, "spiffe_id_malformed"),  # a certificate without a URI SAN
        (
            {MTLS_ATTRIBUTE: True, URI_SAN_ATTRIBUTE: "https://acme.example/rag"},
            "spiffe_id_malformed",
        ),
        ({MTLS_ATTRIBUTE: True, URI_SAN_ATTRIBUTE: RAG + "/"}, "spiffe_id_malformed"),
        ({MTLS_ATTRIBUTE: True, URI_SAN_ATTRIBUTE: 7}, "spiffe_id_malformed"),
        (
            {MTLS_ATTRIBUTE: True, URI_SAN_ATTRIBUTE: "spiffe://partner.example/ns/acme/sa/rag"},
            "workload_unmapped",
        ),
    ],
)
def test_no_usable_certificate_is_an_identity_error(attributes: dict[str, Any], code: str) -> None:
    with pytest.raises(IdentityError) as raised:
        identify(attributes, FORGED_HEADERS)
    assert raised.value.code == code


def test_headers_never_make_or_change_the_caller() -> None:
    indexer = "spiffe://cluster.local/ns/globex/sa/indexer"
    caller = identify({MTLS_ATTRIBUTE: True, URI_SAN_ATTRIBUTE: indexer}, FORGED_HEADERS)
    assert caller == Caller("globex", frozenset({indexer}))
    assert MeshMtls(WorkloadMap.parse(TABLE)).strip_headers == ("x-forwarded-client-cert",)


# --- Settings and the proxy's listener ----------------------------------------------------------


def _tls_files(tmp_path: Path) -> dict[str, str]:
    files = {}
    for name in ("tls_cert_file", "tls_key_file", "tls_client_ca_file"):
        (tmp_path / name).write_text("PEM")
        files[name] = str(tmp_path / name)
    return files


def test_settings_from_a_file_with_a_workloads_table(tmp_path: Path) -> None:
    config = tmp_path / "gate.toml"
    config.write_text(
        '[identity]\nmode = "mesh-mtls"\n'
        "[identity.workloads]\n"
        f'"{RAG}" = {{tenant = "acme", principals = ["service:rag"]}}\n'
        '"spiffe://cluster.local/ns/{namespace}/sa/*" = {tenant = "{namespace}"}\n'
    )
    settings = load_settings(config)
    assert WorkloadMap.parse(settings.identity.workloads).lookup(parse_spiffe_id(RAG)) == Caller(
        "acme", frozenset({"service:rag", RAG})
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"identity": "mesh-mtls"}, "needs an [identity.workloads] table"),
        ({"identity": "mesh-mtls", "workloads": {"spiffe://td/a": {}}}, "identity.workloads: "),
        ({"identity": "mesh-mtls", "workloads": ["x"]}, "identity.workloads: must be a table"),
    ],
)
def test_mesh_settings_that_cannot_work_are_refused(
    overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_settings(None, overrides)


def _listener(bootstrap: dict[str, Any]) -> dict[str, Any]:
    listener: dict[str, Any] = bootstrap["static_resources"]["listeners"][0]
    return listener


def _bootstrap(**overrides: Any) -> dict[str, Any]:
    settings = load_settings(None, {"identity": "mesh-mtls", "workloads": TABLE, **overrides})
    return build_bootstrap(
        settings, listen=("127.0.0.1", 8443), upstream=Upstream.parse("http://db:1")
    )


def test_the_proxy_listener_requires_and_verifies_client_certificates(tmp_path: Path) -> None:
    files = _tls_files(tmp_path)
    chain = _listener(_bootstrap(**files))["filter_chains"][0]
    tls = chain["transport_socket"]["typed_config"]
    assert tls["require_client_certificate"] is True
    common = tls["common_tls_context"]
    assert common["validation_context"]["trusted_ca"] == {"filename": files["tls_client_ca_file"]}
    assert common["tls_certificates"] == [
        {
            "certificate_chain": {"filename": files["tls_cert_file"]},
            "private_key": {"filename": files["tls_key_file"]},
        }
    ]
    filters = chain["filters"][0]["typed_config"]["http_filters"]
    ext_proc = next(f for f in filters if f["name"] == "envoy.filters.http.ext_proc")
    assert ext_proc["typed_config"]["request_attributes"] == [MTLS_ATTRIBUTE, URI_SAN_ATTRIBUTE]


def test_the_proxy_refuses_a_listener_that_cannot_do_mtls(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="Envoy must terminate mTLS"):
        _bootstrap()
    files = _tls_files(tmp_path)
    with pytest.raises(ConfigError, match=r"go together.*only 'listen.tls_cert_file' given"):
        _bootstrap(tls_cert_file=files["tls_cert_file"])
    with pytest.raises(ConfigError, match=r"listen\.tls_key_file: .*is not a file"):
        _bootstrap(**{**files, "tls_key_file": str(tmp_path / "missing.key")})


def test_other_modes_keep_a_plain_listener_without_attributes() -> None:
    settings = load_settings(None, {"identity": "trusted-headers"})
    bootstrap = build_bootstrap(
        settings, listen=("127.0.0.1", 8080), upstream=Upstream.parse("http://db:6333")
    )
    chain = _listener(bootstrap)["filter_chains"][0]
    assert "transport_socket" not in chain
    filters = chain["filters"][0]["typed_config"]["http_filters"]
    assert all("request_attributes" not in f["typed_config"] for f in filters)
