"""Routed experts in the decode step: transformers' grouped products, with the groups' bounds found by one search.

transformers 5.x computes an MoE layer's routed experts as two grouped matrix products over the
(token, expert) pairs sorted by expert (``grouped_mm``). The products need each expert's end offset in
the sorted list, and transformers counts them with a histogram and a running sum: a cast of the expert
ids (``histc`` takes no integers on a CPU), ``histc`` and ``cumsum`` — three kernels per MoE layer in a
decode step whose expert products are a few microseconds. The offsets are also where each expert's run
ends in the sorted ids, which one ``searchsorted`` finds: the same int32 values, so the same products and
the same tokens. :func:`decode_experts` is transformers' grouped forward with that one change; within
:func:`grouped_experts_for` (the decode step) the layers that run ``grouped_mm`` run it instead, where it
gives this transformers' outputs bit for bit (:func:`same_as_transformers`).

:func:`dynamic_experts` says whether an MoE's experts keep fixed shapes and stay on the device in a decode
step — whether the step may be a CUDA graph or compiled.
"""

from __future__ import annotations

import contextlib

import torch

NAME = "vlmfast_decode_grouped_mm"


def decode_experts(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
    """transformers' ``grouped_mm_experts_forward`` (5.24) for one process (no expert parallelism), each
    expert's end offset found by ``searchsorted`` in the sorted expert ids."""
    from transformers.integrations.moe import _grouped_linear

    num_top_k = top_k_index.size(-1)
    num_tokens, hidden_dim = hidden_states.size(0), hidden_states.size(-1)
    sample_weights, expert_ids = top_k_weights.reshape(-1), top_k_index.reshape(-1)  # (S,): S token-expert pairs

    expert_ids_g, perm = torch.sort(expert_ids)
    selected = hidden_states[perm // num_top_k]
    sample_weights_g = sample_weights[perm]
    # where each expert's run ends in the sorted ids: the running sum of a histogram of them. The experts'
    # ids are a tensor made once (:func:`grouped_configs`): one made here would be a kernel of its own.
    offsets = torch.searchsorted(expert_ids_g, self.vlmfast_expert_ids, right=True, out_int32=True)

    if self.has_gate:
        weights, biases = self.gate_up_proj, self.gate_up_proj_bias[expert_ids_g] if self.has_bias else None
    else:
        weights, biases = self.up_proj, self.up_proj_bias[expert_ids_g] if self.has_bias else None
    out = _grouped_linear(selected, weights, offsets, bias=biases, is_transposed=self.is_transposed)
    out = self._apply_gate(out) if self.has_gate else self.act_fn(out)
    biases = self.down_proj_bias[expert_ids_g] if self.has_bias else None
    out = _grouped_linear(out, self.down_proj, offsets, bias=biases, is_transposed=self.is_transposed)
    if self.has_post_expert_norm:
        out = self.post_expert_norm(out)
    out = out * sample_weights_g.unsqueeze(-1)

    inv_perm = torch.empty_like(perm)  # back to the pairs' order, each token's experts summed in their order
    inv_perm[perm] = torch.arange(perm.size(0), device=perm.device)
    out = out[inv_perm].view(num_tokens, num_top_k, hidden_dim).sum(dim=1)
    return out.to(hidden_states.dtype)


def _available() -> bool:
    """Whether this transformers dispatches experts through an interface with transformers' grouped forward."""
    try:
        from transformers.integrations import moe
    except ImportError:  # transformers 4.x: experts are modules of their own
        return False
    return all(hasattr(moe, name) for name in ("ALL_EXPERTS_FUNCTIONS", "ExpertsInterface", "_grouped_linear"))


def experts_modules(module) -> list:
    """The routed-experts modules under ``module`` (transformers' experts: stacked ``gate_up_proj`` weights)."""
    return [m for m in module.modules() if hasattr(m, "gate_up_proj") and hasattr(m, "num_experts")]


def grouped_configs(layers) -> list:
    """The configs of ``layers``' routed experts that run transformers' ``grouped_mm`` forward, where
    :func:`decode_experts` gives that forward's outputs bit for bit (none where this transformers has no
    experts interface, a layer runs experts another way, or its grouped forward sums otherwise)."""
    if not _available():
        return []
    configs, checked = {}, {}
    for module in experts_modules(layers):
        config = getattr(module, "config", None)
        if getattr(config, "_experts_implementation", None) == "grouped_mm" and not getattr(module, "_is_expert_parallel", False):
            ids = getattr(module, "vlmfast_expert_ids", None)
            if ids is None or ids.device != module.gate_up_proj.device:  # made once, again where the model moved
                with torch.inference_mode(False):
                    module.vlmfast_expert_ids = torch.arange(module.num_experts, device=module.gate_up_proj.device)
            if id(config) not in checked:
                checked[id(config)] = same_as_transformers(module)
            if checked[id(config)]:
                configs[id(config)] = config
    if configs:
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS, ExpertsInterface

        if NAME not in ALL_EXPERTS_FUNCTIONS:
            ExpertsInterface.register(NAME, decode_experts)
    return list(configs.values())


def same_as_transformers(module) -> bool:
    """Whether :func:`decode_experts` gives this transformers' grouped forward's output bit for bit on
    ``module``'s weights (four tokens, two experts each, drawn from a fixed seed): it copies 5.24's, and
    another version's may order or sum otherwise."""
    from transformers.integrations import moe

    forward = getattr(moe, "grouped_mm_experts_forward", None)
    if forward is None:
        return False
    weight = module.gate_up_proj
    hidden = weight.shape[1] if getattr(module, "is_transposed", False) else weight.shape[-1]
    g = torch.Generator().manual_seed(0)
    k = min(2, module.num_experts)
    index = torch.stack([torch.randperm(module.num_experts, generator=g)[:k] for _ in range(4)]).to(weight.device)
    x = torch.randn(4, hidden, generator=g).to(weight.device, weight.dtype)
    routing = torch.rand(4, k, generator=g).to(weight.device, weight.dtype)
    with torch.inference_mode():
        try:
            return torch.equal(forward(module, x, index, routing), decode_experts(module, x, index, routing))
        except Exception:  # a forward this copy does not know how to call: transformers' own runs the step
            return False


@contextlib.contextmanager
def grouped_experts_for(configs: list):
    """Within the block (a decode step) the experts of ``configs`` run :func:`decode_experts`. Switched outside
    any compiled region: it sets a config attribute, which a compiled step reads as a constant. Only configs
    still on ``grouped_mm`` are switched (one set to another implementation since keeps it, after the step too)."""
    switched = [config for config in configs if config._experts_implementation == "grouped_mm"]
    for config in switched:
        config._experts_implementation = NAME
    try:
        yield
    finally:
        for config in switched:
            config._experts_implementation = "grouped_mm"


def dynamic_experts(model, device: str) -> str | None:
    """Why ``model``'s routed experts would change shape or sync with the host inside a decode step on
    ``device`` (no CUDA graph, no compiled step then); None when their shapes are fixed, as they are:

    - transformers 4.x (Qwen3-VL-MoE): at inference every expert runs on every token in one batched product;
    - transformers 5.x ``batched_mm``: each (token, expert) pair gathers its expert's weights;
    - transformers 5.x ``grouped_mm`` on a CPU (a compiled step calls its loop as one opaque operator), and on
      a GPU whose grouped kernel takes the offsets on the device (:func:`_offsets_on_device`: bfloat16 at
      compute capability 9.x or 10.x); elsewhere torch (or, compiled in another dtype, transformers) loops
      over the offsets read on the host.

    ``eager`` loops over the experts a step chose: its shapes follow the routing."""
    experts = experts_modules(model)
    if not experts or not _available():
        return None
    from transformers.integrations import moe

    for module in experts:
        implementation = getattr(getattr(module, "config", None), "_experts_implementation", None)
        if implementation == "batched_mm" or (implementation == "grouped_mm" and not device.startswith("cuda")):
            continue
        if implementation == "grouped_mm":
            weight = module.gate_up_proj
            usable = getattr(moe, "_can_use_grouped_mm", None)
            if _offsets_on_device(weight) and usable is not None and usable(weight[0], weight, weight.new_zeros(0)):
                continue
            here = (str(weight.dtype)[6:] if weight.dtype != torch.bfloat16 else
                    "bfloat16 on ROCm" if torch.version.hip else "bfloat16 at {}.{}".format(*_capability(weight)))
            return (f"its grouped experts are captured only in bfloat16 at compute capability 9.x or 10.x ({here} "
                    "here: their grouped products read the offsets on the host)")
        return f"its experts run transformers' {implementation!r} implementation, whose shapes follow the routing"
    return None


def _capability(weight: torch.Tensor) -> tuple[int, int]:
    return torch.cuda.get_device_capability(weight.device if weight.is_cuda else None)


def _offsets_on_device(weight: torch.Tensor) -> bool:
    """Whether torch's grouped product of ``weight`` on a GPU takes its offsets on the device: its CUTLASS kernel
    (and inductor's grouped template) runs bfloat16 at compute capability 9.x and 10.x only; elsewhere (an
    A100's 8.0, an L4's 8.9, 12.x, ROCm) ``_grouped_mm`` falls back to a loop over ``offs.cpu()``, a host sync
    that a CUDA graph cannot capture."""
    if weight.dtype != torch.bfloat16 or torch.version.hip:
        return False
    return _capability(weight)[0] in (9, 10)
