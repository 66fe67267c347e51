# Unit tests for chunks.rego. Run with `pytest tests/test_rego_unit.py` (one
# pytest case per test rule); they use only features regorus supports.
package retrieval_gate.chunks_test

import rego.v1

import data.retrieval_gate.chunks

now := 1767225600000000000

caller := {"tenant": "acme", "principals": ["user:alice", "group:qa"]}

# An approved, effective, open-ended chunk the caller may read.
good := {
	"id": "c1",
	"doc_id": "SOP-7",
	"version": "3",
	"tenant_id": "acme",
	"allowed_principals": ["group:qa"],
	"status": "approved",
	"effective_at_ns": now,
	"expires_at_ns": null,
	"requires_signature": false,
	"source_uri": "https://docs.example/SOP-7/3",
}

# The reasons for one chunk evaluated alone, for the default caller and time.
reasons_for(chunk) := reasons if {
	reasons := chunks.reasons[chunk.id] with input as {"caller": caller, "now_ns": now, "chunks": [chunk]}
}

# The reasons for a variant of `good`.
reasons_with(overrides) := reasons_for(object.union(good, overrides))

reasons_without(field) := reasons_for(object.remove(good, [field]))

# The reasons for `good` read by another caller. Indexed by a literal id:
# `chunks.reasons[good.id]` is undefined in regorus here (policies/README.md).
reasons_for_caller(other) := reasons if {
	reasons := chunks.reasons.c1 with input as {"caller": other, "now_ns": now, "chunks": [good]}
}

# Admission

test_good_chunk_is_admitted if reasons_for(good) == []

test_any_shared_principal_admits if reasons_with({"allowed_principals": ["user:bob", "user:alice"]}) == []

# One reason each

test_other_tenant if reasons_with({"tenant_id": "globex"}) == ["TENANT_MISMATCH"]

test_no_shared_principal if reasons_with({"allowed_principals": ["group:finance"]}) == ["PRINCIPAL_MISMATCH"]

test_status_draft if reasons_with({"status": "draft"}) == ["STATUS_DRAFT"]

test_status_superseded if reasons_with({"status": "superseded"}) == ["STATUS_SUPERSEDED"]

test_status_revoked if reasons_with({"status": "revoked"}) == ["STATUS_REVOKED"]

test_status_quarantined if reasons_with({"status": "quarantined"}) == ["STATUS_QUARANTINED"]

test_unknown_status_is_policy_deny if reasons_with({"status": "archived"}) == ["POLICY_DENY"]

test_status_is_case_sensitive if reasons_with({"status": "Approved"}) == ["POLICY_DENY"]

test_not_yet_effective if reasons_with({"effective_at_ns": now + 1}) == ["NOT_YET_EFFECTIVE"]

test_expired if reasons_with({"expires_at_ns": now - 1}) == ["EXPIRED"]

# Boundaries: validity is [effective_at_ns, expires_at_ns)

test_effective_at_now_is_admitted if reasons_with({"effective_at_ns": now}) == []

test_expires_at_now_is_expired if reasons_with({"expires_at_ns": now}) == ["EXPIRED"]

test_expires_one_ns_after_now_is_admitted if reasons_with({"expires_at_ns": now + 1}) == []

# All failing reasons are listed, sorted

test_all_reasons_listed if {
	reasons_with({
		"tenant_id": "globex",
		"allowed_principals": ["group:finance"],
		"status": "revoked",
		"effective_at_ns": now + 1,
		"expires_at_ns": now,
	}) == ["EXPIRED", "NOT_YET_EFFECTIVE", "PRINCIPAL_MISMATCH", "STATUS_REVOKED", "TENANT_MISMATCH"]
}

test_unknown_status_with_other_reasons if {
	reasons_with({"status": "archived", "tenant_id": "globex"}) == ["POLICY_DENY", "TENANT_MISMATCH"]
}

# A missing, null or mistyped chunk field denies

test_missing_tenant_id if reasons_without("tenant_id") == ["TENANT_MISMATCH"]

test_null_tenant_id if reasons_with({"tenant_id": null}) == ["TENANT_MISMATCH"]

test_empty_tenant_id if reasons_with({"tenant_id": ""}) == ["TENANT_MISMATCH"]

test_missing_allowed_principals if reasons_without("allowed_principals") == ["PRINCIPAL_MISMATCH"]

test_empty_allowed_principals if reasons_with({"allowed_principals": []}) == ["PRINCIPAL_MISMATCH"]

test_string_allowed_principals if reasons_with({"allowed_principals": "group:qa"}) == ["PRINCIPAL_MISMATCH"]

test_object_allowed_principals if reasons_with({"allowed_principals": {"x": "group:qa"}}) == ["PRINCIPAL_MISMATCH"]

