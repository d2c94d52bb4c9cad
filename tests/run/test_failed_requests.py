"""With --n K a request the run failed on has one error row; counted wrong where another step answered it, it
stands for K wrong answers, as an answered request stands for K answers — and the step's samples figures agree."""

import json


def _write(path, spec):
    rows = []
    for rid, marks in spec.items():
        if marks == "err":
            rows.append({"id": rid, "sample": None, "text": None, "finish_reason": None, "error": "out of memory even alone",
                         "score": None, "correct": None})
        else:
            rows += [{"id": rid, "sample": k, "text": f"<answer>{c}</answer>", "finish_reason": "eos", "error": None,
                      "score": float(c), "correct": bool(c), "format_ok": True, "scorer": "exact"} for k, c in enumerate(marks)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def test_a_failed_request_counts_as_k_wrong_answers(tmp_path):
    from vlmfast.evaluation.flags import per_request
    from vlmfast.evaluation.stats import summarize
    from vlmfast.run.rescore import judge_failed

    specs = {100: {**{f"q{i}": [1] * 8 for i in range(9)}, **{f"q{i}": "err" for i in range(9, 12)}},  # 9 of 12
             200: {**{f"q{i}": [1] * 8 for i in range(11)}, "q11": [0] * 8}}  # 11 of 12
    figures, tables = [], {}
    for step, spec in specs.items():
        rows = _write(tmp_path / f"step-{step}.jsonl", spec)
        ok = [r for r in rows if r["error"] is None]
        figures.append({"step": step, "label": "checkpoint", "results": str(tmp_path / f"step-{step}.jsonl"),
                        "rows": len(rows), "errors": len(rows) - len(ok), "samples": summarize(rows)["samples"],
                        "accuracy": round(sum(r["correct"] for r in ok) / len(ok), 4)})
        tables[step] = per_request(rows)
    judge_failed(figures, tables)
    by_step = {f["step"]: f for f in figures}
    assert by_step[100]["accuracy"] == 0.75  # 72 of 96 answers, as 9 of 12 requests (was 72 of 75: 0.96, ranked best)
    assert by_step[100]["samples"]["mean_at_k"] == 0.75 and by_step[100]["samples"]["maj_at_k"] == 0.75
    assert max(figures, key=lambda f: f["accuracy"])["step"] == 200


def test_by_groups_count_failed_requests_as_the_step_s_accuracy_does(tmp_path):
    """--by cat: a step that failed both 'hard' requests another step answered must not show 100 % on 'hard'."""
    from vlmfast.evaluation.flags import per_request
    from vlmfast.evaluation.stats import group_accuracy
    from vlmfast.run.rescore import judge_failed

    values = {"q0": "easy", "q1": "easy", "q2": "hard", "q3": "hard", "q4": "hard"}
    specs = {100: {"q0": [1], "q1": [1], "q2": [1], "q3": "err", "q4": "err"},
             200: {"q0": [1], "q1": [0], "q2": [1], "q3": [1], "q4": [0]}}
    figures, tables = [], {}
    for step, spec in specs.items():
        rows = _write(tmp_path / f"step-{step}.jsonl", spec)
        ok = [r for r in rows if r["error"] is None]
        figures.append({"step": step, "label": "checkpoint", "results": str(tmp_path / f"step-{step}.jsonl"),
                        "rows": len(rows), "errors": len(rows) - len(ok), "by": group_accuracy(rows, values, "cat"),
                        "accuracy": round(sum(r["correct"] for r in ok) / len(ok), 4)})
        tables[step] = per_request(rows)
    assert figures[0]["by"]["hard"]["accuracy"] == 1.0  # as the step finished it: 1 of 1
    judge_failed(figures, tables, (values, "cat"))
    assert figures[0]["accuracy"] == 0.6
    assert figures[0]["by"]["hard"] == {"requests": 3, "scored": 3, "accuracy": 1 / 3}
    assert figures[0]["by"]["easy"]["accuracy"] == 1.0
    assert figures[1]["by"]["hard"]["accuracy"] == 2 / 3  # nothing failed: as it was


def test_the_coarse_search_steers_by_the_accuracy_with_failed_requests_counted_wrong():
    from vlmfast.run.search import search, steering_accuracy

    assert steering_accuracy({"accuracy": 8 / 9, "scored": 9, "errors": 3}) == 8 / 12
    assert steering_accuracy({"accuracy": 0.5, "scored": 8, "errors": 1, "samples": {"samples_per_request": 4}}) == 4 / 12
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
