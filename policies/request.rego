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

# The answer depends only on the input and this policy (its sources and data):
# no clock, randomness, network or runtime builtins. The gate may then keep it
# per input until the policy changes (policies/README.md, "Request cache").
# Remove this line before adding a rule that reads anything else.
time_pure := true

# Collection ownership, from policy data:
#   data.retrieval_gate.collections = {"sops": {"tenants": ["acme"]}}
# A collection described there is reserved to its tenants; a collection not
# described is open to every caller, and without the data nothing is described.
# Qdrant aliases are names like any other: describe an alias of a reserved
# collection too.
default collections := {}

collections := data.retrieval_gate.collections

# input.collections holds every collection the request names: in its path, and
# in its body (lookup collections, GraphQL classes, multi-search lines). An
# entry may be a pattern (Elasticsearch wildcards; "*" for every index): a
# pattern passes only if every described collection it matches is the
# caller's. The request passes when every entry passes; a route that names
# none (an empty array) has nothing to own.
#
# A Chroma path names a collection by its id, and the gate adds the name it
# learned for that id from Chroma's own answers. input.unnamed_collections
# holds the ids whose name it does not know (another worker read it, the gate
# restarted, or no one asked): such a collection may be any collection
# described by name, so it passes only if every collection described by a name
# is the caller's. Keys written as a collection id (a lowercase, hyphenated
# UUID) describe ids, checked as input.collections names them.
passed contains "COLLECTION_FORBIDDEN" if {
	is_array(input.collections)
	every name in input.collections {
		collection_allowed(name)
	}
	unnamed := object.get(input, "unnamed_collections", [])
	is_array(unnamed)
	every id in unnamed {
		unnamed_allowed(id)
	}
}

unnamed_allowed(id) if {
	is_string(id)
	is_object(collections)
	every described, _ in collections {
		name_spares(described)
	}
}

name_spares(described) if regex.match(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`, described)

name_spares(described) if owned(described)

collection_allowed(name) if {
	is_string(name)
	not is_pattern(name)
	undescribed(name)
}

collection_allowed(name) if {
	is_string(name)
	not is_pattern(name)
	owned(name)
}

collection_allowed(name) if {
	is_string(name)
	is_pattern(name)
	is_object(collections)
	every described, _ in collections {
		pattern_spares(name, described)
	}
}

is_pattern(name) if contains(name, "*")

is_pattern(name) if contains(name, "?")

# Undescribed only when the data is an object without this key: data that is
# not an object cannot prove that the collection is undescribed.
undescribed(name) if {
	is_object(collections)
	not name in object.keys(collections)
}

owned(name) if {
	tenants := collections[name].tenants
	is_array(tenants)
	tenant := input.caller.tenant
	is_string(tenant)
	tenant != ""
	tenant in tenants
}

# No delimiters (null): "*" matches across dots, as an Elasticsearch wildcard does
# ([] would make "." one, so "fin*" would spare "finance.q1"). A positive proof:
# glob.match must answer false. A pattern it cannot parse ("fin[*") is an error,
# which an OPA server without strict builtin errors turns into "undefined"; under
# `not`, that would spare every described collection.
pattern_spares(pattern, described) if glob.match(pattern, null, described) == false

pattern_spares(pattern, described) if owned(described)

# Routes. The gate filters what searches return, so by default a caller may
# use only routes whose responses the gate filters ("filtered") or that return
# no chunk content ("read"). The format adapters classify the routes they know
# (input.route_kind). Writes (they could touch another tenant's chunks),
# routes that return chunk content the gate cannot filter ("content":
# snapshots, exports, counts, document fetches by id) and routes no adapter
# knows (null: an unknown route of the database may return anything) are
# refused unless policy data opts in:
#   data.retrieval_gate.routes = {
#     "allow_writes": true, "allow_unfiltered_content": true, "allow_unknown": true}
passed contains "ROUTE_FORBIDDEN" if input.route_kind in {"filtered", "read"}

passed contains "ROUTE_FORBIDDEN" if {
	input.route_kind == "write"
	data.retrieval_gate.routes.allow_writes == true
}

passed contains "ROUTE_FORBIDDEN" if {
	input.route_kind == "content"
	data.retrieval_gate.routes.allow_unfiltered_content == true
}

passed contains "ROUTE_FORBIDDEN" if {
	input.route_kind == null
	data.retrieval_gate.routes.allow_unknown == true
}
