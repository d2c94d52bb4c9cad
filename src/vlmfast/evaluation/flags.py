"""What changed across a sweep: each checkpoint against base and against the best, and flags on the run.

Per request (a request with several answers counts once): its score is the mean correctness of its
answers, it is *right* when its answers' majority vote is correct (the one answer, with one), and it is
*format-valid* when at least half of its answers are. :func:`compare` pairs two checkpoints over the
requests both scored: the difference of their scores with its interval
(:func:`vlmfast.evaluation.stats.paired_comparison`), how many requests flipped each way (right/wrong by the
majority vote), and the exact McNemar p-value of those flips.

Flags (:func:`flag_run`), each rule with its threshold:

- ``format_only_gain``: accuracy is above base's by more than ``GAIN`` (points), but over the requests
  format-valid in both (at least ``MIN_COMMON`` of them) the gain is ``GAIN`` or less: the answers learnt
  the format, not the task.
- ``length_blowup`` / ``length_collapse``: the median response length is at least ``BLOWUP`` × base's, or
  at most ``COLLAPSE`` × base's.
- ``truncation``: more than ``TRUNCATION`` of the answers stopped at the length limit.
- ``repetition``: more than ``REPETITION`` of the answers end in a loop
  (:func:`vlmfast.evaluation.health.repeats`).
- ``collapse_after_peak``: a checkpoint after the best one that is outside the set not distinguishable from
  the best (:mod:`vlmfast.evaluation.best`: a paired test shows it below another step, Holm-corrected over
  both one-sided hypotheses of every two steps, below ``ALPHA``), so worse than the best with a family-wise
  error of at most ``ALPHA``; the figure is its adjusted p-value. Without per-request tables (figures only),
  below the best's interval (its ``ci_low``).
- ``reward_without_accuracy``: the mean reward (``reward_mean``, the rows' total ``--reward``; only when
  both have one) is above base's by more than ``REWARD_GAIN`` while the accuracy stays inside base's
  interval (``ci_low`` to ``ci_high``).
"""

from __future__ import annotations

from collections import defaultdict

from vlmfast.evaluation.best import ALPHA

GAIN = 0.05
MIN_COMMON = 5
BLOWUP = 2.0
COLLAPSE = 0.5
TRUNCATION = 0.05
REPETITION = 0.05
REWARD_GAIN = 0.05
# figures are fractions in floating point (0.46 − 0.41 = 0.05000000000000002): a figure within this of a threshold
# is at the threshold, so "more than 5 points" is not tripped by 5 points
TOLERANCE = 1e-9
CODES = ("format_only_gain", "length_blowup", "length_collapse", "truncation", "repetition", "collapse_after_peak",
         "reward_without_accuracy")


def per_request(rows: list[dict]) -> dict[str, tuple[float, bool, bool]]:
    """id → (score, right, format-valid) over the rows with ground truth (see the module docstring)."""
    from vlmfast.evaluation.samples import majority_correct

    groups: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        if row.get("error") is None and row.get("correct") is not None:
            groups[str(row["id"])].append(row)
    out = {}
    for rid, answers in groups.items():
        answers.sort(key=lambda r: r.get("sample") or 0)
        score = sum(bool(r["correct"]) for r in answers) / len(answers)
        right = bool(answers[0]["correct"]) if len(answers) == 1 else majority_correct(answers)
        formatted = sum(bool(r.get("format_ok")) for r in answers) * 2 >= len(answers)
        out[rid] = (score, right, formatted)
    return out


def reward_errors_as_wrong(rows: list[dict], scored_elsewhere: bool = False) -> tuple[list[dict], int]:
    """``rows`` with every answer the reward function raised on (``--skip-bad``: ``reward_error``) judged
    wrong with a score of 0, and how many: checkpoints compared on the requests each one's function could
    score would be compared on different requests. Where it scored none of ``rows``, they stay as they are
    (the function is broken, not the answers) unless it scored other checkpoints' (``scored_elsewhere``)."""
    if not scored_elsewhere and not any(r.get("correct") is not None for r in rows):
        return rows, 0
    raised = [r.get("error") is None and r.get("reward_error") is not None for r in rows]
    return [{**r, "score": 0.0, "correct": False} if bad else r for r, bad in zip(rows, raised)], sum(raised)


