"""Format adapters: one module per vector database's API, and the registry that picks one.

``base`` holds the adapter skeleton and the protocols; ``registry`` builds the
configured set. Importing this package loads no adapter.
"""
