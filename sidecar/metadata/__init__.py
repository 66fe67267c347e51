"""Authoritative chunk metadata: the store interface, its backends and the cache."""
