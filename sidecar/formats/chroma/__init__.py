"""Chroma HTTP API v2: the REST adapter and its request rewriter."""
