"""The chunk and request policies evaluated by an OPA server, over its REST Data API.

``--policy-engine opa --opa-url URL`` sends each response's chunk decisions to
OPA in ONE call, ``POST /v1/data/retrieval_gate/chunks/reasons`` with
``{"input": <the whole batch>}`` (the same input document and the same policy
package as the in-process engine: policies/README.md), and each request's
request policy to ``/v1/data/retrieval_gate/request/denials``. The HTTP client
is ``opa-python-client``'s synchronous ``OpaClient`` (a reused
``requests.Session``).

Failure is a PolicyError, never an answer: unreachable, a timeout, an HTTP
error, a body that is not JSON, an undefined rule, or a result of the wrong
shape or with other chunk ids than the input's. The gate turns it into
POLICY_ERROR for every chunk of the response, the request path into a 403.

Bounds: every connect and every read on the socket waits at most
``timeout_seconds``; a refused or failed connection is retried ``retries``
times (1 by default), immediately; nothing else is retried, so a request
OPA may already have evaluated is never sent twice.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests
from opa_client import OpaClient

from sidecar.core.policy import PolicyError

# The validation of results is shared with the in-process engine, so that both
# engines refuse exactly the same answers.
from sidecar.rego.regorus_engine import DEFAULT_QUERY, checked_reasons, input_chunk_ids
from sidecar.rego.request_policy import REQUEST_QUERY, checked_denials

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_SECONDS = 0.5
DEFAULT_RETRIES = 1
_SEGMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DEFAULT_PORTS = {"http": 80, "https": 443}

# The input the chunk rule is probed with at start-up: a well-formed empty batch.
_EMPTY_BATCH = {
    "caller": {"tenant": "", "principals": [], "drafts_allowed": False},
    "now_ns": 0,
    "chunks": [],
}


def read_token_file(path: Path) -> str:
    """The bearer token in ``path``, without surrounding whitespace.

    Raises ValueError (naming the file, never quoting it) when it cannot be
    read or is empty.
    """
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"OPA token file {path}: {type(exc).__name__}") from None
    if not token:
        raise ValueError(f"OPA token file {path} is empty")
    return token


class OpaServer:
    """The connection to one OPA server: where it is, how long to wait, how to retry."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        ca_file: Path | None = None,
        retries: int = DEFAULT_RETRIES,
    ) -> None:
        """``url`` is OPA's base URL (``http://127.0.0.1:8181``; a path prefix is
        kept, for an OPA behind a reverse proxy). ``ca_file`` verifies an https
        OPA's certificate against that CA bundle instead of the system's.

        Raises ValueError for a URL that is not http(s)://host[:port][/prefix],
        or that carries credentials, a query or a fragment (the token belongs in
        the token file, never in a URL that is logged).
        """
        parts = urlsplit(url)
        if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
            raise ValueError("OPA URL must be http://host[:port] or https://host[:port]")
        if parts.username is not None or parts.password is not None:
            raise ValueError("OPA URL must not carry credentials: use the token file")
        if parts.query or parts.fragment:
            raise ValueError("OPA URL must not have a query or a fragment")
        if ca_file is not None and parts.scheme != "https":
            raise ValueError("an OPA CA file needs an https:// OPA URL")
        try:
            port = parts.port or _DEFAULT_PORTS[parts.scheme]
        except ValueError:
            raise ValueError("OPA URL has an invalid port") from None
        if timeout_seconds <= 0 or retries < 0:
            raise ValueError("OPA timeout must be > 0 and retries >= 0")
        host = parts.hostname
        prefix = parts.path.strip("/")
        self._display = f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"
        # OpaClient: ``ssl`` is both "use https" and requests' ``verify`` (True:
        # the system CAs; a path: that bundle); ``version`` is the path under
        # the host, so a reverse proxy's prefix goes there.
        verify: bool | str = False
        if parts.scheme == "https":
            verify = str(ca_file) if ca_file is not None else True
        self._client = OpaClient(
            host=f"[{host}]" if ":" in host else host,
            port=port,
            version=f"{prefix}/v1" if prefix else "v1",
            ssl=verify,
            token=token,
            # urllib3's Retry never retries a POST after it was sent (reads,
            # 5xx): only connection errors are retried, as documented above.
            retries=retries,
            timeout=timeout_seconds,
        )

    @property
    def display_url(self) -> str:
        """The base URL, for logs and the policy version (it never holds credentials)."""
        return self._display

    def query(self, rule: str, document: Mapping[str, Any]) -> Any:
        """The value of ``rule`` (``data.a.b.c``) for ``document`` as input; None when undefined.

        One ``POST /v1/data/a/b/c``. Raises PolicyError on any failure; the
        message says what kind, never input data or the token.
        """
        package, name = _split_rule(rule)
        try:
            answer = self._client.query_rule(dict(document), package, name)
        except requests.Timeout:
            raise PolicyError(f"OPA did not answer {rule} in time") from None
        except requests.ConnectionError:
            raise PolicyError(f"OPA is unreachable for {rule}") from None
        except requests.HTTPError as exc:
            status = exc.response.status_code if exc.response is not None else "?"
            raise PolicyError(f"OPA answered {rule} with HTTP {status}") from None
        except ValueError:  # includes requests' JSONDecodeError
            raise PolicyError(f"OPA's answer for {rule} is not JSON") from None
        except TypeError:
            raise PolicyError("policy input is not JSON-serialisable") from None
        except Exception as exc:
            # Anything else the client or the transport raises still denies.
            raise PolicyError(f"OPA query for {rule} failed: {type(exc).__name__}") from None
        if not isinstance(answer, dict):
            raise PolicyError(f"OPA's answer for {rule} is not a JSON object")
        # OPA leaves ``result`` out when the rule is undefined for the input.
        return answer.get("result")

    def close(self) -> None:
        """Close the HTTP session."""
        self._client.close_connection()


