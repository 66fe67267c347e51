"""One Weaviate GraphQL query, rewritten on its syntax tree: tenant push-down and over-fetch.

The query is parsed with graphql-core (the reference implementation's Python
port), changed as a tree and printed back, so nothing the app wrote is ever
spliced as text: the tenant is a string literal node, and the app's ``where``
is a node nested as an operand. Every class field of every ``Get`` gets

    where: {operator: And, operands: [
        {path: ["<tenant_key>"], operator: Equal, valueText: "<tenant>"},
        <the app's where, as written>]}

or the condition alone when the app sent none (or ``null``). ``And`` keeps the
app's filter exactly as it was and can only narrow it; variables inside it
keep working, since the object around them keeps its type. A ``where`` given
as a variable as a whole is refused: Weaviate types the ``where`` argument
and the ``operands`` items differently (``...WhereInpObj`` and
``...WhereOperandsInpObj``), so the variable cannot be moved into the operand.

What the tenant condition cannot reach is refused (``UnfilterableRequest``):

- root fields other than ``Get`` (``Aggregate`` and ``Explore`` compute over,
  or point at, every object; introspection fields pass) and aliased root
  fields, which the response filter could not recognise;
- fragments (spread or inline) at the root or directly in ``Get``, directives
  there, and two class fields with one response key: where class fields hide
  or merge, the condition could miss one or a limit be applied to another;
- ``nearObject`` and ``moveTo``/``moveAwayFrom`` ``objects``: they name an
  object by id, which Weaviate looks up whatever the filter says (another
  tenant's object would answer for its existence and its vector);
- a multi-tenancy ``tenant`` argument naming anyone but the caller;
- operations other than queries, and documents with other definitions.

Over-fetch raises a class field's literal ``limit`` (a variable, or no limit
at all, is left alone: the default is the server's ``QUERY_DEFAULTS_LIMIT``,
which the gate cannot know), and only without ``offset``, ``after`` (pages
counted before the response check), ``autocut`` (cut points computed over the
whole result list) and ``groupBy`` (its limits count groups).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any, Final

from graphql import GraphQLError, parse, print_ast
from graphql.language import ast

from sidecar.formats.base import MalformedRequest, UnfilterableRequest

# Root fields that carry no objects: the schema and the type names.
_INTROSPECTION: Final = frozenset({"__typename", "__schema", "__type"})
# Arguments after which a longer result list is not the same list extended.
_NO_OVERFETCH: Final = frozenset({"offset", "after", "autocut", "groupBy"})
# Object fields that name objects by id, at any depth of a class field's arguments.
_BY_ID: Final = frozenset({"nearObject", "objects"})
# Tokens in one query at most (graphql-core counts them as it parses).
_MAX_TOKENS: Final = 100_000


def refused(what: str) -> UnfilterableRequest:
    """The refusal of a request whose query the tenant condition cannot reach."""
    return UnfilterableRequest(f"{what} cannot be restricted to the caller's tenant")


@dataclass(frozen=True, slots=True)
class Options:
    """What to apply to a query: the tenant condition and the over-fetch."""

    tenant: str
    tenant_key: str | None  # None: no push-down
    factor: Decimal | None  # None: no over-fetch
    cap: int


@dataclass(frozen=True, slots=True)
class Rewritten:
    """A query as the gate sends it.

    ``limits`` pairs each class field's response key with the limit the app
    asked for where it was raised (None where it was not), sorted by key; empty
    when nothing is over-fetched (a document with several operations never is).
    """

    query: str
    collections: tuple[str, ...]
    limits: tuple[tuple[str, int | None], ...]


def rewrite_query(query: str, variables: Mapping[str, Any], options: Options) -> Rewritten:
    """Restrict every ``Get`` class field of ``query`` to the tenant and raise its limits.

    ``variables`` are the request's; they are read for a ``tenant`` argument only.
    Raises UnfilterableRequest for what the condition cannot reach, and
    MalformedRequest when ``query`` is not a GraphQL document.
    """
    document = _parse(query)
    collections, limits = _walk(document, variables, options)
    return Rewritten(
        print_ast(document),
        collections,
        tuple(sorted(limits)) if options.factor is not None else (),
    )


# What a read of a query's classes applies: nothing.
_READ_ONLY: Final = Options(tenant="", tenant_key=None, factor=None, cap=0)


def query_collections(query: str, variables: Mapping[str, Any]) -> tuple[str, ...]:
    """The classes ``query`` reads, as ``rewrite_query`` gives them, without rewriting it.

    It refuses what ``rewrite_query`` refuses without push-down or over-fetch.
    """
    return _walk(_parse(query), variables, _READ_ONLY)[0]


def _walk(
    document: ast.DocumentNode, variables: Mapping[str, Any], options: Options
) -> tuple[tuple[str, ...], list[tuple[str, int | None]]]:
    """Apply ``options`` to every class field of ``document`` (in place); the classes
    it reads and, per class field, its response key and the app's raised limit."""
    collections: dict[str, None] = {}
    limits: list[tuple[str, int | None]] = []
    operations = sum(isinstance(d, ast.OperationDefinitionNode) for d in document.definitions)
    if operations != 1:
        # Which one runs is the request's operationName: limits could not be placed.
        options = replace(options, factor=None)
    for definition in document.definitions:
        if isinstance(definition, ast.FragmentDefinitionNode):
            # Spread inside class fields only (the root and Get refuse spreads),
            # for cross-references: its type is a class read.
            collections[definition.type_condition.name.value] = None
            continue
        if not isinstance(definition, ast.OperationDefinitionNode):
            raise refused("a definition other than an operation or fragment")
        if definition.operation is not ast.OperationType.QUERY:
            raise refused("an operation other than a query")
        keys: set[str] = set()
        for field in _class_fields(definition, options.tenant_key is not None):
            key = (field.alias or field.name).value
            if key in keys:
                raise refused("two class fields with one response key")
            keys.add(key)
            collections.update(dict.fromkeys(_classes_read(field)))
            limits.append((key, _rewrite_class_field(field, variables, options)))
    return tuple(collections), limits


