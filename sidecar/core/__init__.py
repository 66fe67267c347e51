"""The decision core and the types every layer shares.

The bottom layer: it imports nothing else of the project, so importing it
loads no adapter, no store and nothing of Envoy (docs/architecture.md).
"""
