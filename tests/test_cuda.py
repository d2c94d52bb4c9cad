"""What only a CUDA machine can show: the runtime choice, CUDA-graph capture and replay, compiled
graphs, synchronized clocks and peak memory. Skipped (all of them) where torch sees no CUDA device;
a test that needs a package the machine lacks is skipped and says which."""

import importlib.util

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
# images are decoded and resized by qwen_vl_utils: without it every test that runs images would fail on import
needs_qwen_vl_utils = pytest.mark.skipif(importlib.util.find_spec("qwen_vl_utils") is None,
                                         reason="qwen_vl_utils is not installed (pip install qwen-vl-utils)")
needs_bf16 = pytest.mark.skipif(torch.cuda.is_available() and not torch.cuda.is_bf16_supported(),
                                reason="this GPU has no bfloat16")

# bf16: tokens of the first BF16_TOKENS steps, graphs against the eager loop. The eager loop attends
# to the cache sliced to its filled length, a graph to the whole static buffer under a mask: the
# attention kernels differ and round differently in bf16, which flips an argmax only where the top two
# logits are nearly tied. With random weights such ties end a row's agreement after a few dozen
# tokens (measured on the 3B shape), rarely earlier; a wrong position, mask or cache slot breaks the
# first decode step of nearly every row (mean common prefix ~1: the prefill token). Hence the bound:
# rows share on average at least half of their first BF16_TOKENS tokens with the eager loop.
BF16_TOKENS = 16
BF16_MIN_MEAN_PREFIX = BF16_TOKENS // 2

from vlmfast.engines.hf.engine import Engine, GenerationSettings  # noqa: E402
from vlmfast.inputs.requests import Request  # noqa: E402
from vlmfast.engines.hf.scheduler import Scheduler  # noqa: E402


@pytest.fixture(scope="module")
def on_gpu(grpo_ckpt):
    """float32 on the GPU: graphs, eager and generate must then agree token for token."""
    from vlmfast.checkpoints.load import load

    return load(str(grpo_ckpt), device="cuda", dtype="float32", attn="sdpa")


@pytest.fixture(scope="module")
def on_gpu_bf16(grpo_ckpt):
    from vlmfast.checkpoints.load import load

    return load(str(grpo_ckpt), device="cuda", dtype="bfloat16", attn="sdpa")


def _batches(engine, images, batch_size=3):
    """Every batch the scheduler ran: its results (in batch order) and timing."""
    reqs = [Request(str(p), (str(p),), "What shapes are in this image?") for p in images]
    return [(rs, t) for _, rs, t in Scheduler(engine).run(reqs, {}, batch_size)]


def _run(engine, images, batch_size=3):
    batches = _batches(engine, images, batch_size)
    return {r.id: r.token_ids for rs, _ in batches for r in rs}, [t for _, t in batches]


def _eager_vision(engine):
    """``engine`` with its vision blocks left eager, as the eager reference's are: a compiled engine compiles
    them too, and image features an ulp apart can flip a near-tie first token, which says nothing about the
    decode step under test."""
    engine.compile_vision = False
    return engine


def _common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def test_runtime_choice_on_this_gpu():
    from vlmfast.checkpoints.load import detect_runtime

    runtime = detect_runtime()
    assert runtime.device == "cuda"
    assert runtime.dtype == ("bfloat16" if torch.cuda.is_bf16_supported() else "float16")
    from vlmfast.checkpoints.load import flash_attn_state

    usable, problem = flash_attn_state()  # an installed flash-attn that does not load is said, not taken
    if usable:
        assert runtime.attn == "flash_attention_2"
    else:
        said = problem or "flash-attn is not installed"
        assert runtime.attn == "sdpa" and any(said in n for n in runtime.notes), runtime.notes


