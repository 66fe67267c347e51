"""The response path, protocol-free: parse, look up, decide, release, record."""
