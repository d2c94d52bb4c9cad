"""vlmfast sweep: every checkpoint of a made run (three checkpoints with different weights and a base),
each one's rows equal to a fresh infer of it, the best step, resume, weight swaps and full loads, --watch."""

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from conftest import cli, read_jsonl
from vlmfast.run.options import InferOptions
from vlmfast.engines.rows import GenerationSettings

SETTINGS = GenerationSettings(max_new_tokens=6)


@pytest.fixture(scope="module")
def run(tmp_path_factory, images):
    """A run dir with checkpoint-100/200/300 (tiny, GRPO-like, different weight seeds), a base and a manifest
    whose ground truth is checkpoint-200's own answers (so step 200 is the best, by construction)."""
    from vlmfast.run.runner import infer
    from vlmfast.checkpoints.tiny import build_checkpoint

    root = tmp_path_factory.mktemp("sweep")
    for step, seed in ((100, 1), (200, 2), (300, 3)):
        build_checkpoint(root / "run" / f"checkpoint-{step}", preset="tiny", like="grpo", seed=seed)
    base = build_checkpoint(root / "base", preset="tiny", like="base", seed=0)
    plain = root / "plain.jsonl"
    plain.write_text("".join(json.dumps({"id": f"q{i}", "image": str(p), "prompt": "Count."}) + "\n"
                             for i, p in enumerate(images[:4])))
    fresh = {}
    for step in (100, 200, 300):
        out = root / f"fresh-{step}.jsonl"
        infer(InferOptions(ckpt=str(root / "run" / f"checkpoint-{step}"), manifest=str(plain), out=str(out),
                           generation=SETTINGS, device="cpu"))
        fresh[step] = read_jsonl(out)
    manifest = root / "m.jsonl"
    manifest.write_text("".join(json.dumps({"id": r["id"], "image": r["images"][0], "prompt": "Count.",
                                            "solution": r["text"], "scorer": "exact"}) + "\n" for r in fresh[200]))
    return {"root": root, "run": root / "run", "base": base, "manifest": manifest, "fresh": fresh}


def _options(run, out_dir, **kw):
    from vlmfast.run.sweep import SweepOptions

    infer = InferOptions(ckpt=str(run["run"]), manifest=str(run["manifest"]), generation=SETTINGS, device="cpu")
    return SweepOptions(run_dir=str(run["run"]), out_dir=str(out_dir), infer=infer, **kw)


def _tokens(rows):
    return [(r["id"], r["text"], r["n_new_tokens"]) for r in rows]


def _digests(*dirs):
    import hashlib

    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for d in dirs for p in sorted(d.rglob("*")) if p.is_file()}


def test_every_checkpoint_once_rows_equal_fresh_loads_and_the_best_step(run, tmp_path):
    from vlmfast.run.sweep import sweep

    before = _digests(run["run"], run["base"])
    report = sweep(_options(run, tmp_path / "s", base=str(run["base"])))
    assert _digests(run["run"], run["base"]) == before  # swapping into a loaded (memory-mapped) model writes no file
    steps = [c["step"] for c in report["checkpoints"]]
    assert steps == [0, 100, 200, 300] and report["checkpoints"][0]["label"] == "base"
    for c in report["checkpoints"][1:]:
        assert _tokens(read_jsonl(c["results"])) == _tokens(run["fresh"][c["step"]])  # swapped weights = a fresh load
    by_step = {c["step"]: c for c in report["checkpoints"]}
    assert by_step[200]["accuracy"] == 1.0 and by_step[100]["accuracy"] < 1.0
    assert {k: report["best"][k] for k in ("step", "label", "path", "accuracy")} == \
        {"step": 200, "label": "hf-trainer", "path": str(run["run"] / "checkpoint-200"), "accuracy": 1.0}
    assert "load_s" in by_step[0] and all("swap_s" in by_step[s] for s in (100, 200, 300))  # loaded once
    assert 0 <= by_step[100]["ci_low"] <= by_step[100]["accuracy"] <= by_step[100]["ci_high"] <= 1
    assert report["schema"] == "vlmfast.sweep/1" and report["exit_code"] == 0


