"""`attnserve serve --model HF_DIR`: a Hugging Face checkpoint directory served in one command, exported once.

A directory with config.json and no attnserve.json is a checkpoint, not a model directory. It is imported
(`attnserve import`: proven against transformers) and exported (`attnserve export`: the parity and
invariance gates) into the export cache, each in a child process, since the server never imports torch.
The export's folder is named by the checkpoint's sha256 (its top-level files: config, weights, tokenizer)
and the export flags (--dtype, --quantize, --context-length), so the next start with the same files
and flags serves it at once, and a changed file makes a new one. A lock file keeps two starts from exporting one key
together, and an export is moved into place only once it is whole: a start cut off leaves no half
export. The proof's report is kept beside the export (import.json), and each start says where it serves
from and what was proven.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from ..runtime.contract import DTYPES, MANIFEST_FILE

if TYPE_CHECKING:
    from .config import ServerConfig

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"  # what makes a directory a Hugging Face checkpoint
IMPORT_REPORT = "import.json"  # `attnserve import`'s report, kept beside the export
CACHE_VARIABLE = "ATTNSERVE_CACHE"
CHUNK = 1 << 24  # bytes hashed at a time
UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")  # of a checkpoint's name, in a folder name


class CheckpointExportError(Exception):
    """The import or the export of a checkpoint failed (the child's own error is above, on stderr)."""


def is_checkpoint(path: str | Path) -> bool:
    """A Hugging Face checkpoint directory: config.json, and not an exported attnserve model directory."""
    path = Path(path)
    return (path / CONFIG_FILE).is_file() and not (path / MANIFEST_FILE).exists()


def cache_root(flag: str | None) -> Path:
    """--export-cache, else $ATTNSERVE_CACHE, else $XDG_CACHE_HOME/attnserve, else ~/.cache/attnserve."""
    if flag:
        return Path(flag)
    if os.environ.get(CACHE_VARIABLE):
        return Path(os.environ[CACHE_VARIABLE])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "attnserve"


def checkpoint_digest(checkpoint: Path) -> str:
    """sha256 of the checkpoint's top-level files (name, size and bytes of each, in name order; links
    followed, hidden files and subfolders such as a hub's original/ weights left out)."""
    digest = hashlib.sha256()
    for path in sorted(checkpoint.iterdir()):
        if path.name.startswith(".") or not path.is_file():
            continue
        digest.update(f"{path.name}\0{path.stat().st_size}\0".encode())
        with path.open("rb") as f:
            while chunk := f.read(CHUNK):
                digest.update(chunk)
    return digest.hexdigest()


def export_key(checkpoint: Path, dtype: str, quantize: str | None, context_length: int | None = None) -> str:
    """The export's folder name: the checkpoint's name, its digest's first 16 hex digits, the flags."""
    name = UNSAFE.sub("-", checkpoint.resolve().name).strip("-.") or "checkpoint"
    flags = dtype + (f"-{quantize}" if quantize else "") + (f"-ctx{context_length}" if context_length else "")
    return f"{name[:64]}-{checkpoint_digest(checkpoint)[:16]}-{flags}"


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` (made if missing), held while the block runs."""
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def attnserve(*argv: str) -> None:
    """Run `attnserve ARGV` in a child process, its output on this one's stderr; CheckpointExportError
    if it fails."""
    command = [sys.executable, "-m", "attnserve.cli", *argv]
    done = subprocess.run(command, stdout=sys.stderr, stderr=sys.stderr, check=False)
    if done.returncode:
        raise CheckpointExportError(
            f"attnserve {argv[0]} {argv[1]} failed (exit {done.returncode}); its error is above"
        )


def export_checkpoint(export: Export, into: Path) -> None:
    """Import and export a checkpoint into the folder `into` (made whole, then moved into place)."""
    work = Path(tempfile.mkdtemp(prefix=f".{into.name}.", dir=into.parent))
    context = ("--context-length", str(export.context_length)) if export.context_length else ()
    try:
        attnserve("import", str(export.checkpoint), "--out", str(work / "run"), *context)
        flags = ["--dtype", export.dtype, *(("--quantize", export.quantize) if export.quantize else ())]
        attnserve("export", str(work / "run" / "checkpoint.pt"), "--out", str(work / "model"), *flags)
        shutil.copy(work / "run" / IMPORT_REPORT, work / "model" / IMPORT_REPORT)
        os.rename(work / "model", into)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def proven(export: Path) -> str:
    """What the import's proof and the export's gate showed, in a few words."""
    try:
        report = json.loads((export / IMPORT_REPORT).read_text())
        greedy = report["greedy"]
        steps = sum(row["steps"] for row in greedy.get("sources", greedy.get("prompts")))
        proof = f"greedy tokens identical to transformers' over {steps} steps"
    except (OSError, ValueError, KeyError, TypeError):
        proof = f"no {IMPORT_REPORT}"
    return f"{proof}; parity gate passed"


@dataclasses.dataclass(frozen=True)
class Export:
    """What to export: a checkpoint and the export flags."""

    checkpoint: Path
    dtype: str = DTYPES[0]
    quantize: str | None = None
    context_length: int | None = None

    @property
    def key(self) -> str:
        return export_key(self.checkpoint, self.dtype, self.quantize, self.context_length)


def served_export(wanted: Export, cache: str | None) -> Path:
    """The model directory `attnserve serve` runs for a checkpoint: the cached export of these files
    and flags, made now if there is none."""
    checkpoint = wanted.checkpoint
    exports = cache_root(cache) / "exports"
    exports.mkdir(parents=True, exist_ok=True)
    key = wanted.key
    export = exports / key
    with locked(exports / f".{key}.lock"):
        if (export / MANIFEST_FILE).is_file():
            log.info("%s: serving its export %s (made before: %s)", checkpoint, export, proven(export))
            return export
        log.info("%s: a Hugging Face checkpoint; importing and exporting it once into %s", checkpoint, export)
        export_checkpoint(wanted, export)
    log.info("%s: exported to %s (%s); the next start reuses it", checkpoint, export, proven(export))
    return export


def serving_export(config: ServerConfig) -> ServerConfig:
    """`config` with its --model's export in place of a checkpoint (the model still named as the
    checkpoint's folder unless --served-model-name says otherwise); a model directory's as it is.
    Raises CheckpointExportError (naming --export-cache for a cache that cannot be written)."""
    if not is_checkpoint(config.model):
        return config
    try:
        wanted = Export(Path(config.model), config.dtype or DTYPES[0], config.quantize, config.context_length)
        export = served_export(wanted, config.export_cache)
    except OSError as e:
        raise CheckpointExportError(f"--export-cache {e.filename}: {e.strerror}") from None
    name = config.served_model_name or Path(config.model).resolve().name
    return dataclasses.replace(config, model=str(export), served_model_name=name)
