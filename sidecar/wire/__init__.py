"""Envoy wire messages, generated from proto/ by the build (see setup.py)."""
