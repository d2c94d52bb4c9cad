import dataclasses
import json

import pytest

from conftest import read_jsonl
from vlmfast.engines.hf.engine import GenerationSettings
from vlmfast.run.runner import InferOptions, infer


def _options(grpo_ckpt, images, out, **kw):
    kw.setdefault("generation", GenerationSettings(max_new_tokens=8))
    return InferOptions(ckpt=str(grpo_ckpt), images=[str(p) for p in images], prompt="Count.", out=str(out),
                        batch_size=4, **kw)


def test_results_in_input_order_and_report_adds_up(loaded, grpo_ckpt, images, tmp_path):
    shuffled = [images[i] for i in (3, 0, 5, 1, 4, 2)]
    report = infer(_options(grpo_ckpt, shuffled, tmp_path / "r.jsonl"), loaded=loaded)
    assert [r.id for r in report.results] == [str(p) for p in shuffled]
    assert [row["id"] for row in read_jsonl(tmp_path / "r.jsonl")] == [str(p) for p in shuffled]
    assert report.new_tokens == sum(r.n_new_tokens for r in report.results)
    assert report.finish["eos"] + report.finish["length"] == report.samples == 6
    assert report.batches == 2 and report.ttft_ms_p50 is not None and report.tokens_per_s > 0
    assert json.loads(json.dumps(report.as_dict()))["cache"]["forced_on"] is True


def test_resume_after_a_crash_completes_every_id_exactly_once(loaded, grpo_ckpt, images, tmp_path):
    out = tmp_path / "r.jsonl"
    full = infer(_options(grpo_ckpt, images, tmp_path / "full.jsonl"), loaded=loaded)
    rows = read_jsonl(tmp_path / "full.jsonl")
    # a run that died after two rows, mid-way through writing the third
    out.write_text(json.dumps(rows[4]) + "\n" + json.dumps(rows[1]) + "\n" + json.dumps(rows[2])[:25])
    (tmp_path / "r.run.json").write_bytes((tmp_path / "full.run.json").read_bytes())  # written before the first row
    resumed = infer(_options(grpo_ckpt, images, out), loaded=loaded)
    assert resumed.skipped_existing == 2 and resumed.samples == 4
    assert any("torn last line" in n for n in resumed.notes)
    assert read_jsonl(out) == rows  # same rows, same order, nothing duplicated, nothing lost
    assert {r.id: r.token_ids for r in resumed.results} == {r.id: r.token_ids for r in full.results if r.id not in (rows[4]["id"], rows[1]["id"])}


def test_retry_errors_redoes_only_error_rows_and_keeps_one_row_per_id(loaded, grpo_ckpt, images, tmp_path):
    import shutil

    broken = tmp_path / "late.png"
    broken.write_text("arrives later")
    paths = [str(images[0]), str(broken)]
    out = tmp_path / "r.jsonl"
    opts = dict(ckpt=str(grpo_ckpt), images=paths, prompt="Count.", out=str(out), skip_bad=True,
                generation=GenerationSettings(max_new_tokens=4))
    first = infer(InferOptions(**opts), loaded=loaded)
    assert first.errors == 1 and "not a readable image" in read_jsonl(out)[1]["error"]
    good_row = read_jsonl(out)[0]
    shutil.copyfile(images[1], broken)  # the user fixes the file
    again = infer(InferOptions(**opts), loaded=loaded)
    assert again.samples == 0 and read_jsonl(out)[1]["error"] is not None  # plain resume keeps the error row
    retried = infer(InferOptions(**opts, retry_errors=True), loaded=loaded)
    rows = read_jsonl(out)
    assert retried.samples == 1 and retried.skipped_existing == 1
    assert [r["id"] for r in rows] == paths and rows[1]["error"] is None and rows[1]["n_new_tokens"] >= 1
    assert rows[0] == good_row  # the good row was not redone


def test_skip_bad_error_rows_keep_input_order_in_the_file_and_on_stdout(loaded, grpo_ckpt, images, tmp_path):
    from conftest import cli

    broken = tmp_path / "broken.png"
    broken.write_text("not an image")
    paths = [str(images[0]), str(broken), str(tmp_path / "gone.png"), str(images[1]), str(tmp_path / "none-*.png")]
    out = tmp_path / "r.jsonl"
    report = infer(InferOptions(ckpt=str(grpo_ckpt), images=paths, prompt="Count.", out=str(out), skip_bad=True,
                                generation=GenerationSettings(max_new_tokens=3)), loaded=loaded)
    rows = read_jsonl(out)
    assert [r["id"] for r in rows] == paths and [r.id for r in report.results] == paths
    assert [r["error"] is None for r in rows] == [True, False, False, True, False]
    streamed = cli("infer", "--ckpt", grpo_ckpt, "--images", *paths, "--prompt", "Count.", "--skip-bad",
                   "--max-new-tokens", 3)
    assert streamed.returncode == 0, streamed.stderr
    assert [json.loads(line)["id"] for line in streamed.stdout.splitlines()] == paths  # stdout rows in input order too


