"""Running the gate: the sidecar server, worker processes, Envoy bootstrap and supervision."""