@needs_qwen_vl_utils
def test_cuda_graphs_replay_the_eager_tokens(on_gpu, images):
    settings = GenerationSettings(max_new_tokens=20)
    eager, _ = _run(Engine(on_gpu, settings, cuda_graphs=False), images)
    graphs = Engine(on_gpu, settings)  # CUDA graphs by default on CUDA
    replayed, timings = _run(graphs, images)
    assert graphs.cuda_graphs and replayed == eager
    loops = list(graphs._static.values())
    assert loops and all(loop.graph is not None for loop in loops)  # captured, then replayed per token
    assert graphs.policy.compile_s > 0  # capture time, kept out of the decode clock
    for t in timings:
        assert t.ttft_s > 0 and t.decode_s > 0 and t.syncs <= -(-t.steps // 8)  # read back every 8 steps


@needs_qwen_vl_utils
@pytest.mark.parametrize("compiled", [False, True])
def test_static_steps_attending_by_two_products_give_the_eager_tokens(on_gpu, images, monkeypatch, compiled):
    """The two-product decode attention (VLMFAST_DECODE_ATTENTION=products) in captured graphs and in a
    compiled step: the eager loop's tokens (float32; the vision blocks eager in both)."""
    from vlmfast.engines.hf.text_decoder import PRODUCTS_DECODE_ATTENTION

    torch._dynamo.reset()
    monkeypatch.setenv("VLMFAST_DECODE_ATTENTION", "products")
    settings = GenerationSettings(max_new_tokens=12)
    eager, _ = _run(Engine(on_gpu, settings, cuda_graphs=False), images[:3])
    graphs = _eager_vision(Engine(on_gpu, settings, compile=compiled))
    replayed, _ = _run(graphs, images[:3])
    torch._dynamo.reset()
    assert graphs.cuda_graphs and graphs.policy.enabled == compiled, graphs.notes + graphs.policy.notes
    assert [s.attention for s in graphs._static.values()] == [PRODUCTS_DECODE_ATTENTION]
    assert all(s.graph is not None for s in graphs._static.values()) and replayed == eager


@needs_qwen_vl_utils
@pytest.mark.parametrize("compiled", [False, True])
def test_a_repetition_penalty_in_graphs_and_compiled_steps_gives_the_eager_tokens(on_gpu, images, monkeypatch, compiled):
    """The checkpoint's repetition penalty inside a captured (and a compiled) step: each row's seen tokens
    updated on the device, the eager loop's tokens (float32; the vision blocks eager in both)."""
    torch._dynamo.reset()
    monkeypatch.setattr(on_gpu.model.generation_config, "repetition_penalty", 1.3)
    settings = GenerationSettings(max_new_tokens=16, ignore_eos=True)
    eager, _ = _run(Engine(on_gpu, settings, cuda_graphs=False), images[:3])
    graphs = _eager_vision(Engine(on_gpu, settings, compile=compiled))
    replayed, _ = _run(graphs, images[:3])
    torch._dynamo.reset()
    assert graphs.penalty == 1.3 and graphs.policy.enabled == compiled, graphs.notes + graphs.policy.notes
    assert all(s.graph is not None and s.seen is not None for s in graphs._static.values()) and replayed == eager


@needs_qwen_vl_utils
def test_graph_buckets_serve_smaller_batches(on_gpu, images):
    settings = GenerationSettings(max_new_tokens=12, ignore_eos=True)
    eager, _ = _run(Engine(on_gpu, settings, cuda_graphs=False), images, batch_size=5)
    graphs = Engine(on_gpu, settings)
    replayed, _ = _run(graphs, images, batch_size=5)  # batches of 5 and 1 → buckets 8 and 1
    assert replayed == eager
    assert sorted(shape[0] for shape in graphs._static) == [1, 8]


@needs_qwen_vl_utils
def test_compiled_graphs_give_the_same_tokens(on_gpu, images, tmp_path, monkeypatch):
    from vlmfast.engines.hf.compile_policy import CompileCache
    from vlmfast.timing import versions

    torch._dynamo.reset()  # a step compiled earlier in this process would be reused: no cache event to check
    monkeypatch.setenv("VLMFAST_CACHE", str(tmp_path))
    monkeypatch.delenv("VLMFAST_DECODE_ATTENTION", raising=False)
    settings = GenerationSettings(max_new_tokens=12)
    eager, _ = _run(Engine(on_gpu, settings, cuda_graphs=False), images[:2], batch_size=2)
    compiled = Engine(on_gpu, settings, compile=True, compile_cache=CompileCache(versions()))
    got, _ = _run(compiled, images[:2], batch_size=2)
    # a compile that failed falls back to the uncompiled step and says why in the notes: show that cause
    assert compiled.policy.enabled, f"torch.compile fell back: {compiled.notes + compiled.policy.notes}"
    assert compiled.compile_vision, compiled.policy.notes  # the vision blocks compiled too, and gave these tokens
    from vlmfast.engines.hf.text_decoder import PRODUCTS_DECODE_ATTENTION

    # compiled on CUDA, the step attends by two products unless told otherwise
    assert [s.attention for s in compiled._static.values()] == [PRODUCTS_DECODE_ATTENTION]
    events = compiled.policy.cache.events
    assert events and all(e["cache"] in ("miss", "hit", "partial") for e in events), (events, compiled.notes)
    assert got == eager


@needs_qwen_vl_utils
def test_a_captured_shape_serves_a_batch_with_other_padding(on_gpu, images):
    settings = GenerationSettings(max_new_tokens=12, ignore_eos=True)
    eager = _batches(Engine(on_gpu, settings, cuda_graphs=False), images)
    graphs = Engine(on_gpu, settings)
    replayed = _batches(graphs, images)
    assert len(replayed) == 2 and len(graphs._static) == 1  # 2 batches of 3 rows, one captured shape (4 rows)
    assert next(iter(graphs._static.values())).graph is not None
    # the images differ in size: each batch pads its rows, and the two batches differently
    lengths = [sorted(r.n_prompt_tokens for r in rs) for rs, _ in replayed]
    assert lengths[0] != lengths[1] and all(len(set(n)) > 1 for n in lengths)
    assert [[r.token_ids for r in rs] for rs, _ in replayed] == [[r.token_ids for r in rs] for rs, _ in eager]


@needs_qwen_vl_utils
@needs_bf16
@pytest.mark.parametrize("attention", ["sdpa", "products"])
@pytest.mark.parametrize("compiled", [False, True])
def test_bf16_graphs_agree_with_the_bf16_eager_loop(on_gpu_bf16, images, monkeypatch, compiled, attention):
    """Captured graphs, and compiled ones, in bf16, attending with SDPA (the default) or by two products; the
    vision blocks eager in both, so that the first token comes from the same image features."""
    from vlmfast.engines.hf.text_decoder import STATIC_ATTENTION

    torch._dynamo.reset()
    monkeypatch.setenv("VLMFAST_DECODE_ATTENTION", attention)
    settings = GenerationSettings(max_new_tokens=BF16_TOKENS, ignore_eos=True)
    eager, _ = _run(Engine(on_gpu_bf16, settings, cuda_graphs=False), images)
    graphs = _eager_vision(Engine(on_gpu_bf16, settings, compile=compiled))
    replayed, _ = _run(graphs, images)
    torch._dynamo.reset()
    assert graphs.cuda_graphs and all(loop.graph is not None for loop in graphs._static.values())
    assert graphs.policy.enabled == compiled, graphs.notes + graphs.policy.notes
    assert all(loop.attention == STATIC_ATTENTION[attention] for loop in graphs._static.values())
    assert replayed.keys() == eager.keys() and all(len(t) == BF16_TOKENS for t in replayed.values())
    prefixes = [_common_prefix(replayed[k], eager[k]) for k in eager]
    assert all(p >= 1 for p in prefixes), prefixes  # the first token comes from the same prefill
    assert sum(prefixes) / len(prefixes) >= BF16_MIN_MEAN_PREFIX, prefixes


def test_merged_vision_attention_on_the_gpu(on_gpu):
    """The vision tower's windows in one attention call (what prefill uses) on the GPU's kernels."""
    from vlmfast.engines.hf.vision_attention import use_merged_vision_attention

    tower = on_gpu.model.model.visual
    grid = torch.tensor([[1, 16, 20], [1, 8, 12]], device="cuda")
    torch.manual_seed(0)
    pixels = torch.randn(int(grid.prod(-1).sum()), 3 * 2 * 14 * 14, device="cuda")

    def forward():
        with torch.inference_mode():
            out = tower(pixels, grid_thw=grid)
        return getattr(out, "pooler_output", out)

    per_window = forward()
    with use_merged_vision_attention(on_gpu.model) as merged:
        got = forward()
    # float32 both ways; the GPU's attention kernels block their sums differently with and without a mask
    assert merged
    torch.testing.assert_close(got, per_window, rtol=1e-4, atol=1e-5)


@needs_bf16
def test_the_patch_embedding_product_on_the_gpu_in_bf16(on_gpu_bf16):
    """The patch embedding as one product (what prefill uses) against cuDNN's convolution, in bf16."""
    from vlmfast.engines.hf.patch_embed import use_linear_patch_embed

    embed = on_gpu_bf16.model.model.visual.patch_embed
    torch.manual_seed(0)
    patches = torch.randn(2048, embed.proj.weight[0].numel(), device="cuda")
    with torch.inference_mode():
        conv = embed(patches)
        with use_linear_patch_embed(on_gpu_bf16.model) as switched:
            product = embed(patches)
    assert switched == 1 and product.dtype == conv.dtype == torch.bfloat16
    torch.testing.assert_close(product.float(), conv.float(), rtol=2e-2, atol=2e-2)  # bf16: 8 bits of mantissa


@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=needs_bf16)])
def test_the_padded_vision_mlp_on_the_gpu(dtype):
    """Qwen2.5-VL's vision MLP padded to aligned rows (what prefill uses on CUDA) against the MLP as saved,
    on the GPU's kernels; outside the block the layers (views of the padded matrices) compute as before."""
    from vlmfast.engines.hf.vision_mlp import aligned_vision_mlps, use_aligned_vision_mlp
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLMLP
    from transformers import Qwen2_5_VLConfig

    config = Qwen2_5_VLConfig(vision_config=dict(hidden_size=128, intermediate_size=342)).vision_config
    torch.manual_seed(0)
    mlp = Qwen2_5_VLMLP(config, bias=True).to("cuda", getattr(torch, dtype)).eval()
    x = torch.randn(4096, 128, device="cuda", dtype=mlp.gate_proj.weight.dtype)
    with torch.inference_mode():
        reference = mlp(x)
        with use_aligned_vision_mlp(mlp) as count:
            got = mlp(x)
        after = mlp(x)
    assert count == 1 and aligned_vision_mlps(mlp)[0].down.shape == (128, 384)
    tight = dict(rtol=1e-4, atol=1e-5) if dtype == "float32" else dict(rtol=2e-2, atol=2e-2)  # bf16: 8 bits
    torch.testing.assert_close(got.float(), reference.float(), **tight)
    torch.testing.assert_close(after.float(), reference.float(), **tight)


