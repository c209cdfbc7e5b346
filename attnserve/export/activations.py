"""GELU as ONNX Runtime's fused contrib ops, for export.

At opset 18 torch.onnx.export writes GPT-2's tanh GELU as eight nodes (Pow, Mul, Add, Tanh, ...)
and the exact GELU through Erf; ONNX Runtime 1.32's optimizer left GPT-2's as they were. Its contrib
ops FastGelu (the tanh approximation) and Gelu (the exact one) are the same functions in one kernel.
Outside an export they are torch's own, so the parity gate's reference is unchanged. Knows nothing of
serving.
"""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import nn

from ..model.layers import ACTIVATION, FeedForward

M = TypeVar("M", bound=nn.Module)


def fast_gelu(x: torch.Tensor) -> torch.Tensor:
    """GELU's tanh approximation; com.microsoft::FastGelu under export."""
    if not torch.onnx.is_in_onnx_export():
        return nn.functional.gelu(x, approximate="tanh")
    return torch.onnx.ops.symbolic("com.microsoft::FastGelu", [x], {}, dtype=x.dtype, shape=x.shape, version=1)


def gelu(x: torch.Tensor) -> torch.Tensor:
    """The exact GELU; com.microsoft::Gelu under export."""
    if not torch.onnx.is_in_onnx_export():
        return nn.functional.gelu(x)
    return torch.onnx.ops.symbolic("com.microsoft::Gelu", [x], {}, dtype=x.dtype, shape=x.shape, version=1)


FUSED = {id(ACTIVATION["gelu_tanh"]): fast_gelu, id(ACTIVATION["gelu"]): gelu}


def fuse_gelus(model: M) -> M:
    """`model` with every feed-forward's GELU the fused op's (in place); the model."""
    for module in model.modules():
        if isinstance(module, FeedForward) and id(module.act) in FUSED:
            module.act = FUSED[id(module.act)]
    return model
