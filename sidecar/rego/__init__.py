"""Rego policy engines: regorus in process, the request policy, the Rego test runner.

The policies themselves are the Rego files in policies/.
"""