def failed_as_wrong(rows: list[dict], elsewhere: set[str]) -> tuple[list[dict], list[dict], int]:
    """``rows`` with each request the run failed on (it has error rows) that is in ``elsewhere`` (ids another
    step was scored on) made k answers in all, the ones it lacks wrong; the first error row of each request so
    judged; and k, a request's most answers (answered or error rows of one id).

    A request counts once however many error rows it has: vlmfast's runner writes one per sample with ``--n``
    (:func:`vlmfast.engines.rows.of_samples`), results from other tools or older runs may hold one per request,
    and a request may have failed on some samples only. The wrong answers take the error rows' sample indexes
    first, then the free ones."""
    from collections import Counter

    per_id = Counter(str(r.get("id")) for r in rows)
    k = max(per_id.values(), default=1)
    errors: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("error") is not None and str(r.get("id")) in elsewhere:
            errors.setdefault(str(r.get("id")), []).append(r)
    if not errors:
        return rows, [], k
    answered: dict[str, set] = {}
    for r in rows:
        if r.get("error") is None:
            answered.setdefault(str(r.get("id")), set()).add(r.get("sample"))
    out = []
    for r in rows:
        rid = str(r.get("id"))
        if rid not in errors:
            out.append(r)
        elif r is errors[rid][0]:  # the request's wrong answers stand where its first error row stood
            taken = answered.get(rid, set())
            own = [e.get("sample") for e in errors[rid] if e.get("sample") is not None and e.get("sample") not in taken]
            free = list(dict.fromkeys(own + [j for j in range(k) if j not in taken]))
            out += [{**r, "error": None, "score": 0.0, "correct": False, "format_ok": False,
                     "sample": j if k > 1 else r.get("sample")} for j in free[:k - len(taken)]]
        elif r.get("error") is None:
            out.append(r)
    return out, [e[0] for e in errors.values()], k


def missing_answers(rows: list[dict], ids: set[str] | None = None) -> int:
    """How many answers the requests with error rows (those in ``ids``, or all) lack of k, a request's most
    answers: the wrong answers :func:`failed_as_wrong` makes of them (k per request failed on every sample, fewer
    for one that failed on some)."""
    from collections import Counter

    per_id = Counter(str(r.get("id")) for r in rows)
    k = max(per_id.values(), default=1)
    answered = Counter(str(r.get("id")) for r in rows if r.get("error") is None)
    failed = {str(r.get("id")) for r in rows if r.get("error") is not None and (ids is None or str(r.get("id")) in ids)}
    return sum(max(k - answered[i], 0) for i in failed)


def judged_tables(rows_by_step: dict[int, list[dict]]) -> dict[int, dict]:
    """step → the :func:`vlmfast.evaluation.flags.per_request` table of its rows judged as a sweep's report
    judges them (so the page counts the flips report.json counts): answers the reward function raised on
    count as wrong (a step where it raised on every answer too, when it scored another step's:
    :func:`vlmfast.run.rescore.judge_all_raised`), and failed requests another step was scored on count as
    wrong (:func:`vlmfast.run.rescore.judge_failed`)."""
    judged = {step: reward_errors_as_wrong(rows)[0] for step, rows in rows_by_step.items()}
    tables = {step: per_request(rows) for step, rows in judged.items()}
    if any(tables.values()):
        for step in [s for s, t in tables.items() if not t]:
            judged[step] = reward_errors_as_wrong(judged[step], True)[0]
            tables[step] = per_request(judged[step])
    for step, rows in judged.items():
        elsewhere = set().union(*(set(t) for s, t in tables.items() if s != step))
        rows, failed, _ = failed_as_wrong(rows, elsewhere)
        if failed:
            tables[step] = per_request(reward_errors_as_wrong(rows, True)[0])
    return tables


def table_of(rows_or_table: list[dict] | dict) -> dict[str, tuple[float, bool, bool]]:
    """A :func:`per_request` table: made from result rows (a list), or given as one already (a dict)."""
    return rows_or_table if isinstance(rows_or_table, dict) else per_request(rows_or_table)


