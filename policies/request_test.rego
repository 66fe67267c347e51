# Unit tests for request.rego. Run with `pytest tests/test_rego_unit.py` (one
# pytest case per test rule); they use only features regorus supports.
package retrieval_gate.request_test

import rego.v1

import data.retrieval_gate.request

caller := {"tenant": "acme", "principals": ["user:alice", "group:qa"], "drafts_allowed": false}

search := {
	"caller": caller,
	"method": "POST",
	"path": "/collections/sops/points/search",
	"collections": ["sops"],
	"route_kind": "filtered",
}

owned := {
	"sops": {"tenants": ["acme", "initech"]},
	"finance": {"tenants": ["globex"]},
}

# The denials for `search` with `overrides` (merged recursively, as
# object.union does), under the collections `described`.
denials_with(overrides, described) := denials if {
	denials := request.denials with input as object.union(search, overrides)
		with data.retrieval_gate.collections as described
}

# The denials for `search` by a caller with `fields`, under `owned`.
denials_for_caller(fields) := denials_with({"caller": object.union(caller, fields)}, owned)

# Allowed

test_owner_tenant_is_allowed if denials_with({}, owned) == []

test_any_listed_tenant_is_allowed if denials_for_caller({"tenant": "initech"}) == []

test_undescribed_collection_is_allowed if {
	denials_with({"collections": ["public"], "path": "/collections/public/points/search"}, owned) == []
}

test_route_without_collection_is_allowed if {
	denials_with({"collections": [], "method": "GET", "path": "/", "route_kind": "read"}, owned) == []
}

# "Without data" is set here, not assumed: a bundle may carry collection data.
test_without_data_everything_is_allowed if {
	request.denials == [] with input as object.union(search, {"caller": {"tenant": "globex"}})
		with data.retrieval_gate.collections as {}
}

test_empty_collections_allow_everything if denials_with({}, {}) == []

# Forbidden

test_other_tenant_is_forbidden if denials_for_caller({"tenant": "globex"}) == ["COLLECTION_FORBIDDEN"]

test_tenant_match_is_exact if denials_for_caller({"tenant": "ACME"}) == ["COLLECTION_FORBIDDEN"]

test_collection_with_no_tenants_is_forbidden if {
	denials_with({}, {"sops": {"tenants": []}}) == ["COLLECTION_FORBIDDEN"]
}

# A missing, null or mistyped caller tenant denies a described collection

test_caller_without_tenant if {
	# object.union merges recursively: replace the caller as a whole.
	without_tenant := object.union(
		object.remove(search, ["caller"]),
		{"caller": object.remove(caller, ["tenant"])},
	)
	denials := request.denials with input as without_tenant
		with data.retrieval_gate.collections as owned
	denials == ["COLLECTION_FORBIDDEN"]
}

test_null_caller_tenant if denials_for_caller({"tenant": null}) == ["COLLECTION_FORBIDDEN"]

test_empty_caller_tenant_never_matches if {
	denials_with({"caller": {"tenant": ""}}, {"sops": {"tenants": [""]}}) == ["COLLECTION_FORBIDDEN"]
}

test_numeric_caller_tenant_never_matches if {
	denials_with({"caller": {"tenant": 7}}, {"sops": {"tenants": [7]}}) == ["COLLECTION_FORBIDDEN"]
}

test_without_caller if {
	denials := request.denials with input as object.remove(search, ["caller"])
		with data.retrieval_gate.collections as owned
	denials == ["COLLECTION_FORBIDDEN"]
}

# A missing or mistyped collection in the input denies, even without data

test_missing_collection if {
	request.denials == ["COLLECTION_FORBIDDEN"] with input as object.remove(search, ["collections"])
}

test_numeric_collection if {
	denials_with({"collections": [0]}, owned) == ["COLLECTION_FORBIDDEN"]
}

test_string_collections if denials_with({"collections": "sops"}, owned) == ["COLLECTION_FORBIDDEN"]

test_null_collections if denials_with({"collections": null}, owned) == ["COLLECTION_FORBIDDEN"]

test_missing_input if {
	request.denials == ["COLLECTION_FORBIDDEN", "ROUTE_FORBIDDEN"] with input as {}
}

