"""The runner, the summary and the report's arithmetic through a fake backend: no model, no torch."""

import dataclasses
import json
import os

import pytest
from PIL import Image

from conftest import FakeBackend, read_jsonl
from vlmfast.errors import Interrupted, UsageError
from vlmfast.run.options import InferOptions
from vlmfast.run.runner import infer


def _images(tmp_path, sizes):
    paths = []
    for i, size in enumerate(sizes):
        path = tmp_path / f"im{i}.png"
        Image.new("RGB", size, (i * 30 % 255, 40, 90)).save(path)
        paths.append(str(path))
    return paths


@pytest.fixture
def small(tmp_path):
    return _images(tmp_path, [(56, 56), (84, 84), (112, 56), (56, 112)])


def _options(paths, out=None, **kw):
    return InferOptions(ckpt="fake", images=paths, prompt="Which?", out=str(out) if out else None, **kw)


def test_rows_written_scored_and_reported_in_input_order(small, tmp_path):
    out = tmp_path / "r.jsonl"
    report = infer(_options(small, out, batch_size=3), backend=FakeBackend(tokens=5))
    rows = read_jsonl(out)
    assert [r["id"] for r in rows] == small and all(r["answer"] == "A" and r["n_new_tokens"] == 5 for r in rows)
    assert (report.samples, report.new_tokens, report.batches, report.batch_size) == (4, 20, 2, 3)
    assert report.engine == "hf" and report.load_s == 0.5 and report.compile_s is None
    assert [r.id for r in report.results] == small and report.scores["format_rate"] == 1.0


class _EngineInOtherProcesses(FakeBackend):
    """vLLM's shape on a GPU machine: device "cuda", its model in processes of its own."""

    device = "cuda"

    def facts(self):
        return dataclasses.replace(super().facts(), device="cuda", peak_mem_kind="this process only (the engine's not counted)")


def test_an_engine_in_other_processes_reports_this_process_memory_and_starts_no_cuda_here(small, tmp_path):
    """This process holds none of such an engine's GPU memory: its peak is this process's resident memory, and
    CUDA is not started here for it (on a GPU machine a context on the first GPU in every launched process)."""
    report = infer(_options(small, tmp_path / "r.jsonl"), backend=_EngineInOtherProcesses())
    assert report.peak_mem_kind == "this process only (the engine's not counted)"
    assert report.peak_mem_mib > 0  # the resident memory (on a machine without CUDA, asking CUDA's allocator raised)


def test_a_resume_with_every_id_done_opens_no_engine(small, tmp_path, monkeypatch, base_ckpt):
    import shutil

    import vlmfast.engines.open
    from conftest import edit_json

    out = tmp_path / "r.jsonl"
    ckpt = tmp_path / "ckpt"
    shutil.copytree(base_ckpt, ckpt)  # whole weights: a checkpoint that would load, and is not loaded
    edit_json(ckpt / "config.json", lambda c: c.update(use_cache=False))
    infer(InferOptions(ckpt=str(ckpt), images=small, prompt="Which?", out=str(out)), backend=FakeBackend())

    def no_engine(*args, **kwargs):
        raise AssertionError("the engine (and the model) should not be opened")

    monkeypatch.setattr(vlmfast.engines.open, "open_backend", no_engine)
    report = infer(InferOptions(ckpt=str(ckpt), images=small, prompt="Which?", out=str(out)))
    assert report.samples == 0 and report.skipped_existing == 4 and report.load_s == 0.0
    assert report.cache["found_off"] == ["config.json: use_cache"]
    assert report.notes[0] == f"nothing to do: 4 row(s) already in {out}, the model was not loaded (--overwrite runs them again)"
    assert not any(n.startswith(("resuming:", "nothing to run")) for n in report.notes)  # said once, not three times
    assert report.scores["format_rate"] == 1.0  # the file's rows are still summarized


def test_the_results_file_is_read_once_per_run(small, tmp_path, monkeypatch):
    import vlmfast.run.results

    out = tmp_path / "r.jsonl"
    infer(_options(small[:2], out), backend=FakeBackend())
    reads = []
    real = vlmfast.run.results.read_existing
    monkeypatch.setattr(vlmfast.run.results, "read_existing", lambda *a, **k: reads.append(a) or real(*a, **k))
    report = infer(_options(small, out), backend=FakeBackend())
    assert len(reads) == 1 and report.samples == 2 and report.skipped_existing == 2
    assert [r["id"] for r in read_jsonl(out)] == small


def test_max_pixels_cap_is_said_only_when_an_image_was_larger(tmp_path):
    few = _images(tmp_path, [(56, 56), (84, 84)])
    quiet = infer(_options(few), backend=FakeBackend(max_pixels=10_000, capped=True))
    assert quiet.max_pixels_capped is False and not any("capped" in n for n in quiet.notes)
    big = _images(tmp_path / ".." / tmp_path.name, [(56, 56), (200, 100)])  # 20,000 pixels > 10,000
    loud = infer(_options(big), backend=FakeBackend(max_pixels=10_000, capped=True))
    assert loud.max_pixels_capped is True and any("max_pixels capped at 10000" in n for n in loud.notes)


