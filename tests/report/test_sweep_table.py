"""The sweep's terminal table on a made report: within 100 columns, each step's difference from base with its
flips, its flags' short marks, and below it the engine's switches and every flag's message."""

import io

from rich.console import Console

from vlmfast.report import terminal


def _checkpoint(step, accuracy, low, high, **kw):
    return {"step": step, "label": "base" if step == 0 else "hf-trainer", "path": f"/run/checkpoint-{step}",
            "accuracy": accuracy, "ci_low": low, "ci_high": high, "format_rate": 1.0, "new_tokens_p50": 212.0,
            "new_tokens_p90": 1024.0, "truncation_rate": 0.025, "repetition_rate": 0.0, "tokens_per_s": 12345.6,
            "errors": 0, "reward_errors": 0, "vs_base": None, **kw}


REPORT = {
    "run_dir": "/runs/grpo-qwen2.5-vl-7b", "gate": None, "notes": [],
    "checkpoints": [
        _checkpoint(0, 0.4, 0.263, 0.554, load_s=12.34),
        _checkpoint(1200, 0.55, 0.398, 0.693, swap_s=1.2, truncation_rate=0.075,
                    vs_base={"n": 40, "difference": 0.125, "ci_low": 0.02, "ci_high": 0.23, "p_value": 0.03,
                             "wrong_to_right": 6, "right_to_wrong": 1}),
        _checkpoint(12000, 0.075, 0.026, 0.199, swap_s=1.4, repetition_rate=0.3,
                    vs_base={"n": 40, "difference": -0.325, "ci_low": -0.5, "ci_high": -0.15, "p_value": 0.0001,
                             "wrong_to_right": 0, "right_to_wrong": 13}),
    ],
    "best": {"step": 1200, "label": "hf-trainer", "path": "/run/checkpoint-1200", "accuracy": 0.55},
    "flags": [
        {"code": "truncation", "step": 1200, "figure": 0.075, "threshold": 0.05,
         "message": "step 1200: 8% of answers stopped at the length limit"},
        {"code": "repetition", "step": 12000, "figure": 0.3, "threshold": 0.05,
         "message": "step 12000: 30% of answers end in a repeated phrase"},
        {"code": "collapse_after_peak", "step": 12000, "figure": 0.075, "threshold": 0.398,
         "message": "step 12000: accuracy 7.5% is below the interval of the best step 1200 (from 39.8%)"},
    ],
}


def _render(monkeypatch, width):
    out = io.StringIO()
    monkeypatch.setattr(terminal, "stderr", Console(file=out, width=width, highlight=False, soft_wrap=True))
    terminal.render_sweep(REPORT)
    return out.getvalue().splitlines()


def test_sweep_table_fits_100_columns_with_flips_and_flag_marks(monkeypatch):
    lines = _render(monkeypatch, 100)
    table = lines[:lines.index("engine: loaded 1× (12.3 s) · swapped in place 2× (median 1.30 s)")]
    assert max(len(line) for line in table) <= 100
    rows = {line.split()[0]: line for line in table if line.split() and line.split()[0] in ("base", "1200", "12000")}
    assert rows["base"].split() == ["base", "40.0%", "(26–55%)", "–", "100%", "212/1024", "2.5%", "0%", "12,346"]
    assert rows["1200"].split() == ["1200", "55.0%", "(40–69%)", "+12.5", "pp", "(6↑", "1↓)", "100%", "212/1024", "7.5%",
                                    "0%", "12,346", "trunc"]
    assert rows["12000"].split()[3:7] == ["-32.5", "pp", "(0↑", "13↓)"] and rows["12000"].endswith("loop collapse")
    assert lines[-3:] == [f"flag {f['code']}: {f['message']}" for f in REPORT["flags"]]


def test_a_narrow_terminal_wraps_cells_and_cuts_no_figure(monkeypatch):
    text = "\n".join(_render(monkeypatch, 70))
    assert "…" not in text and "13↓)" in text and "collapse" in text


