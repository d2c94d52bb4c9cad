"""The vision tower's attention in one call per layer instead of one per window or image.

Qwen2-VL / Qwen2.5-VL / Qwen3-VL (and -MoE) / Qwen3.5 (and -MoE) vision towers pack every image of a prefill group into one sequence
and say in ``cu_seqlens`` where each attention segment starts: images in full-attention layers, and in
Qwen2.5-VL's windowed layers 112-px windows (64 patches; 16 per 448-px image). Under sdpa or eager,
transformers splits the sequence and calls attention once per segment — per layer, hundreds of small
calls for a batch of images, which leaves a GPU waiting on kernel launches. Only its flash-attn branch
hands the packed sequence and ``cu_seqlens`` to one attention call.

:func:`use_merged_vision_attention` sends the vision attention down that branch with
:func:`merged_attention` behind it: the segments are gathered into a padded batch (segments × longest
segment) and go through one ``scaled_dot_product_attention`` call with a key mask built from
``cu_seqlens``. That is the block-diagonal mask of the packed sequence with the empty blocks left out:
a single (total × total) mask would cost memory and compute quadratic in the tokens of all images
(8 images of 224–640 px: ~8k patches, 65M mask entries and scores per head per layer) where the
windows need ~0.5M. Where padding would cost too much — more than :data:`MAX_PADDING_WASTE` times the
exact scores (a full-attention layer over images of very different sizes), or more than
:data:`MAX_MERGED_SCORES` in all — it falls back to one call per segment, as transformers does. Where
every segment has the same length (images of one size: every window full, every image as long) the
packed tensors are that batch already: a view, no gather, no mask, so SDPA may take its fastest kernel
(on an H200, 32 images of 448 px spent 24 ms of a 289-ms tower gathering into the padded batch).
The registry's function reaches :func:`segment_attention` through one operator,
``vlmfast::segment_attention``: a compiled vision block (:mod:`vlmfast.engines.hf.vision_compile`) keeps
it inside its graph, where the segment lengths it reads on the host would otherwise break the graph.
"""

from __future__ import annotations

import contextlib

# The varlen branch of the vision attention: transformers 4.57 takes it when the vision config says
# exactly "flash_attention_2", 5.x when the name contains "flash"; both look the function up in the
# shared ALL_ATTENTION_FUNCTIONS registry. So the vision configs say "flash_attention_2" and, while the
# context is open, the registry's own entry for that name (an override local to its instance, removed
# on exit) is merged_attention, which hands calls from any other module to the function it replaced.
VARLEN_NAME = "flash_attention_2"

# Score elements per head one merged call may compute (segments × longest segment²). 2**25 is 32
# images of 448 px (1024 patches each) in a full-attention layer — the most a CUDA prefill group of
# 32768 tokens holds at that size. Windowed layers stay far below it (64-patch windows: 8192 windows).
# Where SDPA materializes scores (its math kernel) that is 2**25 × heads × dtype bytes: 1 GiB at 16
# heads in bf16; the flash and memory-efficient kernels (CUDA; CPU float32) never hold them.
MAX_MERGED_SCORES = 2**25
# Padded scores per exact score (segments × longest² ÷ Σ length²) above which the segments run one by
# one: windows waste little (only edge windows are short), while one full-attention layer over 8 images
# of 224–640 px would compute 3.3× the scores (measured on 2 CPU cores, demo tower: 566 ms per forward
# merged throughout vs 398 ms with those layers per image).
MAX_PADDING_WASTE = 2.0

# The vision attention classes whose forward dispatches as described above (read in the sources of
# transformers 4.57 and 5.23), by module path and class name.
VISION_ATTENTION_CLASSES = frozenset({
    "transformers.models.qwen2_5_vl.modeling_qwen2_5_vl.Qwen2_5_VLVisionAttention",
    "transformers.models.qwen2_vl.modeling_qwen2_vl.VisionAttention",
    "transformers.models.qwen3_vl.modeling_qwen3_vl.Qwen3VLVisionAttention",
    "transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe.Qwen3VLMoeVisionAttention",
    "transformers.models.qwen3_5.modeling_qwen3_5.Qwen3_5VisionAttention",
    "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe.Qwen3_5MoeVisionAttention",
})

