"""The vision blocks compiled as one function for every block: the eager tower's output, one graph per kind
of layer whatever the patch count, no graph break at the merged attention; in the engine, the eager
tokens, the compile's seconds kept out of the time to the first token, and a failed compile left behind."""

import pytest

torch = pytest.importorskip("torch")

from test_vision_mlp import _tower  # noqa: E402

from vlmfast.engines.hf import vision_compile  # noqa: E402
from vlmfast.engines.hf.vision_attention import use_merged_vision_attention  # noqa: E402
from vlmfast.engines.hf.vision_compile import use_compiled_vision_blocks  # noqa: E402

GRIDS = ([[1, 8, 8], [1, 8, 12]], [[1, 8, 8]] * 3, [[1, 16, 8]])  # patch counts 160, 192, 128; 2, 3, 1 images


def _tower_forward(tower, grid):
    torch.manual_seed(1)
    grid = torch.tensor(grid)
    pixels = torch.randn(int(grid.prod(-1).sum()), 3 * 2 * 14 * 14)
    with torch.inference_mode():
        out = tower(pixels, grid_thw=grid)
    out = getattr(out, "pooler_output", out)
    return out[0] if isinstance(out, tuple) else out


def test_compiled_blocks_give_the_eager_tower_in_one_graph_per_kind_of_layer():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    tower = _tower(36)
    with use_merged_vision_attention(tower) as merged:
        reference = [_tower_forward(tower, g) for g in GRIDS]
        with use_compiled_vision_blocks(tower) as count:
            assert "forward" in vars(tower.blocks[0])
            got = [_tower_forward(tower, g) for g in GRIDS]
    assert merged and count == 2 and "forward" not in vars(tower.blocks[0])  # eager again outside the block
    for a, b in zip(got, reference):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)  # float32: fused sums may round otherwise
    # two graphs: windowed and full-attention layers (their longest segment is a constant of the code);
    # the attention is an operator inside them, not a graph break, and other patch counts reuse them
    assert counters["stats"]["unique_graphs"] == 2, dict(counters["stats"])
    assert not counters["graph_break"], dict(counters["graph_break"])


def test_a_model_loaded_later_reuses_the_compiled_graphs():
    """A sweep loads model after model: the compiled blocks guard on what the code reads, not on which tower."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    graphs = []
    for seed in range(3):
        tower = _tower(36, seed=seed)
        with use_merged_vision_attention(tower):
            reference = _tower_forward(tower, GRIDS[0])
            with use_compiled_vision_blocks(tower):
                got = _tower_forward(tower, GRIDS[0])
        torch.testing.assert_close(got, reference, rtol=1e-5, atol=1e-6)
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[0] in (1, 2) and graphs == graphs[:1] * 3, graphs  # (4.57 makes one graph of both kinds of layer)


def test_blocks_with_a_forward_of_their_own_are_left_alone():
    """accelerate's hooks replace a module's forward (offload, device maps): such a block stays as it is."""
    tower = _tower(36)
    hooked = tower.blocks[0]
    own = hooked.forward = lambda *args, **kwargs: type(hooked).forward(hooked, *args, **kwargs)
    with use_compiled_vision_blocks(tower) as count:
        assert vars(hooked)["forward"] is own
    assert count == 1 and vars(hooked)["forward"] is own


def test_the_engine_compiles_the_vision_blocks_with_the_decode_step(loaded, images):
    from vlmfast.engines.hf.engine import Engine, GenerationSettings
    from vlmfast.inputs.requests import Request

    requests = [Request(f"r{i}", (str(p),), "Describe the image.") for i, p in enumerate(images[:3])]
    settings = GenerationSettings(max_new_tokens=6)
    eager = Engine(loaded, settings)
    assert not eager.compile_vision  # a CPU prefills eagerly unless told
    # the decode step "compiled" as itself: the policy is on, and only the vision blocks meet torch.compile
    engine = Engine(loaded, settings, compile=True, compiler=lambda fn: fn)
    engine.compile_vision = True
    want = [r.token_ids for r in eager.generate_batch(requests)[0]]
    prepared = engine.prepare(requests)
    assert all(g.positions is not None and g.positions.shape[1] == g.end - g.start for g in prepared.groups)
    first = engine.prefill(prepared)
    again = engine.prefill(engine.prepare(requests))
    assert first.compile_s > 0 and again.compile_s == 0.0  # the same shapes: nothing compiles the second time
    rows, timing = engine.generate_batch(requests)
    assert [r.token_ids for r in rows] == want and timing.ttft_s > 0
    assert engine.compile_vision and not engine.policy.notes
    # a batch that compiles: its time to the first token and its vision tower's share leave the compile out
    torch._dynamo.reset()
    fresh = Engine(loaded, settings, compile=True, compiler=lambda fn: fn)
    fresh.compile_vision = True
    rows, timing = fresh.generate_batch(requests)
    assert [r.token_ids for r in rows] == want and fresh.policy.compile_s > 0
    assert 0 < timing.vision_s < timing.ttft_s < fresh.policy.compile_s


def test_a_failed_vision_compile_leaves_the_blocks_eager(loaded, images, monkeypatch):
    from vlmfast.engines.hf.engine import Engine, GenerationSettings
    from vlmfast.inputs.requests import Request

    def fails(block_class):
        def forward(*args, **kwargs):
            raise torch._dynamo.exc.Unsupported("an operator inductor cannot compile")
        return forward

    monkeypatch.setattr(vision_compile, "compiled_forward", fails)
    requests = [Request(f"r{i}", (str(p),), "Describe the image.") for i, p in enumerate(images[:2])]
    settings = GenerationSettings(max_new_tokens=4)
    want = [r.token_ids for r in Engine(loaded, settings).generate_batch(requests)[0]]
    engine = Engine(loaded, settings, compile=True, compiler=lambda fn: fn)
    engine.compile_vision = True
    rows, _ = engine.generate_batch(requests)
    assert [r.token_ids for r in rows] == want
    assert not engine.compile_vision and engine.policy.enabled  # the decode step stays compiled
    assert any(n.startswith("vision blocks uncompiled: torch.compile failed (Unsupported") for n in engine.policy.notes)
