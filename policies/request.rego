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

# Routes. The gate filters what searches return, so by default a caller may
# use only routes whose responses the gate filters ("filtered") or that return
# no chunk content ("read"). The format adapters classify the routes they know
# (input.route_kind); a route no adapter knows (null) is a read for GET and
# HEAD and a write otherwise. Writes (they could touch another tenant's
# chunks) and routes that return chunk content the gate cannot filter
# ("content": snapshots, exports, document fetches by id) are refused unless
# policy data opts in:
#   data.retrieval_gate.routes = {"allow_writes": true, "allow_unfiltered_content": true}
route_kind := input.route_kind if input.route_kind in {"filtered", "read", "content", "write"}

route_kind := "read" if {
	input.route_kind == null
	input.method in {"GET", "HEAD"}
}

route_kind := "write" if {
	input.route_kind == null
	is_string(input.method)
	not input.method in {"GET", "HEAD"}
}

passed contains "ROUTE_FORBIDDEN" if route_kind in {"filtered", "read"}

passed contains "ROUTE_FORBIDDEN" if {
	route_kind == "write"
	data.retrieval_gate.routes.allow_writes == true
}

passed contains "ROUTE_FORBIDDEN" if {
	route_kind == "content"
	data.retrieval_gate.routes.allow_unfiltered_content == true
}
