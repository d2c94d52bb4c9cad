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