def test_a_failing_batch_keeps_the_rows_before_it(small, tmp_path):
    out = tmp_path / "r.jsonl"
    with pytest.raises(RuntimeError, match="fake failure in batch 1"):
        infer(_options(small, out, batch_size=2), backend=FakeBackend(fail_at=1))
    assert [r["id"] for r in read_jsonl(out)] == small[:2]


def test_ctrl_c_says_what_is_on_disk(small, tmp_path):
    out = tmp_path / "r.jsonl"
    with pytest.raises(Interrupted, match=r"this run's 2 finished row\(s\) are in") as err:
        infer(_options(small, out, batch_size=2), backend=FakeBackend(interrupt_at=1))
    assert err.value.exit_code == 130 and "resume" in err.value.hint and len(read_jsonl(out)) == 2
    assert "--overwrite" not in err.value.hint
    with pytest.raises(Interrupted, match="before this run wrote a row"):
        infer(_options(small, tmp_path / "fresh.jsonl", batch_size=2), backend=FakeBackend(interrupt_at=0))
    with pytest.raises(Interrupted) as err:  # the same command again would redo the rows it just wrote
        infer(_options(small, out, batch_size=2, overwrite=True), backend=FakeBackend(interrupt_at=1))
    assert err.value.hint.startswith("rerun the same command without --overwrite to resume")
    report = infer(_options(small, out, batch_size=2), backend=FakeBackend())  # which resumes
    assert report.skipped_existing == 2 and report.samples == 2


def test_rows_without_their_settings_record_are_not_resumed(small, tmp_path):
    """Rows printed to stdout (or moved without their record) may come from another checkpoint or prompt:
    a resume onto them is refused, with nothing written."""
    out = tmp_path / "r.jsonl"
    infer(_options(small[:2], out), backend=FakeBackend())
    (tmp_path / "r.run.json").unlink()
    before = out.read_bytes()
    with pytest.raises(UsageError, match=r"holds rows but not the record .*\(r\.run\.json\)") as err:
        infer(_options(small, out), backend=FakeBackend())
    assert "--overwrite" in err.value.hint and out.read_bytes() == before and not (tmp_path / "r.run.json").exists()
    report = infer(_options(small, out, overwrite=True), backend=FakeBackend())
    assert report.samples == 4 and (tmp_path / "r.run.json").is_file()


@pytest.mark.parametrize("damaged", ["", "garbage{", "{}", "[1, 2]", '{"settings": null}'])
def test_rows_beside_a_damaged_record_are_not_resumed(small, tmp_path, damaged):
    """A record that is there but unreadable was read as "no difference": a resume with another --max-new-tokens
    completed the file from two settings and exited 0. It is refused as a missing record is, nothing written."""
    from vlmfast.engines.rows import GenerationSettings

    out = tmp_path / "r.jsonl"
    infer(_options(small[:2], out), backend=FakeBackend())
    (tmp_path / "r.run.json").write_text(damaged)
    before = out.read_bytes()
    options = InferOptions(ckpt="fake", images=small, prompt="Which?", out=str(out),
                           generation=GenerationSettings(max_new_tokens=9))
    backend = FakeBackend()
    with pytest.raises(UsageError, match=r"r\.run\.json: the record of the settings .* is unreadable") as err:
        infer(options, backend=backend)
    assert "--overwrite" in err.value.hint and backend.batches_run == 0 and out.read_bytes() == before
    assert infer(dataclasses.replace(options, overwrite=True), backend=FakeBackend()).samples == 4


def test_too_long_prompts_fail_before_running_or_become_error_rows(small, tmp_path):
    with pytest.raises(Exception, match="prompt is too long"):
        infer(_options(small), backend=FakeBackend(too_long=[small[1]]))
    out = tmp_path / "r.jsonl"
    report = infer(_options(small, out, skip_bad=True), backend=FakeBackend(too_long=[small[1]]))
    rows = {r["id"]: r for r in read_jsonl(out)}
    assert report.errors == 1 and "too long" in rows[small[1]]["error"] and rows[small[0]]["error"] is None


@pytest.mark.parametrize("kwargs,message", [
    (dict(overwrite=True, retry_errors=True, out="r.jsonl"), "--retry-errors resumes"),
    (dict(retry_errors=True), "act on a results file"),
    (dict(engine="vllm", device="cpu"), "--device applies to vlmfast's own engine"),
    (dict(engine="vllm", allow_missing=["visual.blocks.1"]), "--allow-missing applies to vlmfast's own engine"),
    (dict(image_root="/no/such/folder"), "--image-root /no/such/folder: no such folder"),
    (dict(decoder="fast"), "--decoder fast: unknown"),
    (dict(batch_size=0), "--batch-size 0"),
    (dict(iou=1.5), "--iou 1.5"),
    (dict(min_pixels=4096, max_pixels=1024), "--min-pixels 4096 > --max-pixels 1024"),
    (dict(scorer="nope"), "--scorer nope: unknown"),
])
def test_options_check_themselves(kwargs, message):
    with pytest.raises(UsageError, match=message):
        InferOptions(ckpt="x", images=["a.png"], prompt="p", **kwargs)