def test_a_killed_sweep_resumes_without_redoing_a_row(run, tmp_path):
    from vlmfast.run.sweep import sweep

    out = tmp_path / "s"
    first = sweep(_options(run, out, steps=(100, 200)))
    rows_200 = read_jsonl(out / "step-200.jsonl")
    (out / "step-200.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows_200[:2]))  # killed mid-checkpoint
    again = sweep(_options(run, out))
    by_step = {c["step"]: c for c in again["checkpoints"]}
    # finished: read back, nothing loaded; its figures are those measured when it ran
    assert by_step[100]["rows"] == 4 and by_step[100]["load_s"] == first["checkpoints"][0]["load_s"] > 0
    assert by_step[100]["read_back"] and not by_step[200].get("read_back")  # the engine line counts step 200 only
    assert [r["id"] for r in read_jsonl(out / "step-200.jsonl")] == ["q0", "q1", "q2", "q3"]  # every row once
    assert _tokens(read_jsonl(out / "step-200.jsonl")) == _tokens(rows_200) and first["best"]["step"] == 200
    assert len(read_jsonl(out / "step-300.jsonl")) == 4


def test_a_checkpoint_of_another_shape_is_loaded_afresh_and_said(run, tmp_path):
    from vlmfast.run.sweep import sweep
    from vlmfast.checkpoints.tiny import build_checkpoint

    mixed = tmp_path / "mixed"
    shutil.copytree(run["run"] / "checkpoint-100", mixed / "checkpoint-100")
    build_checkpoint(mixed / "checkpoint-200", preset="demo", like="grpo", seed=2)  # bigger shapes
    said = []
    options = _options(run, tmp_path / "s", fail_if_best_below=1.0)
    options = type(options)(**{**options.__dict__, "run_dir": str(mixed)})
    report = sweep(options, say=said.append)
    by_step = {c["step"]: c for c in report["checkpoints"]}
    assert "load_s" in by_step[200] and by_step[200]["rows"] == 4
    assert any("checkpoint-200: loaded afresh (its config differs" in s for s in said)
    assert report["exit_code"] == 5 and report["gate"]["failed"]  # nothing here answers like checkpoint-200 did


def test_watch_takes_new_checkpoints_as_the_trainer_writes_them(run, tmp_path):
    from vlmfast.run.sweep import sweep

    live = tmp_path / "live"
    shutil.copytree(run["run"] / "checkpoint-100", live / "checkpoint-100")
    looks = []

    def wait(seconds):
        looks.append(seconds)
        if len(looks) == 1:  # the trainer saves a new checkpoint meanwhile, and is half-way through another
            shutil.copytree(run["run"] / "checkpoint-300", live / "checkpoint-300")
            shutil.copytree(run["run"] / "checkpoint-200", live / "checkpoint-200")
            weights = live / "checkpoint-200" / "model.safetensors"
            weights.write_bytes(weights.read_bytes()[:300_000])
            shutil.copytree(run["run"] / "checkpoint-100", live / "checkpoint-400")  # and one whose header is garbage:
            weights = live / "checkpoint-400" / "model.safetensors"  # no more writing mends it, so no waiting on it
            data = bytearray(weights.read_bytes())
            length = int.from_bytes(data[:8], "little")
            data[8:8 + length] = b"x" * length
            weights.write_bytes(bytes(data))
        if len(looks) == 2:  # the corrupt one saved again, whole
            shutil.copyfile(run["run"] / "checkpoint-100" / "model.safetensors", live / "checkpoint-400" / "model.safetensors")
        return len(looks) < 4

    said = []
    options = _options(run, tmp_path / "s", watch=True, poll_s=5)
    report = sweep(type(options)(**{**options.__dict__, "run_dir": str(live)}), wait=wait, say=said.append)
    assert [c["step"] for c in report["checkpoints"]] == [100, 300, 400] and looks == [5, 5, 5, 5]
    assert _tokens(read_jsonl(tmp_path / "s" / "step-300.jsonl")) == _tokens(run["fresh"][300])
    watching = [s for s in said if s.startswith("watching ")]
    # said when the count changes, not at every look: 1 evaluated, then 2 after the second look
    assert len(watching) == 3 and "1 checkpoint(s) evaluated, looking every 5 s" in watching[0]
    assert "2 checkpoint(s) evaluated" in watching[1] and "3 checkpoint(s) evaluated" in watching[2]
    assert [s for s in said if s.startswith("step ")][0] == f"step 100: {live / 'checkpoint-100'}"  # alone: no "1 of 1"
    assert [s for s in said if s.startswith("not yet: ")] == [s for s in said if "checkpoint-200" in s][:1]
    assert len([s for s in said if s.startswith("not yet: ")]) == 1  # said once, not at every look
    broken = [s for s in said if s.startswith("step 400 not evaluated: ")]
    assert len(broken) == 1 and "corrupt file" in broken[0] and not any("not yet: " in s and "400" in s for s in said)
    assert report["not_evaluated"] == []  # step 400, corrupt at first, was evaluated once saved again


def test_watch_tries_again_a_checkpoint_caught_before_its_processor_was_saved(run, tmp_path):
    """HF Trainer saves the weights and config, then the processor: a look in between refuses the checkpoint
    (its processor does not load), and the next look after the files changed evaluates it."""
    from vlmfast.run.sweep import sweep

    live = tmp_path / "live"
    shutil.copytree(run["run"] / "checkpoint-100", live / "checkpoint-100")
    source, later = run["run"] / "checkpoint-300", live / "checkpoint-300"
    looks = []

    def wait(seconds):
        looks.append(seconds)
        if len(looks) == 1:  # weights and config written, the processor and tokenizer not yet
            later.mkdir()
            for name in ("config.json", "generation_config.json", "model.safetensors"):
                shutil.copyfile(source / name, later / name)
        if len(looks) == 2:
            shutil.copytree(source, later, dirs_exist_ok=True)
        return len(looks) < 3

    said = []
    options = _options({**run, "run": live}, tmp_path / "s", watch=True, poll_s=5)
    report = sweep(options, wait=wait, say=said.append)
    assert [s for s in said if s.startswith("step 300 not evaluated: ")]  # the look in between
    assert [c["step"] for c in report["checkpoints"]] == [100, 300] and report["not_evaluated"] == []
    assert not [n for n in report["notes"] if "not evaluated" in n]
    assert _tokens(read_jsonl(tmp_path / "s" / "step-300.jsonl")) == _tokens(run["fresh"][300])


@pytest.mark.parametrize("step_dir", ["checkpoint-{}", "global_step_{}/actor/huggingface"])
def test_a_checkpoint_corrupt_in_the_first_pass_and_saved_again_is_evaluated_and_not_listed_as_skipped(run, tmp_path,
                                                                                                       step_dir):
    from vlmfast.run.sweep import sweep

    live = tmp_path / "live"
    shutil.copytree(run["run"] / "checkpoint-100", live / step_dir.format(100))
    shutil.copytree(run["run"] / "checkpoint-100", live / step_dir.format(400))
    weights = live / step_dir.format(400) / "model.safetensors"
    data = bytearray(weights.read_bytes())
    length = int.from_bytes(data[:8], "little")
    data[8:8 + length] = b"x" * length  # a garbage header: skipped by the first pass
    weights.write_bytes(bytes(data))
    looks = []

    def wait(seconds):  # the trainer saves it again, whole, before the first look
        looks.append(seconds)
        if len(looks) == 1:
            shutil.copyfile(run["run"] / "checkpoint-100" / "model.safetensors", weights)
        return len(looks) < 2

    options = _options(run, tmp_path / "s", watch=True, poll_s=5)
    report = sweep(type(options)(**{**options.__dict__, "run_dir": str(live)}), wait=wait, say=lambda _: None)
    assert [c["step"] for c in report["checkpoints"]] == [100, 400]
    assert report["not_evaluated"] == []


def test_a_bad_manifest_is_said_before_any_checkpoint(run, tmp_path):
    from vlmfast.errors import InputError
    from vlmfast.run.sweep import sweep

    manifest = tmp_path / "m.jsonl"
    manifest.write_text(run["manifest"].read_text() + json.dumps({"id": "gone", "image": str(tmp_path / "gone.png"),
                                                                  "prompt": "Count."}) + "\n")
    options = _options(run, tmp_path / "s")
    said = []
    with pytest.raises(InputError, match="1 bad input"):
        sweep(dataclasses.replace(options, infer=dataclasses.replace(options.infer, manifest=str(manifest))),
              say=said.append)
    assert not any(s.startswith("step ") for s in said) and not (tmp_path / "s").exists()


def test_sweep_cli_json_report_plot_and_gate(run, tmp_path):
    out = tmp_path / "s"
    r = cli("sweep", run["run"], "--manifest", run["manifest"], "--out-dir", out, "--steps", "200,300",
            "--max-new-tokens", 6, "--device", "cpu", "--json", "--fail-if-best-below", 0.5)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert [c["step"] for c in report["checkpoints"]] == [200, 300] and report["best"]["step"] == 200
    written = json.loads((out / "report.json").read_text())
    assert written["best"] == report["best"] and written["flags"] == report["flags"]
    assert all({"vs_base", "vs_best", "new_tokens_p50", "truncation_rate", "repetition_rate"} <= set(c)
               for c in written["checkpoints"])
    assert written["checkpoints"][1]["vs_best"]["n"] == 4 and written["checkpoints"][0]["vs_best"] is None
    assert "best: step 200" in r.stderr and "engine: loaded 1× (" in r.stderr and "swapped in place 1× (" in r.stderr
    bad = cli("sweep", run["run"], "--manifest", run["manifest"], "--out-dir", out, "--steps", "7")
    assert bad.returncode == 2 and "7" in bad.stderr


def test_a_half_written_checkpoint_is_skipped_with_its_reason_and_the_sweep_goes_on(run, tmp_path):
    from vlmfast.run.sweep import sweep

    cut = tmp_path / "run"
    shutil.copytree(run["run"], cut)
    weights = cut / "checkpoint-300" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:300_000])  # as `head -c 300000` leaves it
    inputs = dict(run, run=cut)
    report = sweep(_options(inputs, tmp_path / "out"))
    assert [c["step"] for c in report["checkpoints"]] == [100, 200]
    assert any("checkpoint-300" in note and "incomplete" in note for note in report["notes"])
    r = cli("sweep", cut, "--manifest", run["manifest"], "--out-dir", tmp_path / "cli", "--max-new-tokens", "6",
            "--device", "cpu")
    assert r.returncode == 0 and "Traceback" not in r.stderr and "incomplete" in r.stdout + r.stderr


