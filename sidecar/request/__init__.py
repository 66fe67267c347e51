"""The request path, protocol-free: the twin of ``sidecar.enforcement``.

``request_path`` (``RequestPath``: a plan per exchange at its request
headers, then the body), ``plans`` (``Refused``, ``PassThrough``,
``ReadCollections``, ``Filter``), ``admission`` (canonical paths, probes,
scope headers, identity), ``policy_check`` (the request policy, off the event
loop when it is remote) and ``answers`` (its answers kept for a time-pure
policy). Knows nothing of Envoy: ``sidecar.envoy`` translates.
"""