REWARD = '''
def accuracy(completions, solution, **kwargs):
    """TRL / VLM-R1 form: 1.0 when the <answer> equals the solution."""
    import re
    out = []
    for completion, truth in zip(completions, solution):
        text = completion[0]["content"]
        if "BOOM" in text:
            raise ValueError("the reward function broke")
        found = re.search(r"<answer>(.*?)</answer>", text)
        out.append(1.0 if found and found.group(1).strip() == truth else 0.0)
    return out
'''


def _manifest(tmp_path, paths, truths):
    m = tmp_path / "m.jsonl"
    m.write_text("".join(json.dumps({"id": f"q{i}", "image": p, "prompt": "Which?", "solution": t}) + "\n"
                         for i, (p, t) in enumerate(zip(paths, truths))))
    return m


def test_reward_function_scores_infer_and_score_alike(small, tmp_path):
    from vlmfast.run.rescore import rescore_file
    from vlmfast.evaluation.rewards import load_reward

    (tmp_path / "reward.py").write_text(REWARD)
    manifest = _manifest(tmp_path, small, ["A", "B", "A", "C"])
    out = tmp_path / "r.jsonl"
    spec = f"{tmp_path / 'reward.py'}:accuracy"
    report = infer(InferOptions(ckpt="fake", manifest=str(manifest), out=str(out), reward=spec),
                   backend=FakeBackend(answers={"q1": "B", "q3": "D"}))
    rows = read_jsonl(out)
    assert [r["score"] for r in rows] == [1.0, 1.0, 1.0, 0.0] and [r["correct"] for r in rows] == [True, True, True, False]
    assert {r["scorer"] for r in rows} == {"reward:accuracy"} and report.scores["accuracy"] == 0.75
    again = rescore_file(out, str(manifest), reward=load_reward(spec), out=tmp_path / "again.jsonl")
    assert read_jsonl(tmp_path / "again.jsonl") == rows and again["accuracy"] == 0.75


def test_a_reward_function_that_raises_stops_the_run_naming_it(small, tmp_path):
    from vlmfast.errors import RewardError

    (tmp_path / "reward.py").write_text(REWARD)
    manifest = _manifest(tmp_path, small, ["A", "A", "A", "A"])
    out = tmp_path / "r.jsonl"
    options = InferOptions(ckpt="fake", manifest=str(manifest), out=str(out), batch_size=2,
                           reward=f"{tmp_path / 'reward.py'}:accuracy")
    with pytest.raises(RewardError, match=r"accuracy.*q2.*ValueError: the reward function broke"):
        infer(options, backend=FakeBackend(answers={"q2": "BOOM"}))
    assert [r["id"] for r in read_jsonl(out)] == ["q0", "q1"]  # the failing batch wrote nothing
    report = infer(InferOptions(ckpt="fake", manifest=str(manifest), out=str(tmp_path / "s.jsonl"), batch_size=2,
                                skip_bad=True, reward=options.reward), backend=FakeBackend(answers={"q2": "BOOM"}))
    rows = {r["id"]: r for r in read_jsonl(tmp_path / "s.jsonl")}
    assert "the reward function broke" in rows["q2"]["reward_error"] and rows["q2"]["score"] is None
    assert rows["q3"]["score"] == 1.0 and report.samples == 4


def test_an_engine_that_compiled_in_an_earlier_run_still_reports_this_runs_rate(small):
    """A sweep keeps one engine: compile seconds spent on an earlier checkpoint are not this run's, so they
    come off neither its wall time nor its tokens/s (which was null once the step had been compiled)."""
    import dataclasses

    class CompiledBefore(FakeBackend):
        def facts(self):
            return dataclasses.replace(super().facts(), compile_s=1000.0, compiled=True)

    report = infer(_options(small), backend=CompiledBefore(tokens=5))
    assert report.compile_s is None and report.generate_s > 0
    assert report.tokens_per_s > 0 and report.new_tokens == 20  # (generate_s is rounded in the report)


def test_progress_counts_answers_against_answers_and_restarts_per_run(small, capsys):
    """With --n 3 the bar's total is requests × 3 (it counted answers against requests: 12/4); a second run on
    the same bar (a sweep's next checkpoint) starts its own count and rate."""
    from vlmfast.engines.rows import GenerationSettings
    from vlmfast.report.progress import ProgressBar

    bar = ProgressBar(enabled=True)
    bar.live = False  # plain lines, as in a CI log
    options = _options(small, generation=GenerationSettings(max_new_tokens=4, n=3, temperature=1.0, seed=0))
    infer(options, progress=bar, backend=FakeBackend(tokens=5))
    first = [line for line in capsys.readouterr().err.splitlines() if line.startswith("progress:")]
    infer(options, progress=bar, backend=FakeBackend(tokens=5))
    second = [line for line in capsys.readouterr().err.splitlines() if line.startswith("progress:")]
    assert first[-1].startswith("progress: 12/12 answers") and second[-1].startswith("progress: 12/12 answers")
    assert first[0].startswith("progress: 6/12 answers")  # batches of 2 requests × 3 answers


def test_a_library_call_without_out_returns_rows_and_prints_none(small, capsys):
    report = infer(_options(small), backend=FakeBackend())
    assert capsys.readouterr().out == ""
    assert [r.id for r in report.results] == small and all(r.text for r in report.results)


