"""What only a CUDA machine can show: the runtime choice, CUDA-graph capture and replay, compiled
graphs, synchronized clocks and peak memory. Skipped (all of them) where torch sees no CUDA device."""

import importlib.util

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

from vlmfast.engine import Engine, GenerationSettings  # noqa: E402
from vlmfast.inputs import Request  # noqa: E402
from vlmfast.scheduler import Scheduler  # noqa: E402


@pytest.fixture(scope="module")
def on_gpu(grpo_ckpt):
    """float32 on the GPU: graphs, eager and generate must then agree token for token."""
    from vlmfast.checkpoint import load

    return load(str(grpo_ckpt), device="cuda", dtype="float32", attn="sdpa")


def _run(engine, images, batch_size=3):
    reqs = [Request(str(p), (str(p),), "What shapes are in this image?") for p in images]
    timings, results = [], {}
    for _, rs, t in Scheduler(engine).run(reqs, {}, batch_size):
        results.update({r.id: r.token_ids for r in rs})
        timings.append(t)
    return results, timings


def test_runtime_choice_on_this_gpu():
    from vlmfast.checkpoint import detect_runtime

    runtime = detect_runtime()
    assert runtime.device == "cuda"
    assert runtime.dtype == ("bfloat16" if torch.cuda.is_bf16_supported() else "float16")
    try:
        import flash_attn  # noqa: F401
        assert runtime.attn == "flash_attention_2"
    except ImportError:
        assert runtime.attn == "sdpa" and any("flash-attn is not installed" in n for n in runtime.notes)


def test_cuda_graphs_replay_the_eager_tokens(on_gpu, images):
    settings = GenerationSettings(max_new_tokens=20)
    eager, _ = _run(Engine(on_gpu, settings, cuda_graphs=False), images)
    graphs = Engine(on_gpu, settings)  # CUDA graphs by default on CUDA
    replayed, timings = _run(graphs, images)
    assert graphs.cuda_graphs and replayed == eager
    loops = list(graphs._static.values())
    assert loops and all(loop.graph is not None for loop in loops)  # captured, then replayed per token
    assert graphs.compile_s > 0  # capture time, kept out of the decode clock
    for t in timings:
        assert t.ttft_s > 0 and t.decode_s > 0 and t.syncs <= -(-t.steps // 8)  # read back every 8 steps


def test_graph_buckets_serve_smaller_batches(on_gpu, images):
    settings = GenerationSettings(max_new_tokens=12, ignore_eos=True)
    eager, _ = _run(Engine(on_gpu, settings, cuda_graphs=False), images, batch_size=5)
    graphs = Engine(on_gpu, settings)
    replayed, _ = _run(graphs, images, batch_size=5)  # batches of 5 and 1 → buckets 8 and 1
    assert replayed == eager
    assert sorted(shape[0] for shape in graphs._static) == [1, 8]


def test_compiled_graphs_give_the_same_tokens(on_gpu, images, tmp_path, monkeypatch):
    from vlmfast.compile_cache import CompileCache
    from vlmfast.timing import versions

    monkeypatch.setenv("VLMFAST_CACHE", str(tmp_path))
    settings = GenerationSettings(max_new_tokens=12)
    eager, _ = _run(Engine(on_gpu, settings, cuda_graphs=False), images[:2], batch_size=2)
    compiled = Engine(on_gpu, settings, compile=True, compile_cache=CompileCache(versions()))
    got, _ = _run(compiled, images[:2], batch_size=2)
    assert got == eager and compiled.compile_cache.events[0]["cache"] in ("miss", "hit", "partial")


def test_peak_memory_and_clocks_are_cuda_figures(grpo_ckpt, images, tmp_path):
    from vlmfast.runner import InferOptions, infer

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
