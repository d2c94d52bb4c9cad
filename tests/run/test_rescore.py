"""Scores in the product: infer writes them into every row, `vlmfast score` recomputes them without a
model, `vlmfast convert` makes manifests with ground truth, bench gates on accuracy."""

import json
import shutil
from pathlib import Path

import pytest

from conftest import cli, read_jsonl
from vlmfast.run.bench_figures import BASE, CKPT, gate
from vlmfast.engines.hf.engine import GenerationSettings
from vlmfast.errors import InputError
from vlmfast.run.rescore import MAX_LISTED, read_result_rows, rescore_file
from vlmfast.run.runner import InferOptions, infer

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
SCORE_FIELDS = ("score", "correct", "format_ok", "scorer", "iou", "parse_failed", "bbox_unmapped")


def _scored_manifest(tmp_path, images) -> Path:
    """configs/scored.example.jsonl beside the test images (its paths are relative to itself)."""
    (tmp_path / "images").mkdir()
    for i in range(4):
        shutil.copyfile(images[i], tmp_path / "images" / f"img_{i:03d}.png")
    manifest = tmp_path / "scored.jsonl"
    shutil.copyfile(CONFIGS / "scored.example.jsonl", manifest)
    return manifest


def test_infer_writes_scores_and_score_recomputes_them_without_a_model(loaded, grpo_ckpt, images, tmp_path):
    manifest = _scored_manifest(tmp_path, images)
    out = tmp_path / "r.jsonl"
    report = infer(InferOptions(ckpt=str(grpo_ckpt), manifest=str(manifest), template="r1", out=str(out),
                                generation=GenerationSettings(max_new_tokens=8)), loaded=loaded)
    rows = read_jsonl(out)
    truths = [json.loads(line) for line in manifest.read_text().splitlines()]
    assert [r["id"] for r in rows] == [t["id"] for t in truths]
    assert [r["scorer"] for r in rows] == ["number", "choice", "bbox", "exact", "contains"][:len(rows)]
    assert all(r["score"] is not None and r["correct"] is (r["score"] == 1.0) for r in rows)
    assert rows[2]["iou"] is not None and rows[2]["bbox_unmapped"] is False  # sizes known: mapped back
    assert report.scores["scored"] == len(rows) and report.scores["accuracy"] == sum(r["correct"] for r in rows) / len(rows)

    rescored = tmp_path / "again.jsonl"
    r = cli("score", out, "--manifest", manifest, "--out", rescored, "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert [{k: row[k] for k in SCORE_FIELDS} for row in read_jsonl(rescored)] == [{k: row[k] for k in SCORE_FIELDS} for row in rows]
    assert summary["accuracy"] == report.scores["accuracy"] and summary["rows"] == len(rows)
    assert "vlmfast score" in r.stderr


def test_score_on_known_answers(tmp_path, images):
    manifest = _scored_manifest(tmp_path, images)
    rows = [
        {"id": "count-1", "text": "<think>one two three</think><answer>3</answer>", "answer": "3"},
        {"id": "mcq-1", "text": "<think>c</think><answer>(C) blue</answer>", "answer": "(C) blue"},
        {"id": "ground-1", "text": "<think>b</think><answer>[{\"bbox_2d\": [8, 10, 60, 96]}]</answer>",
         "answer": "[{\"bbox_2d\": [8, 10, 60, 96]}]", "image_sizes": [[112, 112]], "model_image_sizes": [[112, 112]]},
        {"id": "caption-1", "text": "<answer>no</answer>", "answer": "no"},
        {"id": "free-1", "text": "<think>x</think><answer>unclosed", "answer": None},
    ]
    results = tmp_path / "known.jsonl"
    results.write_text("".join(json.dumps({"finish_reason": "eos", "error": None, **r}) + "\n" for r in rows))
    r = cli("score", results, "--manifest", manifest, "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["scored"] == 5 and summary["accuracy"] == 3 / 5  # count, choice, box right; "no" and unclosed wrong
    assert summary["format_rate"] == 3 / 5 and summary["answer_parse_failures"] == 1
    assert summary["by_scorer"]["bbox"]["accuracy"] == 1.0 and summary["by_scorer"]["exact"]["accuracy"] == 0.0
    bad = cli("score", tmp_path / "missing.jsonl", "--manifest", manifest)
    assert bad.returncode == 2 and "no such results file" in bad.stderr
    bad = cli("score", tmp_path, "--manifest", manifest)
    assert bad.returncode == 2 and "a directory, not a results file" in bad.stderr
    bad = cli("score", results, "--manifest", manifest, "--bbox-space", "x")
    assert bad.returncode == 2 and "--bbox-space x" in bad.stderr, bad.stderr


def test_convert_through_the_cli(tmp_path):
    out = tmp_path / "rec.jsonl"
    r = cli("convert", CONFIGS / "vlmr1_rec.example.json", "--out", out, "--image-root", "/data/coco")
    assert r.returncode == 0, r.stderr
    rows = read_jsonl(out)
    assert rows and all("scorer" not in row and row["image"].startswith("/data/coco/") for row in rows)  # auto: a box
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [], "images": ["a.png"]}\n')
    r = cli("convert", bad, "--out", tmp_path / "x.jsonl", "--format", "swift")
    assert r.returncode == 2 and f"{bad}:1" in r.stderr and not (tmp_path / "x.jsonl").exists()


def test_accuracy_gate_exits_5_on_a_less_accurate_checkpoint():
    report = {"cache": {"found_off": []}, "scenarios": [
        {"name": CKPT, "batch_size": 8, "tokens_per_s": 100.0, "accuracy": 0.50},
        {"name": BASE, "batch_size": 8, "tokens_per_s": 100.0, "accuracy": 0.70}]}
    code, messages = gate(report, None, False, fail_if_less_accurate=0.05)
    assert code == 5 and "accuracy 0.500 < base 0.700 − 0.05 = 0.650" in messages[0]
    assert gate(report, None, False, fail_if_less_accurate=0.25) == (0, [])  # within the allowed drop
    unscored = {**report, "scenarios": [{**s, "accuracy": None} for s in report["scenarios"]]}
    code, messages = gate(unscored, None, False, fail_if_less_accurate=0.05)
    assert code == 2 and "no ground truth" in messages[0]
    both = gate(report, 1.0, True, fail_if_less_accurate=0.05)  # every tripped gate is reported
    assert both[0] == 5 and len(both[1]) == 1


def _manifest(tmp_path, truths: dict) -> Path:
    """A manifest of ``id → solution`` (None: a record without ground truth); images are never opened."""
    path = tmp_path / "truth.jsonl"
    path.write_text("".join(json.dumps({"id": rid, "image": f"{rid}.png", **({"solution": t} if t is not None else {})}) + "\n"
                            for rid, t in truths.items()))
    return path


def _results(tmp_path, rows, name="results.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_rows_of_another_tool_are_scored_from_their_text(tmp_path):
    """id + text + finish_reason only (a vLLM script's rows): the answers are in the text, 5 of 9 right."""
    manifest = _manifest(tmp_path, {f"q{i}": str(i) for i in range(9)})
    rows = [{"id": f"q{i}", "text": f"<think>counting</think><answer>{i if i < 5 else i + 1}</answer>", "finish_reason": "eos"}
            for i in range(9)]
    summary = rescore_file(_results(tmp_path, rows), str(manifest))
    assert (summary["scored"], summary["accuracy"], summary["answer_parse_failures"]) == (9, 5 / 9, 0)
    assert summary["rows_without_truth"] == 0 and summary["notes"] == []
    r = cli("score", tmp_path / "results.jsonl", "--manifest", manifest, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["accuracy"] == 5 / 9


def test_rows_of_another_tool_name_an_option_by_its_text_from_the_manifest_s_prompt(tmp_path):
    """id + text only: an answer that names an option by its text ("square") is read against the options of
    the manifest's prompt, as a row vlmfast wrote (which carries the prompt) is; the prompt is not written
    into the scored rows."""
    prompt = "Question: Which shape?\nOptions:\nA. square\nB. circle\nPlease select the correct answer from the options above. \n"
    manifest = tmp_path / "mcq.jsonl"
    manifest.write_text("".join(json.dumps({"id": rid, "image": f"{rid}.png", "prompt": prompt, "solution": "A",
                                            "scorer": "choice"}) + "\n" for rid in ("a", "b")))
    rows = [{"id": "a", "text": "square"}, {"id": "b", "text": "circle", "prompt": None}]
    out = tmp_path / "scored.jsonl"
    summary = rescore_file(_results(tmp_path, rows), str(manifest), out=out)
    assert (summary["scored"], summary["accuracy"], summary["answer_parse_failures"]) == (2, 0.5, 0)
    written = read_jsonl(out)
    assert [w["correct"] for w in written] == [True, False]
    assert "prompt" not in written[0] and written[1]["prompt"] is None  # as the rows had it


def test_other_fields_are_written_back_unchanged(tmp_path):
    manifest = _manifest(tmp_path, {"a": "3", "b": "B"})
    rows = [{"id": "a", "text": "<answer>3</answer>", "answer": "a stale 7", "latency_ms": 12.5, "meta": {"k": [1]}},
            {"id": "b", "text": None, "error": "timeout", "engine": "vllm"}]
    out = tmp_path / "scored.jsonl"
    summary = rescore_file(_results(tmp_path, rows), str(manifest), out=out)
    written = read_jsonl(out)
    assert [{k: w[k] for k in r} for w, r in zip(written, rows)] == rows  # every field kept as it was
    assert written[0]["correct"] is True and written[1]["score"] is None  # scored from the text; error row unscored
    assert summary["scored"] == 1


def test_rows_without_truth_count_manifest_records_without_one(tmp_path):
    manifest = _manifest(tmp_path, {"a": "1", "b": None})  # b: in the manifest, no ground truth
    rows = [{"id": i, "text": "<answer>1</answer>"} for i in ("a", "b", "zz")]  # zz: not in the manifest
    summary = rescore_file(_results(tmp_path, rows), str(manifest))
    assert (summary["rows"], summary["scored"], summary["rows_without_truth"], summary["rows_not_in_manifest"]) == (3, 1, 2, 1)
    assert any("1 of 3 row id(s) are not in" in n and "zz" in n for n in summary["notes"])


def test_a_repeated_id_is_said_and_its_last_row_scored(tmp_path):
    manifest = _manifest(tmp_path, {"a": "1", "b": "2"})
    rows = [{"id": "a", "text": "<answer>9</answer>"}, {"id": "b", "text": "<answer>2</answer>"},
            {"id": "a", "text": "<answer>1</answer>"}]
    summary = rescore_file(_results(tmp_path, rows), str(manifest))
    assert (summary["rows"], summary["accuracy"]) == (2, 1.0)
    assert any("1 row(s) repeat an earlier id and sample (a)" in n for n in summary["notes"])


def test_n_answer_rows_are_kept_by_id_and_sample_with_their_n_answer_figures(tmp_path):
    """A `--n 2` results file: every (id, sample) row is scored and written back, with pass@k figures."""
    manifest = _manifest(tmp_path, {"a": "1", "b": "2"})
    rows = [{"id": "a", "sample": 0, "text": "<answer>1</answer>"}, {"id": "a", "sample": 1, "text": "<answer>9</answer>"},
            {"id": "b", "sample": 0, "text": "<answer>7</answer>"}, {"id": "b", "sample": 1, "text": "<answer>8</answer>"}]
    out = tmp_path / "rescored.jsonl"
    summary = rescore_file(_results(tmp_path, rows), str(manifest), out=out)
    assert summary["rows"] == 4 and summary["accuracy"] == 0.25 and not summary["notes"]
    assert [(r["id"], r["sample"], r["correct"]) for r in read_jsonl(out)] == [
        ("a", 0, True), ("a", 1, False), ("b", 0, False), ("b", 1, False)]
    assert summary["samples"] is not None and summary["samples"]["pass_at_k"]["2"] == 0.5
    assert summary["samples"]["maj_at_k"] == 0.5  # votes read from the text (a: 1 and 9 tie, 1 first and right)
    said = cli("score", tmp_path / "results.jsonl", "--manifest", manifest)
    assert said.returncode == 0 and "n answers: pass@k · maj@k · all same reward: 50.0% · 50.0% · 50.0% (k=2)" in said.stderr


def test_n_long_plain_answers_all_right_are_right_by_majority(tmp_path):
    """Four untagged answers over 64 characters holding the truth, scorer `contains`: accuracy, pass@k and
    maj@k are all 1.0 (maj@k was 0.0: the vote read no answer in a long untagged text)."""
    text = "Looking at the plot, the quantity that keeps decreasing along every optimiser step is the gradient norm."
    manifest = tmp_path / "truth.jsonl"
    manifest.write_text(json.dumps({"id": "free-1", "image": "free-1.png", "solution": "gradient", "scorer": "contains"}) + "\n")
    results = _results(tmp_path, [{"id": "free-1", "sample": k, "text": text} for k in range(4)])
    r = cli("score", results, "--manifest", manifest, "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["accuracy"] == 1.0 and summary["samples"]["pass_at_k"]["4"] == 1.0
    assert summary["samples"]["maj_at_k"] == 1.0


def test_reward_options_without_a_reward_are_refused(tmp_path):
    manifest = _manifest(tmp_path, {"a": "1"})
    results = _results(tmp_path, [{"id": "a", "text": "<answer>1</answer>"}])
    said = cli("score", results, "--manifest", manifest, "--reward-weights", "1,2")
    assert said.returncode == 2 and "--reward-weights without --reward" in said.stderr


def test_reward_weights_and_threshold_that_are_not_finite_are_refused(tmp_path):
    """A NaN weight or threshold made every row wrong (NaN is never at the threshold) and wrote a bare NaN into
    JSON; an infinite weight made the mean infinite."""
    manifest = _manifest(tmp_path, {"a": "1"})
    results = _results(tmp_path, [{"id": "a", "text": "<answer>1</answer>"}])
    reward = tmp_path / "rw.py"
    reward.write_text("def acc(completions, **kwargs):\n    return [1.0 for _ in completions]\n")
    for flag, value in (("--reward-weights", "nan"), ("--reward-weights", "1e400"), ("--reward-threshold", "nan"),
                        ("--reward-threshold", "inf")):
        said = cli("score", results, "--manifest", manifest, "--reward", f"{reward}:acc", flag, value, "--json")
        assert said.returncode == 2 and f"{flag} " in said.stdout and "finite" in said.stdout, (flag, value, said.stdout)
        assert not (tmp_path / "results.scored.jsonl").exists()
    said = cli("score", results, "--manifest", manifest, "--reward", f"{reward}:acc", "--reward-threshold", "0.5", "--json")
    assert said.returncode == 0 and json.loads(said.stdout)["accuracy"] == 1.0, said.stdout


def test_a_torn_last_line_is_passed_over_with_a_note(tmp_path):
    manifest = _manifest(tmp_path, {"a": "1"})
    path = tmp_path / "torn.jsonl"
    path.write_text(json.dumps({"id": "a", "text": "<answer>1</answer>"}) + '\n{"id": "b", "te')
    summary = rescore_file(path, str(manifest))
    assert summary["rows"] == 1 and "torn last line" in summary["notes"][0]


def test_bad_lines_are_listed_with_their_numbers(tmp_path):
    manifest = _manifest(tmp_path, {"a": "1"})
    lines = [{"id": "a", "text": "<answer>1</answer>"}, "not json", "[1, 2]", {"id": "x"}, {"text": "t"},
             {"id": "n", "text": None}, {"id": "e", "text": None, "error": "boom"}, {"id": True, "text": "t"},
             {"id": "s", "text": "t", "bbox_space": "normalized"}, {"id": "t", "text": 5}]
    path = _results(tmp_path, lines)
    with pytest.raises(InputError) as exc:
        rescore_file(path, str(manifest))
    assert [p.split(":")[1] for p in exc.value.problems] == ["2", "3", "4", "5", "6", "8", "9", "10"]
    assert 'no "text" field' in exc.value.problems[2] and 'no "id" field' in exc.value.problems[3]
    assert "only error rows may lack text" in exc.value.problems[4]
    assert "refusing" not in exc.value.message and '"id"' in exc.value.hint and '"text"' in exc.value.hint
    r = cli("score", path, "--manifest", manifest)
    assert r.returncode == 2 and f"{path}:2: not a JSON line" in r.stderr and "8 bad line(s)" in r.stderr


def test_many_bad_lines_are_capped_in_the_message(tmp_path):
    path = _results(tmp_path, [{"id": str(i)} for i in range(MAX_LISTED + 10)])
    with pytest.raises(InputError) as exc:
        rescore_file(path, str(_manifest(tmp_path, {"a": "1"})))
    assert len(exc.value.problems) == MAX_LISTED + 10
    assert exc.value.message.count("\n  - ") == MAX_LISTED and exc.value.message.endswith("… and 10 more")
    assert read_result_rows(_results(tmp_path, [{"id": 7, "text": "x"}], "ok.jsonl")) == ([{"id": 7, "text": "x"}], [])


def test_score_on_a_partial_results_file_names_the_ids_without_rows(tmp_path, images):
    from vlmfast.run.rescore import rescore_file

    manifest = _scored_manifest(tmp_path, images)
    results = tmp_path / "partial.jsonl"
    results.write_text(json.dumps({"id": "count-1", "text": "<answer>3</answer>", "error": None}) + "\n")
    summary = rescore_file(results, str(manifest))
    assert summary["rows"] == 1 and summary["manifest_ids_without_rows"] == 4
    note = next(n for n in summary["notes"] if "have no row" in n)
    assert note.startswith("4 of 5 manifest id(s) have no row in") and "mcq-1" in note and "count-1" not in note


def test_no_row_id_in_the_manifest_exits_2_naming_both_sides(tmp_path):
    manifest = _manifest(tmp_path, {"a": "1", "b": "2"})
    results = _results(tmp_path, [{"id": "x", "text": "<answer>1</answer>"}, {"id": "y", "text": "2"}])
    r = cli("score", results, "--manifest", manifest, "--out", tmp_path / "scored.jsonl")
    assert r.returncode == 2 and "none of the 2 row id(s)" in r.stderr and "rows have x, y" in r.stderr
    assert "the manifest has a, b" in r.stderr and "hint:" in r.stderr and not (tmp_path / "scored.jsonl").exists()


def test_a_manifest_without_truth_it_recognises_exits_2_naming_the_fields(tmp_path, images):
    """A VLM-R1 training line: the truth is its second "conversations" turn, which a vlmfast manifest
    does not carry; every score would be None."""
    line = {"id": "r0", "image": str(images[0]), "prompt": "Where is the cat?", "gt": [1, 2, 3, 4]}
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps(line) + "\n")
    results = _results(tmp_path, [{"id": "r0", "text": "<answer>[1, 2, 3, 4]</answer>"}])
    r = cli("score", results, "--manifest", manifest)
    assert r.returncode == 2 and "no ground truth in any of the 1 matched record(s)" in r.stderr
    assert '"solution", "answer"' in r.stderr and '"gt"' in r.stderr and 'as "solution"' in r.stderr


def test_a_results_file_given_as_the_manifest_is_named_as_such(tmp_path, images):
    """Rows of an infer run carry images and a prompt, so they read as requests, and their "answer" is the
    model's (null here): the message says the file is results, not where the ground truth is."""
    row = {"id": "r0", "images": [str(images[0])], "prompt": "Count.", "text": "ip cat", "answer": None,
           "finish_reason": "length", "n_new_tokens": 4}
    results = _results(tmp_path, [row])
    r = cli("score", results, "--manifest", results)
    assert r.returncode == 2 and "no ground truth in any of the 1 matched record(s)" in r.stderr
    assert f"{results} is a vlmfast results file" in r.stderr and "not a manifest" in r.stderr


def test_score_refuses_to_write_over_its_manifest_and_may_rescore_in_place(tmp_path):
    manifest = _manifest(tmp_path, {"a": "1", "b": "2"})
    results = _results(tmp_path, [{"id": "a", "text": "<answer>1</answer>"}, {"id": "b", "text": "<answer>3</answer>"}])
    truth = Path(manifest).read_text()
    r = cli("score", results, "--manifest", manifest, "--out", manifest)
    assert r.returncode == 2 and "is one of this run's inputs" in r.stderr and "hint:" in r.stderr
    assert Path(manifest).read_text() == truth  # the ground truth untouched
    r = cli("score", results, "--manifest", manifest, "--out", results)  # rescoring the results in place
    assert r.returncode == 0, r.stderr
    assert [row["correct"] for row in map(json.loads, Path(results).read_text().splitlines())] == [True, False]


def test_error_rows_and_uneven_answer_counts_are_said(tmp_path):
    """An error row (the run failed on its input) has no answer to score: it is counted, and the accuracy that
    counts it as wrong is given beside the one that leaves it out. Requests with uneven answer counts (a run
    cut short mid-request) are said with the k pass@k goes to."""
    manifest = _manifest(tmp_path, {"a": "1", "b": "2", "c": "3"})
    rows = [{"id": "a", "text": "<answer>1</answer>"}, {"id": "b", "text": None, "error": "image unreadable"},
            {"id": "c", "text": "<answer>3</answer>"}]
    summary = rescore_file(_results(tmp_path, rows), str(manifest))
    assert (summary["accuracy"], summary["error_rows"]) == (1.0, 1)
    assert any("1 error row(s) with ground truth" in n and "counted as wrong it is 66.7% (2 of 3)" in n for n in summary["notes"])
    uneven = [{"id": "a", "sample": 0, "text": "<answer>1</answer>"}, {"id": "a", "sample": 1, "text": "<answer>1</answer>"},
              {"id": "b", "sample": 0, "text": "<answer>2</answer>"}]
    summary = rescore_file(_results(tmp_path, uneven), str(manifest))
    assert summary["samples"]["samples_per_request"] == 1 and summary["samples"]["requests_with_more_samples"] == 1
    assert any("uneven answer counts: 1 of 2 have more than the fewest (1)" in n for n in summary["notes"])


def test_a_report_json_given_as_results_is_named_as_such(tmp_path):
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"results": [{"id": "a", "text": "1"}], "tokens_per_s": 12.0}, indent=1))
    with pytest.raises(InputError, match="one JSON document over .* lines \\(a report\\?\\), not a results JSONL") as err:
        read_result_rows(report)
    assert "--out file of vlmfast infer" in err.value.hint