def test_sampled_answers_all_identical_are_said(tmp_path):
    from vlmfast.engines.rows import GenerationSettings

    five = _images(tmp_path, [(56, 56)] * 5)
    sampled = GenerationSettings(n=4, temperature=1.0, max_new_tokens=32)
    report = infer(_options(five, generation=sampled), backend=FakeBackend(tokens=20))  # the fake repeats itself
    assert any(n.startswith("5 of 5 requests got 4+ identical answers") for n in report.notes)
    report = infer(_options(five, generation=sampled), backend=FakeBackend(tokens=4))
    assert not any("identical answers" in n for n in report.notes)  # short answers may repeat by chance


@pytest.mark.parametrize("change, named", [({"ckpt": "other"}, "ckpt: "), ({"template": "r1"}, 'template: "plain" then, "r1" now'),
                                           ({"temperature": 0.7}, "generation.temperature: 0.0 then, 0.7 now"),
                                           ({"max_new_tokens": 9}, "generation.max_new_tokens: "),
                                           ({"n": 2}, "generation.n: 1 then, 2 now")])
def test_a_resume_with_other_settings_is_an_error_naming_them(small, tmp_path, change, named):
    """Rows made one way are never completed another way into one file: the settings are recorded beside
    --out (as a sweep records each step's), a rerun that differs stops before anything runs; --overwrite redoes."""
    from vlmfast.engines.rows import GenerationSettings

    out = tmp_path / "r.jsonl"
    infer(_options(small[:2], out), backend=FakeBackend())
    assert json.loads((tmp_path / "r.run.json").read_text())["settings"]["template"] == "plain"
    gen = {k: change[k] for k in ("temperature", "max_new_tokens", "n") if k in change}
    kw = {k: v for k, v in change.items() if k not in gen and k != "ckpt"}
    options = InferOptions(ckpt=change.get("ckpt", "fake"), images=small, prompt="Which?", out=str(out),
                           generation=GenerationSettings(**gen), **kw)
    backend = FakeBackend()
    with pytest.raises(UsageError, match="holds rows made with other settings") as exc:
        infer(options, backend=backend)
    assert named in exc.value.message and "--overwrite" in exc.value.hint and backend.batches_run == 0
    assert len(read_jsonl(out)) == 2
    report = infer(dataclasses.replace(options, overwrite=True), backend=FakeBackend())
    answers = 4 * options.generation.n
    assert report.samples == answers and report.skipped_existing == 0
    again = infer(options, backend=FakeBackend())  # now recorded with these settings: resumes
    assert again.samples == 0 and again.skipped_existing == 4


def test_a_sweep_step_cut_short_by_a_kill_resumes_on_the_record_infer_wrote(small, tmp_path):
    """infer records its settings when a step's first rows are written; the sweep that resumes that step
    compares its own settings with that record (the inputs, which infer does not record, are not compared)."""
    from vlmfast.run.sweep_record import check, settings_of

    out_dir = tmp_path / "sweep"
    options = _options(small, out_dir / "step-100.jsonl")
    infer(options, backend=FakeBackend())  # as a sweep runs a step; killed right after, before the sweep's record
    assert "ckpt" in json.loads((out_dir / "step-100.run.json").read_text())["settings"]
    assert check(out_dir, settings_of(options), overwrite=False) == []
    with pytest.raises(UsageError, match="template"):
        check(out_dir, settings_of(dataclasses.replace(options, template="r1")), overwrite=False)


def test_overwrite_keeps_the_old_rows_when_the_run_fails_before_it_can_write(small, tmp_path):
    """--overwrite replaces --out once the model is ready to run: a checkpoint that fails to load (here its
    weights file is cut short) leaves the earlier results as they were."""
    from vlmfast.errors import CheckpointError

    out = tmp_path / "r.jsonl"
    infer(_options(small, out), backend=FakeBackend(answers={small[0]: "old"}))
    before = out.read_bytes()
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl"}))
    (ckpt / "model.safetensors").write_bytes(b"")  # a save cut short
    with pytest.raises(CheckpointError, match="the weights are incomplete"):
        infer(InferOptions(ckpt=str(ckpt), images=small, prompt="Which?", out=str(out), overwrite=True))
    assert out.read_bytes() == before  # not a row lost
    infer(_options(small, out, overwrite=True), backend=FakeBackend())
    assert [r["answer"] for r in read_jsonl(out)] == ["A"] * 4  # a run that starts replaces them


def test_out_naming_an_input_is_refused_before_anything_is_written(small, tmp_path, base_ckpt):
    """--out that is the manifest, an image or a file of the checkpoint would replace what the run reads."""
    manifest = tmp_path / "val.jsonl"
    manifest.write_text("".join(json.dumps({"id": f"q{i}", "image": p, "prompt": "Which?"}) + "\n"
                                for i, p in enumerate(small)))
    text = manifest.read_text()
    with pytest.raises(UsageError, match="one of this run's inputs") as exc:
        infer(InferOptions(ckpt="fake", manifest=str(manifest), out=str(manifest), overwrite=True), backend=FakeBackend())
    assert "--out results.jsonl" in exc.value.hint and manifest.read_text() == text
    image = small[0]
    with pytest.raises(UsageError, match="one of this run's inputs"):
        infer(_options(small, image, overwrite=True), backend=FakeBackend())
    assert Image.open(image).size == (56, 56)
    linked = tmp_path / "linked.png"  # another name of the same file: results appended there would write into it
    os.link(image, linked)
    with pytest.raises(UsageError, match="one of this run's inputs"):
        infer(_options(small, linked, overwrite=True), backend=FakeBackend())
    assert Image.open(image).size == (56, 56)

    config = (base_ckpt / "config.json").read_bytes()
    with pytest.raises(UsageError, match="is a file of the checkpoint"):
        infer(InferOptions(ckpt=str(base_ckpt), images=small, prompt="Which?", out=str(base_ckpt / "config.json"), overwrite=True))
    assert (base_ckpt / "config.json").read_bytes() == config