# The configs of the vision attention modules that run merged (while a context is open). Each carries the
# flag MERGED_FLAG too, which merged_attention reads: a compiled vision block guards on the flag's value, not
# on which config (or module) it is, so every block of every model loaded later reuses the same graph.
_active: dict[int, object] = {}
MERGED_FLAG = "_vlmfast_merged_attention"
_replaced = None  # the registry's function for VARLEN_NAME before the override
_attention_op = None  # vlmfast::segment_attention, registered on first use
_plans: dict[int, tuple[object, object]] = {}  # id(cu_seqlens) → (that tensor, its _Segments)


def vision_attention_modules(model) -> list:
    """The vision attention modules of ``model`` (a whole VLM or a bare vision tower) that
    :func:`use_merged_vision_attention` knows how to switch."""
    return [m for m in model.modules() if f"{type(m).__module__}.{type(m).__name__}" in VISION_ATTENTION_CLASSES]


@contextlib.contextmanager
def use_merged_vision_attention(model):
    """Within the block, the vision tower of ``model`` runs each layer's attention in one call
    (:func:`merged_attention`). Yields True when it switched, False when there was nothing to do: no
    vision tower it knows, or one not running sdpa (flash-attn already takes one call per layer;
    eager is kept as asked). Switched outside any compiled region: it sets config attributes."""
    global _replaced
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    modules = vision_attention_modules(model)
    configs = list({id(m.config): m.config for m in modules}.values())
    if not configs or _active or any(c._attn_implementation != "sdpa" for c in configs):
        yield False
        return
    _replaced = ALL_ATTENTION_FUNCTIONS[VARLEN_NAME]
    had_local = VARLEN_NAME in ALL_ATTENTION_FUNCTIONS._local_mapping
    _active.update({id(c): c for c in configs})
    _register_attention_op()  # outside any compiled region
    ALL_ATTENTION_FUNCTIONS[VARLEN_NAME] = merged_attention
    for config in configs:
        config._attn_implementation = VARLEN_NAME
        setattr(config, MERGED_FLAG, True)
    try:
        yield True
    finally:
        for config in configs:
            config._attn_implementation = "sdpa"
            delattr(config, MERGED_FLAG)
        if had_local:
            ALL_ATTENTION_FUNCTIONS[VARLEN_NAME] = _replaced
        else:
            del ALL_ATTENTION_FUNCTIONS[VARLEN_NAME]
        _active.clear()
        _plans.clear()
        _replaced = None


def merged_attention(module, query, key, value, attention_mask=None, scaling=None, dropout: float = 0.0,
                     cu_seq_lens_q=None, **kwargs):
    """Attention of a packed sequence (``query`` etc. (1, heads, tokens, head dim)) within each segment
    of ``cu_seq_lens_q``, as an attention function of transformers': (1, tokens, heads, head dim)."""
    if not getattr(module.config, MERGED_FLAG, False) or cu_seq_lens_q is None:
        return _replaced(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                         cu_seq_lens_q=cu_seq_lens_q, **kwargs)
    return _attention_op(query, key, value, cu_seq_lens_q, scaling), None


def _register_attention_op() -> None:
    """:func:`segment_attention` as one opaque operator (``vlmfast::segment_attention``), so a compiled vision
    block traces around it in one graph: it reads the segment lengths on the host, which dynamo would
    otherwise break the graph for. The output is contiguous, as the fake one that shapes the graph says."""
    global _attention_op
    if _attention_op is not None:
        return
    import torch

    @torch.library.custom_op("vlmfast::segment_attention", mutates_args=(), schema=(
        "(Tensor query, Tensor key, Tensor value, Tensor cu_seqlens, float? scaling) -> Tensor"))
    def op(query, key, value, cu_seqlens, scaling):
        return segment_attention(query, key, value, cu_seqlens, scaling).contiguous()

    @op.register_fake
    def _(query, key, value, cu_seqlens, scaling):
        return query.new_empty(1, query.shape[2], query.shape[1], query.shape[3])

    _attention_op = op