def flipped(a: list[dict] | dict, b: list[dict] | dict) -> dict[str, list[str]]:
    """Requests right in ``b`` and wrong in ``a`` (``right_to_wrong``: going from b to a), and the other way
    round (``wrong_to_right``), in ``a``'s order. ``a`` and ``b``: result rows or :func:`per_request` tables;
    with several answers per request, right means the majority vote is."""
    a, b = table_of(a), table_of(b)
    shared = [rid for rid in a if rid in b]
    return {"right_to_wrong": [rid for rid in shared if b[rid][1] and not a[rid][1]],
            "wrong_to_right": [rid for rid in shared if a[rid][1] and not b[rid][1]]}


def compare(a: list[dict] | dict, b: list[dict] | dict) -> dict:
    """Checkpoint ``a`` against ``b`` (result rows or :func:`per_request` tables): ``n`` requests both scored,
    ``difference`` (a − b, per-request mean correctness) with its ``ci_low``/``ci_high`` (95 %: Newcombe's hybrid
    score interval, on the per-request means with several answers:
    :func:`vlmfast.evaluation.stats.paired_comparison`), ``right_to_wrong`` and ``wrong_to_right`` counts
    (:func:`flipped`) and ``p_value`` (4 significant digits): the paired test of ``difference``
    (:func:`vlmfast.evaluation.stats.paired_p`) — with one answer per request the exact McNemar test on the
    flips; with several, the exact sign-flip test on the per-request mean scores
    (:func:`vlmfast.evaluation.stats.sign_flip_exact`, McNemar's own generalisation), so the test judges the
    figure the steps are ranked by, not the majority vote."""
    from vlmfast.evaluation.stats import paired_comparison

    a, b = table_of(a), table_of(b)
    paired = paired_comparison({k: v[0] for k, v in a.items()}, {k: v[0] for k, v in b.items()})
    flips = {k: len(v) for k, v in flipped(a, b).items()}
    rounded = {k: None if paired[k] is None else round(paired[k], 4) for k in ("difference", "ci_low", "ci_high")}
    p = paired["p_value"]
    # significant digits, not decimals: a clear difference over thousands of requests has p far below 1e-6
    p_value = None if p is None else float(f"{p:.4g}")
    return {"n": paired["n"], **rounded, "p_value": p_value, **flips}


def _flag(code: str, step: int, figure, threshold, message: str, base_step: int | None = None) -> dict:
    """A flag; its message starts with the step's name: "base" for the base (``base_step``), as the table names it."""
    name = "base" if step == base_step else f"step {step}"
    return {"code": code, "step": step, "figure": figure, "threshold": threshold, "message": f"{name}: {message}"}


def flag_run(checkpoints: list[dict], rows_by_step: dict[int, list[dict] | dict], *,
             base_step: int | None = None) -> list[dict]:
    """The flags of a sweep, ordered by step: ``checkpoints`` are its per-step figures (``step``, ``accuracy``,
    ``ci_low``/``ci_high``, the :func:`vlmfast.evaluation.health.health` figures; ``near_best`` and ``holm_p``
    where :func:`vlmfast.evaluation.best.held_up` set them, else that test is run here), ``rows_by_step`` each step's
    result rows or its :func:`per_request` table (a sweep keeps only the tables), ``base_step`` the base's
    step (None: no base, so no rule that needs one). A flag: ``code`` (one of :data:`CODES`), ``step``,
    ``figure`` (the value that tripped the rule), ``threshold`` (the bound it crossed), ``message``."""
    tables = {step: table_of(rows) for step, rows in rows_by_step.items()}
    flags = []
    by_step = {c["step"]: c for c in checkpoints}
    base = by_step.get(base_step) if base_step is not None else None
    ranked = [c for c in checkpoints if c.get("accuracy") is not None]
    best = max(ranked, key=lambda c: (c["accuracy"], -c["step"])) if ranked else None
    if best is not None and all("near_best" in c for c in ranked):  # judged by held_up already: not twice
        worse = {c["step"]: c["holm_p"] for c in ranked if not c["near_best"] and c["step"] in tables}
    else:
        worse = worse_than_best(best["step"], [c["step"] for c in ranked], tables) if best else {}
    best_name = ("base" if best["step"] == base_step else f"step {best['step']}") if best else ""
    for c in sorted(checkpoints, key=lambda c: c["step"]):
        step = c["step"]
        if (c.get("truncation_rate") or 0) > TRUNCATION + TOLERANCE:
            flags.append(_flag("truncation", step, c["truncation_rate"], TRUNCATION,
                               f"{c['truncation_rate']:.0%} of answers stopped at the length limit", base_step))
        if (c.get("repetition_rate") or 0) > REPETITION + TOLERANCE:
            flags.append(_flag("repetition", step, c["repetition_rate"], REPETITION,
                               f"{c['repetition_rate']:.0%} of answers end in a repeated phrase", base_step))
        if best is not None and step > best["step"] and step in worse:
            flags.append(_flag("collapse_after_peak", step, worse[step], ALPHA,
                               f"accuracy {c['accuracy']:.1%} is below the best {best_name}'s "
                               f"{best['accuracy']:.1%}, and a paired test shows it below another step "
                               f"(Holm-adjusted over every two steps, p {worse[step]:.2g})", base_step))
        elif best is not None and step > best["step"] and step not in tables and c.get("accuracy") is not None \
                and best.get("ci_low") is not None and c["accuracy"] < best["ci_low"] - TOLERANCE:
            flags.append(_flag("collapse_after_peak", step, c["accuracy"], best["ci_low"],
                               f"accuracy {c['accuracy']:.1%} is below the interval of the best {best_name} "
                               f"(from {best['ci_low']:.1%})", base_step))
        if base is None or c is base:
            continue
        flags += _against_base(c, base, tables.get(step, {}), tables.get(base["step"], {}))
    return flags