@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=needs_bf16)])
def test_compiled_vision_blocks_on_the_gpu(dtype):
    """The vision blocks compiled (Triton's fused norms, rotary positions and casts; what prefill runs on CUDA
    with a compiled decode step) against the eager tower, padded MLP and merged attention in both, over
    two prefill groups of other patch counts: two graphs, no graph break."""
    from torch._dynamo.utils import counters
    from transformers import Qwen2_5_VLConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel as Tower

    from vlmfast.engines.hf.vision_attention import use_merged_vision_attention
    from vlmfast.engines.hf.vision_compile import use_compiled_vision_blocks
    from vlmfast.engines.hf.vision_mlp import use_aligned_vision_mlp

    config = Qwen2_5_VLConfig(vision_config=dict(depth=4, hidden_size=128, intermediate_size=342, num_heads=2,
                                                 out_hidden_size=64, fullatt_block_indexes=[3])).vision_config
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    tower = Tower._from_config(config).to("cuda", getattr(torch, dtype)).eval()
    torch._dynamo.reset()
    counters.clear()

    def forward(grid):
        grid = torch.tensor(grid, device="cuda")
        torch.manual_seed(1)
        pixels = torch.randn(int(grid.prod(-1).sum()), 3 * 2 * 14 * 14, device="cuda", dtype=tower.dtype)
        out = tower(pixels, grid_thw=grid)
        out = getattr(out, "pooler_output", out)
        return out[0] if isinstance(out, tuple) else out

    grids = ([[1, 32, 32]] * 4, [[1, 16, 16], [1, 32, 24]])
    with torch.inference_mode(), use_merged_vision_attention(tower), use_aligned_vision_mlp(tower):
        reference = [forward(g) for g in grids]
        with use_compiled_vision_blocks(tower) as count:
            got = [forward(g) for g in grids]
    assert count == 4
    tight = dict(rtol=1e-4, atol=1e-4) if dtype == "float32" else dict(rtol=3e-2, atol=3e-2)  # bf16: 8 bits
    for a, b in zip(got, reference):
        torch.testing.assert_close(a.float(), b.float(), **tight)
    assert counters["stats"]["unique_graphs"] <= 3 and not counters["graph_break"], (dict(counters["stats"]),
                                                                                     dict(counters["graph_break"]))


