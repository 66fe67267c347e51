"""The request policy's answers, kept per input for a policy that declares itself time-pure."""

from __future__ import annotations

import threading
from collections import OrderedDict

from sidecar.core.caller import Caller

# (policy version, caller, method, path, collections, unnamed collections):
# everything the request policy's input holds but the route kind, which the
# route decides.
AnswerKey = tuple[str, Caller, str, str, tuple[str, ...], tuple[str, ...]]


class RequestAnswers:
    """The request policy's denials per input, for a policy that declares itself
    time-pure (``time_pure := true`` in its package, policies/README.md).

    Such a policy's answer depends only on its input and the policy (sources
    and data), so the same input under the same policy version gets the same
    answer. The version is part of the key, and a new version empties the
    cache. Failed evaluations are never kept. Bounded: the least recently used
    entries make room.
    """

    def __init__(self, maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError("request cache size must be at least 1")
        self.maxsize = maxsize
        self._entries: OrderedDict[AnswerKey, tuple[str, ...]] = OrderedDict()
        self._version = ""
        # Remote evaluations, and their answers, run off the event loop.
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: AnswerKey) -> tuple[str, ...] | None:
        """The denials kept for ``key``; None when none are."""
        with self._lock:
            denials = self._entries.get(key)
            if denials is not None:
                self._entries.move_to_end(key)
            return denials

    def put(self, key: AnswerKey, denials: tuple[str, ...]) -> None:
        """Keep ``denials`` for ``key``, forgetting every answer of another policy version."""
        entries = self._entries
        with self._lock:
            if key[0] != self._version:
                entries.clear()
                self._version = key[0]
            entries[key] = denials
            if len(entries) > self.maxsize:
                entries.popitem(last=False)
