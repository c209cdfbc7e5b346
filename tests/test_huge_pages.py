"""The prefix cache's pool stays out of transparent huge pages (runtime/arena.py's Device.filled_as_used):
where the kernel gives every large mapping huge pages (THP always) or malloc asks for them, the pool's
first writes while serving would each fault in and zero a whole huge page while a request waits."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
ASKING = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}  # glibc's malloc asks for huge pages (madvise) where THP allows
CHILD = """
import re, sys
import numpy as np
from attnserve.runtime.arena import Device

device, size = Device(), 64 << 20
plain, filled = device.allocate((size,), np.uint8), device.allocate((size,), np.uint8)
device.filled_as_used(filled.data_ptr(), size)
for buffer in (plain, filled):  # every page written
    device.zero(buffer.data_ptr(), size)

def huge_kib(address):
    text = open("/proc/self/smaps").read()
    for block in re.split(r"\\n(?=[0-9a-f]+-[0-9a-f]+ )", text):
        low, high = (int(x, 16) for x in block.split()[0].split("-"))
        if low <= address < high:
            return int(re.search(r"AnonHugePages:\\s+(\\d+)", block).group(1))
    sys.exit(f"no mapping holds {address:#x}")

print(huge_kib(plain.data_ptr()), huge_kib(filled.data_ptr()))
"""


@pytest.mark.skipif(not THP.exists(), reason="Linux's transparent huge pages only")
def test_a_buffer_filled_as_used_stays_in_small_pages_where_malloc_asks_for_huge_ones():
    """In a process whose malloc asks for huge pages (as THP always gives them), a 64 MiB buffer gets them once
    written, where the kernel has them, and one marked filled_as_used gets none."""
    done = subprocess.run([sys.executable, "-c", CHILD], env=ASKING, capture_output=True, text=True, check=True)
    plain, filled = (int(kib) for kib in done.stdout.split())
    assert filled == 0
    if plain == 0:  # THP never, or no huge page free: nothing to tell the two apart by
        pytest.skip(f"the kernel gave no huge pages ({THP.read_text().strip()})")
    assert plain >= 32 << 10
