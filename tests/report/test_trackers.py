"""sweep --tensorboard / --wandb: each checkpoint's figures read back from TensorBoard's event files (with
TensorBoard's own reader) and from W&B's offline run file, at each checkpoint's step with exact values;
a missing package is said, with its pip command, before the sweep starts."""

import json
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import cli
from vlmfast.errors import UsageError
from vlmfast.evaluation.flags import CODES as FLAG_CODES
from vlmfast.report.trackers import (check_trackers, log_to_tensorboard, log_to_wandb, log_trackers,
                                     parse_wandb_target, scalars, with_flags)


def _checkpoint(step, accuracy, **extra):
    return {"step": step, "path": f"/run/checkpoint-{step}", "label": "base" if step == 0 else "hf", "rows": 4,
            "results": f"step-{step}.jsonl", "accuracy": accuracy, "ci_low": 0.25, "ci_high": None, "format_rate": 1.0,
            "tokens_per_s": 12.5, "errors": 0, **extra}


# steps out of order on purpose: the trackers sort them
REPORT = {
    "schema": "vlmfast.sweep/1", "run_dir": "/runs/grpo-7", "out_dir": "/s", "manifest": "/data/val.jsonl",
    "checkpoints": [
        _checkpoint(200, 0.75, samples={"pass_at_k": {"1": 0.5, "4": 0.875}, "all_same_rate": 0.25},
                    vs_base={"n": 4, "difference": 0.5, "p_value": 0.125, "significant": True}),
        _checkpoint(0, 0.25, vs_base=None),
        _checkpoint(100, 0.6667, vs_base={"n": 4, "difference": 0.4167, "p_value": float("nan"), "significant": False}),
    ],
    "best": {"step": 200, "label": "hf", "path": "/run/checkpoint-200", "accuracy": 0.75},
}
EXPECTED = {  # step → every figure sent, by name
    0: {"rows": 4, "accuracy": 0.25, "ci_low": 0.25, "format_rate": 1.0, "tokens_per_s": 12.5, "errors": 0},
    100: {"rows": 4, "accuracy": 0.6667, "ci_low": 0.25, "format_rate": 1.0, "tokens_per_s": 12.5, "errors": 0,
          "vs_base/n": 4, "vs_base/difference": 0.4167, "vs_base/significant": 0},
    200: {"rows": 4, "accuracy": 0.75, "ci_low": 0.25, "format_rate": 1.0, "tokens_per_s": 12.5, "errors": 0,
          "samples/pass_at_k/1": 0.5, "samples/pass_at_k/4": 0.875, "samples/all_same_rate": 0.25,
          "vs_base/n": 4, "vs_base/difference": 0.5, "vs_base/p_value": 0.125, "vs_base/significant": 1},
}


# what the trackers log: every figure, and each flag code of the sweep as 0/1 at every step (REPORT flags none)
LOGGED = {step: {**figures, **{f"flags/{code}": 0 for code in FLAG_CODES}} for step, figures in EXPECTED.items()}


def _figures(checkpoint: dict, report: dict | None = None) -> dict:
    """A checkpoint's figures by name, without the prefix (with ``report``: its flags too, as the trackers log them)."""
    shown = with_flags(checkpoint, report) if report is not None else checkpoint
    return {name.removeprefix("eval/vlmfast/"): value for name, value in scalars(shown).items()}


def test_every_numeric_figure_flattened_strings_none_and_nan_left_out_bools_as_0_1():
    for checkpoint in REPORT["checkpoints"]:
        assert scalars(checkpoint) == {f"eval/vlmfast/{k}": v for k, v in EXPECTED[checkpoint["step"]].items()}
    assert type(scalars(REPORT["checkpoints"][0])["eval/vlmfast/vs_base/significant"]) is int
    assert scalars(REPORT["checkpoints"][1], "eval/x") == {f"eval/x/{k}": v for k, v in EXPECTED[0].items()}


