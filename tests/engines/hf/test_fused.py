"""Fused Q/K/V and gate/up projections in the decode step: one matrix multiply per group, counted with the
profiler; the model's state dict unchanged (names, shapes, values) and a weight copied into it reaches the
fused matrix; the decode loop's tokens still plain generate's (the engine tests hold them to it)."""

import collections

import pytest
import torch

from vlmfast.engines.hf.engine import Engine, GenerationSettings
from vlmfast.engines.hf.fused import Part, fuse_projections, fused_projections
from vlmfast.engines.hf.scheduler import Scheduler
from vlmfast.inputs.requests import Request


PRODUCTS = ("aten::linear", "mkldnn::_linear_pointwise", "mkl::_mkl_linear")  # plain, oneDNN-packed, MKL-packed


def _ops_per_step(loaded, images, *names):
    """Per decode step of a 2-row batch: how many ops of the given names the profiler saw; and the engine."""
    from vlmfast.engines.hf import decode

    engine = Engine(loaded, GenerationSettings(max_new_tokens=4, ignore_eos=True))
    reqs = [Request(str(p), (str(p),), "Describe.") for p in images[:2]]
    counts = []
    step = decode.DecodeState.step

    def counted(self):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            step(self)
        seen = collections.Counter(e.name for e in prof.events())
        counts.append(sum(seen[name] for name in names))

    decode.DecodeState.step = counted
    try:
        list(Scheduler(engine).run(reqs, {}, 2))
    finally:
        decode.DecodeState.step = step
    return counts, engine


def _linears_per_step(loaded, images):
    return _ops_per_step(loaded, images, *PRODUCTS)[0]  # plain or packed (CPU)


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


@pytest.mark.parametrize("key, per_layer", [("qwen3_5", 4), ("qwen3_5_moe", 5)])
def test_qwen3_5s_linear_attention_and_shared_expert_projections_are_one_product_each(key, per_layer, family_loaded,
                                                                                          images):
    """A Gated DeltaNet layer: its four input projections (Q/K/V, z, b, a) one product, then out, gate/up and
    down (was 7); an MoE layer's experts block: the router, the shared expert's gate/up with its one-column
    gate, the shared expert's down (was 5): the routed experts run grouped products, not linear layers."""
    import transformers

    from vlmfast.checkpoints.families import BY_KEY

    if not hasattr(transformers, BY_KEY[key].model_class):
        pytest.skip("not in this transformers")
    loaded = family_loaded(key)
    layers = loaded.model.config.get_text_config().num_hidden_layers
    counts = _linears_per_step(loaded, images)
    assert counts and set(counts) == {layers * per_layer + 1}


def test_a_group_may_span_an_owners_submodules_and_keeps_the_state_dict():
    """The MoE block's shared expert gate/up and the block's own one-column gate read one input: one product."""
    torch.manual_seed(0)
    mlp = torch.nn.Module()
    mlp.shared_expert = torch.nn.Module()
    mlp.shared_expert.gate_proj, mlp.shared_expert.up_proj = (torch.nn.Linear(8, 16, bias=False) for _ in range(2))
    mlp.shared_expert_gate = torch.nn.Linear(8, 1, bias=False)
    layer = torch.nn.Module()
    layer.mlp = mlp
    before = {k: v.clone() for k, v in layer.state_dict().items()}
    x = torch.randn(3, 8)
    expected = [mlp.shared_expert.gate_proj(x), mlp.shared_expert.up_proj(x), mlp.shared_expert_gate(x)]
    (group,) = fuse_projections([layer])
    assert isinstance(mlp.shared_expert_gate, Part) and group.weight.shape == (33, 8)
    after = layer.state_dict()
    assert list(after) == list(before) and all(torch.equal(after[k], before[k]) for k in before)
    with fused_projections([group]):
        got = [mlp.shared_expert.gate_proj(x), mlp.shared_expert.up_proj(x), mlp.shared_expert_gate(x)]
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(got, expected))


def test_a_second_engine_on_the_same_model_decodes_fused_too(loaded, images):
    layers = loaded.model.config.get_text_config().num_hidden_layers
    _linears_per_step(loaded, images)
    assert set(_linears_per_step(loaded, images)) == {layers * 4 + 1}

