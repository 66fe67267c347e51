"""Weaviate: GraphQL over REST (adapter, bodies, requests, the query syntax tree) and the
v4 client's gRPC service (adapter, hits, replies, property values, requests)."""