test_missing_status if reasons_without("status") == ["POLICY_DENY"]

test_null_status if reasons_with({"status": null}) == ["POLICY_DENY"]

test_array_status if reasons_with({"status": ["approved"]}) == ["POLICY_DENY"]

test_missing_effective_at if reasons_without("effective_at_ns") == ["NOT_YET_EFFECTIVE"]

test_null_effective_at if reasons_with({"effective_at_ns": null}) == ["NOT_YET_EFFECTIVE"]

test_string_effective_at if reasons_with({"effective_at_ns": "2026-01-01T00:00:00Z"}) == ["NOT_YET_EFFECTIVE"]

test_missing_expires_at if reasons_without("expires_at_ns") == ["EXPIRED"]

test_string_expires_at if reasons_with({"expires_at_ns": "2099-01-01T00:00:00Z"}) == ["EXPIRED"]

test_boolean_expires_at if reasons_with({"expires_at_ns": true}) == ["EXPIRED"]

test_bare_chunk_fails_every_check if {
	reasons_for({"id": "c1"}) == ["EXPIRED", "NOT_YET_EFFECTIVE", "POLICY_DENY", "PRINCIPAL_MISMATCH", "TENANT_MISMATCH"]
}

# A missing or malformed caller or time denies

test_caller_without_tenant if reasons_for_caller({"principals": caller.principals}) == ["TENANT_MISMATCH"]

test_empty_tenant_never_matches if {
	chunks.reasons.c1 == ["TENANT_MISMATCH"] with input as {
		"caller": {"tenant": "", "principals": caller.principals},
		"now_ns": now,
		"chunks": [object.union(good, {"tenant_id": ""})],
	}
}

test_null_tenant_never_matches if {
	chunks.reasons.c1 == ["TENANT_MISMATCH"] with input as {
		"caller": {"tenant": null, "principals": caller.principals},
		"now_ns": now,
		"chunks": [object.union(good, {"tenant_id": null})],
	}
}

test_numeric_tenant_never_matches if {
	chunks.reasons.c1 == ["TENANT_MISMATCH"] with input as {
		"caller": {"tenant": 7, "principals": caller.principals},
		"now_ns": now,
		"chunks": [object.union(good, {"tenant_id": 7})],
	}
}

test_caller_without_principals if reasons_for_caller({"tenant": "acme"}) == ["PRINCIPAL_MISMATCH"]

test_caller_principals_as_string if reasons_for_caller({"tenant": "acme", "principals": "group:qa"}) == ["PRINCIPAL_MISMATCH"]

test_empty_principal_never_matches if {
	chunks.reasons.c1 == ["PRINCIPAL_MISMATCH"] with input as {
		"caller": {"tenant": "acme", "principals": [""]},
		"now_ns": now,
		"chunks": [object.union(good, {"allowed_principals": [""]})],
	}
}

test_without_caller if {
	chunks.reasons.c1 == ["PRINCIPAL_MISMATCH", "TENANT_MISMATCH"] with input as {"now_ns": now, "chunks": [good]}
}

test_without_now if {
	chunks.reasons.c1 == ["NOT_YET_EFFECTIVE"] with input as {"caller": caller, "chunks": [good]}
}

test_string_now if {
	chunks.reasons.c1 == ["NOT_YET_EFFECTIVE"] with input as {"caller": caller, "now_ns": "now", "chunks": [good]}
}

# Drafts: admitted only when caller.drafts_allowed is exactly true

draft := object.union(good, {"status": "draft"})

# The reasons for `chunk` (id c1) read by the default caller with `fields` added.
reasons_for_caller_with(chunk, fields) := reasons if {
	reasons := chunks.reasons.c1 with input as {
		"caller": object.union(caller, fields),
		"now_ns": now,
		"chunks": [chunk],
	}
}

# The reasons for `chunk` (id c1) read by the default caller with drafts allowed.
reasons_with_drafts(chunk) := reasons_for_caller_with(chunk, {"drafts_allowed": true})

test_draft_admitted_when_drafts_allowed if reasons_with_drafts(draft) == []

test_draft_denied_when_drafts_not_allowed if {
	reasons_for_caller_with(draft, {"drafts_allowed": false}) == ["STATUS_DRAFT"]
}

test_draft_denied_without_drafts_allowed if reasons_for(draft) == ["STATUS_DRAFT"]

test_draft_denied_when_drafts_allowed_is_null if {
	reasons_for_caller_with(draft, {"drafts_allowed": null}) == ["STATUS_DRAFT"]
}

test_draft_denied_when_drafts_allowed_is_a_string if {
	reasons_for_caller_with(draft, {"drafts_allowed": "true"}) == ["STATUS_DRAFT"]
}

