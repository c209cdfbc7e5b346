"""docs/reference/cli.md: every subcommand of `attnserve`, its usage and a table of its flags.

Read from the parsers attnserve/cli.py builds, at a fixed width (never the terminal's), with each
help text expanded as argparse expands it for --help. Knows nothing of what the flags do.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from typing import cast

from attnserve.cli import SUBCOMMANDS, build_parser, subcommand_parser

from .markdown import code, code_block, page, paragraphs, table, text

WIDTH = 100  # columns of the usage and --help text, whatever the terminal's
NONE = "—"  # the default cell of a flag with no default, or a switch off unless given
INTRO = (
    "Every subcommand of `attnserve` with its usage and flags, as `attnserve COMMAND --help` lists them "
    "(`-h`, `--help` is left out of the tables). A default is the parser's own value; where it is none, "
    "the help text says what leaving the flag out means."
)


def render(parser_of: Callable[[str], argparse.ArgumentParser] = subcommand_parser) -> str:
    """The page; `parser_of(name)` gives a subcommand's parser (the test hands it a changed one)."""
    top = fixed_width(build_parser())
    sections = [f"## attnserve\n\n{code_block(top.format_help())}"]
    sections += [subcommand(name, fixed_width(parser_of(name))) for name in SUBCOMMANDS]
    return page("Command line", INTRO, sections)


def fixed_width(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Let `parser` format its help WIDTH columns wide (argparse otherwise asks the terminal)."""
    formatter_class = cast(type[argparse.HelpFormatter], parser.formatter_class)  # typeshed: a protocol of prog only
    parser.formatter_class = functools.partial(formatter_class, width=WIDTH)
    return parser


def subcommand(name: str, parser: argparse.ArgumentParser) -> str:
    """One subcommand's section: heading, description, usage, epilog, a table per group of flags."""
    blocks = [f"## attnserve {name}", text(SUBCOMMANDS[name].help)]
    if parser.description:
        blocks.append(paragraphs(parser.description))
    blocks.append(code_block(parser.format_usage()))
    if parser.epilog:
        blocks.append(paragraphs(parser.epilog))
    formatter = parser._get_formatter()
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if a.help != argparse.SUPPRESS and not is_help(a)]
        if actions:
            rows = [flag_row(formatter, a) for a in actions]
            blocks += [f"**{text(group.title or '')}**", table(["flag", "default", "description"], rows)]
    return "\n\n".join(blocks)


def is_help(action: argparse.Action) -> bool:
    return isinstance(action, argparse._HelpAction)


def flag_row(formatter: argparse.HelpFormatter, action: argparse.Action) -> list[str]:
    """flag(s) with metavar or choices | default | help, expanded as --help expands it."""
    invocation = formatter._format_action_invocation(action)
    help_text = formatter._expand_help(action) if action.help else ""
    return [code(invocation), default(action), text(help_text)]


def default(action: argparse.Action) -> str:
    """The parser's default, literally; none for a required argument or a switch that is off unless given."""
    if action.required:
        return "(required)"
    switch = action.nargs == 0
    if action.default is None or action.default == argparse.SUPPRESS or (switch and action.default != action.const):
        return NONE
    if action.default == "":
        return code('""')
    return code(str(action.default))
