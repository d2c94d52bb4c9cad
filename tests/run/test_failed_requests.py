"""With --n K a request the run failed on counts once: where another step answered it, it stands for K wrong
answers, as an answered request stands for K answers — whether its results hold an error row per sample (as the
runner writes them, :func:`vlmfast.engines.rows.of_samples`) or one for the request (other tools, older results) —
and the step's samples figures agree."""

import dataclasses
import json

import pytest

ERROR = {"text": None, "finish_reason": None, "error": "out of memory even alone", "score": None, "correct": None}


def _write(path, spec, shape="per_sample"):
    """Rows of ``spec`` (id → per-sample verdicts, or "err": the run failed on it, or a list holding None for the
    samples it failed on) as ``shape`` says a failed request's rows are: "per_sample" (the runner with --n K: an
    error row for each of the K samples) or "one_row" (one error row, ``sample`` None)."""
    k = max(len(m) for m in spec.values() if m != "err")
    rows = []
    for rid, marks in spec.items():
        if marks == "err" and shape == "one_row":
            rows.append({"id": rid, "sample": None, **ERROR})
            continue
        for j, c in enumerate([None] * k if marks == "err" else marks):
            rows.append({"id": rid, "sample": j if k > 1 else None, **ERROR} if c is None else
                        {"id": rid, "sample": j if k > 1 else None, "text": f"<answer>{c}</answer>", "finish_reason": "eos",
                         "error": None, "score": float(c), "correct": bool(c), "format_ok": True, "scorer": "exact"})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def _figures(tmp_path, specs, shape="per_sample", **extra):
    from vlmfast.evaluation.flags import per_request
    from vlmfast.evaluation.stats import summarize

    figures, tables = [], {}
    for step, spec in specs.items():
        rows = _write(tmp_path / f"step-{step}.jsonl", spec, shape)
        ok = [r for r in rows if r["error"] is None]
        figures.append({"step": step, "label": "checkpoint", "results": str(tmp_path / f"step-{step}.jsonl"),
                        "rows": len(rows), "errors": len(rows) - len(ok), "samples": summarize(rows).get("samples"),
                        "accuracy": round(sum(r["correct"] for r in ok) / len(ok), 4),
                        **{k: f(rows) for k, f in extra.items()}})
        tables[step] = per_request(rows)
    return figures, tables


@pytest.mark.parametrize("shape", ["per_sample", "one_row"])
def test_a_failed_request_counts_as_k_wrong_answers(tmp_path, shape):
    from vlmfast.run.rescore import judge_failed

    specs = {100: {**{f"q{i}": [1] * 8 for i in range(9)}, **{f"q{i}": "err" for i in range(9, 12)}},  # 9 of 12
             200: {**{f"q{i}": [1] * 8 for i in range(11)}, "q11": [0] * 8}}  # 11 of 12
    figures, tables = _figures(tmp_path, specs, shape)
    said = judge_failed(figures, tables)
    by_step = {f["step"]: f for f in figures}
    # 72 of 96 answers, as 9 of 12 requests (was 72 of 75, 0.96, ranked best; with an error row per sample 72 of
    # 264: each of the 24 error rows made 8 answers)
    assert (by_step[100]["accuracy"], by_step[100]["scored"]) == (0.75, 96)
    samples = by_step[100]["samples"]
    assert samples["mean_at_k"] == 0.75 and samples["maj_at_k"] == 0.75 and samples["requests"] == 12
    assert samples["solve_rate_histogram"] == [3, 0, 0, 0, 0, 0, 0, 0, 9] and samples["requests_with_more_samples"] == 0
    assert tables[100]["q10"] == (0.0, False, False)
    assert max(figures, key=lambda f: f["accuracy"])["step"] == 200
    assert said == ["step 100: 3 request(s) the run failed on (e.g. q9: out of memory even alone) count as wrong "
                    "(24 wrong answer(s): each made up to 8 answers, as --n), as other checkpoints answered those requests"]


