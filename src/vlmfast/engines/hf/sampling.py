"""Choosing the next token: greedy, or a seeded draw that needs no host sync and no generator state.

A draw is the exponential race ``argmax(p / E)`` with ``E ~ Exp(1)`` per vocabulary entry, which picks
token i with probability ``p_i`` (gpt-fast and vLLM sample this way: no ``torch.multinomial``, whose
read-backs stall the host every step). The noise is not drawn from a generator: it is a hash of
(the row's key, the step, the token id), so

- a row's tokens depend only on its own key — :func:`vlmfast.engines.rows.draw_key` of (seed, request id,
  sample index), the key every engine derives its draws from — never on which batch it ran in, on its
  neighbours, on spare rows of a captured graph, on resume order or on which checkpoint the engine held
  before: the same (seed, checkpoint, id, sample) gives the same
  answer in every run;
- the whole choice is a pure function of device tensors, so a CUDA graph can hold it.

The hash is lowbias32-style integer mixing (two xor-shift-multiply rounds with multipliers below 2³¹,
so no product leaves int64) on values kept in 32 bits; the top 24 bits make a uniform in (0, 1).
"""

from __future__ import annotations

import torch

from vlmfast.engines.rows import draw_key

_M32 = 0xFFFFFFFF
_STEP = 0x61C88647  # spreads consecutive steps apart before mixing


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash of every element of ``x`` (int64 holding values in [0, 2³²))."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x2C1B3C6D) & _M32
    return x ^ (x >> 16)


def row_keys(seed: int, request_ids, n: int, device) -> torch.Tensor:
    """The keys of a batch's decode rows: each request's n answers in order (sample 0…n−1)."""
    keys = [draw_key(seed, rid, k) for rid in request_ids for k in range(n)]
    return torch.tensor(keys, dtype=torch.long, device=device)


def token_hashes(vocab: int, device) -> torch.Tensor:
    """Each token id hashed once per state: the per-step noise is one more mix against these."""
    return _mix(torch.arange(vocab, dtype=torch.long, device=device))


def uniform_noise(keys: torch.Tensor, step: torch.Tensor, hashed_tokens: torch.Tensor) -> torch.Tensor:
    """(rows, vocab) uniforms in (0, 1), a pure function of each row's key, the step and the token id.
    ``step`` is a 0-d or 1-element device tensor (a graph replays it), or a Python int."""
    row = _mix((keys & _M32) ^ _mix((step * _STEP + 1) & _M32))  # (rows,)
    bits = _mix(row[:, None] ^ hashed_tokens[None, :]) >> 8  # 24 bits: exact in float32
    return (bits.float() + 0.5) * (1.0 / (1 << 24))


def select(logits, bias, *, temperature: float, top_p: float, keys=None, step=0, hashed_tokens=None):
    """The next token of every row: argmax when ``temperature`` is 0; otherwise temperature, then
    nucleus (top-p) filtering as transformers does it, then the exponential race on each row's own noise
    (``keys``: (rows,) int64 from :func:`~vlmfast.engines.rows.draw_key`; ``step``: which token of the answer this is)."""
    scores = logits + bias
    if temperature == 0:
        return scores.argmax(-1)
    scores = scores / temperature
    if top_p < 1.0:
        ordered, order = torch.sort(scores, descending=False)
        drop = ordered.softmax(-1).cumsum(-1) <= 1 - top_p
        drop[..., -1:] = False  # the most likely token always stays
        scores = scores.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    if hashed_tokens is None:
        hashed_tokens = token_hashes(scores.shape[-1], scores.device)
    exponential = -torch.log(uniform_noise(keys, step, hashed_tokens))
    return (scores.softmax(-1) / exponential).argmax(-1)


def penalize(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """transformers' repetition penalty (``RepetitionPenaltyLogitsProcessor``, which plain ``generate`` applies
    from a checkpoint's generation config and vLLM too): every token a row has seen — its prompt and its answer
    so far — is made less likely, its logit divided by ``penalty`` when positive and multiplied when negative.
    ``seen``: (rows, vocab) bool (:func:`seen_tokens`); float32 logits, as generate scores them.

    Inside a compiled step it is one opaque operator running these eager kernels, so its quotients are eager's
    bit for bit. Eager CUDA divides by a Python number as a product with the reciprocal rounded from the double
    quotient (measured on an H100); inductor's generated code may round that reciprocal, or divide, another
    way (Triton's division is approximate), which would differ in the last bit and could flip a near-tie of
    the greedy choice."""
    if torch.compiler.is_compiling():
        return _penalty_op(logits, seen, float(penalty))
    return torch.where(seen, torch.where(logits < 0, logits * penalty, logits / penalty), logits)


@torch.library.custom_op("vlmfast::repetition_penalty", mutates_args=())
def _penalty_op(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """``vlmfast::repetition_penalty``: :func:`penalize` as one operator that inductor calls, not fuses."""
    return torch.where(seen, torch.where(logits < 0, logits * penalty, logits / penalty), logits)


@_penalty_op.register_fake
def _(logits, seen, penalty):
    return torch.empty_like(logits)


def seen_tokens(input_ids: torch.Tensor, mask: torch.Tensor, vocab: int) -> torch.Tensor:
    """(rows, vocab) bool: the tokens of each row's prompt, its padding left out (each request is penalized on
    its own tokens, as when it runs alone)."""
    seen = torch.zeros(input_ids.shape[0], vocab, dtype=torch.uint8, device=input_ids.device)
    return seen.scatter_reduce_(1, input_ids, mask.to(torch.uint8), reduce="amax").bool()


def mark_seen(seen: torch.Tensor, chosen: torch.Tensor, running: torch.Tensor) -> None:
    """Each row's chosen token counted as seen — not a row's that ended (it picks the pad, unseen for that)."""
    index = torch.arange(chosen.shape[0], device=chosen.device)
    seen[index, chosen] = seen[index, chosen] | running
