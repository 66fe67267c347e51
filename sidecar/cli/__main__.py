"""``python -m sidecar.cli``: the same as the ``retrieval-gate`` command."""

import sys

from sidecar.cli import main

sys.exit(main())
