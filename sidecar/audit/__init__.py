"""The audit trail: typed decision records, the hash chain, JSON Lines and PostgreSQL sinks."""