def test_a_request_failed_on_some_samples_counts_k_answers_its_own_kept(tmp_path):
    """vLLM's unfinished rows can be some of a request's samples: the answers it has stay, the rest are wrong,
    and the request has K answers, not its answers plus K."""
    from vlmfast.run.rescore import judge_failed

    specs = {100: {"q0": [1, 1, 1, 1], "q1": [1, None, 1, None]},
             200: {"q0": [1, 1, 1, 1], "q1": [1, 1, 1, 1]}}
    figures, tables = _figures(tmp_path, specs)
    said = judge_failed(figures, tables)
    assert "count as wrong (2 wrong answer(s): each made up to 4 answers, as --n)" in said[0]  # not 4 per request
    assert (figures[0]["scored"], figures[0]["accuracy"]) == (8, 0.75)
    assert tables[100]["q1"][0] == 0.5
    assert figures[0]["samples"]["solve_rate_histogram"] == [0, 0, 1, 0, 1]


def test_the_flags_judge_a_failed_request_once(tmp_path):
    """The per-request tables the page and the paired tests read: the failed request is K wrong answers."""
    from vlmfast.evaluation.flags import failed_as_wrong, judged_tables

    specs = {100: {"q0": [1, 1], "q1": "err"}, 200: {"q0": [1, 1], "q1": [1, 0]}}
    rows = {step: _write(tmp_path / f"{step}.jsonl", spec) for step, spec in specs.items()}
    judged, failed, k = failed_as_wrong(rows[100], {"q0", "q1"})
    assert k == 2 and [r["sample"] for r in failed] == [0]
    assert [(r["id"], r["sample"], r["correct"]) for r in judged] == [("q0", 0, True), ("q0", 1, True),
                                                                      ("q1", 0, False), ("q1", 1, False)]
    assert judged_tables(rows)[100] == {"q0": (1.0, True, True), "q1": (0.0, False, False)}


def test_by_groups_count_failed_requests_as_the_step_s_accuracy_does(tmp_path):
    """--by cat: a step that failed both 'hard' requests another step answered must not show 100 % on 'hard'."""
    from vlmfast.evaluation.stats import group_accuracy
    from vlmfast.run.rescore import judge_failed

    values = {"q0": "easy", "q1": "easy", "q2": "hard", "q3": "hard", "q4": "hard"}
    specs = {100: {"q0": [1], "q1": [1], "q2": [1], "q3": "err", "q4": "err"},
             200: {"q0": [1], "q1": [0], "q2": [1], "q3": [1], "q4": [0]}}
    figures, tables = _figures(tmp_path, specs, by=lambda rows: group_accuracy(rows, values, "cat"))
    assert figures[0]["by"]["hard"]["accuracy"] == 1.0  # as the step finished it: 1 of 1
    judge_failed(figures, tables, (values, "cat"))
    assert figures[0]["accuracy"] == 0.6
    assert figures[0]["by"]["hard"] == {"requests": 3, "scored": 3, "accuracy": 1 / 3}
    assert figures[0]["by"]["easy"]["accuracy"] == 1.0
    assert figures[1]["by"]["hard"]["accuracy"] == 2 / 3  # nothing failed: as it was