# Malformed data denies the collections it may describe

test_tenants_missing if denials_with({}, {"sops": {}}) == ["COLLECTION_FORBIDDEN"]

test_tenants_as_string if denials_with({}, {"sops": {"tenants": "acme"}}) == ["COLLECTION_FORBIDDEN"]

test_tenants_as_object if denials_with({}, {"sops": {"tenants": {"acme": true}}}) == ["COLLECTION_FORBIDDEN"]

test_description_not_an_object if denials_with({}, {"sops": ["acme"]}) == ["COLLECTION_FORBIDDEN"]

test_null_description if denials_with({}, {"sops": null}) == ["COLLECTION_FORBIDDEN"]

test_collections_as_array if {
	denials_with({"collections": ["public"]}, [{"tenants": ["acme"]}]) == ["COLLECTION_FORBIDDEN"]
}

test_collections_as_false if denials_with({"collections": ["public"]}, false) == ["COLLECTION_FORBIDDEN"]

test_malformed_data_still_allows_routes_without_collection if {
	denials_with({"collections": []}, "not an object") == []
}

# Method and path do not decide ownership

test_method_and_path_do_not_matter if {
	other_route := {"method": "GET", "path": "/collections/public/points"}
	denials_with(other_route, owned) == []
	denials_with(other_route, {"sops": {"tenants": ["globex"]}}) == ["COLLECTION_FORBIDDEN"]
}

# Routes: filtered and reads only, unless policy data opts in

route(method, kind) := denials if {
	denials := request.denials with input as object.union(search, {"method": method, "route_kind": kind})
		with data.retrieval_gate.collections as {}
}

route_with(kind, flags) := denials if {
	denials := request.denials with input as object.union(search, {"method": "POST", "route_kind": kind})
		with data.retrieval_gate.collections as {}
		with data.retrieval_gate.routes as flags
}

test_filtered_and_read_routes_are_allowed if {
	route("POST", "filtered") == []
	route("GET", "filtered") == []
	route("POST", "read") == []
	route("DELETE", "read") == []
}

test_writes_and_unfiltered_content_are_refused_by_default if {
	route("POST", "write") == ["ROUTE_FORBIDDEN"]
	route("GET", "write") == ["ROUTE_FORBIDDEN"]
	route("GET", "content") == ["ROUTE_FORBIDDEN"]
}

test_unknown_routes_are_refused_by_default if {
	route("GET", null) == ["ROUTE_FORBIDDEN"]
	route("HEAD", null) == ["ROUTE_FORBIDDEN"]
	route("POST", null) == ["ROUTE_FORBIDDEN"]
}

test_unknown_routes_allowed_by_data_only if {
	route_with(null, {"allow_unknown": true}) == []
	route_with(null, {"allow_writes": true}) == ["ROUTE_FORBIDDEN"]
	route_with("write", {"allow_unknown": true}) == ["ROUTE_FORBIDDEN"]
	route_with(null, {"allow_unknown": "yes"}) == ["ROUTE_FORBIDDEN"]
}

test_missing_or_mistyped_kind_is_refused if {
	request.denials == ["ROUTE_FORBIDDEN"] with input as object.remove(search, ["route_kind"])
	route("GET", "snapshot") == ["ROUTE_FORBIDDEN"]
	route("GET", 1) == ["ROUTE_FORBIDDEN"]
	route("GET", ["read"]) == ["ROUTE_FORBIDDEN"]
}

test_writes_allowed_by_data if {
	route_with("write", {"allow_writes": true}) == []
}

test_allow_writes_does_not_open_unfiltered_content if {
	route_with("content", {"allow_writes": true}) == ["ROUTE_FORBIDDEN"]
}

test_unfiltered_content_allowed_by_data if {
	route_with("content", {"allow_unfiltered_content": true}) == []
	route_with("write", {"allow_unfiltered_content": true}) == ["ROUTE_FORBIDDEN"]
}

test_allow_flags_must_be_true if {
	route_with("write", {"allow_writes": "yes"}) == ["ROUTE_FORBIDDEN"]
	route_with("content", {"allow_unfiltered_content": 1}) == ["ROUTE_FORBIDDEN"]
}

# Several collections: every one must pass