def segment_attention(query, key, value, cu_seqlens, scaling=None, max_scores: int | None = None):
    """Non-causal attention within each segment ``cu_seqlens[i]:cu_seqlens[i + 1]`` of a packed
    sequence: (1, heads, tokens, dim) in, (1, tokens, heads, dim) out. One SDPA call over the padded
    segments while their scores (segments × longest²) stay within ``max_scores`` (default
    :data:`MAX_MERGED_SCORES`) and :data:`MAX_PADDING_WASTE` × the exact ones; one call per segment else."""
    import torch
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    plan = _plan(cu_seqlens, query.shape[2])
    if plan.count == 1:
        out = sdpa(query, key, value, scale=scaling)
    elif plan.uniform:  # segments of one length (images of one size): a view of the packed tensors, no mask
        heads, tokens, dim = query.shape[1:]
        split = lambda t: t[0].unflatten(1, (plan.count, plan.longest)).transpose(0, 1)  # noqa: E731
        out = sdpa(split(query), split(key), split(value), scale=scaling)  # (segments, heads, longest, dim)
        return out.permute(0, 2, 1, 3).reshape(1, tokens, heads, dim)
    elif plan.padded_scores <= min(MAX_MERGED_SCORES if max_scores is None else max_scores,
                                   MAX_PADDING_WASTE * plan.exact_scores):
        out = sdpa(plan.pad(query), plan.pad(key), plan.pad(value), attn_mask=plan.key_valid, scale=scaling)
        return out.transpose(1, 2)[plan.segment, plan.offset].unsqueeze(0)
    else:
        parts = zip(*(t.split(plan.lengths, dim=2) for t in (query, key, value)))
        out = torch.cat([sdpa(q, k, v, scale=scaling) for q, k, v in parts], dim=2)
    return out.transpose(1, 2)


class _Segments:
    """Where each token of a packed sequence sits in a (segments, longest) padded batch."""

    def __init__(self, cu_seqlens, tokens: int):
        import torch

        device = cu_seqlens.device
        starts, lengths = cu_seqlens[:-1].long(), cu_seqlens.diff().long()
        self.lengths = lengths.tolist()  # the one host read-back per cu_seqlens tensor
        self.count, self.longest = len(self.lengths), max(self.lengths)
        self.uniform = min(self.lengths) == self.longest
        self.padded_scores, self.exact_scores = self.count * self.longest**2, sum(n * n for n in self.lengths)
        self.segment = torch.repeat_interleave(torch.arange(self.count, device=device), lengths, output_size=tokens)
        self.offset = torch.arange(tokens, device=device) - starts[self.segment]
        # (segments, 1, 1, longest): padded keys are never attended to; a padded query row still sees
        # its segment's keys (no empty softmax) and is dropped on the way back
        self.key_valid = (torch.arange(self.longest, device=device) < lengths[:, None])[:, None, None, :]

    def pad(self, packed):
        """(1, heads, tokens, dim) → (segments, heads, longest, dim), zeros in the padding."""
        heads, dim = packed.shape[1], packed.shape[3]
        out = packed.new_zeros(self.count, self.longest, heads, dim)
        out[self.segment, self.offset] = packed[0].transpose(0, 1)
        return out.transpose(1, 2)


def _plan(cu_seqlens, tokens: int) -> _Segments:
    """The padding plan of a ``cu_seqlens`` tensor, made once: a vision forward passes the same tensor
    to every layer of a kind (windowed or full), so the read-back happens twice per forward, not per layer."""
    hit = _plans.get(id(cu_seqlens))
    if hit is not None and hit[0] is cu_seqlens:  # the cached tensor is held: its id cannot be reused
        return hit[1]
    plan = _Segments(cu_seqlens, tokens)
    if len(_plans) >= 4:
        _plans.pop(next(iter(_plans)))
    _plans[id(cu_seqlens)] = (cu_seqlens, plan)
    return plan
