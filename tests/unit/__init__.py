"""In process: no Envoy, no server. The fast tier (`./dev fast`)."""
