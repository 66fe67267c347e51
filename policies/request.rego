# Request policy: may this caller send this request at all?
#
# Evaluated once per request, before the vector database is called. The
# contract (input, output, policy data) is in policies/README.md. In short,
# `denials` is the sorted array of the reasons the request is refused for; an
# empty array allows it.
package retrieval_gate.request

import rego.v1

# As in chunks.rego, every check is a positive proof: a request passes a check
# only when the input and the data prove that it does, so an absent, null or
# mistyped value denies. To add a check, add its reason to `checks` and a
# `passed contains` rule that proves it.
checks := {"COLLECTION_FORBIDDEN", "ROUTE_FORBIDDEN"}

denials := sort(checks - passed)

# Collection ownership, from policy data:
#   data.retrieval_gate.collections = {"sops": {"tenants": ["acme"]}}
# A collection described there is reserved to its tenants; a collection not
# described is open to every caller, and without the data nothing is described.
default collections := {}

collections := data.retrieval_gate.collections

# Routes that name no collection have nothing to own.
passed contains "COLLECTION_FORBIDDEN" if input.collection == null

# Undescribed only when the data is an object without this key: data that is
# not an object cannot prove that the collection is undescribed.
passed contains "COLLECTION_FORBIDDEN" if {
	is_string(input.collection)
	is_object(collections)
	not input.collection in object.keys(collections)
}

passed contains "COLLECTION_FORBIDDEN" if {
	is_string(input.collection)
	tenants := collections[input.collection].tenants
	is_array(tenants)
	tenant := input.caller.tenant
	is_string(tenant)
	tenant != ""
	tenant in tenants
}

# Routes. The gate filters what searches return, so a caller may only read:
# GET and HEAD, and POST to the Qdrant endpoints that read points. Writes
# (upsert, delete, set payload: they could touch another tenant's points) and
# snapshots (a whole collection, chunk text included, past every per-chunk
# check) are refused unless policy data opts in:
#   data.retrieval_gate.routes = {"allow_writes": true, "allow_snapshots": true}
read_endpoints := {
	"", "search", "search/batch", "search/groups", "query", "query/batch", "query/groups",
	"recommend", "recommend/batch", "recommend/groups", "discover", "discover/batch",
	"scroll", "count",
}

snapshot_route if {
	is_string(input.path)
	"snapshots" in split(input.path, "/")
}

passed contains "ROUTE_FORBIDDEN" if {
	input.method in {"GET", "HEAD"}
	not snapshot_route
}

passed contains "ROUTE_FORBIDDEN" if {
	input.method == "POST"
	is_string(input.path)
	parts := split(trim_right(input.path, "/"), "/")
	count(parts) >= 4
	parts[1] == "collections"
	parts[3] == "points"
	concat("/", array.slice(parts, 4, count(parts))) in read_endpoints
}

passed contains "ROUTE_FORBIDDEN" if {
	data.retrieval_gate.routes.allow_writes == true
	not snapshot_route
}

passed contains "ROUTE_FORBIDDEN" if {
	snapshot_route
	data.retrieval_gate.routes.allow_snapshots == true
}