def test_a_sweep_that_fails_before_its_first_checkpoint_leaves_no_out_dir(run, tmp_path):
    """A missing run dir, and a manifest whose record has no prompt: exit 2, and no empty --out-dir."""
    no_prompt = tmp_path / "no-prompt.jsonl"
    no_prompt.write_text('{"id": "a", "image": "missing.png"}\n')
    for k, (target, manifest) in enumerate([(tmp_path / "nothing-here", run["manifest"]), (run["run"], no_prompt)]):
        out = tmp_path / f"out-{k}"
        r = cli("sweep", target, "--manifest", manifest, "--out-dir", out, "--device", "cpu")
        assert r.returncode == 2 and not out.exists(), (k, r.stderr)


def test_a_run_with_its_own_step_0_and_a_base_is_refused_before_anything_is_written(run, tmp_path):
    """--base is step 0 of a sweep: a run that saved checkpoint-0 too would put two models' rows and paired
    figures under one step."""
    import shutil

    from vlmfast.errors import UsageError
    from vlmfast.run.sweep import sweep

    own = tmp_path / "run"
    for step in (0, 100):
        shutil.copytree(run["run"] / "checkpoint-100", own / f"checkpoint-{step}")
    options = _options({**run, "run": own}, tmp_path / "out", base=str(run["base"]))
    with pytest.raises(UsageError, match=r"--base .* and .*checkpoint-0 are both step 0 of the sweep") as err:
        sweep(options)
    assert "drop --base" in err.value.hint and not (tmp_path / "out").exists()
    assert [f["step"] for f in sweep(dataclasses.replace(options, base=None))["checkpoints"]] == [0, 100]


def test_when_no_checkpoint_can_be_evaluated_the_error_names_every_reason(run, tmp_path):
    """Skipped when listed (weights without a config) and refused when loaded (a config that is no JSON): the
    one error of a sweep with nothing to report names both."""
    from vlmfast.errors import CheckpointError
    from vlmfast.run.sweep import sweep

    own = tmp_path / "run"
    for step in (100, 200):
        shutil.copytree(run["run"] / "checkpoint-100", own / f"checkpoint-{step}")
    (own / "checkpoint-100" / "config.json").unlink()
    (own / "checkpoint-200" / "config.json").write_text('{"model_type": "qwen2_5_vl", ')
    with pytest.raises(CheckpointError) as err:
        sweep(_options({**run, "run": own}, tmp_path / "out"))
    lines = err.value.message.splitlines()
    assert lines[1].startswith("  - step 100: ") and lines[1].endswith("weights but no config.json"), lines
    assert lines[2].startswith("  - step 200: ") and len(lines) == 3, lines


def test_sweep_takes_the_prompt_its_hint_names(run, tmp_path):
    """A manifest without prompts: the error's hint names --prompt, and sweep takes it."""
    bare = tmp_path / "bare.jsonl"
    bare.write_text("".join(json.dumps({"id": r["id"], "image": r["images"][0]}) + "\n" for r in run["fresh"][100]))
    first = cli("sweep", run["run"], "--manifest", bare, "--out-dir", tmp_path / "a", "--steps", "100", "--device", "cpu",
                "--max-new-tokens", "6")
    assert first.returncode == 2 and "--prompt" in first.stderr
    r = cli("sweep", run["run"], "--manifest", bare, "--prompt", "Count.", "--out-dir", tmp_path / "b", "--steps", "100",
            "--device", "cpu", "--max-new-tokens", "6")
    assert r.returncode == 0 and _tokens(read_jsonl(tmp_path / "b" / "step-100.jsonl")) == _tokens(run["fresh"][100])


