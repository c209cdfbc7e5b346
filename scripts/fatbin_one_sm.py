"""Keep one GPU architecture's kernels in a CUDA shared library's fat binaries, so that
onnxruntime-gpu fits a small transfer to one kind of GPU (GPU.md: the device tree travels in 64 MiB).

The library's .nv_fatbin section holds fat binaries, each a header and entries (one cubin or PTX per
architecture, zstd-compressed). Every fat binary that has an entry of --sm is rewritten in place to
hold that architecture's entries alone; the bytes it no longer uses are zeroed (they compress to
nothing). The others are left as they are. Addresses do not move, so the registration table
(.nvFatBinSegment) stays valid. A CUDA device of another architecture cannot run the result.

    python scripts/fatbin_one_sm.py LIBRARY.so [--sm 90]
"""

from __future__ import annotations

import argparse
import struct
import subprocess
from pathlib import Path

MAGIC = 0xBA55ED50
HEADER = struct.Struct("<IHHQ")  # magic, version, header size, size of the entries that follow
ENTRY = struct.Struct("<HHIQ")  # kind (1 PTX, 2 cubin), version, header size, payload size
ARCH_AT = 28  # the entry's architecture (90 for sm_90), a uint32 at this offset in its header


def section(library: Path, name: str) -> tuple[int, int]:
    """(file offset, size) of a section, as readelf prints it."""
    for line in subprocess.run(["readelf", "-SW", str(library)], capture_output=True, text=True).stdout.splitlines():
        cells = line.replace("[ ", "[").split()
        if name in cells:
            at = cells.index(name)
            return int(cells[at + 3], 16), int(cells[at + 4], 16)
    raise SystemExit(f"{library}: no {name} section")


def keep_one_sm(data: bytearray, start: int, end: int, sm: int) -> tuple[int, int]:
    """Rewrite each fat binary in data[start:end] that has an `sm` entry; (rewritten, left as they were)."""
    rewritten = left = 0
    at = start
    while at < end:
        magic, version, header_size, size = HEADER.unpack_from(data, at)
        if magic != MAGIC:
            at += 8  # fat binaries are 8-byte aligned, zero-padded between
            continue
        entries, kept, q = at + header_size, [], at + header_size
        while q < entries + size:
            entry_header, payload = ENTRY.unpack_from(data, q)[2:4]
            if struct.unpack_from("<I", data, q + ARCH_AT)[0] == sm:
                kept.append(bytes(data[q : q + entry_header + payload]))
            q += entry_header + payload
        if kept:
            body = b"".join(kept)
            data[entries : entries + size] = body + bytes(size - len(body))
            HEADER.pack_into(data, at, magic, version, header_size, len(body))
            rewritten += 1
        else:
            left += 1
        at = entries + size
    return rewritten, left


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("library", type=Path)
    p.add_argument("--sm", type=int, default=90, help="the architecture to keep (default: 90, the H100's and H200's)")
    args = p.parse_args()
    offset, size = section(args.library, ".nv_fatbin")
    data = bytearray(args.library.read_bytes())
    rewritten, left = keep_one_sm(data, offset, offset + size, args.sm)
    args.library.write_bytes(data)
    print(f"{args.library.name}: {rewritten} fat binaries keep sm_{args.sm} alone, {left} without it left as they were")


if __name__ == "__main__":
    main()
