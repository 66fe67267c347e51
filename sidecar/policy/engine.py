"""The interface every policy engine implements."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class PolicyError(Exception):
    """The policy could not be loaded or evaluated.

    Callers deny: every affected chunk gets POLICY_ERROR, and a request whose
    request policy fails is refused.
    """


class PolicyEngine(Protocol):
    """A chunk policy engine.

    An engine may also have a ``time_pure`` attribute: ``True`` when the loaded
    policy declares that its verdicts may be cached per (caller, record) until
    the record's next validity boundary (policies/README.md, "Verdict cache").
    The gate reads it with a default of ``False``, so engines without it are
    evaluated for every chunk of every response.
    """

    @property
    def version(self) -> str:
        """Identifies the loaded policy (a digest of its sources) for audit records."""
        ...

    def evaluate(self, policy_input: Mapping[str, Any]) -> Mapping[str, list[str]]:
        """Evaluate the chunk policy once for a whole response.

        ``policy_input`` follows the contract in policies/README.md. Returns
        reasons per chunk id; an empty list admits the chunk. Raises PolicyError
        on any engine failure.
        """
        ...