@needs_qwen_vl_utils
def test_peak_memory_and_clocks_are_cuda_figures(grpo_ckpt, images, tmp_path):
    from vlmfast.run.runner import InferOptions, infer

    report = infer(InferOptions(ckpt=str(grpo_ckpt), images=[str(p) for p in images], prompt="Count.",
                                out=str(tmp_path / "r.jsonl"), generation=GenerationSettings(max_new_tokens=8)))
    assert report.device.startswith("cuda") and report.peak_mem_kind == "cuda_max_allocated" and report.peak_mem_mib > 0
    assert report.cuda_graphs and report.ttft_ms_p50 > 0 and report.decode_ms_per_token > 0
    assert report.dtype in ("bfloat16", "float16")


@pytest.mark.skipif(importlib.util.find_spec("flash_attn") is not None, reason="flash-attn is installed here")
def test_flash_attention_request_without_flash_attn_is_clear(grpo_ckpt, images):
    from conftest import cli

    r = cli("infer", "--ckpt", grpo_ckpt, "--images", images[0], "--prompt", "p", "--attn", "flash_attention_2")
    assert r.returncode == 2 and "flash-attn is not installed" in r.stderr and "'vlmfast[gpu]'" in r.stderr


@needs_qwen_vl_utils
@pytest.mark.parametrize("max_new", [1, 2])
def test_graphs_with_one_or_two_new_tokens_replay_the_eager_tokens(on_gpu, images, max_new):
    """With graphs on by default, a one- or two-token evaluation once hit a device-side assert in the
    capture warm-up (a write past the output buffer), which poisons the CUDA context for the whole run."""
    settings = GenerationSettings(max_new_tokens=max_new, ignore_eos=True)
    eager, _ = _run(Engine(on_gpu, settings, cuda_graphs=False), images)
    replayed, _ = _run(Engine(on_gpu, settings), images)
    assert replayed == eager


