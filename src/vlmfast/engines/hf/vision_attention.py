"""The vision tower's attention in one call per layer instead of one per window or image.

Qwen2-VL / Qwen2.5-VL / Qwen3-VL (and -MoE) / Qwen3.5 (and -MoE) vision towers pack every image of a prefill group into one sequence
and say in ``cu_seqlens`` where each attention segment starts: images in full-attention layers, and in
Qwen2.5-VL's windowed layers 112-px windows (64 patches; 16 per 448-px image). Under sdpa or eager,
transformers splits the sequence and calls attention once per segment — per layer, hundreds of small
calls for a batch of images, which leaves a GPU waiting on kernel launches. Only its flash-attn branch
hands the packed sequence and ``cu_seqlens`` to one attention call.

:func:`use_merged_vision_attention` sends the vision attention down that branch with
:func:`merged_attention` behind it. Where every segment has the same length (images of one size: every window
full, every image as long) the packed tensors are a (segments, heads, length, dim) batch already: a view, one
``scaled_dot_product_attention`` call, no gather, no mask, so SDPA may take its fastest kernel. Segments of
several lengths (edge windows, images of several sizes) run one call per length, over the segments of that
length gathered at exactly their length: each segment's result is then bit for bit what it gives alone, whichever
other images share the prefill group. (Padding every segment to the longest with a key mask made an image's
features depend, in their last bits, on the sizes of the others: a tied greedy token could flip with the batch.)
A call holds at most :data:`MAX_MERGED_SCORES` scores per head; more segments of a length run in several calls.
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

# Score elements per head one call may compute (segments × length²). 2**25 is 32 images of 448 px (1024
# patches each) in a full-attention layer — the most a CUDA prefill group of 32768 tokens holds at that size.
# Windowed layers stay far below it (64-patch windows: 8192 windows). Where SDPA materializes scores (its math
# kernel) that is 2**25 × heads × dtype bytes: 1 GiB at 16 heads in bf16; the flash and memory-efficient kernels
# (CUDA; CPU float32) never hold them.
MAX_MERGED_SCORES = 2**25

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
    sequence: (1, heads, tokens, dim) in, (1, tokens, heads, dim) out. Segments of one length: one SDPA call
    over a view; of several: one call per length (and per ``max_scores``, default :data:`MAX_MERGED_SCORES`,
    scores per head), each segment at exactly its length — what it gives alone, bit for bit."""
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    plan = _plan(cu_seqlens, query.shape[2])
    heads, tokens, dim = query.shape[1:]
    if plan.count == 1:
        return sdpa(query, key, value, scale=scaling).transpose(1, 2)
    if plan.uniform:  # segments of one length (images of one size): a view of the packed tensors, no mask
        split = lambda t: t[0].unflatten(1, (plan.count, plan.longest)).transpose(0, 1)  # noqa: E731
        out = sdpa(split(query), split(key), split(value), scale=scaling)  # (segments, heads, longest, dim)
        return out.permute(0, 2, 1, 3).reshape(1, tokens, heads, dim)
    limit = MAX_MERGED_SCORES if max_scores is None else max_scores
    out = query.new_empty(tokens, heads, dim)
    for length, index in plan.groups:  # index: (segments of this length, length) token positions
        for part in index.split(max(1, limit // (length * length))):
            take = lambda t: t[0][:, part].transpose(0, 1)  # noqa: E731 - (segments, heads, length, dim)
            out[part] = sdpa(take(query), take(key), take(value), scale=scaling).transpose(1, 2)
    return out.unsqueeze(0)


class _Segments:
    """The segments of a packed sequence: their lengths, and the token positions of the segments of each length."""

    def __init__(self, cu_seqlens, tokens: int):
        import itertools

        import torch

        self.lengths = cu_seqlens.diff().long().tolist()  # the one host read-back per cu_seqlens tensor
        self.count, self.longest = len(self.lengths), max(self.lengths)
        self.uniform = min(self.lengths) == self.longest
        starts: dict[int, list[int]] = {}
        for start, length in zip(itertools.accumulate([0, *self.lengths]), self.lengths):
            starts.setdefault(length, []).append(start)
        device = cu_seqlens.device
        self.groups = [(length, torch.tensor(at, device=device)[:, None] + torch.arange(length, device=device))
                       for length, at in sorted(starts.items()) if length] if not self.uniform else []


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
