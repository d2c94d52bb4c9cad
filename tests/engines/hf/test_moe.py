"""Routed experts in the decode step: transformers' grouped products with the groups' offsets found by one
``searchsorted``, bit for bit what transformers' own grouped forward gives; the decode step runs it."""

import collections
import types

import pytest
import torch

moe = pytest.importorskip("transformers.integrations.moe")
pytestmark = pytest.mark.skipif(not hasattr(moe, "ALL_EXPERTS_FUNCTIONS"), reason="transformers 4.x: no experts interface")


def _experts(family_loaded, key):
    model = family_loaded(key).model
    return next(m for m in model.model.language_model.layers.modules() if hasattr(m, "gate_up_proj"))


@pytest.mark.parametrize("key", ["qwen3_vl_moe", "qwen3_5_moe"])
def test_decode_experts_are_transformers_grouped_forward_bit_for_bit(key, family_loaded):
    """Routings with experts chosen by no token (the offsets repeat), by every token, and with one token."""
    import transformers

    from vlmfast.engines.hf.moe import decode_experts, grouped_configs

    if not hasattr(transformers, "Qwen3_5MoeForConditionalGeneration") and key == "qwen3_5_moe":
        pytest.skip("not in this transformers")
    experts = _experts(family_loaded, key)
    grouped_configs(torch.nn.ModuleList([experts]))  # what the decoder does: the experts' ids, made once
    g = torch.Generator().manual_seed(0)
    e, k, hidden = experts.num_experts, 2, experts.gate_up_proj.shape[-1]
    routings = [torch.randint(0, e, (5, k), generator=g),
                torch.tensor([[e - 1, 0]] * 6),  # experts 1 .. e-2 unused
                torch.tensor([[1, 2]])]
    for index in routings:
        x = torch.randn(index.shape[0], hidden, generator=g)
        weights = torch.rand(index.shape, generator=g)
        with torch.inference_mode():
            expected = moe.grouped_mm_experts_forward(experts, x, index, weights)
            got = decode_experts(experts, x, index, weights)
        assert torch.equal(got, expected)


def test_the_decode_step_finds_the_offsets_by_one_search_and_plain_forwards_keep_transformers(family_loaded, images):
    from vlmfast.engines.hf import decode
    from vlmfast.engines.hf.engine import Engine, GenerationSettings
    from vlmfast.engines.hf.scheduler import Scheduler
    from vlmfast.inputs.requests import Request

    loaded = family_loaded("qwen3_vl_moe")
    layers = loaded.model.config.get_text_config().num_hidden_layers
    engine = Engine(loaded, GenerationSettings(max_new_tokens=3, ignore_eos=True))
    counts, step = [], decode.DecodeState.step

    def counted(self):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            step(self)
        counts.append(collections.Counter(e.name for e in prof.events()))

    decode.DecodeState.step = counted
    try:
        list(Scheduler(engine).run([Request(str(p), (str(p),), "Describe.") for p in images[:2]], {}, 2))
    finally:
        decode.DecodeState.step = step
    assert counts and all(c["aten::searchsorted"] == layers and c["aten::histc"] == 0 for c in counts)
    experts = _experts(family_loaded, "qwen3_vl_moe")
    assert experts.config._experts_implementation == "grouped_mm"  # left as loaded outside the step


def test_experts_whose_shapes_follow_the_routing_keep_the_step_eager_and_say_why(family_loaded, images):
    """transformers 5.x's default grouped experts have fixed shapes on a CPU: the MoE step may be static and
    compiled (its tokens: the family tests); its ``eager`` experts loop over the chosen ones: no static step."""
    from vlmfast.engines.hf.engine import Engine, GenerationSettings
    from vlmfast.engines.hf.moe import dynamic_experts

    loaded = family_loaded("qwen3_vl_moe")
    settings = GenerationSettings(max_new_tokens=3, ignore_eos=True)
    assert dynamic_experts(loaded.model, "cpu") is None
    assert Engine(loaded, settings, compile=True, compiler=lambda fn: fn).policy.enabled
    config = _experts(family_loaded, "qwen3_vl_moe").config
    config._experts_implementation = "eager"
    try:
        why = dynamic_experts(loaded.model, "cpu")
        engine = Engine(loaded, settings, compile=True, compiler=lambda fn: fn)
    finally:
        config._experts_implementation = "grouped_mm"
    assert "'eager' implementation" in why
    assert not engine.policy.enabled and any(why in n for n in engine.notes), engine.notes
    assert "--compile not applied" in engine.notes


@pytest.mark.parametrize("capability, captured", [((8, 0), False), ((8, 9), False), ((9, 0), True), ((10, 0), True),
                                                 ((12, 0), False)])
def test_bf16_grouped_experts_are_captured_only_where_torchs_kernel_takes_the_offsets_on_the_device(
        capability, captured, monkeypatch):
    """torch's grouped kernel (and inductor's template) runs bfloat16 at compute capability 9.x and 10.x; on
    other GPUs ``_grouped_mm`` loops over ``offs.cpu()``: a host sync, which a CUDA graph capture refuses."""
    from vlmfast.engines.hf.moe import dynamic_experts

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.version, "hip", None)
    experts = torch.nn.Module()
    experts.num_experts = 4
    experts.gate_up_proj = torch.nn.Parameter(torch.zeros(4, 16, 8, dtype=torch.bfloat16), requires_grad=False)
    experts.config = types.SimpleNamespace(_experts_implementation="grouped_mm")
    why = dynamic_experts(experts, "cuda")
    assert (why is None) == captured, why
    if not captured:
        assert f"bfloat16 at {capability[0]}.{capability[1]} here" in why
    assert dynamic_experts(experts, "cpu") is None  # a CPU has no graphs: its compiled loop is one operator


def test_the_decode_step_leaves_experts_set_to_another_implementation_as_they_are(family_loaded):
    """A config set to another implementation after the decoder was made keeps it, in the step and after."""
    from vlmfast.engines.hf.moe import grouped_configs, grouped_experts_for

    config = _experts(family_loaded, "qwen3_vl_moe").config
    configs = grouped_configs(family_loaded("qwen3_vl_moe").model.model.language_model.layers)
    assert configs == [config]
    config._experts_implementation = "batched_mm"
    try:
        with grouped_experts_for(configs):
            inside = config._experts_implementation
        after = config._experts_implementation
    finally:
        config._experts_implementation = "grouped_mm"
    assert (inside, after) == ("batched_mm", "batched_mm")
    with grouped_experts_for(configs):
        assert config._experts_implementation == "vlmfast_decode_grouped_mm"
    assert config._experts_implementation == "grouped_mm"


def test_experts_whose_grouped_forward_sums_otherwise_keep_transformers_forward(family_loaded, monkeypatch):
    """Another transformers version's grouped forward may order or sum otherwise: where the copy's output is not
    bit for bit transformers', the decode step keeps transformers' forward."""
    from vlmfast.engines.hf import moe as ours

    layers = family_loaded("qwen3_vl_moe").model.model.language_model.layers
    assert ours.grouped_configs(layers)  # this transformers' forward is the one copied

    def summed_otherwise(self, hidden_states, top_k_index, top_k_weights):
        return ours.decode_experts(self, hidden_states, top_k_index, top_k_weights) * (1 + 2 ** -10)

    monkeypatch.setattr(moe, "grouped_mm_experts_forward", summed_otherwise)
    assert ours.grouped_configs(layers) == []