@needs_qwen_vl_utils
def test_sampled_graph_steps_never_sync_and_draw_as_the_eager_loop(on_gpu, images):
    """Sampling sits inside the static step (keyed noise, no generator, no multinomial): the step's work makes
    no host sync (sync debug mode raises on one), and a seeded batch draws the eager loop's tokens in float32."""
    settings = GenerationSettings(max_new_tokens=12, temperature=1.0, top_p=0.9, seed=3, ignore_eos=True)
    graphs, _ = _run(Engine(on_gpu, settings), images[:3])
    eager, _ = _run(Engine(on_gpu, settings, cuda_graphs=False), images[:3])
    assert graphs == eager

    engine = Engine(on_gpu, settings)
    _run(engine, images[:3])  # captures the shape
    state = next(iter(engine._static.values()))
    with torch.inference_mode():  # the state's buffers are inference tensors, as in the engine's own runs
        state.rewind()  # step again from each row's first answer token (the run left them at their ends)
        state.cache.attend = state.attends[-1]  # the whole cache, as the capture's warm-up steps attend
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            # the captured step's work run eagerly, as the warm-up and an uncaptured static step run it: a
            # replay only launches the graph and can never sync, and a capture synchronizes on purpose
            for _ in range(4):
                state._body()
        finally:
            torch.cuda.set_sync_debug_mode(0)


@needs_qwen_vl_utils
def test_per_step_times_come_from_cuda_events_without_a_sync_per_step(on_gpu, images):
    """bench's per-step clock records a CUDA event after each step and reads them at the end: the device
    syncs of a recorded run are only the EOS checks (one per 8 steps), and every step has a time."""
    settings = GenerationSettings(max_new_tokens=24, ignore_eos=True)
    _, (timing,) = _run(Engine(on_gpu, settings, record_steps=True), images[:3])
    assert len(timing.step_times_s) == timing.steps - 1 and all(t > 0 for t in timing.step_times_s)
    _, (plain,) = _run(Engine(on_gpu, settings), images[:3])
    assert timing.syncs == plain.syncs


