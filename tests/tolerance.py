"""How far two float32 computations of one value may differ: float32's epsilon times the terms summed to
make it, times their scale. The order of a float32 sum is the kernel's, and the kernels ONNX Runtime and
PyTorch pick differ by CPU (AVX2, AVX-512, Zen 5), so a fixed absolute tolerance that holds on one CPU
fails on another: a Marian beam score off by 1.02e-4 against an absolute 1e-4 on an AMD EPYC (Zen 5)."""

from __future__ import annotations

import numpy as np

EPS32 = float(np.finfo(np.float32).eps)


def float32_sum(terms: int, scale: float) -> float:
    """The rounding a float32 sum of `terms` terms of about `scale` may gather (the worst case grows with
    the count, as the error of a running sum does)."""
    return EPS32 * terms * max(abs(scale), 1.0)
