"""Routed experts in the decode step: transformers' grouped products with the groups' offsets found by one
``searchsorted``, bit for bit what transformers' own grouped forward gives; the decode step runs it."""

import collections

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
