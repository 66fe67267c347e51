"""The request policy, asked for one caller, route and set of collections.

Every question to the request policy goes through :meth:`RequestPolicyCheck.check`,
whether it comes from the request headers (the collections a path names) or
from a body (the collections it names beyond the path): so a remote policy
(OPA) is always asked off the event loop every stream of the process shares,
and a time-pure one is always answered from ``RequestAnswers`` when it can be.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from sidecar import refusals
from sidecar.core.caller import Caller
from sidecar.core.hits import Route, RouteKind
from sidecar.core.policy import PolicyError, RequestPolicyEngine
from sidecar.refusals import Refusal
from sidecar.request.answers import AnswerKey, RequestAnswers

log = logging.getLogger(__name__)


class RequestPolicyCheck:
    """The request policy's answer for one request, as a refusal or None."""

    def __init__(
        self,
        policy: RequestPolicyEngine,
        route_kind: Callable[[Route], RouteKind | None],
        answers: RequestAnswers | None = None,
    ) -> None:
        """``route_kind`` says what a route does (the policy's ``input.route_kind``).

        ``answers`` keeps denials while the policy declares itself time-pure
        (a bundle revision may change that); None evaluates every request.
        """
        self._policy = policy
        self._route_kind = route_kind
        self._answers = answers

    async def check(
        self,
        caller: Caller,
        route: Route,
        collections: Sequence[str],
        unnamed: Sequence[str] = (),
    ) -> Refusal | None:
        """Ask the policy whether ``caller`` may use ``route`` on ``collections``.

        ``unnamed`` are the collections among them named by an id whose name is
        not known (``input.unnamed_collections``). A remote policy is asked in
        a worker thread: an OPA round trip must not hold every other stream of
        the process.
        """
        asked = (caller, route, tuple(collections), tuple(unnamed))
        if self._policy.remote:
            return await asyncio.to_thread(self._ask, *asked)
        return self._ask(*asked)

    def _ask(
        self,
        caller: Caller,
        route: Route,
        collections: tuple[str, ...],
        unnamed: tuple[str, ...],
    ) -> Refusal | None:
        policy, answers = self._policy, self._answers
        key: AnswerKey | None = None
        if answers is not None and policy.time_pure:
            key = (policy.version, caller, route.method, route.path, collections, unnamed)
            denials = answers.get(key)
            if denials is not None:
                return _refusal(denials)
        document = {
            "caller": caller.to_document(),
            "method": route.method,
            "path": route.path,
            "collections": list(collections),
            "unnamed_collections": list(unnamed),
            "route_kind": self._route_kind(route),
        }
        try:
            reasons = tuple(policy.evaluate(document))
        except PolicyError:
            log.error("request policy could not be evaluated; refusing the request")
            return refusals.POLICY_ERROR
        if key is not None:
            assert answers is not None
            answers.put(key, reasons)
        return _refusal(reasons)


def _refusal(denials: tuple[str, ...]) -> Refusal | None:
    return refusals.FORBIDDEN.with_reasons(denials) if denials else None
