"""A third engine needs no edit outside its own module: a test double that implements the
:class:`vlmfast.engines.contract.Backend` protocol, registered in ``ENGINES``, runs ``infer``, ``sweep`` and
``bench`` end to end through the command line."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from conftest import FakeBackend, cli, read_jsonl
from vlmfast.engines.contract import Switched
from vlmfast.engines.open import ENGINES, EngineEntry


class ThirdEngine(FakeBackend):
    """Answers the step number of the checkpoint it was opened on (``checkpoint-200`` → "200"; "0" for
    another directory); cannot move to another checkpoint, so a sweep opens it once per checkpoint."""

    opened: list[str] = []

    def __init__(self, options, found):
        step = found.path.name.rsplit("-", 1)[-1] if found.path.name.startswith("checkpoint-") else "0"
        super().__init__(answers={}, tokens=3)
        self.answers = _Always(step)
        self.found, self.options = found, options
        ThirdEngine.opened.append(found.path.name)

    def switch_to(self, found, canary=None) -> Switched:
        return Switched.impossible("the third engine opens once per checkpoint")

    def news(self):
        return {"third_checked": 1}, []

    def facts(self):
        return dataclasses.replace(super().facts(), engine="third", checkpoint=str(self.found.path), decoder="third")


class _Always(dict):
    def __init__(self, answer):
        super().__init__()
        self.answer = answer

    def get(self, key, default=None):
        return self.answer


@pytest.fixture
def third(monkeypatch):
    """``--engine third``: the double, refusing ``--decoder`` as vLLM does."""
    ThirdEngine.opened = []
    monkeypatch.setitem(ENGINES, "third", EngineEntry(
        lambda options, found, loaded, dist: ThirdEngine(options, found), refuses=("decoder",),
        refusal="{flags} {verb} to vlmfast's own engine, not to --engine third", hint="drop it"))
    return ThirdEngine


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, grpo_ckpt, images):
    """Two checkpoints (copies of the tiny GRPO checkpoint) and a manifest whose every truth is "200"."""
    root = tmp_path_factory.mktemp("third")
    for step in (100, 200):
        shutil.copytree(grpo_ckpt, root / "run" / f"checkpoint-{step}")
    manifest = root / "m.jsonl"
    manifest.write_text("".join(json.dumps({"id": f"q{i}", "image": str(p), "prompt": "Count.", "solution": "200",
                                            "scorer": "exact"}) + "\n" for i, p in enumerate(images[:3])))
    return root


def test_infer_runs_the_third_engine_and_refuses_what_it_does_not_take(third, run_dir, tmp_path):
    out = tmp_path / "r.jsonl"
    r = cli("infer", "--engine", "third", "--ckpt", run_dir / "run" / "checkpoint-200",
            "--manifest", run_dir / "m.jsonl", "--out", out, "--json")
    assert r.returncode == 0, r.stderr
    assert [row["answer"] for row in read_jsonl(out)] == ["200"] * 3
    report = json.loads(r.stdout)
    assert report["engine"] == "third" and report["scores"]["accuracy"] == 1.0
    r = cli("infer", "--engine", "third", "--ckpt", run_dir / "run" / "checkpoint-200", "--images", "x.png",
            "--prompt", "p", "--decoder", "hf")
    assert r.returncode == 2 and "--decoder applies to vlmfast's own engine, not to --engine third" in r.stderr


def test_a_sweep_opens_an_engine_that_cannot_switch_once_per_checkpoint(third, run_dir, tmp_path):
    r = cli("sweep", run_dir / "run", "--engine", "third", "--manifest", run_dir / "m.jsonl",
            "--out-dir", tmp_path / "sweep", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert third.opened == ["checkpoint-100", "checkpoint-200"]
    by_step = {c["step"]: c for c in report["checkpoints"]}
    assert by_step[100]["accuracy"] == 0.0 and by_step[200]["accuracy"] == 1.0
    assert report["best"]["step"] == 200
    assert by_step[200]["third_checked"] == 1  # the engine's own news reach the figures
    assert "the third engine opens once per checkpoint" in r.stderr


def test_bench_opens_the_third_engine_through_the_registry(third, run_dir, tmp_path):
    r = cli("bench", "--ckpt", run_dir / "run" / "checkpoint-200", "--manifest", run_dir / "m.jsonl",
            "--engines", "hf,third", "--no-as-saved", "--batch-sizes", "2", "--warmup", "0", "--repeats", "1",
            "--max-new-tokens", "3", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    names = [s["name"] for s in report["scenarios"]]
    assert names == ["ckpt", "ckpt-third"] and third.opened == ["checkpoint-200"]
    third_run = report["scenarios"][1]
    assert third_run["accuracy"] == 1.0 and third_run["tokens_per_s"] > 0
    assert "hf_vs_third" in report["fidelity"]


class OwnProcessEngine(ThirdEngine):
    """The double, with its model in processes of its own (as vLLM's engine is by default)."""

    def facts(self):
        return dataclasses.replace(super().facts(), peak_mem_kind="this process only (the engine's processes not counted)")


def test_bench_shows_no_peak_memory_for_an_engine_whose_model_runs_in_its_own_processes(third, monkeypatch, run_dir):
    monkeypatch.setitem(ENGINES, "third", dataclasses.replace(
        ENGINES["third"], opener=lambda options, found, loaded, dist: OwnProcessEngine(options, found)))
    r = cli("bench", "--ckpt", run_dir / "run" / "checkpoint-200", "--manifest", run_dir / "m.jsonl",
            "--engines", "hf,third", "--no-as-saved", "--batch-sizes", "2", "--warmup", "0", "--repeats", "1",
            "--max-new-tokens", "3", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    hf_run, third_run = report["scenarios"]
    assert hf_run["peak_mem_mib"] > 0  # this process holds the HF engine's model
    assert third_run["peak_mem_mib"] is None  # this process's RSS would pass for the engine's memory
    assert third_run["peak_mem_kind"] == "this process only (the engine's processes not counted)"
    assert any(n.startswith("ckpt-third (batch 2): peak memory not shown") for n in report["notes"])
