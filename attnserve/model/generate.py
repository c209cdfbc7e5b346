"""Reference autoregressive generation in PyTorch, using the KV cache.

The ground truth that exported graphs and the server are compared with: greedy decoding
(temperature 0) is deterministic; sampling applies temperature, top-k and top-p.
"""

from __future__ import annotations

import torch

from ..tokenizer.utf8 import BOS_ID, EOS_ID, PAD_ID


def left_pad(seqs: list[list[int]], pad_id: int = PAD_ID):
    """input_ids, attention_mask (1 = real) and position_ids (0 for padding), each (B, T)."""
    t = max(len(s) for s in seqs)
    ids = torch.tensor([[pad_id] * (t - len(s)) + list(s) for s in seqs], dtype=torch.long)
    mask = torch.tensor([[0] * (t - len(s)) + [1] * len(s) for s in seqs], dtype=torch.long)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, positions


def next_token(
    logits: torch.Tensor,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Pick one token per row of logits (B, V): argmax when temperature is 0, else sample."""
    if temperature <= 0:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k > 0:
        kth = logits.topk(min(top_k, logits.size(-1)), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        drop = cumulative - sorted_logits.softmax(-1) >= top_p  # keep the smallest set reaching top_p
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    return torch.multinomial(logits.softmax(-1), 1, generator=generator)[:, 0]


def _finish(tokens: torch.Tensor, eos_id: int) -> list[list[int]]:
    """Generated ids per row, cut before the first EOS."""
    out = []
    for row in tokens.tolist():
        out.append(row[: row.index(eos_id)] if eos_id in row else row)
    return out


@torch.no_grad()
def generate(
    model,
    prompts: list[list[int]],
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    eos_id: int = EOS_ID,
) -> list[list[int]]:
    """Continue each prompt (a decoder-only model; prompts may differ in length); EOS not included."""
    model.eval()
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    ids, mask, positions = left_pad(prompts)
    logits, past = model(ids, mask, positions)
    out, done = [], torch.zeros(len(prompts), dtype=torch.bool)
    for _ in range(max_new_tokens):
        token = next_token(logits[:, -1], temperature, top_k, top_p, generator)
        out.append(token)
        done |= token == eos_id
        if bool(done.all()) or mask.size(1) >= model.config.max_len:
            break
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        positions = positions[:, -1:] + 1
        logits, past = model(token[:, None], mask, positions, past)
    return _finish(torch.stack(out, dim=1), eos_id)


@torch.no_grad()
def generate_seq2seq(
    model,
    sources: list[list[int]],
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    eos_id: int = EOS_ID,
) -> list[list[int]]:
    """Translate each source (an encoder-decoder model): the decoder starts from BOS."""
    model.eval()
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    device = next(model.parameters()).device  # a model training on a GPU is measured there
    src, src_mask = (t.to(device) for t in left_pad(sources)[:2])
    cross = model.cross_kv(model.encode(src, src_mask))
    b = len(sources)
    token = torch.full((b,), BOS_ID, dtype=torch.long, device=device)
    mask = torch.ones(b, 1, dtype=torch.long, device=device)
    past, out, done = None, [], torch.zeros(b, dtype=torch.bool, device=device)
    for step in range(max_new_tokens):
        positions = torch.full((b, 1), step, dtype=torch.long, device=device)
        logits, past = model.decode(token[:, None], mask, positions, src_mask, cross, past)
        token = next_token(logits[:, -1], temperature, top_k, top_p, generator)
        out.append(token)
        done |= token == eos_id
        if bool(done.all()) or step + 1 >= model.config.max_len:
            break
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
    return _finish(torch.stack(out, dim=1), eos_id)