def worse_than_best(best: int, steps: list[int], tables: dict) -> dict[int, float]:
    """Steps (of ``steps``, with a table) that a paired test shows below another step, Holm-corrected over
    both one-sided hypotheses of every two of them (:func:`vlmfast.evaluation.best.indistinguishable`, the
    test that decides the set not distinguishable from the best): step → its adjusted p-value. Each is below
    the best by its accuracy, and truly worse than the best with a family-wise error of at most ``ALPHA``."""
    from vlmfast.evaluation.best import indistinguishable, pairwise

    if best not in tables:
        return {}
    tested = [s for s in steps if s in tables]
    keep, adjusted = indistinguishable(best, tested, pairwise({s: tables[s] for s in tested}))
    return {s: p for s, p in adjusted.items() if s not in keep}


def _against_base(c: dict, base: dict, mine: dict, theirs: dict) -> list[dict]:
    flags, step = [], c["step"]
    ours, base_p50 = c.get("new_tokens_p50"), base.get("new_tokens_p50")
    if ours is not None and base_p50:
        ratio = round(ours / base_p50, 3)
        if ratio >= BLOWUP - TOLERANCE:
            flags.append(_flag("length_blowup", step, ratio, BLOWUP, f"median length {ours:g} tokens is {ratio:g}× base's"))
        elif ratio <= COLLAPSE + TOLERANCE:
            flags.append(_flag("length_collapse", step, ratio, COLLAPSE, f"median length {ours:g} tokens is {ratio:g}× base's"))
    if c.get("accuracy") is not None and base.get("accuracy") is not None \
            and c["accuracy"] - base["accuracy"] > GAIN + TOLERANCE:
        common = [rid for rid in mine if rid in theirs and mine[rid][2] and theirs[rid][2]]
        if len(common) >= MIN_COMMON:
            gain = round(sum(mine[r][0] - theirs[r][0] for r in common) / len(common), 4)
            if gain <= GAIN + TOLERANCE:
                flags.append(_flag("format_only_gain", step, gain, GAIN,
                                   f"accuracy is {c['accuracy'] - base['accuracy']:+.1%} over base, but {gain:+.1%} over "
                                   f"the {len(common)} requests both answered in format: the gain is the format"))
    rewards = c.get("reward_mean"), base.get("reward_mean")
    if None not in rewards and rewards[0] - rewards[1] > REWARD_GAIN + TOLERANCE and c.get("accuracy") is not None \
            and base.get("ci_low") is not None \
            and base["ci_low"] - TOLERANCE <= c["accuracy"] <= base["ci_high"] + TOLERANCE:
        flags.append(_flag("reward_without_accuracy", step, round(rewards[0] - rewards[1], 4), REWARD_GAIN,
                           f"mean reward {rewards[0] - rewards[1]:+.3f} over base while accuracy {c['accuracy']:.1%} "
                           f"stays inside base's interval"))
    return flags
