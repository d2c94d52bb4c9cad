"""Compilation paid once per machine: the cache key, a cache hit in a second process, the decision."""

import copy
import json
import os

import pytest

from conftest import cli, read_jsonl, vlmfast
from vlmfast.engines.hf.compile_policy import CompileCache, decide


def test_the_key_changes_with_config_dtype_shape_and_versions(loaded, tmp_path):
    versions = {"torch": "2.14.1", "transformers": "5.23.0", "vlmfast": "0.2.0"}
    cache = CompileCache(versions, root=tmp_path)
    key = cache.key(loaded.model, "float32", 8, 512, "cpu")
    assert key == CompileCache(dict(versions), root=tmp_path / "elsewhere").key(loaded.model, "float32", 8, 512, "cpu")
    assert key != cache.key(loaded.model, "bfloat16", 8, 512, "cpu")
    assert key != cache.key(loaded.model, "float32", 16, 512, "cpu")
    assert key != cache.key(loaded.model, "float32", 8, 768, "cpu")
    assert key != CompileCache({**versions, "torch": "2.15.0"}, root=tmp_path).key(loaded.model, "float32", 8, 512, "cpu")
    other = copy.deepcopy(loaded.model.config)
    other.get_text_config().num_hidden_layers += 1

    class Model:
        config = other
    assert key != cache.key(Model, "float32", 8, 512, "cpu")


def test_compiling_pays_only_for_enough_steps():
    small = decide({}, device="cpu", step_ms=5.0, remaining_steps=100)
    assert not small.compile and "first compile on this machine" in small.reason
    measured = {"compile_s_warm": 2.0, "eager_step_ms": 10.0, "compiled_step_ms": 5.0}
    big = decide(measured, device="cuda", step_ms=10.0, remaining_steps=1000)  # 1000 × 10 ms × 50% = 5 s > 2 s
    assert big.compile and "measured" in big.reason and "5.0 s > 2.0 s" in big.reason
    assert not decide(measured, device="cuda", step_ms=10.0, remaining_steps=300).compile  # 1.5 s <= 2 s


def test_on_cuda_the_vision_tower_still_to_run_counts_for_compiling():
    """Short answers over many images: the decode steps alone do not repay a compile, the vision blocks'
    saving with them does (CUDA compiles both); a CPU keeps its tower eager and counts none of it."""
    measured = {"compile_s_warm": 2.0, "eager_step_ms": 10.0, "compiled_step_ms": 5.0}
    steps_only = decide(measured, device="cuda", step_ms=10.0, remaining_steps=300)  # 1.5 s <= 2 s
    with_tower = decide(measured, device="cuda", step_ms=10.0, remaining_steps=300, vision_s=30.0)
    assert not steps_only.compile and with_tower.compile  # 1.5 + 30 × 50% = 16.5 s > 2 + 10 s
    assert "+ 30.0 s of vision tower × 50% (estimate) = 16.5 s > 12.0 s" in with_tower.reason
    assert "the vision blocks 10 s" in with_tower.reason
    assert not decide(measured, device="cuda", step_ms=10.0, remaining_steps=300, vision_s=15.0).compile  # 9 <= 12
    on_cpu = decide(measured, device="cpu", step_ms=10.0, remaining_steps=300, vision_s=30.0)
    assert not on_cpu.compile and "vision" not in on_cpu.reason