test_draft_denied_when_drafts_allowed_is_a_number if {
	reasons_for_caller_with(draft, {"drafts_allowed": 1}) == ["STATUS_DRAFT"]
}

test_draft_denied_when_drafts_allowed_is_an_array if {
	reasons_for_caller_with(draft, {"drafts_allowed": [true]}) == ["STATUS_DRAFT"]
}

test_drafts_allowed_outside_caller_is_ignored if {
	chunks.reasons.c1 == ["STATUS_DRAFT"] with input as {
		"caller": caller,
		"drafts_allowed": true,
		"now_ns": now,
		"chunks": [draft],
	}
}

test_draft_other_checks_still_apply if {
	other_tenant_expired := object.union(draft, {"tenant_id": "globex", "expires_at_ns": now})
	reasons_with_drafts(other_tenant_expired) == ["EXPIRED", "TENANT_MISMATCH"]
}

test_drafts_allowed_admits_no_other_status if {
	reasons_with_drafts(object.union(good, {"status": "superseded"})) == ["STATUS_SUPERSEDED"]
}

test_drafts_allowed_does_not_widen_status_case if {
	reasons_with_drafts(object.union(good, {"status": "Draft"})) == ["POLICY_DENY"]
}

test_drafts_allowed_keeps_approved_admitted if reasons_with_drafts(good) == []

# Batches

test_batch_has_an_entry_per_chunk if {
	chunks.reasons == {
		"ok": [],
		"draft": ["STATUS_DRAFT"],
		"other-tenant": ["TENANT_MISMATCH"],
		"expired-draft": ["EXPIRED", "STATUS_DRAFT"],
		"bare": ["EXPIRED", "NOT_YET_EFFECTIVE", "POLICY_DENY", "PRINCIPAL_MISMATCH", "TENANT_MISMATCH"],
	} with input as {
		"caller": caller,
		"now_ns": now,
		"chunks": [
			object.union(good, {"id": "ok"}),
			object.union(good, {"id": "draft", "status": "draft"}),
			object.union(good, {"id": "other-tenant", "tenant_id": "globex"}),
			object.union(good, {"id": "expired-draft", "status": "draft", "expires_at_ns": now}),
			{"id": "bare"},
		],
	}
}

test_batch_with_drafts_allowed if {
	chunks.reasons == {
		"ok": [],
		"draft": [],
		"expired-draft": ["EXPIRED"],
		"revoked": ["STATUS_REVOKED"],
	} with input as {
		"caller": object.union(caller, {"drafts_allowed": true}),
		"now_ns": now,
		"chunks": [
			object.union(good, {"id": "ok"}),
			object.union(good, {"id": "draft", "status": "draft"}),
			object.union(good, {"id": "expired-draft", "status": "draft", "expires_at_ns": now}),
			object.union(good, {"id": "revoked", "status": "revoked"}),
		],
	}
}

test_empty_batch if chunks.reasons == {} with input as {"caller": caller, "now_ns": now, "chunks": []}

test_missing_chunks if chunks.reasons == {} with input as {"caller": caller, "now_ns": now}

# Time purity: the verdict cache relies on `time_pure` (policies/README.md,
# "Verdict cache"). A chunk's reasons may change only where now_ns crosses
# effective_at_ns or expires_at_ns, and never depend on the rest of the batch.

test_declares_itself_time_pure if chunks.time_pure == true

windowed := object.union(good, {"effective_at_ns": now, "expires_at_ns": now + 1000})

reasons_at(t) := reasons if {
	reasons := chunks.reasons.c1 with input as {"caller": caller, "now_ns": t, "chunks": [windowed]}
}

test_reasons_are_constant_before_effective_at if {
	reasons_at(0) == ["NOT_YET_EFFECTIVE"]
	reasons_at(now - 1) == ["NOT_YET_EFFECTIVE"]
}

test_reasons_are_constant_inside_the_validity_interval if {
	reasons_at(now) == []
	reasons_at(now + 500) == []
	reasons_at(now + 999) == []
}

test_reasons_are_constant_from_expires_at_on if {
	reasons_at(now + 1000) == ["EXPIRED"]
	reasons_at(now * 2) == ["EXPIRED"]
}

test_reasons_do_not_depend_on_the_batch if {
	alone := reasons_for(object.union(good, {"status": "draft"}))
	in_batch := chunks.reasons.c1 with input as {
		"caller": caller,
		"now_ns": now,
		"chunks": [
			object.union(good, {"status": "draft"}),
			object.union(good, {"id": "c2", "tenant_id": "globex"}),
			object.union(good, {"id": "c3", "expires_at_ns": now}),
		],
	}
	alone == in_batch
}