def test_the_rate_counts_from_the_mark_not_from_the_load(capsys):
    """A benchmark marks where its timed runs begin: the tokens/s shown leave out the load and warm-up."""
    from vlmfast.report.progress import ProgressBar

    clock = iter([0.0, 100.0, 101.0, 102.0])  # start, mark (after 100 s of load and warm-up), two runs
    bar = ProgressBar(enabled=True, clock=clock.__next__)
    bar.live = False
    bar.start(2)
    bar.mark()
    bar.advance(1, 50)
    bar.advance(1, 50)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("progress:")]
    assert lines == ["progress: 1/2 answers, 50.0 tokens/s over the last 1.0 s",
                     "progress: 2/2 answers, 50.0 tokens/s over the last 2.0 s"]


def test_rows_of_an_earlier_version_under_resolved_paths_resume_under_today_s_ids(tmp_path):
    """0.12 named a manifest record without an id by its image path resolved against the manifest's folder;
    today by the path as written. A results file of 0.12 resumes: its rows take today's ids, their requests
    do not run again, and no request has two rows."""
    folder = tmp_path / "data"
    folder.mkdir()
    paths = _images(folder, [(56, 56), (84, 84), (112, 56)])
    manifest = folder / "m.jsonl"
    manifest.write_text("".join(json.dumps({"image": f"im{i}.png", "prompt": "Which?"}) + "\n" for i in range(3)))
    out = tmp_path / "r.jsonl"
    old = [{"id": str(folder / f"im{i}.png"), "images": [paths[i]], "prompt": "Which?", "text": "<answer>B</answer>",
            "think": None, "answer": "B", "finish_reason": "stop", "n_prompt_tokens": 9, "n_image_tokens": 4,
            "n_new_tokens": 3, "error": None} for i in range(2)]
    out.write_text("".join(json.dumps(r) + "\n" for r in old))
    first = tmp_path / "first.jsonl"  # the settings record a run with these settings writes beside its rows
    infer(InferOptions(ckpt="fake", manifest=str(manifest), out=str(first)), backend=FakeBackend(tokens=5))
    (tmp_path / "r.run.json").write_bytes((tmp_path / "first.run.json").read_bytes())
    report = infer(InferOptions(ckpt="fake", manifest=str(manifest), out=str(out)), backend=FakeBackend(tokens=5))
    rows = read_jsonl(out)
    assert [r["id"] for r in rows] == ["im0.png", "im1.png", "im2.png"]
    assert [r["answer"] for r in rows] == ["B", "B", "A"]  # the first two kept, only the third ran
    assert any(n.startswith("2 row(s) an earlier vlmfast wrote under another id") for n in report.notes)