@needs_qwen_vl_utils
def test_a_graph_per_attended_length_and_the_eager_tokens(on_gpu, images):
    """CUDA graphs attend to the filled keys: one graph per ATTEND_STEP multiple up to the cache length,
    sharing one memory pool; a run that crosses a boundary replays the eager loop's tokens."""
    from vlmfast.engines.hf.decode import ATTEND_STEP

    settings = GenerationSettings(max_new_tokens=300, ignore_eos=True)
    eager, _ = _run(Engine(on_gpu, settings, cuda_graphs=False), images[:2], 2)
    engine = Engine(on_gpu, settings)
    graphs, _ = _run(engine, images[:2], 2)
    assert graphs == eager
    state = next(iter(engine._static.values()))
    assert sorted(state.graphs) == list(range(ATTEND_STEP, state.max_len + 1, ATTEND_STEP)) and len(state.graphs) >= 2


@needs_qwen_vl_utils
def test_requests_admitted_into_freed_rows_between_replays_draw_the_eager_tokens(on_gpu, images):
    """Continuous batching under CUDA graphs: three requests through two captured rows, the third admitted
    into a freed row between replayed steps (admission happens outside the graphs); seeded draws equal the
    eager loop's, row for row (float32)."""
    from vlmfast.engines.hf.continuous import stream

    settings = GenerationSettings(max_new_tokens=16, temperature=1.0, top_p=0.9, seed=5)
    reqs = [Request(str(p), (str(p),), "Count the shapes.") for p in images[:3]]

    def answers(engine):
        length = max(engine.cost(r) for r in reqs) + 64 + settings.max_new_tokens
        return {r.id: r.token_ids for out, _ in stream(engine, reqs, 2, length) for r in out}

    eager = answers(Engine(on_gpu, settings, cuda_graphs=False))
    graphs = Engine(on_gpu, settings)
    assert answers(graphs) == eager and len(eager) == 3
    assert graphs._static and all(state.graph is not None for state in graphs._static.values())


@needs_qwen_vl_utils
def test_graphs_capture_a_stop_set_of_hundreds_of_ids(on_gpu, images):
    """The real-length benchmark stops a 151k vocabulary at one id in 256 (~600 stops): ``torch.isin`` on
    such a set syncs, which broke the capture. Unused extra stops change no token, eager or replayed."""
    import dataclasses

    settings = GenerationSettings(max_new_tokens=20)
    few, _ = _run(Engine(on_gpu, settings, cuda_graphs=False), images)
    produced = {t for row in few.values() for t in row}
    unused = [t for t in range(on_gpu.model.config.get_text_config().vocab_size) if t not in produced][:600]
    many = dataclasses.replace(on_gpu, eos_token_ids=[*on_gpu.eos_token_ids, *unused])
    graphs = Engine(many, settings)
    replayed, _ = _run(graphs, images)
    assert replayed == few and all(state.graph is not None for state in graphs._static.values())


@needs_qwen_vl_utils
def test_answers_prefilled_ahead_take_rows_between_replays_with_the_eager_tokens(on_gpu, images):
    """The GPU's admission policy under CUDA graphs: a prefill makes a set of rows' answers (2 requests × --n 3
    for 4 rows), the 2 that find no row wait prefilled and take rows as they free, between replayed steps."""
    from vlmfast.engines.hf.continuous import AdmitPolicy, stream

    settings = GenerationSettings(max_new_tokens=16, temperature=1.0, top_p=0.9, seed=5, n=3)
    reqs = [Request(str(p), (str(p),), "Count the shapes.") for p in images[:3]]

    def answers(engine):
        length = max(engine.cost(r) for r in reqs) + 64 + settings.max_new_tokens
        out = stream(engine, reqs, 4, length, AdmitPolicy.for_device(True))
        return {(r.id, r.sample): r.token_ids for rows, _ in out for r in rows}, engine.admissions

    eager, _ = answers(Engine(on_gpu, settings, cuda_graphs=False))
    graphs = Engine(on_gpu, settings)
    replayed, said = answers(graphs)
    assert replayed == eager and len(eager) == 9
    assert "answer(s) waited, prefilled, for a row" in said and " 0 answer(s) waited" not in said
    assert graphs._static and all(state.graph is not None for state in graphs._static.values())


