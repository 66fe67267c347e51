"""The chunk metadata store: interface, SQLite and PostgreSQL backends, cache, loader."""
