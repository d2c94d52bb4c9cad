"""Fused Q/K/V and gate/up projections in the decode step: one matrix multiply per group, counted with the
profiler; the model's state dict unchanged (names, shapes, values) and a weight copied into it reaches the
fused matrix; the decode loop's tokens still plain generate's (the engine tests hold them to it)."""

import collections

import torch

from vlmfast.engines.hf.engine import Engine, GenerationSettings
from vlmfast.engines.hf.fused import Part, fuse_projections, fused_projections
from vlmfast.engines.hf.scheduler import Scheduler
from vlmfast.inputs.requests import Request


def _linears_per_step(loaded, images):
    from vlmfast.engines.hf import decode

    engine = Engine(loaded, GenerationSettings(max_new_tokens=4, ignore_eos=True))
    reqs = [Request(str(p), (str(p),), "Describe.") for p in images[:2]]
    counts = []
    step = decode.DecodeState.step

    def counted(self):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            step(self)
        counts.append(collections.Counter(e.name for e in prof.events())["aten::linear"])

    decode.DecodeState.step = counted
    try:
        list(Scheduler(engine).run(reqs, {}, 2))
    finally:
        decode.DecodeState.step = step
    return counts


def test_a_decode_step_runs_four_products_per_layer_not_seven(loaded, images):
    layers = loaded.model.config.get_text_config().num_hidden_layers
    counts = _linears_per_step(loaded, images)
    # per layer: QKV, O, gate-up, down (was q, k, v, o, gate, up, down); plus the LM head
    assert counts and set(counts) == {layers * 4 + 1}


def test_the_state_dict_is_unchanged_and_a_copied_weight_reaches_the_fused_matrix():
    torch.manual_seed(0)

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj, self.k_proj, self.v_proj = (torch.nn.Linear(8, n, bias=True) for n in (8, 4, 4))

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn = Attention()

    layer = Layer()
    before = {k: v.clone() for k, v in layer.state_dict().items()}
    x = torch.randn(3, 1, 8)
    expected = [getattr(layer.self_attn, n)(x) for n in ("q_proj", "k_proj", "v_proj")]
    (group,) = fuse_projections([layer])
    assert isinstance(layer.self_attn.k_proj, Part)
    after = layer.state_dict()
    assert list(after) == list(before) and all(torch.equal(after[k], before[k]) for k in before)
    with fused_projections([group]):
        got = [getattr(layer.self_attn, n)(x) for n in ("q_proj", "k_proj", "v_proj")]
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(got, expected))
    with torch.no_grad():
        after["self_attn.v_proj.weight"].copy_(torch.zeros(4, 8))  # what a checkpoint swap does
    assert torch.equal(group.weight[12:], torch.zeros(4, 8))
    with fused_projections([group]):
        assert torch.equal(layer.self_attn.v_proj(x), layer.self_attn.v_proj.bias.expand(3, 1, 4))
    assert group._input is None and group._output is None  # nothing held between steps


def test_a_second_engine_on_the_same_model_decodes_fused_too(loaded, images):
    layers = loaded.model.config.get_text_config().num_hidden_layers
    _linears_per_step(loaded, images)
    assert set(_linears_per_step(loaded, images)) == {layers * 4 + 1}
