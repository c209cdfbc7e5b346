"""Reference autoregressive generation in PyTorch, using the KV cache.

The ground truth that exported graphs and the server are compared with: greedy decoding
(temperature 0) is deterministic; sampling applies temperature, top-k and top-p. One decode loop
per architecture (decode, decode_seq2seq), which export's parity gate and the decode benchmark
drive too; special ids are always the caller's (its tokenizer's), never a default.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..tokenizer import padding


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """input_ids, attention_mask (1 = real) and position_ids (0 for padding), each (B, T) int64
    (tokenizer/padding.py's)."""
    ids, mask, positions = padding.left_pad(seqs, pad_id)
    return torch.tensor(ids), torch.tensor(mask), torch.tensor(positions)


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


Pick = Callable[[torch.Tensor], torch.Tensor]  # the last position's logits (B, V) -> one token per row (B,)


@torch.no_grad()
def decode(model, prompts: list[list[int]], steps: int, pick: Pick, pad_id: int, eos_id: int | None = None):
    """The reference decode loop of a decoder-only model, over its KV cache: the prompts left-padded
    and prefilled together, then one token per row per step, `pick`ed from the last position's
    logits. (B, n) tokens, n <= steps: it stops early once every row has produced `eos_id` (None:
    never) or the context is full. Greedy, sampled, timed or gated, every PyTorch decode runs this."""
    device = next(model.parameters()).device  # a model training on a GPU is measured there
    ids, mask, positions = (t.to(device) for t in left_pad(prompts, pad_id))
    logits, past = model(ids, mask, positions)
    out, done = [], torch.zeros(len(prompts), dtype=torch.bool, device=device)
    for _ in range(steps):
        token = pick(logits[:, -1])
        out.append(token)
        if eos_id is not None:
            done |= token == eos_id
        if bool(done.all()) or mask.size(1) >= model.config.max_len:
            break
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        positions = positions[:, -1:] + 1
        logits, past = model(token[:, None], mask, positions, past)
    return torch.stack(out, dim=1)


@torch.no_grad()
def decode_seq2seq(
    model, sources: list[list[int]], steps: int, pick: Pick, pad_id: int, bos_id: int, eos_id: int | None = None
):
    """decode() for an encoder-decoder: the sources encoded once, the decoder starting from BOS."""
    device = next(model.parameters()).device
    src, src_mask = (t.to(device) for t in left_pad(sources, pad_id)[:2])
    cross = model.cross_kv(model.encode(src, src_mask))
    b = len(sources)
    token = torch.full((b,), bos_id, dtype=torch.long, device=device)
    mask = torch.ones(b, 1, dtype=torch.long, device=device)
    past, out, done = None, [], torch.zeros(b, dtype=torch.bool, device=device)
    for step in range(steps):
        positions = torch.full((b, 1), step, dtype=torch.long, device=device)
        logits, past = model.decode(token[:, None], mask, positions, src_mask, cross, past)
        token = pick(logits[:, -1])
        out.append(token)
        if eos_id is not None:
            done |= token == eos_id
        if bool(done.all()) or step + 1 >= model.config.max_len:
            break
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
    return torch.stack(out, dim=1)


def sampler(temperature: float, top_k: int, top_p: float, seed: int | None) -> Pick:
    """next_token with these settings, on a generator of its own when seeded."""
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    return lambda logits: next_token(logits, temperature, top_k, top_p, generator)


def generate(
    model,
    prompts: list[list[int]],
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    *,
    eos_id: int,
    pad_id: int,
) -> list[list[int]]:
    """Continue each prompt (a decoder-only model; prompts may differ in length); EOS not included.
    The special ids are the model's tokenizer's (`tokenizer.eos_id`, `tokenizer.pad_id`)."""
    model.eval()
    pick = sampler(temperature, top_k, top_p, seed)
    return _finish(decode(model, prompts, max_new_tokens, pick, pad_id, eos_id), eos_id)


def generate_seq2seq(
    model,
    sources: list[list[int]],
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    *,
    bos_id: int,
    eos_id: int,
    pad_id: int,
) -> list[list[int]]:
    """Translate each source (an encoder-decoder model): the decoder starts from BOS."""
    model.eval()
    pick = sampler(temperature, top_k, top_p, seed)
    return _finish(decode_seq2seq(model, sources, max_new_tokens, pick, pad_id, bos_id, eos_id), eos_id)
