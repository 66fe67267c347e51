"""Tenant push-down for a generic format: a configured place and a JSON template.

A generic format knows where its API keeps a search's filter only when told:

- ``tenant_filter_at``: a selector of the filter in the request body
  (``$.filter``, ``$.query.filter``, ``$.queries[*].filter``): it ends with
  the filter's field name, and every object above it must be there;
- ``tenant_filter``: the JSON value (a TOML table) that takes the filter's
  place, written in the API's own filter language. Its placeholders are
  whole JSON strings, never parts of one: ``"{tenant}"`` becomes the
  caller's tenant (a JSON string), ``"{filter}"`` the app's filter as the
  JSON value it sent (nested, untouched), and ``"{tenant_key}"`` (a string
  or an object key) the route's ``tenant_key``. It holds ``"{tenant}"``
  and exactly one ``"{filter}"``, for example
  ``{"$and": [{"{tenant_key}": {"$eq": "{tenant}"}}, "{filter}"]}``;
- ``tenant_filter_alone``: what goes there when the app sent no filter
  (absent or null). By default the template without its ``"{filter}"``
  element (or key): ``{"$and": [{"tenant": {"$eq": "acme"}}]}``.

Nothing is ever spliced into a string, so no tenant id or app filter can
change the template's structure; that the template ANDs (and so keeps the
app's filter from widening the result) is the operator's to write, in the
API's language. The options are checked when the format is built, each
error naming its option.

Without these options a generic format does not rewrite requests, whatever
``tenant_key`` says: the gate cannot know where an unknown API keeps its
filter, and guessing would either break the API or leave the filter where
the API does not read it. Its responses are still checked hit by hit, and
its counts are recomputed from the hits it releases, so no other tenant's
text or count goes out; what push-down adds is full pages. The docs say
so. Requests are never over-fetched: the gate does not know the limit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final

from sidecar.core.hits import Route
from sidecar.formats.base import MalformedBody, MalformedRequest, UnfilterableRequest
from sidecar.formats.generic.rest_options import RouteTemplate, field_option
from sidecar.formats.generic.selectors import Selector
from sidecar.formats.rewriter import SearchRewriter

TENANT: Final = "{tenant}"
FILTER: Final = "{filter}"
TENANT_KEY: Final = "{tenant_key}"
_PLACEHOLDERS: Final = (TENANT, FILTER, TENANT_KEY)
_SCALARS: Final = (str, int, float, bool, type(None))


@dataclass(frozen=True, slots=True)
class TenantFilter:
    """Where the filter is, and what takes its place with and without one."""

    at: Selector
    template: Any
    alone: Any


def checked_tenant_filter(at: object, template: object, alone: object) -> TenantFilter | None:
    """The ``tenant_filter_at``, ``tenant_filter`` and ``tenant_filter_alone`` options,
    checked; None when none is given. Raises ValueError naming the option."""
    if at is None and template is None and alone is None:
        return None
    if at is None or template is None:
        raise ValueError("tenant_filter_at, tenant_filter: give both, or neither")
    selector = field_option("tenant_filter_at", at, relative=False)
    counts = _placeholders(template, "tenant_filter")
    if counts[FILTER] != 1 or not counts[TENANT]:
        raise ValueError(
            f'tenant_filter: needs "{TENANT}" and exactly one "{FILTER}", each a whole string'
        )
    if alone is None:
        # Not the template itself: it holds "{tenant}" as well.
        alone = _without_filter(template)
    else:
        counts = _placeholders(alone, "tenant_filter_alone")
        if counts[FILTER] or not counts[TENANT]:
            raise ValueError(f'tenant_filter_alone: needs "{TENANT}" and no "{FILTER}"')
    return TenantFilter(selector, template, alone)


def _placeholders(template: object, option: str) -> dict[str, int]:
    """How often each placeholder stands in ``template``; ValueError for anything
    that is not JSON or holds a placeholder inside other text."""
    counts = dict.fromkeys(_PLACEHOLDERS, 0)
    pending = [template]
    while pending:
        value = pending.pop()
        if isinstance(value, dict):
            for key in value:
                if key in (TENANT, FILTER):
                    raise ValueError(f'{option}: only "{TENANT_KEY}" may stand for an object key')
                if key != TENANT_KEY:
                    _literal(key, option)
            pending.extend(value.values())
            counts[TENANT_KEY] += TENANT_KEY in value
        elif isinstance(value, list):
            pending.extend(value)
        elif isinstance(value, str) and value in _PLACEHOLDERS:
            counts[value] += 1
        elif isinstance(value, str):
            _literal(value, option)
        elif not isinstance(value, _SCALARS) or (
            isinstance(value, float) and not math.isfinite(value)
        ):
            raise ValueError(f"{option}: holds a value that is not JSON")
    return counts


def _literal(text: object, option: str) -> None:
    if not isinstance(text, str):
        raise ValueError(f"{option}: holds a value that is not JSON")
    if any(placeholder in text for placeholder in _PLACEHOLDERS):
        raise ValueError(f"{option}: a placeholder must be a whole string, not part of one")


def _without_filter(template: Any) -> Any:
    """``template`` without the array element or object entry that is ``"{filter}"``."""
    if isinstance(template, dict):
        return {k: _without_filter(v) for k, v in template.items() if v != FILTER}
    if isinstance(template, list):
        return [_without_filter(item) for item in template if item != FILTER]
    return template


def _filled(template: Any, tenant: str, tenant_key: str, app_filter: Any) -> Any:
    """``template`` with its placeholders replaced (containers copied, the filter not)."""
    if isinstance(template, dict):
        return {
            tenant_key if k == TENANT_KEY else k: _filled(v, tenant, tenant_key, app_filter)
            for k, v in template.items()
        }
    if isinstance(template, list):
        return [_filled(item, tenant, tenant_key, app_filter) for item in template]
    if template == TENANT:
        return tenant
    if template == FILTER:
        return app_filter
    if template == TENANT_KEY:
        return tenant_key
    return template


class GenericRequests(SearchRewriter[TenantFilter]):
    """Pushes the tenant down into the requests of a generic format's routes, when
    its tenant filter options say where and how."""

    _routes: tuple[RouteTemplate, ...]
    _tenant_filter: TenantFilter | None

    def _request_endpoint(self, route: Route) -> TenantFilter | None:
        if self._tenant_filter is None:
            return None
        if not any(template.matches(route) for template in self._routes):
            return None
        return self._tenant_filter

    def _push_down(
        self, request: dict[str, Any], endpoint: TenantFilter, tenant_key: str, tenant: str
    ) -> None:
        field = endpoint.at.steps[-1]
        assert isinstance(field, str)  # checked: the selector ends with a field name
        parents = _parents(request, endpoint.at)
        for parent in parents:
            app_filter = parent.get(field)
            template = endpoint.alone if app_filter is None else endpoint.template
            parent[field] = _filled(template, tenant, tenant_key, app_filter)

    def _overfetches(self, endpoint: TenantFilter) -> bool:
        return False

    def _limit(self, request: dict[str, Any], endpoint: TenantFilter) -> tuple[str, Any] | None:
        return None


def _parents(request: dict[str, Any], at: Selector) -> list[dict[str, Any]]:
    """The objects that hold the filter; refused unless there is at least one and
    every one is an object."""
    try:
        matches = at.head(len(at.steps) - 1).require(request)
        found = True
    except MalformedBody:
        found = False
    # Raised outside the handler: nothing of the body is chained.
    if not found or not matches:
        raise UnfilterableRequest(f"the body has no place for the filter at {at.text!r}")
    parents = [match.value for match in matches]
    if not all(isinstance(parent, dict) for parent in parents):
        raise MalformedRequest(f"the filter at {at.text!r} is not in a JSON object")
    return parents
