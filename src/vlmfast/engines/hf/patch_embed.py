"""The vision tower's patch embedding as one matrix product.

Every Qwen-VL vision tower embeds its patches (3 colours × 2 frames × 14² or 16² pixels) with an
``nn.Conv3d`` whose kernel equals its stride: no window overlaps another, so the convolution is one matrix
product of the flattened patches with the kernel read as a matrix. cuDNN has no good algorithm for that
shape on some GPU, dtype and version combinations (reported: seconds per call on an H100 in bf16, and tens
of thousands of times the product's time on Blackwell), which is why vLLM and SGLang compute it as a
product and transformers 5.x offers that as an opt-in fusion. On the 2-core development CPU, 8 images'
2,300 patches took 13.6 ms as a convolution and 3.8 ms as a product.

:func:`use_linear_patch_embed` makes every such patch embedding of a model a product while the block is
open (prefill), in products of :data:`ROWS` patches each; the module, its weight and the state dict stay as they
are.
"""

from __future__ import annotations

import contextlib

import torch
from torch.nn import functional


def linear_patch_embeds(model) -> list:
    """The patch embeddings of ``model`` whose ``proj`` is a convolution that is one product per patch."""
    found = []
    for module in model.modules():
        proj = getattr(module, "proj", None)
        if type(proj) is torch.nn.Conv3d and _one_product_per_patch(proj) and hasattr(module, "embed_dim"):
            found.append(module)
    return found


def _one_product_per_patch(conv: torch.nn.Conv3d) -> bool:
    no_padding = not isinstance(conv.padding, str) and set(conv.padding) == {0}  # ("valid" / "same": not this)
    return tuple(conv.kernel_size) == tuple(conv.stride) and no_padding and set(conv.dilation) == {1} and conv.groups == 1


# Patches per product: every product has this many rows (the last padded with zeros), so a patch's embedding is
# the same bits whichever images share the prefill group. A product's row depends on how many rows the product
# has (BLAS picks its kernel, and so its order of sums, by the shape: one image alone and 10 images together
# gave a patch other last bits, and a tied greedy token flipped with the batch).
ROWS = 1024


def _product(module):
    proj = module.proj

    def forward(hidden_states: torch.Tensor) -> torch.Tensor:
        weight = proj.weight  # (embed, channels, frames, height, width): one row per output feature
        rows = hidden_states.to(weight.dtype).reshape(-1, weight[0].numel())
        count = rows.shape[0]
        padded = functional.pad(rows, (0, 0, 0, -count % ROWS))
        matrix = weight.reshape(weight.shape[0], -1)
        out = torch.cat([functional.linear(part, matrix, proj.bias) for part in padded.split(ROWS)])
        return out[:count]

    return forward


@contextlib.contextmanager
def use_linear_patch_embed(model):
    """Within the block, the patch embeddings of ``model`` compute their product; yields how many."""
    modules = [m for m in linear_patch_embeds(model) if "forward" not in vars(m)]  # not already switched
    for module in modules:
        module.forward = _product(module)
    try:
        yield len(modules)
    finally:
        for module in modules:
            del module.forward