def _parse(query: str) -> ast.DocumentNode:
    try:
        return parse(query, no_location=True, max_tokens=_MAX_TOKENS)
    except (GraphQLError, RecursionError):
        pass
    # Raised outside the handler: a syntax error's message quotes the query.
    raise MalformedRequest("'query' is not a GraphQL document the gate can read")


def _class_fields(
    operation: ast.OperationDefinitionNode, restricted: bool
) -> Iterator[ast.FieldNode]:
    """The class fields of every ``Get`` of ``operation``.

    With push-down (``restricted``), anything else at the root that reads
    objects is refused; without it the response filter withholds it.
    """
    for selection in operation.selection_set.selections:
        if not isinstance(selection, ast.FieldNode):
            raise refused("a fragment at the root of a query")
        name = selection.name.value
        if selection.alias is not None and name not in _INTROSPECTION:
            raise refused("an aliased root field")
        if name in _INTROSPECTION:
            continue
        if name != "Get":
            if restricted:
                raise refused(f"the root field {name!r}")
            continue
        if selection.directives:
            raise refused("a directive on Get")
        for field in selection.selection_set.selections if selection.selection_set else ():
            if not isinstance(field, ast.FieldNode):
                raise refused("a fragment in Get")
            if field.name.value == "__typename":
                continue
            if field.directives:
                raise refused("a directive on a Get class field")
            yield field


def _classes_read(field: ast.FieldNode) -> Iterator[str]:
    """The class a class field reads, then those its cross-references name
    (inline fragments ``... on Class``), in query order."""
    yield field.name.value
    pending = [field.selection_set] if field.selection_set else []
    while pending:
        selection_set = pending.pop(0)
        for selection in selection_set.selections:
            if isinstance(selection, ast.InlineFragmentNode) and selection.type_condition:
                yield selection.type_condition.name.value
            nested = getattr(selection, "selection_set", None)
            if nested is not None:
                pending.append(nested)