def test_rows_of_a_manifest_converted_by_0_18_9_resume_into_its_reconversion(tmp_path):
    """vlmfast convert in 0.18.9 and earlier named an ms-swift record without an id NNNNN_<image stem>; today it writes the id
    --manifest gives the record read as it is (its first image as written). Results made from the old manifest
    resume into the manifest converted again at the same path: nothing is decoded again, no request has two rows,
    and score matches every row."""
    from conftest import cli
    from vlmfast.run.rescore import rescore_file

    data, conv = tmp_path / "data", tmp_path / "conv"
    (data / "images").mkdir(parents=True)
    conv.mkdir()
    for i in range(2):
        Image.new("RGB", (56, 56), (i * 60, 40, 90)).save(data / "images" / f"img_{i:03d}.png")
    records = [{"messages": [{"role": "user", "content": f"<image>Q{i}?"}], "images": [f"images/img_{i:03d}.png"],
                "solution": "AB"[i]} for i in range(2)]
    (data / "swift.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    manifest, out = conv / "m.jsonl", conv / "out.jsonl"
    manifest.write_text("".join(json.dumps({"id": f"{i:05d}_img_{i:03d}", "image": f"../data/images/img_{i:03d}.png",
                                            "prompt": f"Q{i}?", "solution": "AB"[i]}) + "\n" for i in range(2)))
    infer(InferOptions(ckpt="fake", manifest=str(manifest), out=str(out)), backend=FakeBackend(answers={"00001_img_001": "B"}))
    assert cli("convert", str(data / "swift.jsonl"), "--out", str(manifest)).returncode == 0
    assert [json.loads(line)["id"] for line in manifest.read_text().splitlines()] == ["images/img_000.png", "images/img_001.png"]
    backend = FakeBackend()
    report = infer(InferOptions(ckpt="fake", manifest=str(manifest), out=str(out)), backend=backend)
    assert report.samples == 0 and backend.batches_run == 0
    rows = read_jsonl(out)
    assert [r["id"] for r in rows] == ["images/img_000.png", "images/img_001.png"]
    assert [r["correct"] for r in rows] == [True, True]  # the earlier answers, scored against today's records
    assert any(n.startswith("2 row(s) an earlier vlmfast wrote under another id") for n in report.notes)
    summary = rescore_file(out, str(manifest))
    assert (summary["scored"], summary["rows_not_in_manifest"], summary["manifest_ids_without_rows"]) == (2, 0, 0)


def test_a_run_says_it_resumes_and_loads_before_its_first_answer(small, tmp_path, monkeypatch):
    """The load is a run's longest silence: what is loaded (and what a resume skips) is said before it."""
    import vlmfast.engines.open

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"model_type": "fake"}))  # no tensor list to check the file against
    header = json.dumps({"w": {"dtype": "F32", "shape": [256, 1024], "data_offsets": [0, 2**20]}}).encode()
    (ckpt / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(2**20))
    monkeypatch.setattr(vlmfast.engines.open, "open_backend", lambda *args, **kwargs: FakeBackend(tokens=3))

    class Said:
        def __init__(self):
            self.events = []

        def start(self, total):
            self.events.append(f"start {total}")

        def advance(self, answers, new_tokens):
            pass

        def note(self, text):
            self.events.append(text)

    out, said = tmp_path / "r.jsonl", Said()
    infer(InferOptions(ckpt=str(ckpt), images=small[:2], prompt="Which?", out=str(out)), progress=said)
    assert said.events == [f"loading {ckpt} (1.0 MiB of weights)", "start 2"]
    said.events.clear()
    infer(InferOptions(ckpt=str(ckpt), images=small, prompt="Which?", out=str(out)), progress=said)
    assert said.events == [f"resuming: 2 id(s) already in {out} were skipped (--overwrite redoes them)",
                           f"loading {ckpt} (1.0 MiB of weights)", "start 2"]
    said.events.clear()
    infer(_options(small[:1]), progress=said, backend=FakeBackend())  # an engine handed in: nothing to load
    assert said.events == ["start 1"]


def test_a_resume_on_another_dtype_or_device_is_said(small, tmp_path):
    """A run cut short on a GPU (bfloat16) and resumed on a CPU (float32): the settings match, so the rows are
    kept, but greedy answers differ between the two, which the report says."""
    out = tmp_path / "r.jsonl"

    class OnGpu(FakeBackend):
        def facts(self):
            return dataclasses.replace(super().facts(), device="cuda", dtype="bfloat16")

    infer(_options(small[:2], out), backend=OnGpu())
    assert json.loads((tmp_path / "r.run.json").read_text())["runtime"] == {"engine": "hf", "device": "cuda",
                                                                           "dtype": "bfloat16", "repetition_penalty": None}
    report = infer(_options(small, out), backend=FakeBackend())
    assert [n for n in report.notes if "another runtime" in n] == [
        f"{out}: the earlier rows were made on another runtime (device cuda then, cpu now; dtype bfloat16 then, "
        "float32 now): their answers may differ from this run's (--overwrite redoes them)"]
    report = infer(_options(small, out), backend=OnGpu())  # nothing to do: nothing said
    assert not any("another runtime" in n for n in report.notes)


def test_a_resume_decoding_with_another_repetition_penalty_is_refused(small, tmp_path):
    """Rows decoded without the checkpoint's penalty (vlmfast 0.14's loop applied none, and recorded none) and
    rows decoded with it do not mix: the resume is refused before a row is written."""
    def backend(penalty):
        class Penalized(FakeBackend):
            def facts(self):
                return dataclasses.replace(super().facts(), repetition_penalty=penalty)

        return Penalized()

    out = tmp_path / "r.jsonl"
    infer(_options(small[:2], out), backend=backend(1.0))
    with pytest.raises(UsageError, match="decoded with repetition penalty 1; this run applies 1.3") as err:
        infer(_options(small, out), backend=backend(1.3))
    assert "--repetition-penalty 1 to go on" in err.value.hint and len(read_jsonl(out)) == 2
    record = json.loads((tmp_path / "r.run.json").read_text())  # as 0.14 wrote it: no penalty anywhere
    del record["runtime"], record["settings"]["generation"]["repetition_penalty"]
    (tmp_path / "r.run.json").write_text(json.dumps(record))
    with pytest.raises(UsageError, match="decoded with repetition penalty 1; this run applies 1.05"):
        infer(_options(small, out), backend=backend(1.05))
    assert infer(_options(small, out), backend=backend(1.0)).samples == 2


def test_an_unreadable_line_s_error_row_of_0_14_resumes_under_today_s_id(small, tmp_path):
    """0.14 named a bad manifest line's error row by the manifest's path as given and the line; today by the
    file's name and the line: a resume keeps one row for it, not two."""
    folder = tmp_path / "mf"
    folder.mkdir()
    manifest = folder / "m.jsonl"
    manifest.write_text(json.dumps({"id": "a", "image": small[0], "prompt": "p"}) + "\n{not json\n"
                        + json.dumps({"id": "b", "image": small[1], "prompt": "p"}) + "\n")
    out = tmp_path / "r.jsonl"
    infer(InferOptions(ckpt="fake", manifest=str(manifest), out=str(out), skip_bad=True), backend=FakeBackend())
    rows = read_jsonl(out)
    assert [r["id"] for r in rows] == ["a", "m.jsonl:2", "b"]
    rows[1]["id"] = f"{manifest}:2"  # as 0.14 wrote it
    out.write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
    report = infer(InferOptions(ckpt="fake", manifest=str(manifest), out=str(out), skip_bad=True), backend=FakeBackend())
    assert [r["id"] for r in read_jsonl(out)] == ["a", "m.jsonl:2", "b"] and report.samples == 1