def test_a_resume_only_run_reports_no_rate(loaded, grpo_ckpt, images, tmp_path):
    out = tmp_path / "r.jsonl"
    infer(_options(grpo_ckpt, images[:2], out), loaded=loaded)
    again = infer(_options(grpo_ckpt, images[:2], out), loaded=loaded)
    assert (again.samples, again.skipped_existing) == (0, 2)
    assert again.tokens_per_s is None and again.samples_per_s is None  # not "0.0 tokens/s"


def test_n_sampled_answers_resume_by_id_and_sample(loaded, grpo_ckpt, images, tmp_path, monkeypatch):
    """--n 3: three rows per id (sample 0, 1, 2) in input order; a run killed part-way decodes only the
    answers the file lacks, and every (id, sample) ends up in the file once; a seed repeats a run."""
    from vlmfast.engines.hf.engine import Engine

    settings = GenerationSettings(max_new_tokens=6, temperature=1.0, n=3, seed=11, ignore_eos=True)
    paths = [str(p) for p in images[:4]]

    def run(out):
        return infer(InferOptions(ckpt=str(grpo_ckpt), images=paths, prompt="Count.", out=str(out), batch_size=6,
                                  generation=settings), loaded=loaded)

    full = run(tmp_path / "full.jsonl")
    rows = read_jsonl(tmp_path / "full.jsonl")
    assert [(r["id"], r["sample"]) for r in rows] == [(p, k) for p in paths for k in range(3)]
    assert full.samples == 12 and full.batches == 2  # 6 answers a batch: 2 requests × 3
    rerun = run(tmp_path / "full.jsonl")  # everything done: nothing runs, the file stays as it was
    assert (rerun.samples, rerun.skipped_existing) == (0, 4) and read_jsonl(tmp_path / "full.jsonl") == rows
    out = tmp_path / "r.jsonl"
    kept = {**rows[3], "text": "an answer written before the kill"}  # marked: a rerun would not write this text
    out.write_text("".join(json.dumps(r) + "\n" for r in [*rows[:3], kept]))  # request 0 whole, request 1 one answer of 3
    (tmp_path / "r.run.json").write_bytes((tmp_path / "full.run.json").read_bytes())  # written before the first row
    decoded = []
    result = Engine.result
    monkeypatch.setattr(Engine, "result", lambda self, request, *a: decoded.append(request.id) or result(self, request, *a))
    resumed = run(out)
    assert resumed.skipped_existing == 1 and resumed.samples == 8  # the answer request 1 has is not given twice
    assert sorted(decoded) == sorted([paths[1]] * 2 + [p for p in paths[2:] for _ in range(3)])  # nor decoded again
    assert [(r["id"], r["sample"]) for r in read_jsonl(out)] == [(p, k) for p in paths for k in range(3)]
    assert read_jsonl(out)[:4] == [*rows[:3], kept]  # answers already written are kept, not redone
    assert read_jsonl(out)[4:] == rows[4:]  # the seed draws the same answers for the rest


def test_a_batch_size_below_n_is_raised_to_n_and_said(loaded, grpo_ckpt, images, tmp_path):
    settings = GenerationSettings(max_new_tokens=4, temperature=1.0, n=3, seed=1)
    report = infer(InferOptions(ckpt=str(grpo_ckpt), images=[str(p) for p in images[:2]], prompt="Count.",
                                out=str(tmp_path / "r.jsonl"), batch_size=2, generation=settings), loaded=loaded)
    assert report.batch_size == 3 and report.samples == 6
    assert any("batch size 2 is below --n 3: 3 decode rows" in n for n in report.notes), report.notes


