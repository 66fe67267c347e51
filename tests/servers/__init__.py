"""Against a live server without Envoy: PostgreSQL, Chroma, Milvus Lite, Prometheus."""
