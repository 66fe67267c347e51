"""Pinecone data plane: the REST adapter and its request rewriter, the gRPC twins."""