@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN")
def test_on_a_cpu_every_decode_product_runs_on_a_packed_weight_and_the_head_is_left_in_place(loaded, images):
    from vlmfast.engines.hf.decode import TextDecoder
    from vlmfast.engines.hf.fused import layout_of

    layers = loaded.model.config.get_text_config().num_hidden_layers
    layout = layout_of(loaded.model.lm_head.weight)  # the tiny checkpoint's weights are all small: one layout
    counts, engine = _ops_per_step(loaded, images, {"MKL": "mkl::_mkl_linear", "oneDNN": "mkldnn::_linear_pointwise"}[layout])
    assert set(counts) == {layers * 4 + 1}
    assert [n for n in engine.decode_notes() if f"on {layout}-packed weights" in n]  # the report says so
    # the head is packed from the module's own weight, the module untouched: a head tied to the embedding stays so
    decoder = TextDecoder(loaded.model)
    assert type(loaded.model.lm_head) is torch.nn.Linear and decoder.head.weight is loaded.model.lm_head.weight


def test_small_weights_pack_for_mkl_and_large_ones_for_onednn():
    """MKL's packed product is the faster at every row count for a small weight and loses at many rows of a
    large one (a pack made for 2 rows): the layout is chosen per weight, once, so a row's bits never depend
    on the batch."""
    from vlmfast.engines.hf import fused

    if not fused.mkl_serves_any_rows():
        pytest.skip("this torch's MKL does not serve every row count from one pack (oneDNN packs instead)")
    small, large, one = torch.zeros(1024, 1024), torch.zeros(1025, 1024), torch.zeros(1, 64)
    assert (fused.layout_of(small), fused.layout_of(large), fused.layout_of(one)) == ("MKL", "oneDNN", "oneDNN")
    assert (fused.Packed(small).mkl, fused.Packed(large).mkl) == (True, False)


def test_the_layouts_are_those_of_the_fused_matrices_not_of_the_layers(monkeypatch):
    """A layer's own weight may be small (a 2-head K of 256 x 2,048) where its fused group is not: the note names
    (and the probes check) the layouts the packed matrices get, not the layers'."""
    from vlmfast.engines.hf import fused

    if not fused.mkl_serves_any_rows():
        pytest.skip("this torch's MKL does not serve every row count from one pack (oneDNN packs instead)")
    monkeypatch.setattr(fused, "available_memory", lambda: 10**11)
    layer = torch.nn.Module()
    layer.self_attn = torch.nn.Module()
    for name, out in (("q_proj", 2048), ("k_proj", 256), ("v_proj", 256), ("o_proj", 2048)):
        setattr(layer.self_attn, name, torch.nn.Linear(2048, out, bias=False))
    layers, head = torch.nn.ModuleList([layer]), torch.nn.Linear(2048, 1000, bias=False)
    pack, note = fused.packing_plan(fused.decode_weights(layers, head), fused.decode_matrices(layers, head))
    groups = fused.fuse_projections(layers, pack=pack) + [fused.Fused([head], pack=True)]
    assert pack and {g.packed.mkl for g in groups} == {False} and "on oneDNN-packed weights" in note


def test_a_packed_weight_follows_a_weight_copied_into_the_model():
    """A checkpoint swap copies new values into the parameters: the next decode step packs them again."""
    torch.manual_seed(0)
    mlp = torch.nn.Module()
    mlp.gate_proj, mlp.up_proj, mlp.down_proj = (torch.nn.Linear(a, b, bias=False) for a, b in ((8, 16), (8, 16), (16, 8)))
    layer = torch.nn.Module()
    layer.mlp = mlp
    with torch.inference_mode():  # where the engine first builds its decoder
        groups = fuse_projections([layer], pack=True)
    assert len(groups) == 2 and all(g.packed is not None for g in groups)
    assert isinstance(mlp.down_proj, Part) and mlp.down_proj.weight is groups[1].weight  # a group of one: no copy
    x = torch.randn(3, 1, 16)
    with fused_projections(groups):
        before = mlp.down_proj(x)
    with torch.no_grad():
        layer.state_dict()["mlp.down_proj.weight"].copy_(torch.zeros(8, 16))
    with fused_projections(groups):
        assert torch.equal(mlp.down_proj(x), torch.zeros(3, 1, 8))
    assert not torch.equal(before, torch.zeros(3, 1, 8))
    with torch.no_grad():
        layer.state_dict()["mlp.up_proj.weight"].copy_(torch.zeros(16, 8))  # a view of the fused gate/up matrix
    with fused_projections(groups):
        assert torch.equal(mlp.up_proj(torch.randn(3, 1, 8)), torch.zeros(3, 1, 16))


