"""The adapter a configuration describes (``adapter = "generic"``): its options, its
request rewriter and the selector language its options are written in."""
