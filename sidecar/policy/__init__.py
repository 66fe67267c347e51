"""Rego policy engines behind one interface."""
