"""Seeded sampling: a draw is the exponential race on noise keyed by (seed, request id, sample, step), so
an answer depends only on those — not on batch size, neighbours, spare rows of a static shape, resume
order, how many samples were asked for, or which checkpoint the engine held before. One test per factor."""

import dataclasses
import json

import pytest
import torch

from conftest import read_jsonl
from vlmfast.engines.hf.engine import Engine
from vlmfast.engines.hf.sampling import select, token_hashes, uniform_noise
from vlmfast.engines.rows import draw_key
from vlmfast.engines.hf.scheduler import Scheduler
from vlmfast.engines.rows import GenerationSettings
from vlmfast.inputs.requests import Request

SAMPLED = dict(max_new_tokens=10, temperature=1.0, top_p=0.95, ignore_eos=True)


def _requests(images, prompt="What shapes are in this image?"):
    return [Request(f"r{i}", (str(p),), prompt) for i, p in enumerate(images)]


def _answers(engine, requests, batch_size):
    return {(r.id, r.sample): tuple(r.token_ids) for _, rows, _ in Scheduler(engine).run(requests, {}, batch_size)
            for r in rows}


# -- the draw itself -------------------------------------------------------------------------------
def test_the_race_picks_each_token_with_its_probability():
    """20,000 keyed draws from one distribution: every token's frequency is within 1.5 points of its
    probability (deterministic: the keys are fixed, so this cannot flake)."""
    probs = torch.tensor([0.5, 0.25, 0.15, 0.07, 0.03])
    rows = 20_000
    keys = torch.tensor([draw_key(0, f"q{i}", 0) for i in range(rows)])
    chosen = select(probs.log().expand(rows, -1), torch.zeros(5), temperature=1.0, top_p=1.0, keys=keys, step=3)
    freq = torch.bincount(chosen, minlength=5).float() / rows
    assert torch.allclose(freq, probs, atol=0.015), freq


def test_noise_is_uniform_and_differs_by_key_step_and_token():
    hashed = token_hashes(4096, "cpu")
    keys = torch.tensor([draw_key(1, "a", 0), draw_key(1, "a", 1), draw_key(2, "a", 0), draw_key(1, "b", 0)])
    u = uniform_noise(keys, torch.tensor([5]), hashed)
    assert u.shape == (4, 4096) and float(u.min()) > 0 and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 0.01
    assert all(not torch.equal(u[i], u[j]) for i in range(4) for j in range(i + 1, 4))  # key: seed, id, sample
    assert not torch.equal(u, uniform_noise(keys, torch.tensor([6]), hashed))  # step
    assert torch.equal(u, uniform_noise(keys, 5, hashed))  # a Python step equals a device step
    assert len(set(u[0].tolist())) > 4000  # token ids get their own noise


def test_greedy_ignores_keys():
    logits = torch.tensor([[0.1, 3.0, 0.2], [2.0, 0.0, 0.1]])
    assert select(logits, torch.zeros(3), temperature=0, top_p=1.0).tolist() == [1, 0]


# -- the engine: one factor per test --------------------------------------------------------------
@pytest.fixture(scope="module")
def reqs(images):
    return _requests(images[:4])


def test_a_seed_gives_the_same_answers_and_another_seed_others(loaded, reqs):
    first = _answers(Engine(loaded, GenerationSettings(**SAMPLED, seed=3)), reqs, 4)
    assert first == _answers(Engine(loaded, GenerationSettings(**SAMPLED, seed=3)), reqs, 4)
    assert first != _answers(Engine(loaded, GenerationSettings(**SAMPLED, seed=4)), reqs, 4)


def test_batch_size_and_neighbours_do_not_change_an_answer(loaded, reqs):
    settings = GenerationSettings(**SAMPLED, seed=3)
    together = _answers(Engine(loaded, settings), reqs, 4)
    alone = {}
    for r in reqs:
        alone.update(_answers(Engine(loaded, settings), [r], 1))
    assert alone == together
    reordered = _answers(Engine(loaded, settings), list(reversed(reqs)), 2)
    assert reordered == together


def test_a_static_shape_with_spare_rows_draws_as_the_eager_loop(loaded, reqs):
    """The static path (fixed shapes, as CUDA graphs and compile run it; here uncompiled) pads a batch of 3
    to its shape; the spare rows draw nothing that a real row sees."""
    settings = GenerationSettings(**SAMPLED, seed=3)
    eager = _answers(Engine(loaded, settings), reqs[:3], 3)
    static = Engine(loaded, settings, compile=True, compiler=lambda fn: fn)
    assert _answers(static, reqs[:3], 3) == eager
    assert static._static and all(state.static for state in static._static.values())


def test_sample_k_is_the_same_answer_whatever_n(loaded, reqs):
    two = _answers(Engine(loaded, GenerationSettings(**SAMPLED, seed=3, n=2)), reqs[:2], 2)
    four = _answers(Engine(loaded, GenerationSettings(**SAMPLED, seed=3, n=4)), reqs[:2], 2)
    assert two == {key: tokens for key, tokens in four.items() if key[1] < 2}
    assert four[("r0", 0)] != four[("r0", 1)]  # samples of one request draw apart