def _read_tensorboard(directory: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(directory))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def _by_tag(expected: dict, prefix="eval/vlmfast") -> dict[str, list[tuple[int, float]]]:
    """What TensorBoard holds: float32 values (its scalar summaries' type), in step order."""
    tags: dict[str, list] = {}
    for step in sorted(expected):
        for name, value in expected[step].items():
            tags.setdefault(f"{prefix}/{name}", []).append((step, float(np.float32(value))))
    return tags


def test_tensorboard_holds_each_figure_at_each_step_beside_the_trainers_files(tmp_path):
    trainer = tmp_path / "events.out.tfevents.1700000000.trainer"
    trainer.write_bytes(b"the trainer's own curves")
    written = log_to_tensorboard(REPORT, tmp_path)
    assert written.parent == tmp_path / "vlmfast-sweep-val" and written.name.startswith("events.out.tfevents.")
    assert _read_tensorboard(written.parent) == _by_tag(LOGGED)
    assert trainer.read_bytes() == b"the trainer's own curves"
    assert sorted(p.name for p in tmp_path.iterdir()) == [trainer.name, "vlmfast-sweep-val"]


def test_a_rerun_replaces_the_event_file_one_point_per_step(tmp_path):
    first = log_to_tensorboard({**REPORT, "checkpoints": REPORT["checkpoints"][1:]}, tmp_path, prefix="eval/x", name="s")
    again = log_to_tensorboard(REPORT, tmp_path, prefix="eval/x", name="s")
    assert not first.exists() or first == again
    assert list((tmp_path / "s").iterdir()) == [again]
    assert _read_tensorboard(tmp_path / "s") == _by_tag(LOGGED, prefix="eval/x")


def _wandb_records(run_file: Path):
    """The records of an offline run's .wandb file: a 7-byte header, then 32 KiB blocks of chunks (4-byte
    checksum, 2-byte length, 1-byte type: full, first, middle, last), each record a wandb protobuf Record."""
    from wandb.proto import wandb_internal_pb2

    data, position, pending, block = run_file.read_bytes(), 7, b"", 32768
    assert data[:4] == b":W&B"
    while position + 7 <= len(data):
        if block - position % block < 7:  # a block's tail too short for a chunk header is padding
            position += block - position % block
            continue
        _, length, kind = struct.unpack("<IHB", data[position:position + 7])
        if kind == 0 and length == 0:
            break
        pending += data[position + 7:position + 7 + length]
        position += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def _wandb_history(run_dir: Path) -> dict[int, dict]:
    """Each history row of the offline run: its step → {figure: value}, W&B's own _keys left out. W&B's service
    process writes the file: it is shut down first, so every record is on disk (a loaded machine showed
    records still in flight after the run had finished)."""
    import wandb

    wandb.teardown()
    (run_file,) = run_dir.glob("*.wandb")
    history = {}
    for record in _wandb_records(run_file):
        if record.WhichOneof("record_type") == "history":
            items = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in record.history.item}
            history[record.history.step.num] = {k: v for k, v in items.items() if not k.startswith("_")}
    return history


@pytest.fixture
def wandb_offline(tmp_path, monkeypatch):
    """W&B offline, everything it writes under tmp_path; its process-wide setup (which read the environment
    once) is torn down around the test."""
    import wandb

    wandb.teardown()
    for name in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        (tmp_path / name).mkdir()
        monkeypatch.setenv(name, str(tmp_path / name))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    yield tmp_path / "WANDB_DIR" / "wandb"
    wandb.teardown()


def _expected_history(prefix="eval/vlmfast"):
    return {step: {**{f"{prefix}/{k}": v for k, v in figures.items()}, f"{prefix}/step": step}
            for step, figures in LOGGED.items()}


def test_wandb_offline_run_holds_each_figure_at_each_step(wandb_offline):
    where = Path(log_to_wandb(REPORT, "vlmfast-tests/sweep-val"))
    assert where.name == "files" and where.parent.name.startswith("offline-run-") and where.parent.name.endswith("-sweep-val")
    assert _wandb_history(where.parent) == _expected_history()


