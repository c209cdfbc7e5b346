"""The manual and every `--help` agree (issue 27, then 42): each subcommand's flags are in its guide
(its synopsis, examples or flag table), every flag the README or a docs page writes after
`attnserve COMMAND` exists, and a default the flag tables give as a literal is the parser's; the
shell examples that show their output print it, and the Python examples run. Dates and commit ids
stay in the reports and the decision records."""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys

import manual
import pytest
from fixtures_server import start_server

from attnserve.cli import SUBCOMMANDS, subcommand_parser

# The guide that documents each subcommand.
SECTIONS = {
    "train": "docs/guides/training.md",
    "import": "docs/guides/import.md",
    "export": "docs/guides/export.md",
    "serve": "docs/guides/serving.md",
    "generate": "docs/guides/generation.md",
    "tokenize": "docs/guides/generation.md",
    "bench": "docs/guides/benchmarking.md",
    "ray-serve": "docs/guides/ray-serve.md",
    "attention-map": "docs/guides/encoder-decoder.md",
}
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
TABLE_ROW = re.compile(r"^\| *(`--[^|]*?) *\|([^|]*)\|", re.MULTILINE)
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")


def section(page: str) -> str:
    """The guide of a subcommand."""
    return manual.PAGES[page]


def command_text(text: str, command: str) -> list[str]:
    """What follows `attnserve COMMAND` on each line of `text` (to a comment, a table cell or the end of
    the inline code), with a synopsis's continuation lines (indented, starting with '[')."""
    found = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        for match in re.finditer(rf"attnserve {re.escape(command)}(?![\w-])([^`#\n]*)", line):
            found.append(match.group(1))
            if line.startswith("    "):
                following = (text for text in lines[i + 1 :] if text.startswith("    "))
                for more in following:
                    if not more.strip().startswith("["):
                        break
                    found.append(more)
    return found


def parser_flags(command: str) -> dict[str, argparse.Action]:
    """Each option string of the subcommand (-h and --help too) -> its action."""
    return {option: action for action in subcommand_parser(command)._actions for option in action.option_strings}


@pytest.mark.parametrize("command", list(SUBCOMMANDS))
def test_every_flag_is_in_its_readme_section(command):
    text = section(SECTIONS[command])
    documented = {flag for part in command_text(text, command) for flag in FLAG.findall(part)}
    documented |= {flag for cells, _ in TABLE_ROW.findall(text) for flag in FLAG.findall(cells)}
    flags = parser_flags(command).values()
    missing = {a.option_strings[0] for a in flags if not isinstance(a, argparse._HelpAction)} - documented
    assert not missing, f"attnserve {command}'s flags missing from {SECTIONS[command]}: {sorted(missing)}"


@pytest.mark.parametrize("command", list(SUBCOMMANDS))
def test_every_flag_the_readme_writes_exists(command):
    written = {flag for part in command_text(manual.text(), command) for flag in FLAG.findall(part)}
    written |= {flag for cells, _ in TABLE_ROW.findall(section(SECTIONS[command])) for flag in FLAG.findall(cells)}
    unknown = written - set(parser_flags(command))
    assert not unknown, f"the manual writes flags attnserve {command} does not have: {sorted(unknown)}"


@pytest.mark.parametrize("command", list(SUBCOMMANDS))
def test_the_flag_tables_literal_defaults_are_the_parsers(command):
    """A table row `| --flag | `value` | ...` states the default; it must be the parser's, or what
    --help says it is where it is worked out at run time."""
    flags = parser_flags(command)
    wrong = []
    for cells, default in TABLE_ROW.findall(section(SECTIONS[command])):
        literal = re.fullmatch(r"`([^`]+)`", default.strip())
        if literal is None:
            continue  # words: "(required)", "no cap", "as `attnserve serve`"
        for flag in FLAG.findall(cells):
            action, text = flags[flag], literal.group(1)
            number = isinstance(action.default, float) and re.fullmatch(r"[\d.]+", text) is not None
            same = (
                str(action.default) == text
                or f"(default: {text}" in (action.help or "")  # worked out at run time: runs/PRESET, bpe
                or (number and float(text) == action.default)
            )
            if not same:
                wrong.append(f"{flag}: manual `{text}`, parser {action.default!r}, help {action.help!r}")
    assert not wrong, f"attnserve {command}'s guide's defaults differ from its parser: {wrong}"


def shell_examples() -> list[tuple[list[str], list[str]]]:
    """The manual's `$ attnserve ...` lines, each with the output lines written under it."""
    examples: list[tuple[list[str], list[str]]] = []
    reading = False
    for line in manual.text().splitlines():
        if line.startswith("    $ "):
            reading = line.startswith("    $ attnserve ")
            if reading:
                examples.append((shlex.split(line.removeprefix("    $ ")), []))
        elif reading and line.startswith("    "):
            examples[-1][1].append(line.strip())
        else:
            reading = False
    return examples


def test_the_manuals_shell_examples_print_what_it_shows(server, tiny_model_dir):
    """Each `$ attnserve ...` example runs as written (a client's gets the tests' server as --target,
    `models/tiny` is the tests' tiny model) and prints exactly the lines the manual shows under it."""
    examples = shell_examples()
    assert len(examples) >= 3
    for argv, shown in examples:
        if argv[1] in ("generate", "bench"):
            argv = [*argv, "--target", server.target]
        argv = [str(tiny_model_dir) if a == "models/tiny" else a for a in argv]
        done = subprocess.run([sys.executable, "-m", "attnserve.cli", *argv[1:]], capture_output=True, text=True)
        assert (done.stdout + done.stderr).splitlines() == shown, argv


@pytest.fixture(scope="module")
def bpe_server(tiny_bpe_model_dir):
    """A BPE model's server (and its OpenAI-compatible HTTP API): the manual's examples send token ids a
    byte model does not have."""
    running = start_server(tiny_bpe_model_dir, http_port=0)
    yield running
    running.stop()


def python_examples() -> list[str]:
    return manual.fenced("python")


@pytest.mark.parametrize("index", range(len(python_examples())))
def test_the_manuals_python_examples_run(bpe_server, tiny_bpe_model_dir, index):
    """Each Python example of the manual runs as written against a real server, its addresses (and, for tritonclient and
    OpenAI's client, the model's name) replaced by the test server's."""
    code = python_examples()[index].replace("127.0.0.1:50051", bpe_server.target)
    code = code.replace("127.0.0.1:8000", f"127.0.0.1:{bpe_server.server.http.port}")
    code = code.replace("127.0.0.2:50051", bpe_server.target).replace('"small"', repr(tiny_bpe_model_dir.name))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip(), done.stderr


@pytest.mark.parametrize("page", [p for p in manual.PAGES if not p.startswith(manual.STAMPED)])
def test_guides_and_reference_pages_carry_no_date_or_commit_id(page):
    """A measurement's date and tree belong in its stamped report or decision record, linked from here."""
    lines = manual.PAGES[page].splitlines()
    found = [
        f"{n}: {line.strip()[:100]}" for n, line in enumerate(lines, 1) if DATE.search(line) or COMMIT.search(line)
    ]
    assert not found, (
        f"{page} names dates or commit ids; move the measurement to docs/reports/ or a decision record: {found}"
    )