def test_reward_errors_are_counted_and_named_as_the_reason_there_is_no_best(run, tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("def accuracy(completions, solution, **kwargs):\n    raise ValueError('boom')\n")
    r = cli("sweep", run["run"], "--manifest", run["manifest"], "--out-dir", tmp_path / "out", "--steps", "100",
            "--device", "cpu", "--max-new-tokens", "6", "--reward", f"{broken}:accuracy", "--skip-bad", "--json")
    report = json.loads(r.stdout)
    assert r.returncode == 0 and report["checkpoints"][0]["reward_errors"] == 4 and report["best"] is None
    assert "4 reward call(s) failed" in r.stderr and "no row had ground truth" not in r.stderr


def test_answers_a_reward_raised_on_count_as_wrong_so_steps_are_judged_on_the_same_requests(run, tmp_path):
    """--skip-bad keeps going past a reward function that raises on some answers; leaving those answers out
    would rank each step over other requests (step 200 got 2 of 2 instead of 2 of 4 here)."""
    from vlmfast.run.sweep import sweep

    picky = tmp_path / "picky.py"
    picky.write_text("def accuracy(completions, solution, boom=None, **kwargs):\n"
                     "    if any(boom or []):\n        raise ValueError('boom')\n"
                     "    return [float(c[0]['content'] == s) for c, s in zip(completions, solution)]\n")
    manifest = tmp_path / "m.jsonl"
    lines = [json.loads(line) for line in run["manifest"].read_text().splitlines()]
    manifest.write_text("".join(json.dumps({**line, "boom": k < 2}) + "\n" for k, line in enumerate(lines)))
    options = _options(run, tmp_path / "s", steps=[200])
    options = dataclasses.replace(options, infer=dataclasses.replace(
        options.infer, manifest=str(manifest), reward=[f"{picky}:accuracy"], skip_bad=True))
    report = sweep(options, say=lambda _: None)
    step = report["checkpoints"][0]
    assert (step["accuracy"], step["scored"], step["reward_errors"]) == (0.5, 4, 2)
    assert "step 200: 2 answer(s) the reward function raised on (--skip-bad) count as wrong" in report["notes"]
    assert read_jsonl(tmp_path / "s" / "step-200.jsonl")[0]["correct"] is None  # the rows as written: unscored


def test_a_step_whose_every_answer_a_working_reward_raised_on_ranks_as_all_wrong(run, tmp_path):
    """The function scores step 200's answers and raises on every one of step 100's (unparsable to it): step
    100's answers count as wrong, as one step's raised answers do, instead of leaving it out of the ranking."""
    from vlmfast.run.sweep import sweep

    strict = tmp_path / "strict.py"
    strict.write_text("def accuracy(completions, solution, **kwargs):\n"
                      "    if any(c[0]['content'] != s for c, s in zip(completions, solution)):\n"
                      "        raise ValueError('cannot parse it')\n"
                      "    return [1.0] * len(completions)\n")
    options = _options(run, tmp_path / "s", steps=(100, 200))
    options = dataclasses.replace(options, infer=dataclasses.replace(options.infer, reward=[f"{strict}:accuracy"],
                                                                     skip_bad=True))
    report = sweep(options, say=lambda _: None)
    steps = {c["step"]: c for c in report["checkpoints"]}
    assert (steps[100]["accuracy"], steps[100]["scored"], steps[100]["reward_errors"]) == (0.0, 4, 4)
    assert steps[200]["accuracy"] == 1.0 and report["best"]["step"] == 200
    assert steps[100]["vs_best"]["n"] == 4  # paired with the best over every request
    assert ("step 100: the reward function raised on every answer (--skip-bad), where it scored other checkpoints': "
            "they count as wrong") in report["notes"]


def test_answers_a_step_failed_on_count_as_wrong_where_another_step_answered(run, tmp_path):
    """A step whose run failed on some inputs (out of memory even alone, vLLM's unfinished rows) was ranked over
    the requests it finished: 2 of 2 right beat 3 of 4. Where another step answered those requests, they count
    as wrong; a request no step answered stays out of every step's figures."""
    from vlmfast.run.sweep import sweep

    out = tmp_path / "s"
    options = _options(run, out, steps=(100, 200))
    sweep(options, say=lambda _: None)
    verdicts = {"step-100.jsonl": [1, 1, 1, 0], "step-200.jsonl": [1, 1, None, None]}  # None: the run failed on it
    for name, marks in verdicts.items():
        rows = read_jsonl(out / name)
        for row, mark in zip(rows, marks):
            row.update(score=None, correct=None, format_ok=None, text=None, error="out of memory even alone") if mark is None \
                else row.update(score=float(mark), correct=bool(mark))
        (out / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    rows = read_jsonl(out / "step-100.jsonl")  # q3: no step answers it
    rows[3].update(score=None, correct=None, format_ok=None, text=None, error="out of memory even alone")
    (out / "step-100.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = sweep(options, say=lambda _: None)  # read back, nothing generated
    steps = {c["step"]: c for c in report["checkpoints"]}
    assert (steps[100]["accuracy"], steps[100]["scored"]) == (1.0, 3)
    assert (steps[200]["accuracy"], steps[200]["scored"], steps[200]["errors"]) == (round(2 / 3, 4), 3, 2)
    assert report["best"]["step"] == 100 and steps[200]["vs_best"]["n"] == 3
    assert any(n.startswith("step 200: 1 request(s) the run failed on (e.g. q2: out of memory even alone) count as wrong")
               for n in report["notes"])


def test_the_report_carries_health_paired_figures_and_flags(run, tmp_path):
    from vlmfast.evaluation.flags import compare, per_request
    from vlmfast.run.sweep import sweep

    report = sweep(_options(run, tmp_path / "s", base=str(run["base"]), steps=(100, 200)))
    base, s100, s200 = report["checkpoints"]
    assert base["label"] == "base" and base["vs_base"] is None and s200["vs_best"] is None  # 200 is the best
    for c in report["checkpoints"]:
        assert {"new_tokens_p50", "new_tokens_p90", "truncation_rate", "repetition_rate", "empty_answer_rate",
                "multi_answer_rate", "mean_think_chars"} <= set(c)
    rows = {step: read_jsonl(tmp_path / "s" / name) for step, name in ((0, "base.jsonl"), (200, "step-200.jsonl"))}
    assert s200["vs_base"] == compare(per_request(rows[200]), per_request(rows[0]))
    right = {step: {r["id"] for r in rs if r["correct"]} for step, rs in rows.items()}
    assert s200["vs_base"]["wrong_to_right"] == len(right[200] - right[0])
    assert s200["vs_base"]["right_to_wrong"] == len(right[0] - right[200])
    assert isinstance(report["flags"], list) and all(f["step"] in (0, 100, 200) for f in report["flags"])
    assert set(s200["vs_base"]) == set(s100["vs_best"]) == {"n", "difference", "ci_low", "ci_high", "p_value",
                                                           "right_to_wrong", "wrong_to_right"}
    assert all(set(f) == {"code", "step", "figure", "threshold", "message"} for f in report["flags"])


def test_a_rerun_with_another_base_says_the_rows_were_made_from_the_other_base(run, tmp_path):
    """A sweep rerun into the same --out-dir with another --base: base.jsonl's rows were made from the first
    base, not from files that changed since; the note names both, and the base is evaluated again."""
    from vlmfast.checkpoints.tiny import build_checkpoint
    from vlmfast.run.sweep import sweep

    out = tmp_path / "s"
    sweep(_options(run, out, steps=(100,), base=str(run["base"])))
    other = build_checkpoint(tmp_path / "other-base", preset="tiny", like="base", seed=5)
    again = sweep(_options(run, out, steps=(100,), base=str(other)))
    said = [n for n in again["notes"] if n.startswith("base.jsonl: ")]
    assert len(said) == 1 and said[0].startswith(f"base.jsonl: its rows were made from {run['base']} and this run "
                                                 f"evaluates {other} (fingerprint "), said
    assert "weight files changed" not in said[0] and "evaluated again" in said[0]
    assert not any(n.startswith("step-100.jsonl: ") for n in again["notes"])  # the same checkpoint: kept


def test_a_rerun_keeps_measured_figures_and_refuses_other_settings(run, tmp_path):
    """A finished sweep rerun keeps each checkpoint's figures from when it ran (not null tokens/s and 0 s);
    the settings that shape the rows are recorded beside each step file and in the report, and a rerun with
    another template or length is an error naming what differs, until --overwrite."""
    import dataclasses

    from vlmfast.errors import UsageError
    from vlmfast.run.sweep import sweep

    out = tmp_path / "s"
    options = _options(run, out, steps=(100, 200))
    first = sweep(options)
    again = sweep(options)
    keys = ("tokens_per_s", "load_s", "swap_s", "decode_row_utilization")
    assert [{k: c.get(k) for k in keys} for c in again["checkpoints"]] == [{k: c.get(k) for k in keys} for c in first["checkpoints"]]
    assert first["checkpoints"][0]["tokens_per_s"] > 0 and 0 < first["checkpoints"][0]["decode_row_utilization"] <= 1
    record = json.loads((out / "step-100.run.json").read_text())
    assert record["settings"]["generation"]["max_new_tokens"] == 6 and record["settings"]["template"] == "plain"
    assert again["settings"] == record["settings"] and "transformers" in again["versions"]
    other = dataclasses.replace(options, infer=dataclasses.replace(options.infer, template="r1",
                                                                    generation=GenerationSettings(max_new_tokens=16)))
    with pytest.raises(UsageError) as err:
        sweep(other)
    assert "template: \"plain\" then, \"r1\" now" in err.value.message and "max_new_tokens" in err.value.message
    assert "--overwrite" in err.value.hint
    fresh = sweep(dataclasses.replace(other, overwrite=True))
    assert all(r["n_new_tokens"] <= 16 for r in read_jsonl(out / "step-100.jsonl"))
    aside = next(out.glob("replaced-*"))  # the earlier rows moved aside, not deleted
    assert sorted(p.name for p in aside.iterdir()) == ["step-100.jsonl", "step-100.run.json", "step-200.jsonl",
                                                        "step-200.run.json"]
    assert all(r["n_new_tokens"] <= 6 for r in read_jsonl(aside / "step-100.jsonl"))
    assert any(str(aside) in n for n in fresh["notes"])
    assert json.loads((out / "step-100.run.json").read_text())["settings"]["template"] == "r1"
    assert [c["step"] for c in fresh["checkpoints"]] == [100, 200]


def test_sweep_cli_overwrite_flag(run, tmp_path):
    out = tmp_path / "s"
    args = ["sweep", run["run"], "--manifest", run["manifest"], "--out-dir", out, "--steps", "100", "--device", "cpu"]
    assert cli(*args, "--max-new-tokens", 6).returncode == 0
    refused = cli(*args, "--max-new-tokens", 7)
    assert refused.returncode == 2 and "--overwrite" in refused.stderr
    assert cli(*args, "--max-new-tokens", 7, "--overwrite").returncode == 0


def test_an_odd_base_is_said(run, tmp_path):
    """A base of another family, or one of the run's own checkpoints, is accepted but said."""
    from vlmfast.checkpoints.tiny import build_checkpoint
    from vlmfast.run.sweep import sweep

    other = build_checkpoint(tmp_path / "qwen2", family="qwen2_vl")
    said = []
    report = sweep(_options(run, tmp_path / "a", base=str(other), steps=(100,)), say=said.append)
    assert any("is a qwen2_vl model and the run's checkpoints are qwen2_5_vl" in n for n in report["notes"])
    assert any("is a qwen2_vl model" in s for s in said)
    own = sweep(_options(run, tmp_path / "b", base=str(run["run"] / "checkpoint-100"), steps=(200,)))
    assert not any("one of the run's own checkpoints" in n for n in own["notes"])  # 100 is not in this sweep's steps
    own = sweep(_options(run, tmp_path / "c", base=str(run["run"] / "checkpoint-100"), steps=(100,)))
    assert any("one of the run's own checkpoints" in n for n in own["notes"])
    plain = sweep(_options(run, tmp_path / "d", base=str(run["base"]), steps=(100,)))
    assert not any("--base" in n for n in plain["notes"])


def test_a_checkpoint_that_lost_its_head_is_not_evaluated_and_the_sweep_goes_on(run, tmp_path):
    from safetensors.torch import load_file, save_file

    from vlmfast.run.sweep import sweep

    lost = tmp_path / "run"
    shutil.copytree(run["run"], lost)
    weights = lost / "checkpoint-200" / "model.safetensors"
    save_file({k: v for k, v in load_file(weights).items() if k != "lm_head.weight"}, weights, metadata={"format": "pt"})
    report = sweep(_options(dict(run, run=lost), tmp_path / "out"))
    assert [c["step"] for c in report["checkpoints"]] == [100, 300]  # evaluated like the others no more
    assert [(r["step"], "lm_head.weight: 1 missing" in r["reason"]) for r in report["not_evaluated"]] == [(200, True)]
    assert any(note.startswith("step 200 not evaluated:") for note in report["notes"])
    assert not (tmp_path / "out" / "step-200.jsonl").exists() and report["exit_code"] == 0


def test_a_checkpoint_whose_generation_config_is_refused_is_not_evaluated_and_the_sweep_goes_on(run, tmp_path):
    """Step 100's generation_config.json holds a value transformers refuses to load (a fresh load), step 300's a
    repetition penalty of 0 (a swap after step 200): each is listed as not evaluated with the file and the
    value, and the sweep goes on (it stopped with exit 2 and wrote no report)."""
    from vlmfast.run.sweep import sweep

    odd = tmp_path / "run"
    shutil.copytree(run["run"], odd)
    for step, value in ((100, {"early_stopping": "true"}), (300, {"repetition_penalty": 0})):
        gen = json.loads((odd / f"checkpoint-{step}" / "generation_config.json").read_text())
        (odd / f"checkpoint-{step}" / "generation_config.json").write_text(json.dumps({**gen, **value}))
    report = sweep(_options(dict(run, run=odd), tmp_path / "out"))
    assert [c["step"] for c in report["checkpoints"]] == [200] and report["exit_code"] == 0
    assert [(r["step"], r["reason"].split(": ")[1]) for r in report["not_evaluated"]] == [
        (100, "early_stopping 'true'"), (300, "repetition_penalty 0")]
    assert _tokens(read_jsonl(tmp_path / "out" / "step-200.jsonl")) == _tokens(run["fresh"][200])


def test_a_checkpoint_that_does_not_load_after_a_good_one_is_not_evaluated_and_the_sweep_goes_on(run, tmp_path):
    """Its weights whole, its config another model type: the engine let the previous model go before the load
    failed. The step is listed as not evaluated with the loader's first line, the next checkpoint loads
    afresh, and the report is written (it once ended in a traceback from closing the emptied engine)."""
    from vlmfast.run.sweep import sweep

    odd = tmp_path / "run"
    shutil.copytree(run["run"], odd)
    config = json.loads((odd / "checkpoint-200" / "config.json").read_text())
    (odd / "checkpoint-200" / "config.json").write_text(json.dumps(dict(config, model_type="llama")))
    said = []
    report = sweep(_options(dict(run, run=odd), tmp_path / "out"), say=said.append)
    assert [s for s in said if s.startswith("step 300: ")] == [f"step 300: {odd / 'checkpoint-300'} (3 of 3)"]
    assert [c["step"] for c in report["checkpoints"]] == [100, 300]
    assert _tokens(read_jsonl(tmp_path / "out" / "step-300.jsonl")) == _tokens(run["fresh"][300])
    [skipped] = report["not_evaluated"]
    assert skipped["step"] == 200 and "cannot load the model (ValueError: Unrecognized configuration class" in skipped["reason"]
    assert len(skipped["reason"]) < 400 and "model_type" in skipped["hint"]
    assert any(note.startswith("step 200 not evaluated:") for note in report["notes"])


def test_a_checkpoint_without_weights_is_listed_as_not_evaluated(run, tmp_path):
    """A save cut short (config.json written, no weights yet): skipped with a note, and in report.json's
    not_evaluated with the others the sweep could not take."""
    from vlmfast.run.sweep import sweep

    cut = tmp_path / "run"
    shutil.copytree(run["run"], cut)
    (cut / "checkpoint-400").mkdir()
    shutil.copy(cut / "checkpoint-300" / "config.json", cut / "checkpoint-400" / "config.json")
    report = sweep(_options(dict(run, run=cut), tmp_path / "out"))
    assert [c["step"] for c in report["checkpoints"]] == [100, 200, 300]
    assert [(r["step"], r["path"]) for r in report["not_evaluated"]] == [(400, str(cut / "checkpoint-400"))]
    assert report["not_evaluated"][0]["reason"]


def test_the_best_step_holds_up_in_the_report_the_table_and_the_page(run, tmp_path):
    from vlmfast.report.terminal import sweep_table
    from vlmfast.run.sweep import sweep
    from vlmfast.run.sweep_page import write_sweep_dir

    report = sweep(_options(run, tmp_path / "s"))
    by_step = {c["step"]: c for c in report["checkpoints"]}
    assert sum(c["p_best"] for c in report["checkpoints"]) == pytest.approx(1.0, abs=1e-3)
    best = report["best"]
    assert best["step"] == 200 and best["p_best"] == by_step[200]["p_best"] and best["requests"] == 4
    assert best["indistinguishable"] == [s for s in (100, 200, 300) if by_step[s]["near_best"]]
    assert 200 in best["indistinguishable"] and by_step[200]["holm_p"] is None
    assert all(by_step[s]["holm_p"] is not None for s in (100, 300))
    write_sweep_dir(report, tmp_path / "s")
    saved = json.loads((tmp_path / "s" / "report.json").read_text())
    assert saved["best"]["p_best"] == best["p_best"] and "p_best" in saved["checkpoints"][0]
    assert "P(best)" in (tmp_path / "s" / "report.html").read_text()
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(sweep_table(report))
    text = console.export_text()
    assert "P(best)" in text and f"{by_step[200]['p_best']:.0%} ≈" in text


def test_fingerprints_per_step_and_a_resumed_sweep_redoes_a_step_whose_files_changed(run, tmp_path):
    from vlmfast.checkpoints.fingerprint import fingerprint
    from vlmfast.run.sweep import sweep

    moved = tmp_path / "run"
    shutil.copytree(run["run"], moved)
    inputs = dict(run, run=moved)
    report = sweep(_options(inputs, tmp_path / "out"))
    digests = {c["step"]: c["fingerprint"] for c in report["checkpoints"]}
    assert len(set(digests.values())) == 3 and digests[100] == fingerprint(moved / "checkpoint-100")["digest"]
    record = json.loads((tmp_path / "out" / "step-100.run.json").read_text())
    assert record["fingerprint"] == digests[100]
    again = sweep(_options(inputs, tmp_path / "out"))  # nothing changed: read back, nothing redone
    assert [c["fingerprint"] for c in again["checkpoints"]] == list(digests.values())
    assert not any("changed since" in n for n in again["notes"])
    shutil.rmtree(moved / "checkpoint-100")
    shutil.copytree(run["run"] / "checkpoint-300", moved / "checkpoint-100")  # overwritten in place by the trainer
    redone = sweep(_options(inputs, tmp_path / "out"))
    [said] = [n for n in redone["notes"] if "changed since" in n and "step-100.jsonl" in n]
    [aside] = list((tmp_path / "out").glob("replaced-*"))  # the earlier rows are kept, not deleted
    assert said.endswith(f"(the earlier rows are in {aside})")
    assert sorted(p.name for p in aside.iterdir()) == ["step-100.jsonl", "step-100.run.json"]
    by_step = {c["step"]: c for c in redone["checkpoints"]}
    assert by_step[100]["fingerprint"] == digests[300]
    assert (f"steps 100, 300 have identical weights (fingerprint {digests[300]}): the same model saved twice, or a copy"
            in redone["notes"]) and not any("identical weights" in n for n in report["notes"])
    assert _tokens(read_jsonl(by_step[100]["results"])) == _tokens(run["fresh"][300])  # its rows are the new weights'


def test_base_takes_a_hub_id_as_bench_compare_base_does(run, tmp_path, monkeypatch):
    """--base Qwen/Qwen2.5-VL-3B-Instruct (the README's first sweep): a hub id is located as infer and bench
    locate one (here from the local Hugging Face cache, offline), and its rows are the base directory's."""
    from huggingface_hub import constants

    from vlmfast.run.sweep import sweep

    cache = tmp_path / "hub"
    repo = cache / "models--tinyorg--tiny-base"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    shutil.copytree(run["base"], repo / "snapshots" / ("0" * 40))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    by_id = sweep(_options(run, tmp_path / "hub-base", base="tinyorg/tiny-base", steps=(100,)))
    by_dir = sweep(_options(run, tmp_path / "dir-base", base=str(run["base"]), steps=(100,)))
    assert [c["label"] for c in by_id["checkpoints"]] == ["base", by_dir["checkpoints"][1]["label"]]
    assert _tokens(read_jsonl(tmp_path / "hub-base" / "base.jsonl")) == _tokens(read_jsonl(tmp_path / "dir-base" / "base.jsonl"))


def test_a_sweep_reads_vlmr1_jsonl_as_it_is(run, tmp_path):
    """VLM-R1's own lines ("image", "conversations") are a sweep's evaluation set with no convert step: the
    same prompts as the vlmfast manifest they mirror, so the same tokens, and the truth scored."""
    from vlmfast.run.sweep import sweep

    lines = [json.loads(line) for line in run["manifest"].read_text().splitlines()]
    vlmr1 = tmp_path / "vlmr1.jsonl"
    vlmr1.write_text("".join(json.dumps({"id": line["id"], "image": line["image"], "accu_reward_method": "default",
                                         "conversations": [{"from": "human", "value": "<image>" + line["prompt"]},
                                                           {"from": "gpt", "value": line["solution"]}]}) + "\n"
                             for line in lines))
    options = _options(run, tmp_path / "s", steps=(200,))
    report = sweep(dataclasses.replace(options, infer=dataclasses.replace(options.infer, manifest=str(vlmr1))))
    assert _tokens(read_jsonl(tmp_path / "s" / "step-200.jsonl")) == _tokens(run["fresh"][200])
    assert report["checkpoints"][0]["accuracy"] is not None


def test_sampling_without_a_seed_draws_one_seed_for_every_checkpoint_and_keeps_it_on_resume(run, tmp_path):
    """Sampled answers, no --seed: every checkpoint draws with the same seed (the same noise: differences
    between steps are the weights'), recorded beside each step's rows and taken again by a resumed sweep."""
    from vlmfast.run.sweep import sweep
    from vlmfast.run.sweep_record import sidecar

    sampled = dataclasses.replace(SETTINGS, temperature=1.0)
    options = _options(run, tmp_path / "out", steps=(100, 200))
    options = dataclasses.replace(options, infer=dataclasses.replace(options.infer, generation=sampled))
    first = sweep(options)
    seeds = {json.loads(sidecar(tmp_path / "out" / f"step-{s}.jsonl").read_text())["settings"]["generation"]["seed"]
             for s in (100, 200)}
    [seed] = seeds
    assert f"--seed {seed} drawn for this run: pass it to draw the same answers again" in first["notes"]
    (tmp_path / "out" / "step-200.jsonl").unlink()
    sidecar(tmp_path / "out" / "step-200.jsonl").unlink()
    rows = read_jsonl(tmp_path / "out" / "step-100.jsonl")
    again = sweep(dataclasses.replace(options, steps=(100, 200, 300)))
    assert f"--seed {seed}: the seed the earlier rows were drawn with, kept for the rows to come" in again["notes"]
    assert read_jsonl(tmp_path / "out" / "step-100.jsonl") == rows and [c["step"] for c in again["checkpoints"]] == [100, 200, 300]


def test_accuracy_says_how_many_answers_it_is_over_when_some_requests_have_no_ground_truth(run, tmp_path):
    from vlmfast.run.sweep import sweep

    lines = read_jsonl(run["manifest"])
    manifest = tmp_path / "half.jsonl"
    manifest.write_text("".join(json.dumps({k: v for k, v in r.items() if i < 2 or k != "solution"}) + "\n"
                                for i, r in enumerate(lines)))
    options = _options(run, tmp_path / "out", steps=(200,))
    options = dataclasses.replace(options, infer=dataclasses.replace(options.infer, manifest=str(manifest)))
    report = sweep(options)
    [step] = report["checkpoints"]
    assert (step["rows"], step["scored"], step["accuracy"]) == (4, 2, 1.0)
    assert "accuracy is over the answers with ground truth: 2 of 4 at step 200 (2 have none in the manifest)" in report["notes"]


def test_a_manifest_without_ground_truth_is_said_before_any_checkpoint_and_refused_with_a_gate(run, tmp_path):
    from vlmfast.errors import UsageError
    from vlmfast.run.sweep import sweep

    manifest = tmp_path / "none.jsonl"
    manifest.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "solution"}) + "\n"
                                for r in read_jsonl(run["manifest"])))
    options = _options(run, tmp_path / "out", steps=(100,))
    options = dataclasses.replace(options, infer=dataclasses.replace(options.infer, manifest=str(manifest)))
    said = []
    report = sweep(options, say=said.append)
    want = f"{manifest} has no ground truth in any record: accuracy and the best step will be none"
    assert said[0] == want and want in report["notes"] and report["best"] is None
    with pytest.raises(UsageError, match="--fail-if-best-below needs ground truth") as caught:
        sweep(dataclasses.replace(options, out_dir=str(tmp_path / "gated"), fail_if_best_below=0.5))
    assert "solution" in caught.value.hint and not (tmp_path / "gated").exists()