def test_rows_under_the_ids_convert_0_18_9_gave_score_against_the_manifest_converted_again(tmp_path):
    """A manifest written by vlmfast convert in 0.18.9 and earlier named id-less ms-swift records NNNNN_<image stem>; converted
    again today it names them by their first image (ranked). Rows made from the old manifest are matched to the
    record at that position and written under today's id; where the file holds a row under today's id already,
    the earlier one is left unscored as before (not two answers to one request)."""
    from vlmfast.inputs.convert import convert_file, write_manifest

    source = tmp_path / "swift.jsonl"
    source.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"<image>Q{i}?"}], "images": [image],
                                          "solution": str(i)}) + "\n" for i, image in enumerate(["a.png", "a.png", "b.png"])))
    manifest = write_manifest(convert_file(str(source)), str(tmp_path / "m.jsonl"))
    rows = [{"id": rid, "prompt": f"Q{i}?", "text": f"<answer>{i}</answer>"} for i, rid in enumerate(["00000_a", "00001_a", "00002_b"])]
    results, out = _results(tmp_path, rows), tmp_path / "rescored.jsonl"
    summary = rescore_file(results, str(manifest), out=out)
    assert (summary["scored"], summary["accuracy"], summary["rows_not_in_manifest"]) == (3, 1.0, 0)
    assert [r["id"] for r in read_jsonl(out)] == ["a.png", "a.png#2", "b.png"]
    assert any(n.startswith("3 row(s) carry the id an earlier vlmfast convert gave their record") for n in summary["notes"])
    both = _results(tmp_path, rows[:2] + [{"id": "a.png", "prompt": "Q0?", "text": "<answer>0</answer>"}], name="both.jsonl")
    summary = rescore_file(both, str(manifest))
    assert (summary["scored"], summary["rows_not_in_manifest"]) == (2, 1)  # a.png and a.png#2; 00000_a left unscored