def test_a_rewarded_sweep_has_a_reward_column_with_sub_score_means_and_says_what_decided(monkeypatch):
    import copy

    rewarded = copy.deepcopy(REPORT)
    for c, (mean, acc) in zip(rewarded["checkpoints"], ((0.28, 0.31), (0.5, 0.55), (0.07, 0.08))):
        c.update(reward_mean=mean, reward_score_means={"format": 0.0, "accuracy": acc}, correct_from="accuracy")
    out = io.StringIO()
    monkeypatch.setattr(terminal, "stderr", Console(file=out, width=200, highlight=False, soft_wrap=True))
    terminal.render_sweep(rewarded)
    text = out.getvalue()
    assert "reward" in text.splitlines()[1] and "0.50 (format 0.00 · accuracy 0.55)" in text
    assert "the reward's accuracy sub-score reaches --reward-threshold" in text


def test_the_engine_line_counts_only_the_switches_of_this_run(monkeypatch):
    """A checkpoint read back keeps the figures of the run that evaluated it; the engine line speaks of this run."""
    out = io.StringIO()
    monkeypatch.setattr(terminal, "stderr", Console(file=out, width=100, highlight=False, soft_wrap=True))
    first, *rest = REPORT["checkpoints"]
    terminal.render_sweep({**REPORT, "checkpoints": [{**first, "read_back": True}, *rest]})
    assert "engine: swapped in place 2× (median 1.30 s)" in out.getvalue().splitlines()
    out = io.StringIO()
    monkeypatch.setattr(terminal, "stderr", Console(file=out, width=100, highlight=False, soft_wrap=True))
    terminal.render_sweep({**REPORT, "checkpoints": [{**c, "read_back": True} for c in REPORT["checkpoints"]]})
    lines = out.getvalue().splitlines()
    assert "engine: not started (every checkpoint's rows were already in the output directory)" in lines
    assert not any(line.startswith("engine: loaded") for line in lines)


def test_a_sweep_where_every_checkpoint_scores_the_same_names_no_best(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(terminal, "stderr", Console(file=out, width=100, highlight=False, soft_wrap=True))
    tied = [{**c, "accuracy": 0.0} for c in REPORT["checkpoints"]]
    terminal.render_sweep({**REPORT, "checkpoints": tied, "flags": [], "best": {**REPORT["best"], "step": 0,
                                                                              "label": "base", "accuracy": 0.0}})
    lines = out.getvalue().splitlines()
    assert "best: a tie — every checkpoint scored 0.0%; none is better than another" in lines
    assert not any(line.startswith("best: base") for line in lines)


def test_sweep_by_names_a_tie_not_a_best_step(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(terminal, "stderr", Console(file=out, width=120, highlight=False, soft_wrap=True))
    checkpoints = [{"step": s, "label": "hf-trainer", "by": {"shape": {"requests": 2, "scored": 4, "accuracy": 0.0},
                                                              "color": {"requests": 2, "scored": 4, "accuracy": a}}}
                   for s, a in ((100, 0.25), (200, 0.5))]
    terminal._sweep_groups({"by": "category", "checkpoints": checkpoints})
    said = out.getvalue()
    assert "best step by category: color: 200 (50.0%) · shape: a tie (0.0%)" in said and "shape (2)" in said, said


def test_without_base_step_0_is_a_step_and_p_best_is_worded_as_what_it_is(monkeypatch):
    """No --base: the run's checkpoint-0 is step 0 in the best line, as in the table; "base" is the --base model's."""
    report = {**REPORT, "checkpoints": [{**c, "label": "hf-trainer"} for c in REPORT["checkpoints"]],
              "best": {**REPORT["best"], "p_best": 0.36, "indistinguishable": [0, 1200], "requests": 40, "alpha": 0.05}}
    out = io.StringIO()
    monkeypatch.setattr(terminal, "stderr", Console(file=out, width=400, highlight=False, soft_wrap=True))
    terminal.render_sweep(report)
    best = next(line for line in out.getvalue().splitlines() if line.startswith("best:"))
    assert best.endswith("(Holm over every two steps, alpha 0.05): 0") and "base" not in best
    assert "P(best) 36% (how often it is highest when the 40 requests are resampled; not the chance it is truly best" in best
    rows = [line.split()[0] for line in out.getvalue().splitlines() if line.split() and line.split()[0] in ("0", "base")]
    assert rows == ["0"]