def test_retry_errors_redoes_only_the_error_rows_of_every_step(run, tmp_path, images):
    """--skip-bad made error rows for an image that was missing; once it is there, --retry-errors redoes those
    rows at every step and reads the rest back (--overwrite would redo everything)."""
    from vlmfast.errors import UsageError
    from vlmfast.run.sweep import sweep

    late = tmp_path / "late.png"
    lines = read_jsonl(run["manifest"])
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(dict(r, image=str(late)) if i == 1 else r) + "\n" for i, r in enumerate(lines)))
    options = _options(run, tmp_path / "out", steps=(100, 200))
    options = dataclasses.replace(options, infer=dataclasses.replace(options.infer, manifest=str(manifest), skip_bad=True))
    first = sweep(options)
    assert [c["errors"] for c in first["checkpoints"]] == [1, 1]
    kept = {s: [r for r in read_jsonl(tmp_path / "out" / f"step-{s}.jsonl") if r["error"] is None] for s in (100, 200)}
    shutil.copy(lines[1]["image"], late)
    again = sweep(dataclasses.replace(options, retry_errors=True))
    assert [c["errors"] for c in again["checkpoints"]] == [0, 0]
    for s in (100, 200):
        rows = read_jsonl(tmp_path / "out" / f"step-{s}.jsonl")
        assert [r["id"] for r in rows] == [r["id"] for r in lines] and [r for r in rows if r["id"] != lines[1]["id"]] == kept[s]
    assert _tokens(read_jsonl(tmp_path / "out" / "step-200.jsonl"))[1] == _tokens(run["fresh"][200])[1]
    with pytest.raises(UsageError, match="--overwrite starts afresh; --retry-errors"):
        dataclasses.replace(options, retry_errors=True, overwrite=True)