@pytest.mark.parametrize("layout", ["MKL", "oneDNN"])
def test_a_row_of_a_packed_product_does_not_depend_on_the_batch(monkeypatch, layout):
    """What makes batch 1 and batch N decode the same tokens: a row's result is the same bits for any rows —
    one row included (alone it takes another kernel, whose sums differ: MKL's at 64 inputs, oneDNN's from
    2,048 on), in either packed layout, on the torch the setup installs (2.14); an older one whose oneDNN
    lacks it (2.11) is said aloud."""
    from vlmfast.engines.hf import fused

    if layout == "MKL" and not fused.mkl_serves_any_rows():
        pytest.skip("this torch's MKL does not serve every row count from one pack")
    monkeypatch.setattr(fused, "layout_of", lambda weight: layout)
    torch.manual_seed(0)
    invariant = True
    for shape in ((192, 64), (512, 256), (96, 2048)):
        weight, bias, x = torch.randn(*shape), torch.randn(shape[0]), torch.randn(64, 1, shape[1])
        packed = fused.Packed(weight)
        alone = [packed(x[row:row + 1], bias) for row in range(8)]
        invariant &= all(torch.equal(packed(x[:rows], bias)[row:row + 1], alone[row])
                         for rows in (2, 3, 8, 13, 32, 64) for row in range(min(rows, 8)))
        assert torch.allclose(alone[0], torch.nn.functional.linear(x[:1], weight, bias), rtol=1e-5, atol=1e-4)
    assert fused.row_invariant(layout) == invariant
    monkeypatch.setattr(fused, "available_memory", lambda: 10**9)
    pack, note = fused.packing_plan([torch.zeros(64, 64)])
    assert pack and f"on {layout}-packed weights" in note
    assert ("batch 1 and batch N may choose other tokens" in note) == (not invariant)
    if tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 14):
        assert invariant


def test_mkl_packs_a_weight_once_for_products_of_any_row_count():
    """MKL's API packs a weight for a row count; here one pack (made for 2 rows) serves every count: as many
    bytes as a pack for 64 rows, ``linear``'s values to rounding, and for each row the bits it has in a
    product of all 40 rows — what :func:`mkl_serves_any_rows` checks before MKL packs."""
    from vlmfast.engines.hf import fused

    if not fused.mkl_serves_any_rows():
        pytest.skip("this torch's MKL does not serve every row count from one pack (oneDNN packs instead)")
    torch.manual_seed(1)
    weight, bias, x = torch.randn(200, 2048), torch.randn(200), torch.randn(40, 2048)
    packed = fused.Packed(weight)
    assert packed.mkl
    whole = packed(x, bias)
    assert packed.blocked.shape == torch.ops.mkl._mkl_reorder_linear_weight(weight, 64).shape
    for rows in (1, 2, 5, 17, 40):
        got = packed(x[:rows], bias)
        assert torch.equal(got, whole[:rows])
        assert torch.allclose(got, torch.nn.functional.linear(x[:rows], weight, bias), rtol=1e-4, atol=1e-3)


def test_packing_needs_float32_cpu_weights_with_version_counters_and_room(monkeypatch):
    from vlmfast.engines.hf import fused

    def fits(weights):
        return fused.packing_plan(weights)[0]

    weights = [torch.zeros(64, 64), torch.zeros(64, 64)]
    monkeypatch.setattr(fused, "available_memory", lambda: 10**9)
    assert fits(weights)
    assert not fits([w.bfloat16() for w in weights])
    with torch.inference_mode():
        assert not fits([torch.zeros(64, 64)])
    monkeypatch.setattr(fused, "available_memory", lambda: 4 * 64 * 64 * 4 * 2 - 1)  # the copies > a quarter of it
    pack, note = fused.packing_plan(weights)
    assert not pack and "more than 25% of the" in note
    assert not fits([])


@pytest.mark.parametrize("layout, op", [("MKL", torch.ops.mkl), ("oneDNN", torch.ops.mkldnn)])
def test_a_cpu_that_cannot_pack_decodes_unpacked_and_says_why(monkeypatch, layout, op):
    from vlmfast.engines.hf import fused

    def refuse(*args):
        raise RuntimeError("no packed format for this CPU")

    monkeypatch.setattr(fused, "available_memory", lambda: 10**9)
    monkeypatch.setattr(fused, "layout_of", lambda weight: layout)
    monkeypatch.setattr(op, "_mkl_reorder_linear_weight" if layout == "MKL" else "_reorder_linear_weight", refuse)
    pack, note = fused.packing_plan([torch.zeros(64, 64)])
    assert not pack and f"{layout} could not pack here (no packed format for this CPU)" in note
