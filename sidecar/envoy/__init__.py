"""Envoy-facing code: gRPC servicers (protocol only), bootstrap config, process supervision."""