def test_a_resume_scores_kept_answers_against_today_s_truth_and_refuses_answers_to_other_requests(small, tmp_path):
    """A manifest whose answers were corrected after a run: the rows kept by a resume are scored again (and
    rewritten so). One whose id now names another prompt or another image (ids by position, rows removed or
    reordered) answered another request: refused. Lines only appended change nothing kept."""
    manifest, out = tmp_path / "m.jsonl", tmp_path / "r.jsonl"

    def write(truths, prompts=("Which?",) * 4, order=(0, 1, 2, 3)):
        manifest.write_text("".join(json.dumps({"id": f"q{k}", "image": str(small[i]), "prompt": q, "answer": t}) + "\n"
                                    for k, (i, t, q) in enumerate(zip(order, truths, prompts))))

    options = InferOptions(ckpt="fake", manifest=str(manifest), out=str(out))
    write(["A", "A", "B", "B"][:3], order=(0, 1, 2))
    assert infer(options, backend=FakeBackend()).scores["accuracy"] == 2 / 3
    write(["A", "A", "B", "B"])  # a line appended: the kept rows stand as they are, the new one runs
    report = infer(options, backend=FakeBackend())
    assert report.samples == 1 and not any("changed since" in n for n in report.notes)
    write(["A", "B", "B", "B"])  # q1's answer corrected: "A" is wrong now
    report = infer(options, backend=FakeBackend())
    assert report.scores["accuracy"] == 0.25 and [r["correct"] for r in read_jsonl(out)] == [True, False, False, False]
    assert f"{out}: {manifest} changed since the kept answers were written: they were scored again against its " \
           "ground truth, and 1 changed verdict" in report.notes
    assert not any("changed since" in n for n in infer(options, backend=FakeBackend()).notes)  # recorded: once
    write(["A", "B", "B", "B"], ("Which?", "How many?", "Which?", "Which?"))
    with pytest.raises(UsageError, match=r"answers to other requests than 1 id\(s\) name now \(q1\)"):
        infer(options, backend=FakeBackend())
    write(["A", "B", "B", "B"], order=(1, 0, 2, 3))  # rows reordered: q0 and q1 name each other's images
    with pytest.raises(UsageError, match=r"than 2 id\(s\) name now \(q0, q1\)"):
        infer(options, backend=FakeBackend())


def test_a_manifest_left_as_it_was_or_appended_to_is_unchanged_for_a_resume(tmp_path):
    """The state recorded beside the rows (a shortened digest and the size): the same file, or the same
    with lines appended, is unchanged; a line edited in place is not."""
    from vlmfast.run.sweep_record import manifest_state, manifest_unchanged, sidecar

    manifest, out = tmp_path / "m.jsonl", tmp_path / "r.jsonl"
    manifest.write_text('{"id": "a"}\n{"id": "b"}\n')
    sidecar(out).write_text(json.dumps({"manifest": manifest_state(manifest)}))
    assert manifest_unchanged(out, manifest)
    with manifest.open("a") as f:
        f.write('{"id": "c"}\n')
    assert manifest_unchanged(out, manifest)
    manifest.write_text('{"id": "a"}\n{"id": "B"}\n{"id": "c"}\n')
    assert not manifest_unchanged(out, manifest)


def test_kept_answers_a_reward_cannot_score_again_keep_their_scores(small, tmp_path):
    """Kept rows carry no token ids: a reward reading completion_ids raises on them when a changed manifest
    has them scored again. The resume goes on and their earlier rewards stand, said."""
    reward = tmp_path / "ids.py"
    reward.write_text("def by_ids(completions, completion_ids, **kwargs):\n"
                      "    return [len(ids) / 100 for ids in completion_ids]\n")
    manifest, out = tmp_path / "m.jsonl", tmp_path / "r.jsonl"
    lines = [json.dumps({"id": f"q{k}", "image": str(small[k]), "prompt": "Which?", "answer": "A"}) for k in range(3)]
    manifest.write_text("\n".join(lines[:2]) + "\n")
    options = InferOptions(ckpt="fake", manifest=str(manifest), out=str(out), reward=f"{reward}:by_ids")
    infer(options, backend=FakeBackend())
    kept = [r["score"] for r in read_jsonl(out)]
    assert all(s is not None for s in kept)
    manifest.write_text("\n".join([lines[0].replace('"A"', '"B"'), lines[1], lines[2]]) + "\n")  # edited in place
    report = infer(options, backend=FakeBackend())
    assert report.samples == 1 and [r["score"] for r in read_jsonl(out)][:2] == kept
    assert any("the reward function raised on 2 kept answer(s)" in n for n in report.notes)