@pytest.mark.torch_mechanism  # ~2 min of cold compile in a subprocess; compiling is tested under 4.57 below (one or two new tokens), and by test_step_kernels
def test_a_second_run_compiles_from_the_cache_and_tokens_do_not_change(grpo_ckpt, images, tmp_path):
    env = {"VLMFAST_CACHE": str(tmp_path / "cache")}
    common = ["infer", "--ckpt", grpo_ckpt, "--images", images[0], images[1], "--prompt", "Count.", "--max-new-tokens", 6,
              "--batch-size", 2, "--compile", "--json"]
    os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)  # each process must find its cache through VLMFAST_CACHE
    first = vlmfast(*common, "--out", tmp_path / "a.jsonl", env=env)
    second = vlmfast(*common, "--out", tmp_path / "b.jsonl", env=env)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    a, b = json.loads(first.stdout), json.loads(second.stdout)
    assert a["compiled"] and a["compile_s"] > 0 and a["compile_cache"]["dir"].startswith(str(tmp_path / "cache"))
    assert [c["cache"] for c in a["compile_cache"]["compiles"]] == ["miss"]
    assert [c["cache"] for c in b["compile_cache"]["compiles"]] == ["hit"]
    stats = json.loads((tmp_path / "cache" / "compile-stats.json").read_text())
    assert {"compile_s_cold", "compile_s_warm", "compiled_step_ms"} <= set(next(iter(stats.values())))
    eager = cli("infer", "--ckpt", grpo_ckpt, "--images", images[0], images[1], "--prompt", "Count.",
                "--max-new-tokens", 6, "--batch-size", 2, "--no-compile", "--device", "cpu", "--out", tmp_path / "e.jsonl")
    assert eager.returncode == 0, eager.stderr
    tokens = [[r["text"] for r in read_jsonl(tmp_path / f)] for f in ("a.jsonl", "b.jsonl", "e.jsonl")]
    assert tokens[0] == tokens[1] == tokens[2]


def test_a_failing_compile_falls_back_to_the_uncompiled_step(loaded, images, monkeypatch):
    import torch

    from vlmfast.engines.hf.engine import Engine, GenerationSettings
    from vlmfast.inputs.requests import Request
    from vlmfast.engines.hf.scheduler import Scheduler

    def broken(fn, **kwargs):
        def compiled(*args):
            raise RuntimeError("InductorError: no working C++ compiler found")
        return compiled

    monkeypatch.setattr(torch, "compile", broken)
    reqs = [Request(str(p), (str(p),), "Count.") for p in images[:2]]
    settings = GenerationSettings(max_new_tokens=6)
    engine = Engine(loaded, settings, compile=True)
    got = {r.id: r.token_ids for _, rs, _ in Scheduler(engine).run(reqs, {}, 2) for r in rs}
    eager = {r.id: r.token_ids for _, rs, _ in Scheduler(Engine(loaded, settings)).run(reqs, {}, 2) for r in rs}
    assert got == eager and engine.policy.enabled is False
    assert engine.policy.notes == ["torch.compile failed (RuntimeError: InductorError: no working C++ compiler found); decoding uncompiled"]


def test_an_uncompiled_run_records_its_step_time_for_the_next_decision(loaded, images, tmp_path):
    from vlmfast.engines.hf.engine import Engine, GenerationSettings
    from vlmfast.inputs.requests import Request
    from vlmfast.engines.hf.scheduler import Scheduler
    from vlmfast.timing import versions

    cache = CompileCache(versions(), root=tmp_path)
    engine = Engine(loaded, GenerationSettings(max_new_tokens=6, ignore_eos=True), compile_cache=cache)
    list(Scheduler(engine).run([Request(str(p), (str(p),), "Count.") for p in images[:2]], {}, 2))
    cache.flush()
    stats = cache.stats(engine.shape_key(engine.last_shape))
    assert set(stats) == {"eager_step_ms"} and stats["eager_step_ms"] > 0


@pytest.mark.parametrize("max_new", ["1", "2"])
def test_compile_with_one_or_two_new_tokens_runs_to_the_end(grpo_ckpt, images, tmp_path, max_new):
    """`--compile --max-new-tokens 1` crashed in the static warm-up (a write past the output buffer)."""
    out = tmp_path / "r.jsonl"
    r = cli("infer", "--ckpt", grpo_ckpt, "--images", images[0].parent, "--prompt", "Describe.", "--device", "cpu",
            "--max-new-tokens", max_new, "--ignore-eos", "--compile", "--out", out)
    rows = read_jsonl(out)
    assert r.returncode == 0 and rows and all(row["error"] is None and row["n_new_tokens"] == int(max_new) for row in rows)


