"""The setting flags of `serve` and `proxy`, generated from the Settings fields.

Every setting gets ``--name-with-dashes`` unless its field is marked file-only;
the value's type comes from the field's annotation: a boolean is ``--x/--no-x``,
an enum offers its values, a tuple is a comma-separated list. Every flag
defaults to None, which :func:`load_settings` reads as "not given", so the
file's value or the default stays in force.
"""

from __future__ import annotations

import argparse
import types
from dataclasses import Field, fields
from enum import Enum
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

from sidecar.config import Settings, load_settings, setting_info


def flag_name(setting_field: Field[Any]) -> str | None:
    """``--max-body-bytes`` for ``max_body_bytes``; None for a file-only setting."""
    if setting_info(setting_field).file_only is not None:
        return None
    return "--" + setting_field.name.replace("_", "-")


def add_setting_flags(parser: argparse.ArgumentParser) -> None:
    """Add ``--config`` and one flag per setting that is not file-only."""
    parser.add_argument("--config", type=Path, help="TOML settings file (flags override it)")
    hints = get_type_hints(Settings)
    for setting_field in fields(Settings):
        flag = flag_name(setting_field)
        if flag is not None:
            parser.add_argument(
                flag,
                dest=setting_field.name,
                default=None,
                help=_help(setting_field),
                **_value_options(hints[setting_field.name]),
            )


def settings_from_flags(args: argparse.Namespace) -> Settings:
    """The settings of ``--config`` with the flags given on the command line over it."""
    overrides = {
        setting_field.name: getattr(args, setting_field.name)
        for setting_field in fields(Settings)
        if flag_name(setting_field) is not None
    }
    config: Path | None = args.config
    return load_settings(config, overrides)


def _value_options(hint: Any) -> dict[str, Any]:
    """The add_argument options that turn the flag's text into the setting's type."""
    value_type = _without_none(hint)
    if value_type is bool:
        return {"action": argparse.BooleanOptionalAction}
    if value_type in (int, float):
        return {"type": value_type}
    if isinstance(value_type, type) and issubclass(value_type, Enum):
        return {"choices": [member.value for member in value_type]}
    if get_origin(value_type) is tuple:
        return {"type": _comma_list, "metavar": "A,B,..."}
    if value_type in (str, Path):
        return {}
    raise TypeError(f"no flag for a setting of type {hint}: mark it file-only")


def _without_none(hint: Any) -> Any:
    if isinstance(hint, types.UnionType):
        (value_type,) = [arg for arg in get_args(hint) if arg is not type(None)]
        return value_type
    return hint


def _comma_list(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def _help(setting_field: Field[Any]) -> str:
    text = setting_info(setting_field).help
    default = setting_field.default
    if isinstance(default, bool):
        text += f" (default: {'on' if default else 'off'})"
    elif isinstance(default, Enum):
        text += f" (default: {default.value})"
    elif isinstance(default, float):
        text += f" (default: {default:g})"
    elif isinstance(default, int | str):
        text += f" (default: {default})"
    # Other defaults (None, (), a factory's) are described by the help text itself.
    return text.replace("%", "%%")  # argparse formats help with %