def test_a_resumed_run_draws_what_an_uninterrupted_one_drew(grpo_ckpt, images, tmp_path):
    """infer killed after its first batch and rerun: the rows written after the resume equal the rows of a
    run that was never stopped."""
    from vlmfast.run.options import InferOptions
    from vlmfast.run.runner import infer

    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"id": f"q{i}", "image": str(p), "prompt": "Describe."}) + "\n"
                                for i, p in enumerate(images[:4])))
    generation = GenerationSettings(**SAMPLED, seed=11)
    whole, part = tmp_path / "whole.jsonl", tmp_path / "part.jsonl"
    options = InferOptions(ckpt=str(grpo_ckpt), manifest=str(manifest), generation=generation, device="cpu",
                           batch_size=2)
    infer(dataclasses.replace(options, out=str(whole)))
    part.write_text("".join(json.dumps(r) + "\n" for r in read_jsonl(whole)[:2]))  # as if killed after batch 1
    (tmp_path / "part.run.json").write_bytes((tmp_path / "whole.run.json").read_bytes())  # written before any row
    infer(dataclasses.replace(options, out=str(part)))
    assert [r["text"] for r in read_jsonl(part)] == [r["text"] for r in read_jsonl(whole)]
    assert len({r["text"] for r in read_jsonl(whole)}) > 1


def test_a_swapped_checkpoint_decodes_with_its_own_repetition_penalty(images, tmp_path):
    """Weights swapped in place: the next checkpoint's generation config brings its repetition penalty (a
    sweep kept the first checkpoint's), so each step's rows equal a fresh infer of that checkpoint."""
    from vlmfast.checkpoints.tiny import build_checkpoint
    from vlmfast.run.options import InferOptions
    from vlmfast.run.runner import infer
    from vlmfast.run.sweep import SweepOptions, sweep

    for step in (100, 200):  # the same weights; step 200's generation config adds a penalty
        build_checkpoint(tmp_path / "run" / f"checkpoint-{step}", preset="tiny", like="grpo", seed=1)
    config = tmp_path / "run" / "checkpoint-200" / "generation_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "repetition_penalty": 1.8}))
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"id": f"q{i}", "image": str(p), "prompt": "Describe.", "solution": "x"})
                                + "\n" for i, p in enumerate(images[:3])))
    options = InferOptions(ckpt=str(tmp_path / "run"), manifest=str(manifest), device="cpu",
                           generation=GenerationSettings(max_new_tokens=24))
    report = sweep(SweepOptions(run_dir=str(tmp_path / "run"), out_dir=str(tmp_path / "sweep"), infer=options))
    assert "swap_s" in report["checkpoints"][1]  # swapped in, not loaded afresh
    swept = {step: [r["text"] for r in read_jsonl(tmp_path / "sweep" / f"step-{step}.jsonl")] for step in (100, 200)}
    fresh = tmp_path / "fresh-200.jsonl"
    infer(dataclasses.replace(options, ckpt=str(tmp_path / "run" / "checkpoint-200"), out=str(fresh)))
    assert swept[200] == [r["text"] for r in read_jsonl(fresh)]
    assert swept[200] != swept[100]  # the penalty changed the answers: the test can tell
    record = json.loads((tmp_path / "sweep" / "step-200.run.json").read_text())
    assert record["runtime"]["repetition_penalty"] == 1.8


def test_a_swapped_checkpoint_draws_what_a_fresh_load_of_it_draws(images, tmp_path):
    """A sweep swaps weights into one engine: its sampled rows of each checkpoint equal a fresh infer of
    that checkpoint with the same seed, and a sweep of that step alone (--steps)."""
    from vlmfast.checkpoints.tiny import build_checkpoint
    from vlmfast.run.options import InferOptions
    from vlmfast.run.runner import infer
    from vlmfast.run.sweep import SweepOptions, sweep

    for step, seed in ((100, 1), (200, 2)):
        build_checkpoint(tmp_path / "run" / f"checkpoint-{step}", preset="tiny", like="grpo", seed=seed)
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"id": f"q{i}", "image": str(p), "prompt": "Describe.", "solution": "x"})
                                + "\n" for i, p in enumerate(images[:3])))
    options = InferOptions(ckpt=str(tmp_path / "run"), manifest=str(manifest), device="cpu",
                           generation=GenerationSettings(**SAMPLED, seed=5))
    report = sweep(SweepOptions(run_dir=str(tmp_path / "run"), out_dir=str(tmp_path / "sweep"), infer=options))
    assert "swap_s" in report["checkpoints"][1]  # the second checkpoint was swapped in, not loaded afresh
    fresh = tmp_path / "fresh-200.jsonl"
    infer(dataclasses.replace(options, ckpt=str(tmp_path / "run" / "checkpoint-200"), out=str(fresh)))
    swept = [r["text"] for r in read_jsonl(tmp_path / "sweep" / "step-200.jsonl")]
    assert swept == [r["text"] for r in read_jsonl(fresh)]
    # --steps 200 alone: the same answers as step 200 of the whole sweep
    sweep(SweepOptions(run_dir=str(tmp_path / "run"), out_dir=str(tmp_path / "alone"), infer=options, steps=(200,)))
    assert [r["text"] for r in read_jsonl(tmp_path / "alone" / "step-200.jsonl")] == swept