def test_a_sweep_stopped_inside_a_checkpoint_reports_the_finished_ones_and_exits_130(run, tmp_path, monkeypatch):
    """Ctrl-C inside a checkpoint's run (the runner's Interrupted) or between them: the finished checkpoints
    are reported, the gate is not judged on part of a sweep, and the exit code says it stopped early —
    except under --watch, whose way to stop is Ctrl-C."""
    import vlmfast.run.runner as runner
    from vlmfast.errors import Interrupted
    from vlmfast.run.sweep import sweep

    real = runner.infer

    def stopped_at_200(options, *args, **kwargs):
        if options.ckpt.endswith("checkpoint-200"):
            raise Interrupted("interrupted: this run's 1 finished row(s) are in …", hint="rerun")
        return real(options, *args, **kwargs)

    monkeypatch.setattr(runner, "infer", stopped_at_200)
    report = sweep(_options(run, tmp_path / "s", fail_if_best_below=0.99))
    assert [c["step"] for c in report["checkpoints"]] == [100]
    assert report["interrupted"] and report["exit_code"] == 130 and report["gate"] is None
    assert report["error"]["exit_code"] == 130 and report["error"]["message"].startswith("interrupted:")  # as --json's errors
    assert any(n.startswith("interrupted: the finished checkpoints are reported") for n in report["notes"])
    watched = sweep(_options(run, tmp_path / "w", watch=True, poll_s=1.0))  # stopped in its first pass
    assert watched["interrupted"] and watched["exit_code"] == 0 and [c["step"] for c in watched["checkpoints"]] == [100]
    gated = sweep(_options(run, tmp_path / "g", watch=True, poll_s=1.0, fail_if_best_below=0.99))  # --watch's stop
    assert gated["gate"]["failed"] and gated["exit_code"] == 5  # judged on the checkpoints evaluated


