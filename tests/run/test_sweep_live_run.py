"""A sweep against a run the trainer changes under it: a checkpoint deleted while it is copied in
(save_total_limit), and a checkpoint rewritten in place between a killed sweep and its resume."""

import json
import shutil

from conftest import read_jsonl
from test_sweep import _options, _tokens, run  # noqa: F401 (the module's run fixture)


def test_a_checkpoint_deleted_while_it_is_swapped_in_is_not_evaluated_and_the_sweep_goes_on(run, tmp_path, monkeypatch):
    import vlmfast.checkpoints.swap as swap
    from vlmfast.run.sweep import sweep

    live = tmp_path / "live"
    shutil.copytree(run["run"], live)
    real = swap.plan_swap

    def then_deleted(loaded, directory):  # the trainer's save_total_limit removes it while the sweep copies it in
        plan = real(loaded, directory)
        if directory.name == "checkpoint-200":
            shutil.rmtree(directory)
        return plan

    monkeypatch.setattr(swap, "plan_swap", then_deleted)
    options = _options(run, tmp_path / "s")
    report = sweep(type(options)(**{**options.__dict__, "run_dir": str(live)}))
    assert [c["step"] for c in report["checkpoints"]] == [100, 300]
    [gone] = report["not_evaluated"]
    assert gone["step"] == 200 and "its files went away while it was being loaded" in gone["reason"]
    # the half-copied model is not reused: step 300 is loaded afresh and answers as a fresh load does
    assert _tokens(read_jsonl(tmp_path / "s" / "step-300.jsonl")) == _tokens(run["fresh"][300])


def test_a_sweep_killed_inside_a_checkpoint_does_not_resume_onto_weights_rewritten_in_place(run, tmp_path, monkeypatch):
    import vlmfast.run.runner as runner
    from vlmfast.checkpoints.fingerprint import fingerprint
    from vlmfast.run.sweep import sweep

    live = tmp_path / "live"
    shutil.copytree(run["run"] / "checkpoint-200", live / "checkpoint-200")
    options = _options(run, tmp_path / "s")
    options = type(options)(**{**options.__dict__, "run_dir": str(live)})

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run_batches", killed)
    assert sweep(options)["interrupted"]
    record = json.loads((tmp_path / "s" / "step-200.run.json").read_text())
    # what made the rows to come is recorded before the first of them: a resume is checked against it
    assert record["fingerprint"] == fingerprint(live / "checkpoint-200")["digest"]
    (tmp_path / "s" / "step-200.jsonl").write_text(json.dumps(run["fresh"][200][0]) + "\n")  # one row, then killed
    monkeypatch.undo()
    shutil.rmtree(live / "checkpoint-200")  # a rerun of the training into the same output dir
    shutil.copytree(run["run"] / "checkpoint-300", live / "checkpoint-200")
    report = sweep(options)
    assert any("step-200.jsonl: the checkpoint's weight files changed since" in n for n in report["notes"])
    assert _tokens(read_jsonl(tmp_path / "s" / "step-200.jsonl")) == _tokens(run["fresh"][300])  # no row of the old weights


def test_watch_evaluates_again_a_checkpoint_rewritten_in_place(run, tmp_path):
    from vlmfast.run.sweep import sweep

    live = tmp_path / "live"
    shutil.copytree(run["run"] / "checkpoint-100", live / "checkpoint-100")
    looks, logged = [], []

    def wait(seconds):
        looks.append(seconds)
        if len(looks) == 1:  # a rerun of the training into the same output dir saves checkpoint-100 again
            shutil.copyfile(run["run"] / "checkpoint-300" / "model.safetensors", live / "checkpoint-100" / "model.safetensors")
        return len(looks) < 3

    options = _options(run, tmp_path / "s", watch=True, poll_s=1)
    report = sweep(type(options)(**{**options.__dict__, "run_dir": str(live)}), wait=wait,
                   on_report=lambda so_far: logged.append([c["fingerprint"] for c in so_far["checkpoints"]]))
    [c] = report["checkpoints"]
    assert _tokens(read_jsonl(c["results"])) == _tokens(run["fresh"][300])  # the rows of the weights there now
    assert any("step-100.jsonl: the checkpoint's weight files changed since" in n for n in report["notes"])
    assert len(logged) == 2 and logged[0] != logged[1]  # the trackers got the step again, with its new figures


