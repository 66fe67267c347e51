# Chunk policy: may this caller use this exact chunk version, now?
#
# The contract (input, output, reasons) is in policies/README.md. In short,
# `reasons` has an entry for every input chunk id; its value is the sorted array
# of the reasons the chunk is refused for, and an empty array admits the chunk.
package retrieval_gate.chunks

import rego.v1

# Declares that each chunk's reasons depend only on that chunk's record, the
# caller and the policy (sources and data), and on input.now_ns only through
# the validity checks below (now_ns against effective_at_ns and expires_at_ns).
# The gate may then cache a chunk's reasons per (caller, record, policy
# version) until the record's next validity boundary; see policies/README.md,
# "Verdict cache". Remove this line before adding a check that breaks it.
time_pure := true

# Every check is a positive proof: a chunk passes a check only when its fields
# prove that it does. An absent, null or mistyped field proves nothing, so the
# check fails. A check written as a test for failure (`c.status != "approved"`)
# would admit a chunk without a status, because comparing an absent field is
# "undefined", never true.
#
# One comprehension builds the whole object, in one pass over the chunks: per-id
# partial rules (`reasons[id] := ...`) make some engines rescan the batch per id.
# Its tables are local values rather than rules because regorus pays a fixed
# cost (tens of microseconds) per rule referenced in an evaluation.
reasons := {c.id: sort((checks - passed) | status_denials) |
	checks := {"TENANT_MISMATCH", "PRINCIPAL_MISMATCH", "NOT_YET_EFFECTIVE", "EXPIRED"}

	# Drafts are admitted only for a caller whose verified identity allows them:
	# exactly the boolean true, so that "true", 1 or a missing flag deny.
	admitted_drafts := {"draft" | input.caller.drafts_allowed == true}
	status_reasons := object.remove(
		{
			"draft": "STATUS_DRAFT",
			"superseded": "STATUS_SUPERSEDED",
			"revoked": "STATUS_REVOKED",
			"quarantined": "STATUS_QUARANTINED",
		},
		admitted_drafts,
	)

	# Any other status, or none, is POLICY_DENY: only "approved" admits.
	known_statuses := {"approved", "draft", "superseded", "revoked", "quarantined"}

	# Facts about the caller and the time are sets, empty when the input has no
	# usable value, so that a missing value proves nothing (and a null caller
	# tenant cannot match a chunk's null tenant_id).
	tenants := {t | t := input.caller.tenant; is_string(t); t != ""}
	principals := {p | is_array(input.caller.principals); some p in input.caller.principals; is_string(p); p != ""}
	nows := {n | n := input.now_ns; is_number(n)}

	some c in input.chunks

	# Validity is [effective_at_ns, expires_at_ns): inclusive start, exclusive end.
	passed := {"TENANT_MISMATCH" | c.tenant_id in tenants} |
		{"PRINCIPAL_MISMATCH" | is_array(c.allowed_principals); some p in c.allowed_principals; p in principals} |
		{"NOT_YET_EFFECTIVE" | some now in nows; is_number(c.effective_at_ns); now >= c.effective_at_ns} |
		{"EXPIRED" | c.expires_at_ns == null} |
		{"EXPIRED" | some now in nows; is_number(c.expires_at_ns); now < c.expires_at_ns}

	# object.get, not c.status: OPA moves a reference out of a `not`, so with
	# `not c.status in S` a chunk without a status would be undefined there, and
	# admitted, while regorus denies it (open-policy-agent/opa#1877).
	status_denials := {reason | reason := status_reasons[c.status]} |
		{"POLICY_DENY" | not object.get(c, "status", null) in known_statuses}
}
