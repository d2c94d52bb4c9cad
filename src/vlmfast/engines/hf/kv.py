"""The decode cache: keys and values of every full-attention layer for ``batch`` rows × ``max_len``
positions, preallocated once, each row with its own length.

A row holds one answer at a time. Its prompt's keys sit at columns ``[0, prompt width)`` (a prompt
prefilled in a group keeps the group's left padding, which ``key_valid`` masks), its answer's keys follow,
and :attr:`StaticKV.write` says where each row writes next. Rows are independent: a row that ended is
given to the next request by copying that request's prefill cache into it (:meth:`StaticKV.admit`), while
the other rows go on. A hybrid model's linear-attention layers (Qwen3.5) keep their states instead
(:class:`~vlmfast.engines.hf.linear_states.LinearStateCache`), one row per sequence as well.

The attention modules call ``update(key, value, layer_idx[, cache_kwargs])`` — the only cache method a
decoder layer uses on transformers 4.57 and 5.x — with one new token per row: it is written at each
row's own column and the first :attr:`attend` columns are returned (the caller masks what a row must
not see). Every index is a device tensor, so a step never needs the host (CUDA graphs hold it).
"""

from __future__ import annotations

import torch

from vlmfast.engines.hf.linear_states import LinearStateCache


class StaticKV(LinearStateCache):
    """Keys and values of every full-attention layer for ``batch`` rows of ``max_len`` positions;
    ``linear`` (layer index → module) names the layers that keep linear-attention states instead."""

    def __init__(self, layers: int, batch: int, kv_heads: int, max_len: int, head_dim: int, dtype, device,
                 linear: dict | None = None):
        shape = (batch, kv_heads, max_len, head_dim)
        linear = linear or {}
        self.keys = [None if i in linear else torch.zeros(shape, dtype=dtype, device=device) for i in range(layers)]
        self.values = [None if i in linear else torch.zeros(shape, dtype=dtype, device=device) for i in range(layers)]
        self.init_linear_states(linear, batch, device)
        self.batch, self.max_len, self.dtype = batch, max_len, dtype
        self.write = torch.zeros(batch, dtype=torch.long, device=device)  # the column each row writes next
        self.row_index = torch.arange(batch, device=device)
        self.attend = max_len  # columns a step reads: [0, attend)
        self.active = batch  # rows a step computes: [0, active) (the eager loop packs live rows first)

    def admit(self, rows: torch.Tensor, cache, prompts: torch.Tensor) -> int:
        """Copy one prefill group's HF ``cache`` into decode ``rows``: row k gets prompt row
        ``prompts[k]`` (n answers of one prompt: its index n times), at columns ``[0, width)``; returns
        the width (the group's prompt length)."""
        self.admit_linear_states(rows, cache, prompts)
        width = 0
        for i, layer in enumerate(cache.layers):
            if self.keys[i] is None:
                continue
            width = layer.keys.shape[2]
            self.keys[i][rows, :, :width] = layer.keys[prompts]
            self.values[i][rows, :, :width] = layer.values[prompts]
        if width == 0:  # a model of linear-attention layers only has no keys to measure: ask the cache
            width = cache.get_seq_length()
        self.write[rows] = width
        return width

    def move(self, src: int, dst: int, filled: int | None = None) -> None:
        """Row ``src``'s keys (its first ``filled`` columns; all when None), values and states into row
        ``dst`` (packing live rows to the front)."""
        end = self.max_len if filled is None else filled
        for k, v in zip(self.keys, self.values):
            if k is not None:
                k[dst, :, :end].copy_(k[src, :, :end])
                v[dst, :, :end].copy_(v[src, :, :end])
        self.move_linear_states(src, dst)
        self.write[dst] = self.write[src]

    def update(self, key, value, layer_idx: int, cache_kwargs=None, **kwargs):  # 5.24 adds kwargs=…
        rows = self.active
        k, v = self.keys[layer_idx][:rows], self.values[layer_idx][:rows]
        k[self.row_index[:rows], :, self.write[:rows]] = key[:, :, 0]
        v[self.row_index[:rows], :, self.write[:rows]] = value[:, :, 0]
        return k[:, :, :self.attend], v[:, :, :self.attend]