def test_vllm_data_parallel_is_refused_before_anything_loads():
    """vLLM's LLM raises on data_parallel_size > 1 in one process (after the checkpoint is read): said first."""
    from vlmfast.engines.vllm.support import VllmSettings

    with pytest.raises(UsageError, match="--data-parallel-size 2: vLLM's offline engine runs one data-parallel replica") as exc:
        VllmSettings(data_parallel_size=2)
    assert "accelerate launch --num_processes 2 -m vlmfast infer --engine vllm" in exc.value.hint


def test_a_full_disk_is_one_error_saying_what_was_kept_and_how_to_resume(small, tmp_path, monkeypatch):
    import errno

    from vlmfast.errors import VlmfastError
    from vlmfast.run.results import ResultsWriter

    write = ResultsWriter.write
    calls = []

    def full(self, rows, positions):
        calls.append(len(rows))
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        write(self, rows, positions)

    monkeypatch.setattr(ResultsWriter, "write", full)
    out = tmp_path / "r.jsonl"
    with pytest.raises(VlmfastError) as err:
        infer(_options(small, out, batch_size=2), backend=FakeBackend())
    assert err.value.message == f"cannot write to {out}: No space left on device (2 answer(s) written before)"
    assert "rerun the same command to resume" in err.value.hint and err.value.exit_code == 1
    assert len(read_jsonl(out)) == 2


def test_a_second_run_onto_the_same_results_file_is_refused_while_the_first_runs(small, tmp_path):
    """Two runs appending to one --out mixed their rows under one record; the second is refused, naming the
    process that holds it, and nothing is left behind once the first is done."""
    from vlmfast.files import held_alone

    out = tmp_path / "r.jsonl"
    with held_alone(out, "--out"):  # the first run, here
        with pytest.raises(UsageError, match=rf"--out {out} is being written by another vlmfast run \(process {os.getpid()}\)"):
            infer(_options(small, out), backend=FakeBackend())
        assert not out.exists()
    assert infer(_options(small, out), backend=FakeBackend()).samples == len(small)
    assert not list(tmp_path.glob(".*lock"))  # no lock file left


def test_a_reader_gone_from_stdout_is_not_called_a_full_disk(small, monkeypatch):
    from vlmfast.run.results import ResultsWriter

    def gone(self, rows, positions):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(ResultsWriter, "write", gone)
    with pytest.raises(BrokenPipeError):
        infer(_options(small), backend=FakeBackend())


def test_the_image_root_is_recorded_resolved_and_compared_given_or_not(tmp_path, monkeypatch):
    from vlmfast.run.sweep_record import settings_of

    monkeypatch.chdir(tmp_path)
    (tmp_path / "B").mkdir()
    given = settings_of(InferOptions(ckpt="x", manifest="m.jsonl", image_root="B"), digest=False)
    assert given["image_root"] == str(tmp_path / "B")
    assert settings_of(InferOptions(ckpt="x", manifest="m.jsonl"), digest=False)["image_root"] is None


def test_a_record_from_before_the_resize_rule_ran_with_qwens(tmp_path):
    """Records written before --resize-rule existed have no such key: their rows were resized by Qwen's rule, so a
    resume with --resize-rule easyr1 stops and names it instead of adding rows resized another way."""
    from vlmfast.run.sweep_record import compare, settings_of

    old = settings_of(InferOptions(ckpt="x", manifest="m.jsonl"), digest=False)
    del old["resize_rule"]
    record = tmp_path / "r.run.json"
    record.write_text(json.dumps({"settings": old}))
    same = settings_of(InferOptions(ckpt="x", manifest="m.jsonl"), digest=False)
    compare(record, same, "other settings", hint="h")  # Qwen's rule now too: no error
    with pytest.raises(UsageError, match='resize_rule: "qwen" then, "easyr1" now'):
        compare(record, settings_of(InferOptions(ckpt="x", manifest="m.jsonl", resize_rule="easyr1"), digest=False),
                "other settings", hint="h")


def test_a_check_of_many_images_is_said_once_before_it_runs(tmp_path, monkeypatch, capsys):
    """Decoding each distinct image takes ~5 ms (4,000: 20 s of nothing on stderr): above the threshold (3
    here) a run says "checking N images …" once, before the check, on stderr off a terminal too; a run of
    the same images again (checked already in this process) and a run of few images say nothing; stdout
    stays the rows'."""
    from vlmfast.inputs import records
    from vlmfast.report.progress import ProgressBar

    monkeypatch.setattr(records, "SAY_CHECKING_ABOVE", 3)
    (tmp_path / "many").mkdir()
    (tmp_path / "few").mkdir()
    many = _images(tmp_path / "many", [(56, 56)] * 5)
    few = _images(tmp_path / "few", [(56, 56)] * 3)

    def said(paths) -> list[str]:
        bar = ProgressBar(enabled=True)
        bar.live = False  # a CI log
        infer(_options(paths + paths[:1]), progress=bar, backend=FakeBackend(tokens=3))  # a path named twice: one image
        captured = capsys.readouterr()
        assert "checking" not in captured.out
        return [line for line in captured.err.splitlines() if "checking" in line]

    assert said(many) == ["note: checking 5 images (each decoded whole, once: a cut or corrupt file is found now, not "
                          "mid-run) …"]
    assert said(many) == []  # decoded already: nothing to wait for
    assert said(few) == []
