"""``retrieval-gate verify-answer``: check an answer's citations and quotes at a running gate.

Reads an answer file, calls ``Gate/VerifyAnswer`` with the end user's
credential (a file, or the ``RETRIEVAL_GATE_CREDENTIAL`` variable: never an
argument, which ``ps`` would show) and prints one line per claim. The answer
file is JSON with exactly these keys::

    {
      "decision_ids": ["<decision id of a retrieval>", ...],
      "chunks": [{"id": "<chunk id>", "text": "<the text as the application holds it>"}, ...],
      "claims": [{"chunk_ids": ["<chunk id>", ...], "quotes": ["<quoted span>", ...]}, ...]
    }

Exit 0 when every claim is supported, 1 when not, 2 when it cannot be
checked (a bad file, no credential, the gate unreachable or refusing).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import grpc
import orjson

from sidecar.cli.exit_codes import ExitCode
from sidecar.wire import gate_pb2, gate_pb2_grpc

CREDENTIAL_VARIABLE = "RETRIEVAL_GATE_CREDENTIAL"
_TOP_KEYS = frozenset({"decision_ids", "chunks", "claims"})
_CHUNK_KEYS = frozenset({"id", "text"})
_CLAIM_KEYS = frozenset({"chunk_ids", "quotes"})


class AnswerFileError(ValueError):
    """The answer file is not what ``verify-answer`` reads; the message says what to fix."""


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``verify-answer`` to the top-level ``commands``."""
    parser = commands.add_parser(
        "verify-answer",
        help="check an answer's citations and quotes against the gate's decisions",
        description=(
            "verify-answer --gate TARGET [--credential-file FILE] ANSWER.json\n\n"
            "Calls Gate/VerifyAnswer and prints each claim's verdict (supported, "
            "unknown_decision, not_released, text_mismatch, revoked_since, "
            "superseded_since, quote_not_found). The credential is the end user's token, "
            f"from --credential-file or ${CREDENTIAL_VARIABLE}. Exit 0 when every claim is "
            "supported, 1 when not, 2 when the answer cannot be checked."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("answer", type=Path, help="the answer file (JSON)")
    parser.add_argument(
        "--gate", required=True, help="the gate's gRPC address: host:port or unix:/path"
    )
    parser.add_argument(
        "--credential-file", type=Path, help=f"file holding the token (else ${CREDENTIAL_VARIABLE})"
    )
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds (default 10)")
    parser.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run ``verify-answer``."""
    try:
        request = read_answer(args.answer)
        token = _credential(args.credential_file)
    except (AnswerFileError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.CANNOT_RUN
    try:
        with grpc.insecure_channel(args.gate) as channel:
            response = gate_pb2_grpc.GateStub(channel).VerifyAnswer(
                request, metadata=(("authorization", f"Bearer {token}"),), timeout=args.timeout
            )
    except grpc.RpcError as exc:
        code = exc.code() if isinstance(exc, grpc.Call) else None
        details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        name = code.name if code is not None else "error"
        print(f"error: the gate did not verify the answer: {name}: {details}", file=sys.stderr)
        return ExitCode.CANNOT_RUN
    if len(response.claims) != len(request.claims):
        print("error: the gate's answer does not match the claims", file=sys.stderr)
        return ExitCode.CANNOT_RUN
    supported = response.supported and all(c.verdict == "supported" for c in response.claims)
    if args.json:
        print(orjson.dumps(_as_json(response, supported), option=orjson.OPT_INDENT_2).decode())
    else:
        for claim in response.claims:
            print(f"claim {claim.position}: {claim.verdict}{_about(claim)}")
        for decision_id in response.unknown_decision_ids:
            print(f"decision {decision_id}: unknown (or not made for this caller)")
        verdict = "supported" if supported else "NOT supported"
        print(f"answer: {verdict} (verification {response.verification_id})")
    return ExitCode.OK if supported else ExitCode.FAILED


def read_answer(path: Path) -> gate_pb2.VerifyAnswerRequest:
    """The request an answer file describes; AnswerFileError naming the first problem."""
    try:
        data = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise AnswerFileError(f"{path}: not JSON: {exc}") from None
    document = _object(data, _TOP_KEYS, f"{path}")
    decision_ids = _strings(document.get("decision_ids"), f"{path}: decision_ids")
    if not decision_ids:
        raise AnswerFileError(f"{path}: decision_ids is empty: give the retrievals' decision ids")
    chunks = []
    for index, item in enumerate(_list(document.get("chunks", []), f"{path}: chunks")):
        chunk = _object(item, _CHUNK_KEYS, f"{path}: chunks[{index}]")
        chunk_id, text = chunk.get("id"), chunk.get("text")
        if not isinstance(chunk_id, str) or not isinstance(text, str):
            raise AnswerFileError(f"{path}: chunks[{index}] needs a string id and text")
        chunks.append(gate_pb2.Candidate(id=chunk_id, text=text))
    claims = []
    for index, item in enumerate(_list(document.get("claims"), f"{path}: claims")):
        claim = _object(item, _CLAIM_KEYS, f"{path}: claims[{index}]")
        cited = _strings(claim.get("chunk_ids"), f"{path}: claims[{index}].chunk_ids")
        quotes = _strings(claim.get("quotes", []), f"{path}: claims[{index}].quotes")
        claims.append(gate_pb2.ClaimToVerify(chunk_ids=cited, quotes=quotes))
    return gate_pb2.VerifyAnswerRequest(decision_ids=decision_ids, claims=claims, chunks=chunks)


def _object(value: object, keys: frozenset[str], where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise AnswerFileError(f"{where}: expected a JSON object")
    unknown = sorted(set(value) - keys)
    if unknown:
        raise AnswerFileError(
            f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(keys))})"
        )
    return value


def _list(value: object, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise AnswerFileError(f"{where}: expected a list")
    return value


def _strings(value: object, where: str) -> list[str]:
    items = _list(value, where)
    if not all(isinstance(item, str) for item in items):
        raise AnswerFileError(f"{where}: expected a list of strings")
    return items


def _credential(path: Path | None) -> str:
    token = path.read_text().strip() if path is not None else os.environ.get(CREDENTIAL_VARIABLE)
    if not token:
        raise AnswerFileError(
            f"no credential: give --credential-file FILE or set ${CREDENTIAL_VARIABLE}"
        )
    return token


def _about(claim: gate_pb2.ClaimVerdict) -> str:
    if claim.HasField("quote"):
        return f" (quote {claim.quote})"
    return f" (chunk {claim.chunk_id})" if claim.chunk_id else ""


def _as_json(response: gate_pb2.VerifyAnswerResponse, supported: bool) -> dict[str, Any]:
    return {
        "verification_id": response.verification_id,
        "supported": supported,
        "claims": [
            {
                "position": c.position,
                "verdict": c.verdict,
                "chunk_id": c.chunk_id or None,
                "quote": c.quote if c.HasField("quote") else None,
            }
            for c in response.claims
        ],
        "unknown_decision_ids": list(response.unknown_decision_ids),
    }