def test_wandb_project_alone_is_a_new_run_each_time(wandb_offline):
    first = Path(log_to_wandb(REPORT, "vlmfast-tests")).parent
    second = Path(log_to_wandb(REPORT, "vlmfast-tests")).parent
    assert first != second
    assert _wandb_history(first) == _wandb_history(second) == _expected_history()


def test_log_trackers_says_what_it_did(tmp_path, wandb_offline):
    said = log_trackers(REPORT, tensorboard=tmp_path / "tb", wandb="vlmfast-tests/said")
    (event_file,) = (tmp_path / "tb" / "vlmfast-sweep-val").iterdir()
    assert said[0] == f"wrote {event_file} (tensorboard --logdir {tmp_path / 'tb'})"
    (run_dir,) = wandb_offline.glob("offline-run-*-said")
    assert said[1] == f"logged step(s) 0, 100, 200 to W&B: {run_dir / 'files'}"
    assert log_trackers({**REPORT, "checkpoints": []}, wandb="p") == [
        "nothing logged to TensorBoard or W&B: no checkpoint was evaluated"]
    assert log_trackers(REPORT) == []


def test_a_tracker_that_fails_says_the_report_is_safe_and_a_rerun_logs_it(tmp_path):
    from vlmfast.errors import VlmfastError

    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(VlmfastError) as caught:
        log_trackers(REPORT, tensorboard=tmp_path / "file" / "logs")
    assert caught.value.exit_code == 1 and str(caught.value).startswith(
        "the figures are not logged to TensorBoard: NotADirectoryError")
    assert caught.value.hint == (f"the sweep's results are on disk: check --tensorboard {tmp_path / 'file' / 'logs'}, "
                                 "then rerun the same command (finished checkpoints are read back, nothing is evaluated "
                                 "again)")


@pytest.mark.parametrize("target,parsed", [("p", ("p", None)), ("my-proj/sweep_1", ("my-proj", "sweep_1"))])
def test_wandb_targets(target, parsed):
    assert parse_wandb_target(target) == parsed


@pytest.mark.parametrize("target", ["", "p/", "/r", "a/b/c", "p/run:1", "p/run 1"])
def test_a_malformed_wandb_target_is_a_usage_error(target):
    with pytest.raises(UsageError) as caught:
        parse_wandb_target(target)
    assert caught.value.exit_code == 2 and f"--wandb {target!r}" in str(caught.value)


def test_a_tensorboard_dir_that_is_a_file_is_refused_up_front(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError) as caught:
        check_trackers(str(tmp_path / "file"), None)
    assert str(caught.value) == f"--tensorboard {tmp_path / 'file'}: a file, not a directory"


@pytest.mark.parametrize("option,module,command", [
    ("tensorboard", "tensorboard", "pip install 'vlmfast[tensorboard]'"),
    ("wandb", "wandb", "pip install 'vlmfast[wandb]'"),
])
def test_a_missing_package_names_its_pip_command(monkeypatch, option, module, command):
    monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError
    with pytest.raises(UsageError) as caught:
        check_trackers(**{"tensorboard": None, "wandb": None, option: "x"})
    assert caught.value.hint == command and str(caught.value).startswith(f"--{option} needs the {module} package")


def test_online_wandb_without_an_api_key_is_refused_up_front(monkeypatch):
    import types

    def login(verify):
        assert verify is False  # no network call at option time
        raise RuntimeError("No API key configured. Use `wandb login` to log in.")

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(login=login))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    with pytest.raises(UsageError) as caught:
        check_trackers(None, "p/r")
    assert str(caught.value) == "--wandb: not logged in to W&B (No API key configured. Use `wandb login` to log in.)"
    assert caught.value.hint == "wandb login (or WANDB_API_KEY=…), or WANDB_MODE=offline then wandb sync"
    monkeypatch.setenv("WANDB_MODE", "offline")
    check_trackers(None, "p/r")  # offline needs no key


