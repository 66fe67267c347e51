"""The audit trail: typed decision records, the hash chain, its sinks and verifiers."""
