"""``sweep --engine vllm``: one vLLM engine for the run, each next checkpoint's weights reloaded in place
(with its own generation config), checked by a canary against a fresh engine; another shape gets a fresh
engine; a reload whose weights never reach the engine is caught; a killed sweep resumes. Runs where vLLM
imports (.venv-vllm).

This module starts vLLM a dozen times. Where one engine runs at a time and nothing under test crosses to
vLLM's worker process, its engine runs inside this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): a start
takes ~16 s on 2 CPU cores instead of ~40 s, when its engine core and worker each start a process that
imports torch and vLLM again. It runs last among the vLLM tests because such an engine leaves this
process changed (vLLM binds its threads and replaces ``torch.set_num_threads``), and it holds one engine
only. The reload and the canary (two engines at once; a reload and weight digests sent to the worker)
run as users run them, in vLLM's own processes (``vllm_processes``)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from vlmfast.engines.rows import GenerationSettings  # noqa: E402
from vlmfast.run.options import InferOptions  # noqa: E402
from vlmfast.run.sweep import SweepOptions, sweep  # noqa: E402

MAX_NEW = 16
PROMPT = "Describe the image."
IN_PROCESS = "VLLM_ENABLE_V1_MULTIPROCESSING"


def _executor(processes: bool) -> None:
    """The next vLLM engine's engine core and worker: in processes of their own, or in this one. vLLM
    caches its environment once an engine ran in this process: the cache is dropped so it reads this."""
    import vllm.envs as envs

    os.environ[IN_PROCESS] = "1" if processes else "0"
    envs.disable_envs_cache()


@pytest.fixture(scope="module", autouse=True)
def in_process():
    before = os.environ.get(IN_PROCESS)
    _executor(False)
    yield
    _executor(True)
    if before is None:
        del os.environ[IN_PROCESS]
    else:
        os.environ[IN_PROCESS] = before


@pytest.fixture
def vllm_processes(in_process):
    """This test's engines in vLLM's own processes, as users run them."""
    _executor(True)
    yield
    _executor(False)


PENALTY = 1.8


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A training run of three same-shape checkpoints (the demo preset): two seeds, then the second one's
    weights again with a generation config that adds a repetition penalty."""
    from vlmfast.checkpoints.tiny import build_checkpoint

    root = tmp_path_factory.mktemp("vllm-run") / "run"
    for step, seed in ((100, 0), (200, 1)):
        build_checkpoint(root / f"checkpoint-{step}", preset="demo", like="grpo", seed=seed)
    shutil.copytree(root / "checkpoint-200", root / "checkpoint-300")
    config = root / "checkpoint-300" / "generation_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "repetition_penalty": PENALTY}))
    return root


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> list[str]:
    from vlmfast.checkpoints.tiny import make_images

    return [str(p) for p in make_images(tmp_path_factory.mktemp("vllm-sweep-images"), n=4)]


def _infer_options(ckpt, images, out=None, **kwargs) -> InferOptions:
    return InferOptions(ckpt=str(ckpt), images=images, prompt=PROMPT, engine="vllm", out=None if out is None else str(out),
                        generation=GenerationSettings(max_new_tokens=MAX_NEW), **kwargs)


def _tokens(path: Path) -> dict:
    return {row["id"]: (row["text"], row["n_new_tokens"]) for row in map(json.loads, path.read_text().splitlines())}


@pytest.fixture(scope="module")
def fresh(run, images, tmp_path_factory) -> dict[int, dict]:
    """Each later checkpoint's greedy rows from a fresh `infer --engine vllm` of it."""
    from vlmfast.run.runner import infer

    out = tmp_path_factory.mktemp("vllm-fresh")
    rows = {}
    for step in (200, 300):
        infer(_infer_options(run / f"checkpoint-{step}", images, out / f"{step}.jsonl"))
        rows[step] = _tokens(out / f"{step}.jsonl")
    return rows


def _sweep(run_dir, out_dir, images, **kwargs) -> dict:
    return sweep(SweepOptions(run_dir=str(run_dir), out_dir=str(out_dir), infer=_infer_options(run_dir, images), **kwargs))