def test_a_sweep_that_could_evaluate_no_checkpoint_is_an_error(run, tmp_path):
    from vlmfast.errors import CheckpointError
    from vlmfast.run.sweep import sweep

    broken = tmp_path / "run" / "checkpoint-5"
    shutil.copytree(run["run"] / "checkpoint-100", broken)
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "model_type": "qwen9_vl"}))
    options = _options(run, tmp_path / "s")
    options = dataclasses.replace(options, run_dir=str(tmp_path / "run"),
                                  infer=dataclasses.replace(options.infer, ckpt=str(tmp_path / "run")))
    with pytest.raises(CheckpointError, match=r"no checkpoint of .*run could be evaluated:\n  - step 5: "):
        sweep(options)
    assert not (tmp_path / "s").exists()  # nothing written


def test_a_second_sweep_into_the_same_folder_is_refused_while_the_first_runs(run, tmp_path):
    from vlmfast.errors import UsageError
    from vlmfast.files import held_alone
    from vlmfast.run.sweep import sweep

    with held_alone(tmp_path / "s", "--out-dir"):
        with pytest.raises(UsageError, match="--out-dir .*s is being written by another vlmfast run"):
            sweep(_options(run, tmp_path / "s"))
    assert not (tmp_path / "s").exists() and not list(tmp_path.glob(".*lock"))