def test_no_more_decode_rows_than_answers_to_give(loaded, grpo_ckpt, images, tmp_path):
    """--batch-size 4096 for 2 requests held 4096 decode rows of KV cache (on a GPU, memory for nothing, or an
    out-of-memory error); the rows are one per answer to give, said, and the tokens are the same."""
    opts = dict(ckpt=str(grpo_ckpt), images=[str(p) for p in images[:2]], prompt="Count.",
                generation=GenerationSettings(max_new_tokens=6, n=2, temperature=1.0, seed=3))
    wide = infer(InferOptions(**opts, out=str(tmp_path / "wide.jsonl"), batch_size=4096), loaded=loaded)
    assert wide.batch_size == 4 and any("4 decode rows, one per answer to give (batch size 4096)" in n
                                        for n in wide.notes), wide.notes
    exact = infer(InferOptions(**opts, out=str(tmp_path / "exact.jsonl"), batch_size=4), loaded=loaded)
    assert exact.batch_size == 4 and not any("one per answer" in n for n in exact.notes)
    assert [r.token_ids for r in wide.results] == [r.token_ids for r in exact.results]


def test_greedy_n_says_the_answers_are_identical(loaded, grpo_ckpt, images, tmp_path):
    report = infer(InferOptions(ckpt=str(grpo_ckpt), images=[str(images[0])], prompt="Count.", out=str(tmp_path / "r.jsonl"),
                                generation=GenerationSettings(max_new_tokens=4, n=2)), loaded=loaded)
    rows = read_jsonl(tmp_path / "r.jsonl")
    assert [r["sample"] for r in rows] == [0, 1] and rows[0]["text"] == rows[1]["text"]
    assert any("identical answers" in n for n in report.notes)


def test_sampling_without_a_seed_draws_one_records_it_and_a_resume_keeps_it(loaded, grpo_ckpt, images, tmp_path):
    """No --seed: the run draws one, says it and records it beside --out; a run that resumes the file takes the
    recorded one, so the rows it adds are the ones the first run would have drawn."""
    from vlmfast.run.sweep_record import sidecar

    settings = GenerationSettings(max_new_tokens=6, temperature=1.0, ignore_eos=True)
    out = tmp_path / "r.jsonl"
    first = infer(_options(grpo_ckpt, images[:4], out, generation=settings), loaded=loaded)
    seed = json.loads(sidecar(out).read_text())["settings"]["generation"]["seed"]
    assert isinstance(seed, int) and f"--seed {seed} drawn for this run: pass it to draw the same answers again" in first.notes
    rows = read_jsonl(out)
    out.write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
    resumed = infer(_options(grpo_ckpt, images[:4], out, generation=settings), loaded=loaded)
    assert f"--seed {seed}: the seed the earlier rows were drawn with, kept for the rows to come" in resumed.notes
    assert resumed.samples == 2 and read_jsonl(out) == rows
    again = infer(_options(grpo_ckpt, images[:4], tmp_path / "again.jsonl", generation=settings), loaded=loaded)
    assert any(n.endswith("drawn for this run: pass it to draw the same answers again") for n in again.notes)


def test_a_resume_onto_rows_made_from_other_weights_is_refused(grpo_ckpt, images, tmp_path):
    """The checkpoint's weight files changed between a run and its resume (a trainer saved over it): the new
    rows would come from another model. The fingerprint recorded beside --out says so before any work."""
    import shutil

    import pytest

    from vlmfast.checkpoints.tiny import build_checkpoint
    from vlmfast.errors import UsageError

    ckpt = shutil.copytree(grpo_ckpt, tmp_path / "ckpt")
    out = tmp_path / "r.jsonl"
    infer(_options(ckpt, images[:2], out))
    assert json.loads(out.with_name("r.run.json").read_text())["fingerprint"]
    other = build_checkpoint(tmp_path / "other", preset="tiny", like="grpo", seed=7)
    shutil.copy(other / "model.safetensors", ckpt / "model.safetensors")
    with pytest.raises(UsageError, match="holds rows made from other weights") as caught:
        infer(_options(ckpt, images[:4], out))
    assert "--overwrite" in caught.value.hint and len(read_jsonl(out)) == 2
    assert "the checkpoint's weight files changed since (fingerprint" in caught.value.message
    with pytest.raises(UsageError) as both:  # other weights and another prompt: one refusal names both
        infer(dataclasses.replace(_options(ckpt, images[:4], out), prompt="Name them."))
    assert "other weights" in both.value.message and 'and other settings: prompt: "Count." then, "Name them." now' \
        in both.value.message, both.value.message
    assert infer(_options(ckpt, images[:4], out, overwrite=True)).samples == 4


