"""The language model of a Qwen-VL model called layer by layer for new tokens, and the attention a
decode step uses: :class:`TextDecoder`, :func:`decode_attention`, the prompt's rotary positions and the
bias that keeps placeholder tokens out of answers."""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
from dataclasses import dataclass

import torch
from transformers import AttentionInterface

from vlmfast.engines.hf.fused import Fused, decode_matrices, decode_weights, fuse_projections, packing_plan
from vlmfast.engines.hf.kv import StaticKV
from vlmfast.engines.hf.linear_states import check_cache_api, linear_modules
from vlmfast.engines.hf.moe import grouped_configs
from vlmfast.errors import UsageError


class TextDecoder:
    """The language model of a Qwen-VL model (Qwen2-VL to Qwen3.5) called layer by layer for new
    tokens: embedding, 3-D rotary positions, the decoder layers with a caller-made mask, final norm, LM
    head. Qwen3.5's linear-attention layers get no mask (a new token is never padding) and keep their
    states in the cache's linear half."""

    def __init__(self, model):
        text = model.model.language_model
        self.embed, self.rotary, self.layers, self.norm = text.embed_tokens, text.rotary_emb, text.layers, text.norm
        self.lm_head = model.lm_head
        config = model.config.get_text_config()
        self.linear = linear_modules(self.layers)
        if self.linear:
            check_cache_api()
        # Q/K/V and gate/up as one product each in decode steps; on a CPU, every product on a packed weight
        self.packed, self.pack_note = packing_plan(decode_weights(self.layers, self.lm_head),
                                                   decode_matrices(self.layers, self.lm_head))
        self.fused = fuse_projections(self.layers, pack=self.packed)
        self.head = Fused([self.lm_head], pack=True) if self.packed else None  # the module stays: ties hold
        if self.head is not None:
            self.fused.append(self.head)
        self.experts = grouped_configs(self.layers)  # routed experts whose decode-step offsets take one search
        # transformers 5.24 renamed the layers' ``past_key_values`` argument ``cache`` (the old name still
        # works through a shim that warns at every call): pass the name this version's layers take
        self.cache_arg = "cache" if "cache" in inspect.signature(self.layers[0].forward).parameters else "past_key_values"
        attention = next(layer.self_attn for layer in self.layers if hasattr(layer, "self_attn"))
        self.attention_config = attention.config  # what the attention modules read per call
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.vocab = config.vocab_size

    def new_cache(self, batch: int, max_len: int) -> StaticKV:
        weight = self.lm_head.weight
        return StaticKV(len(self.layers), batch, self.kv_heads, max_len, self.head_dim, weight.dtype, weight.device,
                        linear=self.linear)

    def __call__(self, tokens, positions, mask, cache: StaticKV):
        """Logits (batch, vocab, float32) of the next token after ``tokens`` (batch, 1) at ``positions``
        (3, batch, 1); ``mask``: an additive mask (batch, 1, 1, keys), :class:`RowGroups` (eager steps), or
        None (no padding: every key is seen)."""
        hidden = self.embed(tokens)
        rotary = self.rotary(hidden, positions)
        for i, layer in enumerate(self.layers):
            out = layer(hidden, attention_mask=None if i in self.linear else mask, position_embeddings=rotary,
                        use_cache=True, **{self.cache_arg: cache})
            hidden = out[0] if isinstance(out, tuple) else out  # 4.57 layers return a tuple
        last = self.norm(hidden)[:, -1, :]
        head = self.head
        return (head.part(last, 0) if head is not None and head.active else self.lm_head(last)).float()


DECODE_ATTENTION = "vlmfast_decode"


@dataclass(frozen=True)
class RowGroups:
    """An eager step's rows in contiguous groups, each attending to its own number of keys: passed where
    the layers pass the attention mask, read by :func:`decode_attention`. ``groups``: (first row, end row,
    keys, additive mask or None) — rows of one answer in ten attend as far as the longest of them only."""

    groups: tuple[tuple[int, int, int, torch.Tensor | None], ...]


# An attention call costs about as much as reading this many more keys for one row (the 2-core CPU: ~25 µs
# against ~0.05 µs per row and key of the demo model's layer): splitting rows into groups pays past it.
GROUP_COST_KEYS = 512


