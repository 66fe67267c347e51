"""Format adapters: one module per vector database's API, and the registry that picks one.

``base`` holds the protocols and the adapter skeleton, with its parts
``hits`` (where a hit keeps its id, text and metadata; the hit collector),
``body`` (rendering with fewer hits, released positions, substitutes) and
``rewriter`` (tenant push-down and over-fetch); ``registry`` builds the
configured set. Importing this package loads no adapter.
"""
