"""Adversarial identity and tenancy cases (issue 16, item 2), shared by a test and a benchmark.

- ``world``: what the gate runs against (tenants, chunk records, the points
  a hostile vector database returns) and the record contract's answer;
- ``tokens``: the gate's and an attacker's keys, and tokens minted from a
  description at the moment they are sent;
- ``model``: what a case is; ``header_cases``, ``token_cases``,
  ``tenant_cases`` and ``record_cases`` draw each class; ``cases``
  generates a run of them from a seed;
- ``wire``: raw HTTP/1.1 to Envoy; ``runner``: the cases against the real
  stacks, loader and store; ``verdicts``: the invariants, and the table.

``tests/test_adversarial_identity.py`` runs a reduced count,
``bench/adversarial.py`` the full one.
"""