def split_rows(lengths: list[int], *, call_cost: int | None = None, points: int = 16) -> list[tuple[int, int]]:
    """Contiguous row groups ``[(start, end), ...]`` that minimize the keys attention reads — each group reads
    its longest row's length for every row — plus ``call_cost`` per group. Boundaries are taken among at most
    ``points`` evenly spaced rows, so choosing stays cheap at any batch size."""
    n = len(lengths)
    if n == 0:
        return []
    call_cost = GROUP_COST_KEYS if call_cost is None else call_cost
    stride = -(-n // points)
    cuts = list(range(0, n, stride)) + [n]
    best = {0: (0, None)}  # cut index -> (cost of rows before it, previous cut index)
    for j in range(1, len(cuts)):
        options = []
        for i in range(j):
            longest = max(lengths[cuts[i]:cuts[j]])
            options.append((best[i][0] + (cuts[j] - cuts[i]) * longest + call_cost, i))
        best[j] = min(options)
    bounds, j = [], len(cuts) - 1
    while j:
        i = best[j][1]
        bounds.append((cuts[i], cuts[j]))
        j = i
    return bounds[::-1]


def decode_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """Attention for new tokens against the cache, as an attention function of transformers'.

    With grouped-query attention the queries that share a key/value head are packed into one
    sequence per kv head (what transformers 5.x does for one query token), so keys and values are
    read in place: transformers 4.57 copies them once per query head (``repeat_kv``) at every step,
    which measured a third of a decode step on a CPU. A :class:`RowGroups` mask reads each group of rows
    over its own length (one call per group). Returns (batch, new tokens, heads, head dim)."""
    batch, heads, q_len, dim = query.shape
    groups = heads // key.shape[1]
    if groups > 1 and q_len == 1:
        query = query.reshape(batch, key.shape[1], groups, dim)
    attend = functools.partial(torch.nn.functional.scaled_dot_product_attention, dropout_p=0.0, scale=scaling,
                               is_causal=False)
    if isinstance(attention_mask, RowGroups):
        out = torch.cat([attend(query[a:b], key[a:b, :, :n], value[a:b, :, :n], attn_mask=m)
                         for a, b, n, m in attention_mask.groups])
    else:
        out = attend(query, key, value, attn_mask=attention_mask)
    return out.reshape(batch, heads, q_len, dim).transpose(1, 2).contiguous(), None


def products_decode_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                              **kwargs):
    """Decode attention as two batched matrix products around a float32 softmax, the query heads that share a
    key/value head packed as :func:`decode_attention` packs them; for static steps (an additive mask tensor
    or None). A matrix library splits each product over the keys across the whole GPU, where SDPA's kernels
    give each row and key/value head one thread block for all its keys. On CUDA in 16-bit the scores come out
    of the first product in float32 (``bmm``'s ``out_dtype``, where torch has it), as SDPA keeps them: rounded
    to the model's dtype, as transformers' eager attention leaves them, their error grows with their size (measured on
    random inputs: 2–14× SDPA's in bf16). Returns (batch, new tokens, heads, head dim)."""
    batch, heads, q_len, dim = query.shape
    kv, keys = key.shape[1], key.shape[2]
    scaling = dim ** -0.5 if scaling is None else scaling
    query = query.reshape(batch * kv, heads // kv * q_len, dim)
    key, value = key.reshape(batch * kv, keys, dim), value.reshape(batch * kv, keys, dim)
    if query.is_cuda and query.dtype in (torch.bfloat16, torch.float16) and FLOAT32_SCORES:
        scores = torch.bmm(query, key.transpose(1, 2), out_dtype=torch.float32)
    else:
        scores = torch.bmm(query, key.transpose(1, 2)).float()
    scores = scores.view(batch, kv, -1, keys) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    probs = torch.softmax(scores, dim=-1).to(value.dtype).view(batch * kv, -1, keys)
    out = torch.bmm(probs, value)
    return out.reshape(batch, heads, q_len, dim).transpose(1, 2).contiguous(), None


# bmm's float32 output from 16-bit inputs (``out_dtype``: torch 2.8 on, on NVIDIA's CUDA; ROCm's came later and is
# not measured here): without it the products round their scores to 16 bits and are not the default
FLOAT32_SCORES = "dtype" in torch.ops.aten.bmm.overloads() and torch.version.hip is None
PRODUCTS_DECODE_ATTENTION = "vlmfast_decode_products"
AttentionInterface.register(DECODE_ATTENTION, decode_attention)
AttentionInterface.register(PRODUCTS_DECODE_ATTENTION, products_decode_attention)
STATIC_ATTENTION = {"sdpa": DECODE_ATTENTION, "products": PRODUCTS_DECODE_ATTENTION}


def static_attention(*, compiled: bool, cuda: bool) -> str:
    """The attention function of a static decode step (CUDA graphs, compiled): on CUDA a compiled step attends
    by two matrix products (:func:`products_decode_attention`), every other static step by SDPA
    (:func:`decode_attention`); ``VLMFAST_DECODE_ATTENTION=sdpa|products`` chooses for every static step.

    Measured on an H100 (bf16, 3B shape, 16 query and 2 key/value heads): compiled, the attention alone took
    6.6 / 7.8 µs at batch 1 and 512 / 1,024 keys against SDPA's 15.0 / 24.7 (9.7 / 13.6 against 16.1 / 26.7 at
    batch 32), and the whole compiled step 3.37 ms against 3.66 at batch 1; in float32 its tokens are the eager
    loop's. Uncompiled, in a CUDA graph, the products are five kernels, slower than SDPA's one at batch 32
    (19.8 against 15.9 µs at 512 keys). Eager steps attend with SDPA always (their rows may be split in groups
    of their own lengths). Where torch's ``bmm`` cannot write float32 scores (:data:`FLOAT32_SCORES`), SDPA stays
    the default everywhere."""
    default = "products" if compiled and cuda and FLOAT32_SCORES else "sdpa"
    wanted = os.environ.get("VLMFAST_DECODE_ATTENTION", "").strip().lower() or default
    if wanted not in STATIC_ATTENTION:
        raise UsageError(f"VLMFAST_DECODE_ATTENTION={wanted!r} is not a decode attention",
                         hint=f"use one of {', '.join(STATIC_ATTENTION)}, or unset it (products for compiled steps on "
                              "CUDA, sdpa otherwise)")
    return STATIC_ATTENTION[wanted]


@contextlib.contextmanager
def decode_attention_for(decoder: TextDecoder, kernel: str = DECODE_ATTENTION):
    """Decode attention runs through ``kernel`` (:func:`decode_attention`; a static step may take
    :func:`products_decode_attention`) whatever the model was loaded with: flash-attn's padded path unpads
    with a host sync and takes a 2-D mask; eager attention wants an additive mask. Switched outside any
    compiled region: it sets a config attribute."""
    config = decoder.attention_config
    loaded_with = config._attn_implementation
    config._attn_implementation = kernel
    try:
        yield
    finally:
        config._attn_implementation = loaded_with


def rope_positions(model, inputs):
    """Qwen2.5-VL's 3-D rotary positions of the prompt (3, batch, length), from the model's own
    ``get_rope_index`` (its signature differs across transformers versions)."""
    accepted = inspect.signature(model.model.get_rope_index).parameters
    extra = {k: inputs[k] for k in ("image_grid_thw", "video_grid_thw", "attention_mask", "mm_token_type_ids",
                                    "second_per_grid_ts") if k in accepted and k in inputs}
    positions, _ = model.model.get_rope_index(inputs["input_ids"], **extra)
    return positions


def suppress_bias(vocab: int, token_ids, device) -> torch.Tensor:
    """Added to the logits: -inf on tokens never to emit (vision placeholders), 0 elsewhere."""
    bias = torch.zeros(vocab, device=device)
    if token_ids:
        bias[list(token_ids)] = float("-inf")
    return bias


# The step forwards of a decode state (:class:`vlmfast.engines.hf.decode.DecodeState`): its rows' tokens through
# the decoder over its cache.
def forward_eager(state):
    """The next-token logits of the computed rows, attending to exactly the filled part of the cache."""
    cache, rows = state.cache, state.cache.active
    end = cache.attend
    mask = None
    if state.ragged:
        seen = state.key_valid[:rows, :end] & (state.keys[:end] <= cache.write[:rows, None])
        # additive, made once per step: sdpa turns a boolean mask into this same -inf mask in every layer
        mask = torch.zeros(seen.shape, dtype=cache.dtype, device=seen.device).masked_fill_(~seen, float("-inf"))
        mask = mask[:, None, None, :]
        groups = state.row_groups()
        if len(groups) > 1:  # each group of rows attends over its own longest row's keys
            mask = RowGroups(tuple((a, b, n, mask[a:b, :, :, :n] if ragged else None) for a, b, n, ragged in groups))
    positions = state.next_position[:, :rows] + (state.count[:rows] - 1)[None, :, None]
    return state.decoder(state.tokens[:rows], positions, mask, cache)


def forward_static(state):
    """The next-token logits over the cache's first ``attend`` keys: keys a row has not written, and its
    prompt padding, are masked by an additive mask in the model's dtype, made once per step (a boolean
    mask would be converted in every layer)."""
    cache, dtype = state.cache, state.cache.dtype
    seen = state.key_valid[:, :cache.attend] & (state.keys[:cache.attend] <= cache.write[:, None])
    mask = torch.zeros(seen.shape, dtype=dtype, device=seen.device).masked_fill_(~seen, torch.finfo(dtype).min)
    positions = state.next_position + (state.count - 1)[None, :, None]
    return state.decoder(state.tokens, positions, mask[:, None, None, :], cache)
