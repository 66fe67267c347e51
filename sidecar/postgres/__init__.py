"""PostgreSQL helpers shared by the chunk store and the audit sink."""
