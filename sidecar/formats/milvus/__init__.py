"""Milvus: the REST v2 adapter and its request rewriter, the gRPC (``MilvusService``)
twins and the parts that read and rebuild its column-shaped replies."""
