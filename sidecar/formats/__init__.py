"""Format adapters: one subpackage per vector database, and the registry that picks one.

``base`` holds the protocols and the adapter skeleton, with its parts
``hits`` (where a hit keeps its id, text and metadata; the hit collector),
``body`` (rendering with fewer hits, released positions, substitutes) and
``rewriter`` (tenant push-down and over-fetch); ``grpc_frames``,
``grpc_messages`` and ``grpc_adapter`` are what the gRPC adapters share;
``registry`` builds the configured set. Each database's subpackage
(``qdrant``, ``chroma``, ``weaviate``, ``elasticsearch``, ``pinecone``,
``milvus``, and ``generic`` for the adapter a configuration describes) names
its modules alike: ``rest`` and ``grpc`` are the adapters, ``rest_request``
and ``grpc_request`` their request sides, ``rest_*`` and ``grpc_*`` their
parts. Importing this package loads no adapter.
"""