class OpaEngine:
    """A PolicyEngine asking OPA for the reasons of a whole batch in one call.

    Not time-pure: the gate cannot see when OPA's policy or data changes (a
    bundle can be activated at any moment), so no verdict is cached and every
    response is evaluated by OPA.
    """

    time_pure = False
    remote = True  # the gate runs evaluate off its event loop

    def __init__(self, server: OpaServer, *, query: str = DEFAULT_QUERY) -> None:
        """``query`` is the rule returning reasons per chunk id (``data.a.b.reasons``)."""
        _split_rule(query)  # a rule the Data API can address, or ValueError now
        self._server = server
        self._query = query
        self._version = f"opa:{server.display_url}#{query}"

    @property
    def version(self) -> str:
        """``opa:<base URL>#<rule>``: the gate cannot see which policy revision OPA ran."""
        return self._version

    def evaluate(self, policy_input: Mapping[str, Any]) -> dict[str, list[str]]:
        """Reasons per chunk id for one batch, from one call to OPA.

        Raises PolicyError when OPA fails or answers anything but an object of
        string arrays with exactly one entry per input chunk id (the same
        checks as the in-process engine).
        """
        expected_ids = input_chunk_ids(policy_input)
        result = self._server.query(self._query, policy_input)
        return checked_reasons(result, expected_ids, self._query)

    def probe(self) -> None:
        """Evaluate an empty batch, to say at start-up whether OPA serves the rule.

        Raises PolicyError when it does not; the sidecar logs it and starts
        anyway (every response fails closed until OPA answers).
        """
        checked_reasons(self._server.query(self._query, _EMPTY_BATCH), set(), self._query)


class OpaRequestPolicy:
    """The request policy (``data.retrieval_gate.request.denials``) evaluated by OPA."""

    # OPA can change the policy unseen, so no answer is kept by input.
    time_pure = False
    remote = True  # admission runs evaluate off its event loop

    def __init__(self, server: OpaServer) -> None:
        self._server = server
        self._version = f"opa:{server.display_url}#{REQUEST_QUERY}"

    @property
    def version(self) -> str:
        """``opa:<url>#<rule>``: OPA can change the policy unseen, so nothing is kept by it."""
        return self._version

    def evaluate(self, request_input: Mapping[str, Any]) -> list[str]:
        """The reasons the request is denied for; an empty list allows it.

        Raises PolicyError when OPA fails or the result is not an array of strings.
        """
        return checked_denials(self._server.query(REQUEST_QUERY, request_input))


def _split_rule(rule: str) -> tuple[str, str]:
    """``data.a.b.c`` -> (``a.b``, ``c``); ValueError for a path the Data API
    cannot address as plain segments."""
    segments = rule.split(".")
    if len(segments) < 3 or segments[0] != "data":
        raise ValueError(f"OPA rule must be data.<package>.<rule>, got {rule!r}")
    if not all(_SEGMENT.fullmatch(segment) for segment in segments[1:]):
        raise ValueError(f"OPA rule {rule!r} must be plain identifiers separated by dots")
    return ".".join(segments[1:-1]), segments[-1]
