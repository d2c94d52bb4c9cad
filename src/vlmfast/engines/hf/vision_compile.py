"""The vision tower's blocks compiled: norms, rotary positions, casts and residual adds fused.

A vision block's products are few and large; what else it does is a chain of elementwise passes over
every patch of every image. Qwen2.5-VL's rotary positions alone take q and k to float32, multiply,
rotate, add and cast back in separate kernels (~50 bytes moved per element where one fused kernel
moves 4), and each RMSNorm is five more passes. On an H200, 32 images of 448 px (32,768 patches) spent
~100 ms of a 179-ms tower in such kernels, against ~41 TFLOP of products.

:func:`use_compiled_vision_blocks` runs every vision block of the model through one ``torch.compile`` of
the block class's forward: dynamo lifts each block's parameters as inputs, so all blocks (and the blocks
of a model loaded later) share the compiled code, and inductor fuses the passes between the products.
The merged attention (:func:`~vlmfast.engines.hf.vision_attention.merged_attention`) is one opaque
operator inside the graph, so a block is one graph; the patch count is a dynamic size from the first
call, and the longest segment, an integer the block's code branches on, makes windowed and
full-attention layers two graphs. Compiled sums may round differently from eager ones (a fused
multiply-add, another reduction order): the engine compiles the tower on CUDA devices where it compiles
the decode step and the attention runs merged, and a compile that fails leaves the tower eager for the
rest of the run. Blocks that already carry a forward of their own (accelerate's hooks: offload, device
maps) are left as they are.
"""

from __future__ import annotations

import contextlib
import functools

# The vision block classes whose forward compiles as one function for every block (read in the sources of
# transformers 4.57 and 5.24): hidden states in, hidden states out, the attention through the registry.
BLOCK_CLASSES = frozenset({"Qwen2_5_VLVisionBlock", "Qwen2VLVisionBlock", "Qwen3VLVisionBlock",
                           "Qwen3VLMoeVisionBlock", "Qwen3_5VisionBlock", "Qwen3_5MoeVisionBlock"})


def vision_blocks(model) -> list:
    """The vision blocks of ``model`` (a whole VLM or a bare tower) that :func:`use_compiled_vision_blocks` compiles:
    not those whose forward something else replaced (an accelerate hook) or whose weights are elsewhere (meta)."""
    return [m for m in model.modules() if type(m).__name__ in BLOCK_CLASSES and "forward" not in vars(m)
            and not hasattr(m, "_hf_hook") and not any(p.device.type == "meta" for p in m.parameters())]


@functools.cache
def compiled_forward(block_class):
    """One compiled forward per block class (made on first use, kept for the process: a later prefill and a
    swapped checkpoint reuse it)."""
    import torch

    return torch.compile(block_class.forward, fullgraph=False)


def compiled_graphs() -> int:
    """How many graphs dynamo has compiled in this process so far."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def is_compile_error(exc: BaseException) -> bool:
    """Whether ``exc`` came from dynamo or inductor (as opposed to the model's own errors or the device's)."""
    return any(c.__module__.startswith(("torch._dynamo", "torch._inductor")) for c in type(exc).__mro__)


def _run(forward, block, hidden_states, *args, **kwargs):
    """One block through its compiled forward, the patch count (and with it the segment count) a dynamic
    size from the first call on: a graph per kind of layer (windows, whole images) serves every prefill
    group, instead of one compile per count."""
    import torch

    for tensor in (hidden_states, kwargs.get("cu_seqlens"), *(kwargs.get("position_embeddings") or ())):
        if isinstance(tensor, torch.Tensor):
            torch._dynamo.maybe_mark_dynamic(tensor, 0)
    return forward(block, hidden_states, *args, **kwargs)


@contextlib.contextmanager
def use_compiled_vision_blocks(model, enabled: bool = True):
    """Within the block, every vision block of ``model`` runs compiled; yields how many."""
    blocks = vision_blocks(model) if enabled else []
    for block in blocks:
        block.forward = functools.partial(_run, compiled_forward(type(block)), block)
    try:
        yield len(blocks)
    finally:
        for block in blocks:
            del block.forward


def run_compiled(model, forward, vision, device: str) -> tuple[object, float, str | None]:
    """``forward()`` (one prefill group) with the vision blocks of ``model`` compiled: its output, the seconds
    that went to compiling, and None — or, when the compile fails, (None, the seconds it took, what failed).
    A forward that compiled a graph (the first, or for a new kind of layer or size) counts as compiling: its
    time and its marks on the ``vision`` clock are not the prefill's, and the group runs again (its first
    output and caches let go first)."""
    from vlmfast.timing import now

    graphs, start, marked = compiled_graphs(), now(device), vision.count()
    try:
        with use_compiled_vision_blocks(model):
            out = forward()
    except Exception as exc:
        if not is_compile_error(exc):
            raise
        vision.drop_since(marked)
        return None, now(device) - start, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    if compiled_graphs() == graphs:
        return out, 0.0, None
    compiling_s = now(device) - start
    del out
    vision.drop_since(marked)
    with use_compiled_vision_blocks(model):
        return forward(), compiling_s, None
