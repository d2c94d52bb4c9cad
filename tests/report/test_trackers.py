"""A sweep's figures in TensorBoard (read back with TensorBoard's own reader) and W&B (offline run files),
and a missing package said before anything runs."""

import sys

import pytest

from vlmfast.errors import UsageError
from vlmfast.report.trackers import log_to_tensorboard, log_to_wandb, scalars

REPORT = {"run_dir": "runs/grpo", "checkpoints": [
    {"step": 0, "label": "base", "path": "b", "results": "r0", "accuracy": 0.25, "truncation_rate": 0.0,
     "samples": {"pass_at_k": {"1": 0.25, "4": 0.5}}, "vs_base": None, "errors": 0},
    {"step": 200, "label": "hf-trainer", "path": "c", "results": "r1", "accuracy": 0.5, "truncation_rate": 0.1,
     "samples": {"pass_at_k": {"1": 0.5, "4": 0.75}}, "vs_base": {"difference": 0.25, "p_value": 0.03}, "errors": 1,
     "compiled": True},
]}


def test_scalars_flatten_numbers_and_leave_out_the_rest():
    got = scalars(REPORT["checkpoints"][1])
    assert got == {"eval/vlmfast/accuracy": 0.5, "eval/vlmfast/truncation_rate": 0.1, "eval/vlmfast/samples/pass_at_k/1": 0.5,
                   "eval/vlmfast/samples/pass_at_k/4": 0.75, "eval/vlmfast/vs_base/difference": 0.25,
                   "eval/vlmfast/vs_base/p_value": 0.03, "eval/vlmfast/errors": 1.0}


def test_tensorboard_holds_each_figure_at_each_step(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (tmp_path / "trainer.txt").write_text("the trainer's own files stay")
    where = log_to_tensorboard(REPORT, tmp_path)
    events = EventAccumulator(str(where))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert "eval/vlmfast/accuracy" in tags and "eval/vlmfast/samples/pass_at_k/4" in tags
    assert [(e.step, e.value) for e in events.Scalars("eval/vlmfast/accuracy")] == [(0, 0.25), (200, 0.5)]
    assert [(e.step, round(e.value, 6)) for e in events.Scalars("eval/vlmfast/vs_base/difference")] == [(200, 0.25)]
    assert (tmp_path / "trainer.txt").read_text() == "the trainer's own files stay"


def test_wandb_offline_writes_a_run_with_the_figures(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    log_to_wandb(REPORT, "vlmfast-tests")
    files = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1
    data = files[0].read_bytes()
    assert b"eval/vlmfast/accuracy" in data and b"global_step" in data


@pytest.mark.parametrize("option", ["tensorboard", "wandb"])
def test_a_missing_package_is_said_before_the_sweep_starts(option, monkeypatch, tmp_path):
    from vlmfast.run.options import InferOptions
    from vlmfast.run.sweep import SweepOptions

    monkeypatch.setitem(sys.modules, option, None)
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None if name == option else object())
    with pytest.raises(UsageError) as err:
        SweepOptions(run_dir="runs", out_dir=str(tmp_path), infer=InferOptions(ckpt="runs", manifest="m.jsonl"),
                     **{option: "x"})
    assert f"pip install 'vlmfast[{option}]'" == err.value.hint