def test_a_resume_naming_another_checkpoint_says_so_not_that_files_changed(grpo_ckpt, images, tmp_path):
    """Rows made with --ckpt run/checkpoint-200, resumed with --ckpt run/checkpoint-300: no file changed, another
    checkpoint was named, and the refusal says which made the rows and which this run evaluates."""
    import shutil

    import pytest

    from vlmfast.checkpoints.tiny import build_checkpoint
    from vlmfast.errors import UsageError

    made = shutil.copytree(grpo_ckpt, tmp_path / "run" / "checkpoint-200")
    other = build_checkpoint(tmp_path / "run" / "checkpoint-300", preset="tiny", like="grpo", seed=7)
    out = tmp_path / "a.jsonl"
    infer(_options(made, images[:2], out))
    with pytest.raises(UsageError) as caught:
        infer(_options(other, images[:4], out))
    message = caught.value.message
    assert f"holds rows made from other weights: they were made from {made.resolve()} and this run evaluates " \
        f"{other.resolve()} (fingerprint" in message, message
    assert "weight files changed" not in message and "ckpt:" not in message  # the paths are said once
    assert "--overwrite" in caught.value.hint and len(read_jsonl(out)) == 2


def test_a_seed_outside_64_bits_is_a_usage_error():
    import pytest

    from vlmfast.errors import UsageError

    with pytest.raises(UsageError, match="--seed 9223372036854775808: expected a whole number from 0 to 2"):
        GenerationSettings(temperature=1.0, seed=2 ** 63)
    assert GenerationSettings(seed=2 ** 63 - 1).seed == 2 ** 63 - 1


def test_max_new_tokens_over_the_whole_context_is_refused_before_anything_is_written(loaded, grpo_ckpt, images, tmp_path):
    import pytest

    from vlmfast.errors import UsageError

    out = tmp_path / "r.jsonl"
    with pytest.raises(UsageError, match=r"--max-new-tokens 100000000 is more than the model's whole context") as err:
        infer(_options(grpo_ckpt, images[:1], out, generation=GenerationSettings(max_new_tokens=10**8)), loaded=loaded)
    assert err.value.exit_code == 2 and not list(tmp_path.iterdir())  # no rows, no record: nothing allocated either


def test_greedy_n_copies_are_not_counted_as_generated_tokens(loaded, grpo_ckpt, images, tmp_path):
    """Greedy --n 2: plain generate (--decoder hf) decodes each request once and writes the answer as both
    samples; only the decoded tokens count in new_tokens, tokens/s and row utilization. vlmfast's loop decodes
    both rows, and counts both."""
    settings = GenerationSettings(max_new_tokens=6, n=2, ignore_eos=True)
    reports = {}
    for decoder in ("hf", "vlmfast"):
        reports[decoder] = infer(InferOptions(ckpt=str(grpo_ckpt), images=[str(p) for p in images[:4]], prompt="Count.",
                                              out=str(tmp_path / f"{decoder}.jsonl"), batch_size=4, decoder=decoder,
                                              generation=settings), loaded=loaded)
        rows = read_jsonl(tmp_path / f"{decoder}.jsonl")
        assert len(rows) == reports[decoder].samples == 8 and all(r["n_new_tokens"] == 6 for r in rows)
    hf, own = reports["hf"], reports["vlmfast"]
    assert hf.batching == "static" and "--decoder hf: static batches" in " ".join(hf.notes)  # said, not silent
    assert hf.new_tokens == 4 * 6 and own.new_tokens == 8 * 6  # decoded once per request; twice per request
    assert hf.decode_row_utilization == own.decode_row_utilization == 1.0  # every row computed made a token
    # generate_s is rounded to 0.1 ms and tokens_per_s to 0.01: the rate lies within what those roundings allow
    low, high = hf.new_tokens / (hf.generate_s + 5e-5), hf.new_tokens / max(hf.generate_s - 5e-5, 1e-9)
    assert low - 0.005 <= hf.tokens_per_s <= high + 0.005


def test_decode_ms_per_token_is_decode_s_over_the_decode_steps_it_names(loaded, grpo_ckpt, images, tmp_path):
    """The report names the denominator of decode_ms_per_token: under continuous batching, the decode steps
    the loop says it took."""
    import re

    report = infer(_options(grpo_ckpt, images, tmp_path / "r.jsonl", generation=GenerationSettings(max_new_tokens=6,
                                                                                                  ignore_eos=True)),
                   loaded=loaded)
    said = next(n for n in report.notes if n.startswith("continuous batching:"))
    assert report.decode_steps == int(re.search(r"(\d+) decode steps", said).group(1)) == 2 * 5  # 6 answers, 4 rows
    assert report.as_dict()["decode_steps"] == report.decode_steps
    assert report.decode_ms_per_token == pytest.approx(report.decode_s * 1000 / report.decode_steps, abs=1e-2)  # decode_s is rounded to 0.1 ms