@pytest.mark.parametrize("option", ["tensorboard", "wandb"])
def test_sweep_options_refuse_a_missing_package(monkeypatch, tmp_path, option):
    from vlmfast.run.options import InferOptions
    from vlmfast.run.sweep import SweepOptions

    monkeypatch.setitem(sys.modules, option, None)
    with pytest.raises(UsageError) as caught:
        SweepOptions(run_dir="runs", out_dir=str(tmp_path), infer=InferOptions(ckpt="runs", manifest="m.jsonl"),
                     **{option: "x"})
    assert caught.value.hint == f"pip install 'vlmfast[{option}]'"


def test_the_sweep_refuses_before_evaluating_anything(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "wandb", None)
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"id": "q0", "image": "a.png", "prompt": "Count.", "solution": "3"}) + "\n")
    r = cli("sweep", tmp_path / "no-such-run", "--manifest", manifest, "--out-dir", tmp_path / "out", "--wandb", "p")
    assert r.returncode == 2 and "pip install 'vlmfast[wandb]'" in r.stderr
    assert not (tmp_path / "out").exists()
    bad = cli("sweep", tmp_path / "no-such-run", "--manifest", manifest, "--out-dir", tmp_path / "out", "--wandb", "a/b/c")
    assert bad.returncode == 2 and "expected PROJECT or PROJECT/RUN" in bad.stderr


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, images):
    """Two tiny checkpoints (steps 100 and 200, different weights) and a manifest of two requests."""
    from vlmfast.checkpoints.tiny import build_checkpoint

    root = tmp_path_factory.mktemp("trackers")
    built = {step: build_checkpoint(root / f"checkpoint-{step}", preset="tiny", like="grpo", seed=seed)
             for step, seed in ((100, 1), (200, 2))}
    manifest = root / "val.jsonl"
    manifest.write_text("".join(json.dumps({"id": f"q{i}", "image": str(p), "prompt": "Count.", "solution": "3",
                                            "scorer": "exact"}) + "\n" for i, p in enumerate(images[:2])))
    return {"manifest": manifest, **built}


def _run_dir(tmp_path, checkpoints, *steps) -> Path:
    import shutil

    for step in steps:
        shutil.copytree(checkpoints[step], tmp_path / "run" / f"checkpoint-{step}")
    return tmp_path / "run"


def _history_of(report: dict) -> dict[int, dict]:
    return {c["step"]: {**scalars(with_flags(c, report)), "eval/vlmfast/step": c["step"]} for c in report["checkpoints"]}


def test_a_real_sweep_lands_in_tensorboard_and_wandb_at_its_steps(tmp_path, checkpoints, wandb_offline):
    """Two tiny checkpoints swept by the CLI: report.json's figures are the ones TensorBoard and W&B hold."""
    r = cli("sweep", _run_dir(tmp_path, checkpoints, 100, 200), "--manifest", checkpoints["manifest"], "--out-dir",
            tmp_path / "out", "--max-new-tokens", 4, "--device", "cpu", "--tensorboard", tmp_path / "logs",
            "--wandb", "vlmfast-tests/cli")
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    expected = {c["step"]: _figures(c, report) for c in report["checkpoints"]}
    assert sorted(expected) == [100, 200] and "accuracy" in expected[100] and "load_s" in expected[100]
    assert _read_tensorboard(tmp_path / "logs" / "vlmfast-sweep-val") == _by_tag(expected)
    (run_dir,) = wandb_offline.glob("offline-run-*-cli")
    assert _wandb_history(run_dir) == _history_of(report)
    said = r.stderr.replace("\n", "")
    assert "wrote " + str(tmp_path / "logs" / "vlmfast-sweep-val") in said and "logged step(s) 100, 200 to W&B" in said


