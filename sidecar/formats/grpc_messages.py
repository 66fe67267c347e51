"""The vector databases' gRPC messages, from the gate's own trimmed ``.proto`` files.

``proto/vendor/`` holds copies of the messages the gate reads, filters or
rewrites, with the databases' package names, message names and field numbers.
The build compiles them into one FileDescriptorSet next to this module, and
this module loads it into a descriptor pool of its own. Not the default pool:
the databases' client packages (pymilvus, qdrant-client, weaviate-client)
register the same file and message names there, and an application may import
one of them in the process that runs the gate; and the gate never imports them.

A field that a server sends and the gate's copy does not declare survives
decoding as an unknown field: ``released`` drops them all (release only what
is known), and ``has_unknown_fields`` says whether a reply had any, so that a
reply is passed byte for byte only when the gate knew all of it.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.unknown_fields import UnknownFieldSet

from sidecar.formats.base import MalformedBody

DESCRIPTORS = "vendor_protos.binpb"


@functools.cache
def _pool() -> descriptor_pool.DescriptorPool:
    data = resources.files(__package__).joinpath(DESCRIPTORS).read_bytes()
    files = descriptor_pb2.FileDescriptorSet.FromString(data)
    pool = descriptor_pool.DescriptorPool()
    for proto in files.file:
        pool.Add(proto)
    return pool


@functools.cache
def message_class(full_name: str) -> Any:
    """The message class for ``full_name`` (e.g. ``qdrant.QueryResponse``), from the private pool.

    Typed ``Any``: the classes are built at run time, so their fields are
    known to protobuf, not to the type checker. Raises KeyError for a name
    the gate's protos do not define.
    """
    return message_factory.GetMessageClass(_pool().FindMessageTypeByName(full_name))


def decode(full_name: str, data: bytes) -> Any:
    """``data`` parsed as ``full_name``; MalformedBody if it is not one."""
    message = message_class(full_name)()
    try:
        message.ParseFromString(data)
    except DecodeError:
        raise MalformedBody(f"not a {full_name} message") from None
    return message


def has_unknown_fields(message: Message) -> bool:
    """True when ``message`` or any message inside it holds a field the gate's copy lacks."""
    pending = [message]
    while pending:
        current = pending.pop()
        if len(UnknownFieldSet(current)):
            return True
        for field, value in current.ListFields():
            entry = field.message_type
            if field.type != FieldDescriptor.TYPE_MESSAGE or entry is None:
                continue
            if entry.GetOptions().map_entry:
                value_field = entry.fields_by_name["value"]
                if value_field.type == FieldDescriptor.TYPE_MESSAGE:
                    pending.extend(value.values())
            elif field.is_repeated:
                pending.extend(value)
            else:
                pending.append(value)
    return False


def released(message: Message) -> Any:
    """A copy of ``message`` with every unknown field, at every depth, removed."""
    copy = type(message)()
    copy.CopyFrom(message)
    copy.DiscardUnknownFields()
    return copy
