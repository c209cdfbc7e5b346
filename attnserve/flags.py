"""Flags built from dataclass fields, so that each default is written once: in the field.

A field whose metadata holds `flag(help)` is a command-line flag: `--field-name`, converted with
the field's annotated type (or the metadata's own `type`), its default the field's and shown in its
help. `attnserve serve` and `ray-serve` are built this way from whole configs, `generate` and
`bench` from some fields of theirs (`only`). Standard library only: client hosts import it.
"""

from __future__ import annotations

import argparse
import os
import typing
from collections.abc import Callable
from dataclasses import MISSING, Field, fields
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def flag(help: str, *, unset: str = "none", **argparse_keywords: Any) -> dict[str, Any]:
    """A field's flag: its help, what a None default means (`unset`), and argparse keywords the type cannot say."""
    return {"help": help, "unset": unset, **argparse_keywords}


def add_field_flags(parser: argparse.ArgumentParser, config_class: type, only: tuple[str, ...] | None = None) -> None:
    """A flag for each field of `config_class` that has help (each named in `only`, if given)."""
    hints = typing.get_type_hints(config_class)
    for f in fields(config_class):
        if "help" in f.metadata and (only is None or f.name in only):
            parser.add_argument(flag_name(f.name), **argparse_keywords(f, hints[f.name]))


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def argparse_keywords(f: Field[Any], hint: Any) -> dict[str, Any]:
    """add_argument's keywords for one field: the type from its annotation, the default shown in its help."""
    keywords = {k: v for k, v in f.metadata.items() if k != "unset"}
    if f.default is MISSING:
        return {"required": True, **keywords}
    keywords["default"] = f.default
    keywords["help"] += f" (default: {shown_default(f.default, f.metadata['unset'])})"
    if hint is bool:
        assert f.default is False, f"{f.name}: a store_true flag turns on what is off by default"
        return {"action": "store_true", **keywords}
    keywords["type"] = argparse_type(keywords["type"]) if "type" in keywords else value_type(hint)
    return keywords


def shown_default(default: object, unset: str) -> str:
    if default is None:
        return unset
    if isinstance(default, bool):
        return "on" if default else "off"
    return str(default)


def value_type(hint: Any) -> type:
    """`int | None` -> int: the type a flag's text is converted with."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


def argparse_type(parse: Callable[[str], T]) -> Callable[[str], T]:
    """`parse` whose ValueError argparse prints as one line naming the flag: 'argument --x: <why>'."""

    def convert(text: str) -> T:
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    convert.__name__ = parse.__name__
    return convert


def shown(value: object) -> str:
    """A flag's value as it was typed: 3, 0.5, -1 (not 3.0 or 1e+06); text quoted ('', 'x y')."""
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else str(value)
    return str(value) if isinstance(value, int) else repr(value)


def check_directory(flag: str, path: str | Path) -> None:
    """Before a run: `path` must be a directory, or one that can be made (no file where a directory
    of it would go); ValueError naming `flag` otherwise."""
    for place in (Path(path), *Path(path).parents):
        if place.exists():
            if not place.is_dir():
                raise ValueError(f"{flag} {path}: {place} is a file, not a directory")
            return


def check_output(flag: str, path: str | None) -> None:
    """Before a run: `path` must be a file that can be written in a directory that exists (nothing
    is created but the file); ValueError naming `flag` otherwise."""
    if not path:
        return
    parent = Path(path).parent
    if Path(path).is_dir():
        raise ValueError(f"{flag} {path}: is a directory")
    if parent.exists() and not parent.is_dir():
        raise ValueError(f"{flag} {path}: {parent} is a file, not a directory")
    if not parent.is_dir():
        raise ValueError(f"{flag} {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise ValueError(f"{flag} {path}: directory {parent} is not writable")


def check_pem(flag: str, path: str | None) -> None:
    """ValueError naming `flag` unless `path` (if given) is a readable PEM file."""
    if path is None:
        return
    if b"-----BEGIN " not in read_file(flag, path):
        raise ValueError(f"{flag} {path}: not a PEM file (no -----BEGIN line)")


def check_text_file(flag: str, path: str | None) -> None:
    """ValueError naming `flag` unless `path` (if given) is a readable file with some text in it."""
    if path is not None and not read_file(flag, path).strip():
        raise ValueError(f"{flag} {path}: is empty")


def read_file(flag: str, path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise ValueError(f"{flag} {path}: {e.strerror or e}") from None