def test_one_engine_reloads_each_checkpoint_with_the_rows_of_a_fresh_engine(run, images, fresh, tmp_path,
                                                                            vllm_processes):
    """vLLM caches its default sampling parameters per engine: a checkpoint reloaded in place kept the first
    one's repetition penalty (and the canary, comparing with a fresh engine, cried wolf). Step 300 has step
    200's weights and a penalty: its rows differ from 200's, equal a fresh engine's, and the record says it.
    The rows carry the family's box space, as the HF engine's do."""
    report = _sweep(run, tmp_path, images)
    steps = {c["step"]: c for c in report["checkpoints"]}
    assert sorted(steps) == [100, 200, 300]
    assert "load_s" in steps[100] and "reload_s" in steps[200] and "reload_s" in steps[300]
    for step in (200, 300):
        assert _tokens(tmp_path / f"step-{step}.jsonl") == fresh[step]
    said = " ".join(report["notes"])
    assert "canary: 4 request(s) decoded the same" in said, said
    assert fresh[300] != fresh[200]  # the penalty changes these greedy answers
    assert json.loads((tmp_path / "step-300.run.json").read_text())["runtime"]["repetition_penalty"] == PENALTY
    rows = [json.loads(line) for line in (tmp_path / "step-100.jsonl").read_text().splitlines()]
    assert {r["bbox_space"] for r in rows} == {"resized"}


def test_a_reload_whose_weights_never_reach_the_engine_is_caught_by_the_canary(run, images, fresh, tmp_path,
                                                                                monkeypatch, vllm_processes):
    import vlmfast.engines.vllm.reload as reload

    def lost(llm, weights_dir):  # the caches are reset, the weights stay the old ones
        llm.reset_prefix_cache()

    monkeypatch.setattr(reload, "reload_weights", lost)
    report = _sweep(run, tmp_path, images, steps=(100, 200))
    said = " ".join(report["notes"])
    assert "decoded differently on the reloaded engine" in said, said
    assert _tokens(tmp_path / "step-200.jsonl") == fresh[200]  # the fresh engine took over the checkpoint


def _fewer_layers(src: Path, dst: Path) -> Path:
    """A loadable checkpoint of another shape: ``src`` without its last decoder layer."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    text = config.get("text_config", config)
    last = text["num_hidden_layers"] - 1
    for where in (text, config):
        if "num_hidden_layers" in where:
            where["num_hidden_layers"] = last
        if "layer_types" in where:
            where["layer_types"] = where["layer_types"][:last]
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    for f in dst.glob("*.safetensors"):
        tensors = {k: v for k, v in load_file(f).items() if f"layers.{last}." not in k or "visual" in k}
        save_file(tensors, f, metadata={"format": "pt"})
    return dst


def test_a_checkpoint_of_another_shape_gets_a_fresh_engine_and_says_why(run, images, tmp_path):
    other = tmp_path / "run"
    shutil.copytree(run / "checkpoint-100", other / "checkpoint-100")
    _fewer_layers(run / "checkpoint-200", other / "checkpoint-200")
    said = []
    report = sweep(SweepOptions(run_dir=str(other), out_dir=str(tmp_path / "out"), infer=_infer_options(other, images)),
                   say=said.append)
    steps = {c["step"]: c for c in report["checkpoints"]}
    assert "load_s" in steps[200] and steps[200]["rows"] == len(images)
    assert any("loaded afresh" in line and "differs" in line for line in said), said


def test_a_killed_vllm_sweep_resumes(run, images, tmp_path):
    class Kill:  # Ctrl-C once the second checkpoint's first chunk (2 of 4 requests) is written
        seen = 0

        def start(self, total_samples):
            pass

        def advance(self, samples, new_tokens):
            self.seen += samples
            if self.seen > len(images):
                raise KeyboardInterrupt

    options = SweepOptions(run_dir=str(run), out_dir=str(tmp_path), infer=_infer_options(run, images, batch_size=2),
                           steps=(100, 200), canary=0)  # one engine at a time: the canary has its own test
    stopped = sweep(options, progress=Kill())  # the finished checkpoint reported, the stop said by the exit code
    assert stopped["interrupted"] and stopped["exit_code"] == 130 and [c["step"] for c in stopped["checkpoints"]] == [100]
    assert len((tmp_path / "step-200.jsonl").read_text().splitlines()) == 2
    again = sweep(options)
    for step in (100, 200):
        ids = [json.loads(line)["id"] for line in (tmp_path / f"step-{step}.jsonl").read_text().splitlines()]
        assert sorted(ids) == sorted(set(ids)) and len(ids) == len(images)
    assert [c["step"] for c in again["checkpoints"]] == [100, 200]