def test_a_compiled_repetition_penalty_divides_as_eager_does():
    """Inside a compiled step the penalty is an opaque operator running eager's kernels, so its quotients are
    eager's bit for bit. On CUDA eager divides by a Python number as a product with its reciprocal: rounded to
    float32 from the double quotient on an H100 with torch 2.11 (``logits / 1.05`` equalled
    ``logits * (1 / 1.05)`` on every logit), float32's own reciprocal in older torches. So the check that the
    test can fail is the correctly rounded quotient (a division by a CUDA tensor), which misses either
    reciprocal's product on some logits."""
    from vlmfast.engines.hf.sampling import penalize

    logits = torch.randn(8, 151936, device="cuda") * 8
    seen = torch.ones_like(logits, dtype=torch.bool)
    exact = logits / torch.tensor(1.05, device="cuda")  # a true division: no reciprocal
    assert not torch.equal(logits / 1.05, exact)  # a quotient rounded otherwise shows: the test can fail
    compiled = torch.compile(lambda x, s: penalize(x, s, 1.05), fullgraph=True)
    assert torch.equal(compiled(logits, seen), penalize(logits, seen, 1.05))


@pytest.fixture(scope="module")
def moe_ckpt(family_ckpts):
    return family_ckpts("qwen3_vl_moe")


@needs_qwen_vl_utils
def test_moe_experts_in_float32_decode_as_their_transformers_allows(moe_ckpt, images):
    """transformers 5.x reads a float32 grouped product's offsets on the host: no graphs, and the notes say why;
    transformers 4.57 runs every expert on every token (fixed shapes): graphs, with the eager tokens."""
    from vlmfast.checkpoints.load import load
    from vlmfast.engines.hf.moe import dynamic_experts

    loaded = load(str(moe_ckpt), device="cuda", dtype="float32", attn="sdpa")
    settings = GenerationSettings(max_new_tokens=8, ignore_eos=True)
    eager, _ = _run(Engine(loaded, settings, cuda_graphs=False), images)
    engine = Engine(loaded, settings)
    got, _ = _run(engine, images)
    why = dynamic_experts(loaded.model, "cuda")
    if why is not None:  # transformers 5.x
        assert not engine.cuda_graphs and any("only in bfloat16" in n for n in engine.notes), engine.notes
    else:
        assert engine.cuda_graphs and all(loop.graph is not None for loop in engine._static.values())
    assert got == eager


@needs_qwen_vl_utils
@needs_bf16
@pytest.mark.parametrize("compiled", [False, True])
def test_moe_bf16_graphs_agree_with_the_bf16_eager_loop(moe_ckpt, images, compiled):
    """bfloat16 on a GPU of compute capability 9.x or 10.x: the grouped experts take their offsets on the device, so
    the MoE step is captured (and compiled) as a dense one is."""
    from vlmfast.checkpoints.load import load

    if torch.cuda.get_device_capability()[0] not in (9, 10):
        pytest.skip("torch's grouped kernel takes its offsets on the device at compute capability 9.x and 10.x only")
    torch._dynamo.reset()
    loaded = load(str(moe_ckpt), device="cuda", dtype="bfloat16", attn="sdpa")
    settings = GenerationSettings(max_new_tokens=BF16_TOKENS, ignore_eos=True)
    eager, _ = _run(Engine(loaded, settings, cuda_graphs=False), images)
    graphs = _eager_vision(Engine(loaded, settings, compile=compiled))
    replayed, _ = _run(graphs, images)
    torch._dynamo.reset()
    assert graphs.cuda_graphs and all(loop.graph is not None for loop in graphs._static.values()), graphs.notes
    assert graphs.policy.enabled == compiled, graphs.notes + graphs.policy.notes
    from vlmfast.engines.hf.moe import _available

    # transformers 5.x: the captured step ran the searchsorted copy, not transformers' forward after a silent
    # fallback (same_as_transformers returns False on any exception it meets on this GPU)
    assert graphs._text.experts or not _available(), "the searchsorted experts were not used on this GPU"
    prefixes = [_common_prefix(replayed[k], eager[k]) for k in eager]
    assert all(p >= 1 for p in prefixes), prefixes
    assert sum(prefixes) / len(prefixes) >= BF16_MIN_MEAN_PREFIX, prefixes
