"""The README and every `--help` agree (issue 27): each subcommand's flags are in its section of the
README (its synopsis, examples or flag table), every flag the README writes after `attnserve
COMMAND` exists, and a default the flag tables give as a literal is the parser's; the shell examples
that show their output print it, and the Python examples run."""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures_server import start_server

from attnserve.cli import SUBCOMMANDS, subcommand_parser

README = (Path(__file__).parents[1] / "README.md").read_text()

# The heading of the README section that documents each subcommand.
SECTIONS = {
    "train": "### `attnserve train`",
    "export": "### `attnserve export`",
    "serve": "### `attnserve serve`",
    "generate": "### `attnserve generate`",
    "bench": "### `attnserve bench`",
    "ray-serve": "### Ray Serve",
    "attention-map": "## The encoder-decoder Transformer",
}
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
TABLE_ROW = re.compile(r"^\| *(`--[^|]*?) *\|([^|]*)\|", re.MULTILINE)


def section(heading: str) -> str:
    """The README from `heading` to the next heading of the same or a higher level."""
    body = README.index(heading + "\n") + len(heading) + 1
    level = len(heading.split(" ")[0])
    end = re.search(rf"^#{{1,{level}}} ", README[body:], re.MULTILINE)
    return README[body : body + end.start()] if end else README[body:]


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
    assert not missing, f"attnserve {command}'s flags missing from the README's {SECTIONS[command]}: {sorted(missing)}"


@pytest.mark.parametrize("command", list(SUBCOMMANDS))
def test_every_flag_the_readme_writes_exists(command):
    written = {flag for part in command_text(README, command) for flag in FLAG.findall(part)}
    written |= {flag for cells, _ in TABLE_ROW.findall(section(SECTIONS[command])) for flag in FLAG.findall(cells)}
    unknown = written - set(parser_flags(command))
    assert not unknown, f"the README writes flags attnserve {command} does not have: {sorted(unknown)}"


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
                wrong.append(f"{flag}: README `{text}`, parser {action.default!r}, help {action.help!r}")
    assert not wrong, f"attnserve {command}'s README defaults differ from its parser: {wrong}"


def shell_examples() -> list[tuple[list[str], list[str]]]:
    """The README's `$ attnserve ...` lines, each with the output lines written under it."""
    examples: list[tuple[list[str], list[str]]] = []
    reading = False
    for line in README.splitlines():
        if line.startswith("    $ "):
            reading = line.startswith("    $ attnserve ")
            if reading:
                examples.append((shlex.split(line.removeprefix("    $ ")), []))
        elif reading and line.startswith("    "):
            examples[-1][1].append(line.strip())
        else:
            reading = False
    return examples


def test_the_readmes_shell_examples_print_what_it_shows(server):
    """Each `$ attnserve ...` example runs as written (a client's gets the tests' server as --target)
    and prints exactly the lines the README shows under it."""
    examples = shell_examples()
    assert len(examples) >= 3
    for argv, shown in examples:
        if argv[1] in ("generate", "bench"):
            argv = [*argv, "--target", server.target]
        done = subprocess.run([sys.executable, "-m", "attnserve.cli", *argv[1:]], capture_output=True, text=True)
        assert (done.stdout + done.stderr).splitlines() == shown, argv


@pytest.fixture(scope="module")
def bpe_server(tiny_bpe_model_dir):
    """A BPE model's server (and its OpenAI-compatible HTTP API): the README's examples send token ids a
    byte model does not have."""
    running = start_server(tiny_bpe_model_dir, http_port=0)
    yield running
    running.stop()


def python_examples() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", README, re.MULTILINE | re.DOTALL)


@pytest.mark.parametrize("index", range(len(python_examples())))
def test_the_readmes_python_examples_run(bpe_server, tiny_bpe_model_dir, index):
    """Each Python example runs as written against a real server, its addresses (and, for tritonclient and
    OpenAI's client, the model's name) replaced by the test server's."""
    code = python_examples()[index].replace("127.0.0.1:50051", bpe_server.target)
    code = code.replace("127.0.0.1:8000", f"127.0.0.1:{bpe_server.server.http.port}")
    code = code.replace("127.0.0.2:50051", bpe_server.target).replace('"small"', repr(tiny_bpe_model_dir.name))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip(), done.stderr
