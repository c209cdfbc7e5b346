"""RMSNorm as ONNX Runtime's fused SimplifiedLayerNormalization, for export.

torch.onnx.export writes nn.RMSNorm as seven nodes (Pow, ReduceMean, Add, Sqrt, Reciprocal, Mul,
Mul) that ONNX Runtime's optimizer leaves as they are; its contrib op SimplifiedLayerNormalization
(what onnxruntime-genai's model builder writes for the Llama family) is the same function in one
kernel, float32 inside for half-precision inputs. Outside an export the module is the norm itself,
so the parity gate's reference is unchanged. Knows nothing of serving.
"""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import nn

OP = "SimplifiedLayerNormalization"  # ONNX Runtime registers it in the ONNX domain
FLOAT32 = 1  # stash_type: the mean of squares in float32
M = TypeVar("M", bound=nn.Module)


class FusedRMSNorm(nn.Module):
    """An nn.RMSNorm that exports as one SimplifiedLayerNormalization node over the last axis."""

    def __init__(self, norm: nn.RMSNorm):
        super().__init__()
        self.norm = norm
        self.eps = norm.eps if norm.eps is not None else torch.finfo(torch.float32).eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.onnx.is_in_onnx_export():
            return self.norm(x)
        return torch.onnx.ops.symbolic(
            OP,
            [x, self.norm.weight],
            dict(axis=-1, epsilon=float(self.eps), stash_type=FLOAT32),
            dtype=x.dtype,
            shape=x.shape,
            version=1,
        )


def fuse_rms_norms(model: M) -> M:
    """`model` with every nn.RMSNorm inside it wrapped in a FusedRMSNorm (in place); the model."""
    for name, child in list(model.named_children()):
        if isinstance(child, nn.RMSNorm):
            setattr(model, name, FusedRMSNorm(child))
        else:
            fuse_rms_norms(child)
    return model
