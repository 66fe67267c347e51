"""Qdrant: the REST adapter and its request rewriter, the gRPC (``qdrant.Points``) twins."""