def test_each_decode_shape_to_come_is_a_compile_of_its_own():
    """Compiling is judged against one compile per (batch, length) shape the rest of the run will build."""
    measured = {"compile_s_warm": 2.0, "eager_step_ms": 10.0, "compiled_step_ms": 5.0}
    assert decide([measured], device="cuda", step_ms=10.0, remaining_steps=1000).compile  # 5 s > 2 s
    three = decide([measured, measured, {}], device="cuda", step_ms=10.0, remaining_steps=1000)
    from vlmfast.engines.hf.compile_policy import DEFAULT_COLD_COMPILE_S

    cost = 2 + 2 + DEFAULT_COLD_COMPILE_S["cuda"]  # the unmeasured shape costs a cold compile's default
    assert not three.compile  # 5 s <= cost
    assert f"{cost:.1f} s to compile (3 decode shapes, each compiled anew)" in three.reason


def test_planned_shapes_name_every_batch_size_and_length_bucket(loaded, images):
    from vlmfast.engines.hf.engine import Engine, GenerationSettings
    from vlmfast.inputs.requests import Request

    reqs = [Request(str(p), (str(p),), "Count.") for p in images[:5]]
    engine = Engine(loaded, GenerationSettings(max_new_tokens=6))
    shapes = engine.planned_shapes(reqs, {}, [[0, 1], [2, 3], [4]])
    assert [rows for rows, _ in shapes] == [2, 2, 1]  # a CPU runs each batch at its own row count
    assert all(length % 256 == 0 for _, length in shapes)
    engine.settings = GenerationSettings(max_new_tokens=6, n=3)
    assert [rows for rows, _ in engine.planned_shapes(reqs, {}, [[0, 1], [4]])] == [6, 3]  # n rows per request


def test_past_the_recompile_limit_later_shapes_decode_uncompiled_and_it_is_said(loaded, images, monkeypatch):
    """dynamo past its recompile limit would run the step uncompiled while the policy said compiled; it is told
    to fail instead, and the policy turns compiling off for the shapes still to come (tokens unchanged)."""
    import torch

    from vlmfast.engines.hf import compile_policy
    from vlmfast.engines.hf.engine import Engine, GenerationSettings
    from vlmfast.engines.hf.scheduler import Scheduler
    from vlmfast.inputs.requests import Request

    torch._dynamo.reset()
    monkeypatch.setattr(compile_policy, "RECOMPILE_LIMIT", 1)
    reqs = [Request(str(p), (str(p),), "Count.") for p in images[:3]]
    settings = GenerationSettings(max_new_tokens=4)
    engine = Engine(loaded, settings, compile=True,
                    compiler=lambda fn: torch.compile(fn, backend="eager", dynamic=False))
    # dynamo's own patch: monkeypatch's undo of a config entry hides it from later compiles in the session
    with torch._dynamo.config.patch(recompile_limit=1, fail_on_recompile_limit_hit=False):
        got = {r.id: r.token_ids for _, rs, _ in Scheduler(engine).run(reqs, {}, 2) for r in rs}  # 2 rows, then 1
    torch._dynamo.reset()
    eager = {r.id: r.token_ids for _, rs, _ in Scheduler(Engine(loaded, settings)).run(reqs, {}, 2) for r in rs}
    assert got == eager and engine.policy.enabled is False
    assert engine.policy.notes == ["more decode shapes than torch.compile's recompile limit (1): the shapes built "
                                   "so far stay compiled, later ones decode uncompiled"]


def test_compiling_on_a_cpu_does_not_log_the_cuda_home_warning(tmp_path, monkeypatch, caplog):
    import logging

    from torch.utils import cpp_extension

    from vlmfast.engines.hf.compile_policy import CompilePolicy

    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    CompilePolicy(True, device="cpu", compiler=lambda fn: fn).forward()
    caplog.clear()  # the first import of cpp_extension (this test's, when no earlier one) logs it before any filter
    with caplog.at_level(logging.WARNING, logger="torch.utils.cpp_extension"):
        assert cpp_extension._find_cuda_home() == str(tmp_path)
    assert not [r for r in caplog.records if "No CUDA runtime" in r.getMessage()]
