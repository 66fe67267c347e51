"""The setting flags of `serve` and `proxy`, generated from the settings' groups.

Every setting that is not file-only gets the flag of its flat name
(``--tenant-claim`` for ``identity.tenant_claim``, ``--grpc-listen`` for
``listen.grpc``): the names from before the settings were grouped, which
scripts and manifests use. The value's type comes from the field's annotation:
a boolean is ``--x/--no-x``, an enum offers its values, a tuple is a
comma-separated list. Every flag defaults to None, which :func:`load_settings`
reads as "not given", so the file's value or the default stays in force.
"""

from __future__ import annotations

import argparse
from enum import Enum
from pathlib import Path
from typing import Any, get_origin

from sidecar.cli.help_text import plain
from sidecar.config import GROUPS, SETTINGS, Setting, Settings, load_settings


def add_setting_flags(parser: argparse.ArgumentParser) -> None:
    """Add ``--config`` and one flag per setting that is not file-only, by group."""
    parser.add_argument("--config", type=Path, help="TOML settings file (flags override it)")
    for group, cls in GROUPS.items():
        section = parser.add_argument_group(f"[{group}] settings", plain(cls.__doc__))
        for spec in SETTINGS:
            if spec.group == group and spec.flag is not None:
                section.add_argument(
                    spec.flag,
                    dest=spec.name,
                    default=None,
                    help=_help(spec),
                    **_value_options(spec),
                )


def settings_from_flags(args: argparse.Namespace) -> Settings:
    """The settings of ``--config`` with the flags given on the command line over it."""
    overrides = {spec.name: getattr(args, spec.name) for spec in SETTINGS if spec.flag is not None}
    config: Path | None = args.config
    return load_settings(config, overrides)


def _value_options(spec: Setting) -> dict[str, Any]:
    """The add_argument options that turn the flag's text into the setting's type."""
    value_type = spec.value_type
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
    raise TypeError(f"no flag for a setting of type {spec.type}: mark it file-only")


def _comma_list(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def _help(spec: Setting) -> str:
    text = f"{spec.info.help} [{spec.path}]"
    default = spec.default
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