def test_a_step_whose_checkpoint_was_deleted_after_it_was_evaluated_stays_in_the_report(run, tmp_path):
    """save_total_limit deletes old checkpoints: a rerun (or a restarted --watch) listed only the ones left, so the
    best step vanished from the report (a gate then judged the rest) and from the trackers' history. Its finished
    rows are reported as they were, marked gone, said; its figures are the ones it had."""
    from vlmfast.run.sweep import sweep

    live = tmp_path / "live"
    shutil.copytree(run["run"], live)
    options = _options(run, tmp_path / "s", steps=None)
    options = type(options)(**{**options.__dict__, "run_dir": str(live)})
    first = sweep(options)
    shutil.rmtree(live / "checkpoint-100")
    again = sweep(options)
    by_step = {c["step"]: c for c in again["checkpoints"]}
    assert sorted(by_step) == [100, 200, 300] and by_step[100]["gone"] and not by_step[200].get("gone")
    before = {c["step"]: c for c in first["checkpoints"]}
    assert (by_step[100]["accuracy"], by_step[100]["scored"]) == (before[100]["accuracy"], before[100]["scored"])
    assert by_step[100]["path"] == str(live / "checkpoint-100")
    assert any(n.startswith("step 100: its checkpoint is no longer in") for n in again["notes"])
    assert again["best"]["step"] == first["best"]["step"]
    shutil.rmtree(live / "checkpoint-300")  # --steps keeps to the steps it names
    only = sweep(type(options)(**{**options.__dict__, "steps": (200,)}))
    assert [c["step"] for c in only["checkpoints"]] == [200]


def test_another_runs_steps_in_the_same_out_dir_are_not_gone_steps_of_this_run(run, tmp_path):
    """A second run swept into the --out-dir of a first: the first run's step files are not this run's deleted
    checkpoints (they still exist, elsewhere), nor candidates for its best step or its gate."""
    from vlmfast.run.sweep import sweep

    one, two = tmp_path / "one", tmp_path / "two"
    shutil.copytree(run["run"] / "checkpoint-100", one / "checkpoint-100")
    shutil.copytree(run["run"] / "checkpoint-200", two / "checkpoint-200")
    options = _options(run, tmp_path / "s", steps=None)
    sweep(type(options)(**{**options.__dict__, "run_dir": str(one)}))
    report = sweep(type(options)(**{**options.__dict__, "run_dir": str(two)}))
    assert [(c["step"], c.get("gone")) for c in report["checkpoints"]] == [(200, None)]
    assert not any("no longer in" in n for n in report["notes"])


def test_watch_does_not_digest_unchanged_checkpoints_again_at_every_look(run, tmp_path, monkeypatch):
    """--fingerprint full reads every byte: re-digesting every evaluated checkpoint at each look of --watch reads
    the whole run again every --poll seconds. Only a checkpoint whose files changed is digested again."""
    import vlmfast.checkpoints.fingerprint as fp
    from vlmfast.run.sweep import sweep

    live = tmp_path / "live"
    shutil.copytree(run["run"] / "checkpoint-100", live / "checkpoint-100")
    calls, real = [], fp.weights_fingerprint
    monkeypatch.setattr(fp, "weights_fingerprint", lambda *a, **k: calls.append(a) or real(*a, **k))
    looks = []
    options = _options(run, tmp_path / "s", watch=True, poll_s=1)
    sweep(type(options)(**{**options.__dict__, "run_dir": str(live)}),
          wait=lambda s: looks.append(s) or len(looks) < 5)
    assert len(calls) <= 2  # evaluated once, looked at once: not once per look
