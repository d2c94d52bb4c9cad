"""The linear-attention half of the decode cache: Gated DeltaNet states (Qwen3.5), one row per sequence.

Qwen3.5's linear-attention layers keep no keys or values. Each keeps a conv state — the last
``conv_kernel_size`` inputs of its short causal convolution, (rows, conv channels, kernel) — and a
recurrent state, (rows, value heads, key dim, value dim), in float32 as transformers keeps it. A decode
step reads both through the cache object it is given (transformers 5.x: ``get_conv_state``,
``get_recurrent_state``, ``is_recording_past``, ``update_recurrent_state``), updates the conv state in
place and hands the new recurrent state back; :class:`LinearStateCache` answers those calls from
buffers preallocated once, so a step keeps fixed addresses (CUDA graphs hold them).

Why prefill groups can be copied row by row: prefill zeroes the hidden states at padding before the
layer's projections, so a padded position feeds zeros to the convolution and a zero key to the delta
rule, which leaves a zero recurrent state zero. A row's states are therefore those of its unpadded prompt
(up to float rounding) whatever its left padding, and carry no length dimension: unlike keys and values,
they need no right-alignment in the common prompt length.
"""

from __future__ import annotations

import torch


def linear_modules(layers) -> dict[int, torch.nn.Module]:
    """Layer index → linear-attention module, for the decoder layers that have one."""
    return {i: layer.linear_attn for i, layer in enumerate(layers) if hasattr(layer, "linear_attn")}


def check_cache_api() -> None:
    """A UsageError when the installed transformers reads linear-attention states through another cache
    interface than the one :class:`LinearStateCache` answers (the one of 5.23)."""
    from transformers.cache_utils import Cache

    from vlmfast.errors import UsageError

    missing = [m for m in ("get_conv_state", "get_recurrent_state", "update_recurrent_state", "is_recording_past")
               if not hasattr(Cache, m)]
    if missing:
        import transformers

        raise UsageError(f"transformers {transformers.__version__}'s cache has no {', '.join(missing)}: "
                         "vlmfast's decode loop cannot hold this model's linear-attention states",
                         hint="decode with plain generate (--decoder hf), or pip install -U transformers")


class LinearStateCache:
    """Conv and recurrent states of every linear-attention layer for ``batch`` rows; mixed into the
    decode cache, whose full-attention layers keep keys and values. ``linear`` maps layer index → module
    (:func:`linear_modules`); empty for models without linear attention."""

    def init_linear_states(self, linear: dict, batch: int, device) -> None:
        self.conv_states: dict[int, torch.Tensor] = {}
        self.recurrent_states: dict[int, torch.Tensor] = {}
        for i, m in linear.items():
            self.conv_states[i] = torch.zeros(batch, m.conv_dim, m.conv_kernel_size, dtype=m.conv1d.weight.dtype,
                                              device=device)
            self.recurrent_states[i] = torch.zeros(batch, m.num_v_heads, m.head_k_dim, m.head_v_dim,
                                                   dtype=torch.float32, device=device)

    def admit_linear_states(self, rows: torch.Tensor, cache, prompts: torch.Tensor) -> None:
        """Copy one prefill group's states into decode ``rows``, row k from prompt row ``prompts[k]``;
        the rows' earlier states are overwritten whole."""
        for i in self.conv_states:
            layer = cache.layers[i]
            self.conv_states[i][rows] = layer.conv_states[0][prompts]
            self.recurrent_states[i][rows] = layer.recurrent_states[0][prompts]

    def take_linear_states(self, other: LinearStateCache) -> None:
        """``other``'s states (a cache of no more rows) into the same rows here."""
        for i in self.conv_states:
            self.conv_states[i][:other.batch].copy_(other.conv_states[i])
            self.recurrent_states[i][:other.batch].copy_(other.recurrent_states[i])

    def move_linear_states(self, src: int, dst: int) -> None:
        for i in self.conv_states:
            self.conv_states[i][dst].copy_(self.conv_states[i][src])
            self.recurrent_states[i][dst].copy_(self.recurrent_states[i][src])

    # -- what a linear-attention layer calls during a one-token step (transformers 5.x) ----------
    # The step computes the first ``active`` rows (the eager loop packs live rows first): views of them.
    def get_conv_state(self, layer_idx: int, state_idx: int = 0):
        return self.conv_states[layer_idx][:self.active]  # updated in place by the layer's conv1d step

    def get_recurrent_state(self, layer_idx: int, state_idx: int = 0):
        return self.recurrent_states[layer_idx][:self.active]

    def update_recurrent_state(self, recurrent_states, layer_idx: int, state_idx: int = 0, **kwargs):
        self.recurrent_states[layer_idx][:self.active].copy_(recurrent_states)  # copy: the buffer's address stays
        return self.recurrent_states[layer_idx][:self.active]

    def is_recording_past(self, layer_idx: int) -> bool:
        return False  # no speculative rollback: the one-token path updates the conv state in place

    def has_previous_state(self, layer_idx: int | None = None, state_idx: int | None = None) -> bool:
        return True  # decode always continues a prefilled prompt

    def update_conv_state(self, conv_states, layer_idx: int, state_idx: int = 0, **kwargs):
        # Only a forward of several tokens calls this; the decode loop feeds one token per step.
        raise NotImplementedError("vlmfast's decode cache takes one token per step")
