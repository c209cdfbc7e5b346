"""glibc's heap kept for the host's large temporaries while the engine serves.

A host pick of one row of a 50,257-id vocabulary makes float64 arrays of 400 KB, a dozen a row; glibc
hands such blocks back to the kernel as they are freed (mmap'd, or the heap's top trimmed) and takes
fresh pages for the next, each page a fault. On this project's 2-vCPU Xeon that doubled a top-p row's
host pick (sampling.pick_row, 1.1 ms against 0.6; docs/reports/sampling.md). With mallopt, blocks under
MMAP_BELOW come from the heap and a freed heap top is kept up to TRIM_ABOVE: the pages stay, reused.
At most TRIM_ABOVE more resident memory; nothing where the C library is not glibc (mallopt absent).
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
MMAP_BELOW = 32 << 20  # bytes: blocks smaller come from the heap (glibc's default: 128 KiB, then as freed)
TRIM_ABOVE = 64 << 20  # bytes: a free heap top larger goes back to the kernel (glibc's default: 128 KiB)


def keep_heap() -> bool:
    """Set both thresholds for this process from here on; False where mallopt is not there (or refused)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    kept = bool(mallopt(M_MMAP_THRESHOLD, MMAP_BELOW)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_ABOVE))
    log.debug("heap thresholds %s", "set" if kept else "refused")
    return kept