test_every_named_collection_must_pass if {
	denials_with({"collections": ["sops", "finance"]}, owned) == ["COLLECTION_FORBIDDEN"]
}

test_several_allowed_collections if denials_with({"collections": ["sops", "public"]}, owned) == []

# Patterns (Elasticsearch wildcards, "*" for every index): allowed only if no
# described collection of another tenant matches

test_wildcard_over_another_tenants_collection if {
	denials_with({"collections": ["fin*"]}, owned) == ["COLLECTION_FORBIDDEN"]
}

test_every_index_covers_reserved_collections if {
	denials_with({"collections": ["*"]}, owned) == ["COLLECTION_FORBIDDEN"]
}

test_wildcard_over_own_and_undescribed_collections if {
	denials_with({"collections": ["so*", "pub*"]}, owned) == []
}

test_wildcard_for_the_owner if {
	denials_with({"collections": ["*"], "caller": {"tenant": "globex"}}, {"finance": {"tenants": ["globex"]}}) == []
}

test_question_mark_is_a_pattern if {
	denials_with({"collections": ["financ?"]}, owned) == ["COLLECTION_FORBIDDEN"]
}

test_pattern_with_malformed_data if denials_with({"collections": ["*"]}, ["finance"]) == ["COLLECTION_FORBIDDEN"]

test_wildcard_matches_across_dots if {
	denials_with({"collections": ["fin*"]}, {"finance.q1": {"tenants": ["globex"]}}) == ["COLLECTION_FORBIDDEN"]
}

test_every_index_matches_dotted_names if {
	denials_with({"collections": ["*"]}, {"logs.2026": {"tenants": ["globex"]}}) == ["COLLECTION_FORBIDDEN"]
}

# A collection named only by an id whose name the gate has not learned (Chroma)

chroma_id := "0b8e5c1e-93a4-4b7a-9d3e-2f6c1a7b8c9d"

unnamed_search := {
	"path": concat("", ["/api/v2/tenants/t/databases/d/collections/", chroma_id, "/query"]),
	"collections": [chroma_id],
	"unnamed_collections": [chroma_id],
}

test_unnamed_id_may_be_any_collection_described_by_name if {
	denials_with(unnamed_search, owned) == ["COLLECTION_FORBIDDEN"]
}

test_unnamed_id_passes_when_every_name_described_is_the_callers if {
	denials_with(unnamed_search, {"sops": {"tenants": ["acme"]}}) == []
}

test_unnamed_id_without_data_is_allowed if denials_with(unnamed_search, {}) == []

test_unnamed_id_is_not_a_collection_described_by_id if {
	other_id := "11111111-2222-4333-8444-555555555555"
	denials_with(unnamed_search, {other_id: {"tenants": ["globex"]}}) == []
}

test_unnamed_id_described_by_id_is_checked_by_id if {
	denials_with(unnamed_search, {chroma_id: {"tenants": ["globex"]}}) == ["COLLECTION_FORBIDDEN"]
}

# An upper-case key is no id as the gate spells one: it may be a name.
test_unnamed_id_and_a_key_that_is_no_canonical_id if {
	key := "0B8E5C1E-93A4-4B7A-9D3E-2F6C1A7B8C9E"
	denials_with(unnamed_search, {key: {"tenants": ["globex"]}}) == ["COLLECTION_FORBIDDEN"]
}

# Learned, the name goes to input.collections beside the id.
test_a_learned_name_is_checked if {
	named := object.union(unnamed_search, {"collections": [chroma_id, "finance"], "unnamed_collections": []})
	denials_with(named, owned) == ["COLLECTION_FORBIDDEN"]
	denials_with(object.union(named, {"caller": {"tenant": "globex"}}), {"finance": {"tenants": ["globex"]}}) == []
}

test_unnamed_collections_not_an_array if {
	denials_with({"unnamed_collections": chroma_id}, owned) == ["COLLECTION_FORBIDDEN"]
}

test_unnamed_collection_not_a_string if {
	denials_with({"unnamed_collections": [7]}, {}) == ["COLLECTION_FORBIDDEN"]
}

test_unnamed_id_with_malformed_data if {
	denials_with(unnamed_search, ["sops"]) == ["COLLECTION_FORBIDDEN"]
}