def _rewrite_class_field(
    field: ast.FieldNode, variables: Mapping[str, Any], options: Options
) -> int | None:
    """Push the tenant down into ``field`` and raise its limit (in place); the app's
    limit where it was raised, else None."""
    arguments: dict[str, ast.ArgumentNode] = {}
    for argument in field.arguments:
        name = argument.name.value
        if name in arguments:
            raise refused(f"the argument {name!r} given twice")
        arguments[name] = argument
    if options.tenant_key is not None:
        _check_by_id(arguments)
        _check_tenant(arguments.get("tenant"), variables, options.tenant)
        where = arguments.get("where")
        condition = _condition(options.tenant_key, options.tenant)
        arguments["where"] = _argument("where", _and(condition, where))
    asked = None
    if options.factor is not None:
        asked = _overfetch(arguments, options.factor, options.cap)
    field.arguments = tuple(arguments.values())
    return asked


def _check_by_id(arguments: Mapping[str, ast.ArgumentNode]) -> None:
    pending: list[ast.ValueNode] = []
    for name, argument in arguments.items():
        if name in _BY_ID:
            raise refused(f"the argument {name!r}")
        pending.append(argument.value)
    while pending:
        value = pending.pop()
        if isinstance(value, ast.ObjectValueNode):
            for item in value.fields:
                if item.name.value in _BY_ID:
                    raise refused(f"the field {item.name.value!r}")
                pending.append(item.value)
        elif isinstance(value, ast.ListValueNode):
            pending.extend(value.values)


def _check_tenant(
    argument: ast.ArgumentNode | None, variables: Mapping[str, Any], tenant: str
) -> None:
    """A multi-tenancy ``tenant`` argument may name the caller's tenant only."""
    if argument is None:
        return
    value = argument.value
    named: Any = None
    if isinstance(value, ast.StringValueNode):
        named = value.value
    elif isinstance(value, ast.VariableNode):
        named = variables.get(value.name.value)
    if named != tenant:
        raise refused("a tenant argument other than the caller's tenant")


def _condition(tenant_key: str, tenant: str) -> ast.ObjectValueNode:
    return _object(
        path=ast.ListValueNode(values=(ast.StringValueNode(value=tenant_key),)),
        operator=ast.EnumValueNode(value="Equal"),
        valueText=ast.StringValueNode(value=tenant),
    )


def _and(condition: ast.ObjectValueNode, where: ast.ArgumentNode | None) -> ast.ValueNode:
    """``condition`` AND the app's ``where``; the condition alone without one."""
    if where is None or isinstance(where.value, ast.NullValueNode):
        return condition
    if isinstance(where.value, ast.VariableNode):
        raise refused("a where argument given as a variable")
    if not isinstance(where.value, ast.ObjectValueNode):
        raise refused("a where argument that is not an object")
    return _object(
        operator=ast.EnumValueNode(value="And"),
        operands=ast.ListValueNode(values=(condition, where.value)),
    )


def _overfetch(arguments: dict[str, ast.ArgumentNode], factor: Decimal, cap: int) -> int | None:
    limit = arguments.get("limit")
    if limit is None or not isinstance(limit.value, ast.IntValueNode):
        return None
    if _NO_OVERFETCH & arguments.keys():
        return None
    asked = int(limit.value.value)
    if asked < 0:
        return None  # Weaviate refuses it
    raised = min(cap, math.ceil(factor * asked))
    if raised <= asked:
        return None
    arguments["limit"] = _argument("limit", ast.IntValueNode(value=str(raised)))
    return asked


def _argument(name: str, value: ast.ValueNode) -> ast.ArgumentNode:
    return ast.ArgumentNode(name=ast.NameNode(value=name), value=value)


def _object(**fields: ast.ValueNode) -> ast.ObjectValueNode:
    return ast.ObjectValueNode(
        fields=tuple(
            ast.ObjectFieldNode(name=ast.NameNode(value=name), value=value)
            for name, value in fields.items()
        )
    )
