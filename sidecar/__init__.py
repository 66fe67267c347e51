"""Retrieval Gate: policy enforcement for vector-database search responses behind Envoy."""

__version__ = "0.1.0"