def test_watch_logs_each_new_checkpoint_as_it_is_evaluated(tmp_path, checkpoints, wandb_offline):
    """--watch: the first pass is logged before the first wait; a checkpoint the trainer writes later is
    logged after the look that found it; the final report adds nothing twice."""
    from vlmfast.engines.rows import GenerationSettings
    from vlmfast.report.trackers import Trackers
    from vlmfast.run.options import InferOptions
    from vlmfast.run.sweep import SweepOptions, publish, sweep

    run = _run_dir(tmp_path, checkpoints, 100)
    infer = InferOptions(ckpt=str(run), manifest=str(checkpoints["manifest"]), generation=GenerationSettings(max_new_tokens=4),
                         device="cpu")
    options = SweepOptions(run_dir=str(run), out_dir=str(tmp_path / "out"), infer=infer, watch=True, poll_s=1)
    trackers = Trackers(tensorboard=tmp_path / "logs", wandb="vlmfast-tests/watch")
    tensorboard_seen, said = [], []

    def on_report(so_far):
        said.extend(trackers.log(so_far))
        tensorboard_seen.append(sorted({step for points in _read_tensorboard(tmp_path / "logs" / "vlmfast-sweep-val").values()
                                        for step, _ in points}))

    def wait(seconds):  # the trainer writes checkpoint-200 during the first wait; the second ends the watch
        if (run / "checkpoint-200").exists():
            return False
        _run_dir(tmp_path, checkpoints, 200)
        return True

    try:
        report = sweep(options, wait=wait, on_report=on_report)
        said.extend(publish(report, options, trackers=trackers))
    finally:
        trackers.close()
    assert tensorboard_seen == [[100], [100, 200]]
    (run_dir,) = wandb_offline.glob("offline-run-*-watch")
    files = run_dir / "files"
    assert [line for line in said if "W&B" in line] == [f"logged step(s) 100 to W&B: {files}",
                                                       f"logged step(s) 200 to W&B: {files}",
                                                       f"W&B holds every step already: {files}"]
    history = _wandb_history(run_dir)
    assert sorted(history) == [100, 200] and history[200] == _history_of(report)[200]
    assert _read_tensorboard(tmp_path / "logs" / "vlmfast-sweep-val") == _by_tag(
        {c["step"]: _figures(c, report) for c in report["checkpoints"]})


def test_a_step_below_the_last_logged_one_is_logged_too_and_said(wandb_offline):
    """--search coarse, then a plain sweep filling the steps in between (or a broken checkpoint saved again whole
    under --watch): the W&B run gets the step it lacks, at its own x-axis value, without touching the others'
    rows, and the line says which step was logged (not that W&B holds every step already)."""
    from vlmfast.report.trackers import Trackers

    coarse = {**REPORT, "checkpoints": [c for c in REPORT["checkpoints"] if c["step"] != 100]}
    trackers = Trackers(wandb="vlmfast-tests/fill")
    try:
        first = trackers.log(coarse)
        second = trackers.log(REPORT)
        where = Path(trackers._run.dir)
    finally:
        trackers.close()
    assert "logged step(s) 0, 200 to W&B" in first[0] and "logged step(s) 100 to W&B" in second[0]
    rows = {row["eval/vlmfast/step"]: row for row in _wandb_history(where.parent).values()}
    assert rows == _expected_history()  # each step's figures once, none merged into another step's row


def test_each_flag_is_a_0_1_curve_at_every_step(tmp_path):
    """sweep.md: "flags as 0/1": a flag code is 1 at the steps it flags and 0 at the others."""
    flagged = {**REPORT, "flags": [{"code": "truncation", "step": 200, "figure": 0.5, "threshold": 0.05, "message": "m"},
                                   {"code": "length_blowup", "step": 100, "figure": 2.5, "threshold": 2.0, "message": "m"}]}
    held = _read_tensorboard(log_to_tensorboard(flagged, tmp_path).parent)
    assert held["eval/vlmfast/flags/truncation"] == [(0, 0.0), (100, 0.0), (200, 1.0)]
    assert held["eval/vlmfast/flags/length_blowup"] == [(0, 0.0), (100, 1.0), (200, 0.0)]
    assert held["eval/vlmfast/flags/repetition"] == [(0, 0.0), (100, 0.0), (200, 0.0)]