def test_the_coarse_search_steers_by_the_accuracy_with_failed_requests_counted_wrong():
    from vlmfast.run.search import search, steering_accuracy

    assert steering_accuracy({"accuracy": 8 / 9, "scored": 9, "errors": 3}) == 8 / 12
    # --n 4: a failed request is 4 error rows (errors) and one request (failed_requests), 4 wrong answers
    k4 = {"accuracy": 0.5, "scored": 8, "errors": 4, "failed_requests": 1, "samples": {"samples_per_request": 4}}
    assert steering_accuracy(k4) == 4 / 12
    # a request that failed on 2 of its 4 samples lacks 2 answers, not 4: steered as the report judges it (6 of 8)
    partial = {"accuracy": 1.0, "scored": 6, "errors": 2, "failed_requests": 1, "failed_answers": 2,
               "samples": {"samples_per_request": 4}}
    assert steering_accuracy(partial) == 6 / 8
    assert steering_accuracy({"accuracy": 0.5, "scored": 8, "errors": 0}) == 0.5
    assert steering_accuracy({"accuracy": None, "scored": 0, "errors": 3}) is None
    # step 300 finished 8 of 9 right and failed 3: as finished it looks best and draws the search to 200 and 400
    figures = {100: (0.5, 12, 0), 200: (0.55, 12, 0), 300: (8 / 9, 9, 3), 400: (0.6, 12, 0), 500: (0.7, 12, 0),
               600: (0.8, 12, 0), 700: (0.75, 12, 0)}
    looks = {s: {"accuracy": a, "scored": n, "errors": e} for s, (a, n, e) in figures.items()}
    evaluated = search(list(figures), lambda s: steering_accuracy(looks[s]), every=2)
    assert 600 in evaluated and max(evaluated, key=lambda s: steering_accuracy(looks[s])) == 600
    naive = search(list(figures), lambda s: looks[s]["accuracy"], every=2)
    assert 600 not in naive  # what steering by the finished rows alone would have missed


def test_a_sweep_with_n_counts_a_broken_image_once(tmp_path, images):
    """End to end: --n 2 --skip-bad on an image that is broken while steps 100 and 200 run and readable when
    step 300 does. The runner writes an error row per sample; step 100 then has 2 requests × 2 answers, its
    failed request 2 wrong ones, and the note says one request."""
    from vlmfast.checkpoints.tiny import build_checkpoint
    from vlmfast.engines.rows import GenerationSettings
    from vlmfast.run.options import InferOptions
    from vlmfast.run.sweep import SweepOptions, sweep

    for step, seed in ((100, 1), (200, 2), (300, 3)):
        build_checkpoint(tmp_path / "run" / f"checkpoint-{step}", preset="tiny", like="grpo", seed=seed)
    broken = tmp_path / "broken.png"
    broken.write_bytes(images[1].read_bytes()[:100])
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"id": rid, "image": str(image), "prompt": "Pick", "answer": answer,
                                            "scorer": "choice"}) + "\n"
                                for rid, image, answer in (("x1", images[0], "A"), ("x2", broken, "B"))))
    generation = GenerationSettings(max_new_tokens=4, n=2, temperature=1.0, seed=2)
    infer = InferOptions(ckpt=str(tmp_path / "run"), manifest=str(manifest), generation=generation, device="cpu",
                         skip_bad=True)
    options = SweepOptions(run_dir=str(tmp_path / "run"), out_dir=str(tmp_path / "out"), infer=infer, steps=(100, 200))
    sweep(options, say=lambda _: None)
    broken.write_bytes(images[1].read_bytes())
    report = sweep(dataclasses.replace(options, steps=None), say=lambda _: None)
    steps = {c["step"]: c for c in report["checkpoints"]}
    assert (steps[100]["rows"], steps[100]["errors"], steps[100]["scored"]) == (4, 2, 4)  # was scored 6
    assert len(steps[100]["samples"]["solve_rate_histogram"]) == 3 and steps[100]["samples"]["requests_with_more_samples"] == 0
    assert steps[100]["failed_requests"] == 1
    assert (steps[300]["errors"], steps[300]["failed_requests"]) == (0, 0)
    notes = [n for n in report["notes"] if n.startswith("step 100: ")]
    assert len(notes) == 1 and notes[0].startswith("step 100: 1 request(s) the run failed on (e.g. x2: ")
    assert "count as wrong (2 wrong answer(s): each made up to 2 answers, as --n)" in notes[0]
    assert steps[100]["failed_answers"] == 2
