"""`retrieval-gate demo`: Envoy + gate + a fixture upstream, on embedded defaults."""