def test_sweep_by_a_column_gives_each_checkpoint_s_accuracy_per_value_and_the_best_step_of_each(run, tmp_path, monkeypatch):
    import io

    from rich.console import Console

    from vlmfast.report import terminal
    from vlmfast.run.sweep import sweep

    lines = run["manifest"].read_text().splitlines()
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({**json.loads(line), "meta": {"kind": "even" if k % 2 == 0 else "odd"}}) + "\n"
                                for k, line in enumerate(lines)))
    options = _options(run, tmp_path / "s", steps=(100, 200), by="meta.kind")
    options = dataclasses.replace(options, infer=dataclasses.replace(options.infer, manifest=str(manifest)))
    report = sweep(options)
    assert report["by"] == "meta.kind"
    for c in report["checkpoints"]:
        rows = read_jsonl(Path(c["results"]))
        want = {kind: sum(r["correct"] for k, r in enumerate(rows) if (k % 2 == 0) == (kind == "even")) / 2
                for kind in ("even", "odd")}
        assert {k: g["accuracy"] for k, g in c["by"].items()} == want and all(g["scored"] == 2 for g in c["by"].values())
    assert report["checkpoints"][1]["by"] == {"even": {"requests": 2, "scored": 2, "accuracy": 1.0},
                                                  "odd": {"requests": 2, "scored": 2, "accuracy": 1.0}}
    out = io.StringIO()
    monkeypatch.setattr(terminal, "stderr", Console(file=out, width=120, highlight=False))
    terminal.render_sweep(report)
    said = out.getvalue()
    assert "accuracy by meta.kind" in said and "best step by meta.kind: even: 200 (100.0%) · odd: 200 (100.0%)" in said, said
    with pytest.raises(Exception, match="--by category: no record of"):
        sweep(dataclasses.replace(options, by="category", out_dir=str(tmp_path / "t")))
    assert not (tmp_path / "t").exists()
