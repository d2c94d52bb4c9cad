"""``vlmfast score``: score any results file against a manifest's ground truth.

Reads JSONL only — no model, no torch — so rescoring thousands of rows takes a moment. The scores are
the ones ``infer`` writes into its rows (same scorers, same options, same manifest reader). A row needs
only ``id`` and ``text``: files from other tools (a vLLM script, VLM-R1's evaluation, a converted
ms-swift run) score as well as vlmfast's own, and their other fields are kept as they are.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from vlmfast.inputs.convert import _good_requests, read_reward_truths
from vlmfast.errors import InputError, UsageError
from vlmfast.files import atomic_write
from vlmfast.evaluation.scoring import BBOX_SPACES, rescore, row_bbox_space
from vlmfast.evaluation.stats import by_value, summarize
from vlmfast.run.results import rows_under_todays_ids

MAX_LISTED = 50  # bad lines listed in one error (all are counted): enough to see the pattern
ROWS_HINT = ('write one JSON object per line with "id" (the manifest\'s id) and "text" (the model\'s whole '
             'output); rows from another tool: rename its fields, e.g. jq -c \'{id: .question_id, text: .output}\'')


def read_result_rows(path: Path) -> tuple[list[dict], list[str]]:
    """The rows of a results JSONL for scoring, and notes on what was passed over.

    A row needs ``id`` (string or integer) and ``text`` (a string; null only on error rows, those with
    ``error`` set). A torn last line (a run killed mid-write) is passed over with a note; any other bad
    line is an InputError listing every one. Ids seen twice: the last row wins, in the place of the
    first, and a note says so."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise InputError(f"{path}: cannot read the results file ({exc.strerror})", hint="check the path and permissions") from exc
    lines = data.split(b"\n")
    rows: dict[tuple, dict] = {}  # by (id, sample), as everywhere: --n K files hold K rows per id
    problems, notes, repeated = [], [], Counter()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:  # UnicodeDecodeError is one too
            if number == len(lines) and rows:  # no newline after it, rows before it: a write cut short
                notes.append(f"{path}: passed over a torn last line ({len(line)} bytes) left by an interrupted run")
                continue
            why = f"{exc.msg} at column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else "not valid UTF-8"
            problems.append(f"{path}:{number}: not a JSON line ({why})")
            continue
        if (what := _row_problem(row)) is not None:
            problems.append(f"{path}:{number}: {what}")
            continue
        key = (str(row["id"]), row.get("sample"))
        if key in rows:
            repeated[key[0] if key[1] is None else f"{key[0]}#{key[1]}"] += 1
        rows[key] = row
    if problems and len(problems) > 1 and _one_json_document(data):  # e.g. a report.json: its lines are not rows
        raise InputError(f"{path}: one JSON document over {len(lines)} lines (a report?), not a results JSONL",
                         hint="give the --out file of vlmfast infer (one JSON object per line with \"id\" and \"text\"); "
                              "the report's rows are there")
    if problems:
        listing = "\n".join(f"  - {p}" for p in problems[:MAX_LISTED])
        more = f"\n  … and {len(problems) - MAX_LISTED} more" if len(problems) > MAX_LISTED else ""
        raise InputError(f"{len(problems)} bad line(s) in the results file; nothing was scored:\n{listing}{more}",
                         hint=ROWS_HINT, problems=problems)
    if not rows:
        raise InputError(f"{path}: holds no result rows", hint=ROWS_HINT)
    if repeated:
        shown = ", ".join(sorted(repeated)[:5]) + (" …" if len(repeated) > 5 else "")
        notes.append(f"{path}: {sum(repeated.values())} row(s) repeat an earlier id and sample ({shown}); the last row "
                     f"of each is scored, {len(rows)} rows in all")
    return list(rows.values()), notes


def _one_json_document(data: bytes) -> bool:
    """Whether the whole file is one JSON object or array (pretty-printed over several lines)."""
    try:
        return isinstance(json.loads(data), (dict, list))
    except ValueError:
        return False


def _row_problem(row) -> str | None:
    if not isinstance(row, dict):
        return f"a JSON {type(row).__name__}, not an object"
    missing = [f'"{k}"' for k in ("id", "text") if k not in row]
    if missing:
        return f"no {' or '.join(missing)} field"
    if not isinstance(row["id"], (str, int)) or isinstance(row["id"], bool):
        return f'"id" must be a string or an integer, not {json.dumps(row["id"])}'
    if row["text"] is None and row.get("error") is None:
        return '"text" is null but "error" is not set: only error rows may lack text'
    if row["text"] is not None and not isinstance(row["text"], str):
        return f'"text" must be a string, not a JSON {type(row["text"]).__name__}'
    if row.get("bbox_space") is not None and row["bbox_space"] not in BBOX_SPACES:
        return f'"bbox_space" {row["bbox_space"]!r} is not one of {", ".join(BBOX_SPACES)}'
    return None


def _check_matches(rows: list[dict], truths: dict, results: Path, manifest: str, keys) -> None:
    """An InputError when nothing could be scored: no row's id is in the manifest, or none of the rows that
    are has ground truth the manifest reader recognises (every score would be None, and exit 0 would hide it)."""
    from vlmfast.inputs.convert import truth_fields

    matched = [str(r["id"]) for r in rows if str(r["id"]) in truths]
    if not matched:
        ours = ", ".join(dict.fromkeys(str(r["id"]) for r in rows[:5]))
        theirs = ", ".join(list(truths)[:5])
        raise InputError(f"none of the {len(rows)} row id(s) of {results} is in {manifest}: rows have {ours}"
                         f"{' …' if len(rows) > 5 else ''}; the manifest has {theirs}{' …' if len(truths) > 5 else ''}",
                         hint="ids must be the manifest's \"id\" (or its image path where a record has no id): "
                              "give the manifest the results were made from")
    if all(truths[rid][0] is None for rid in matched):
        looked, found, hint = truth_fields(manifest, keys)
        raise InputError(f"{manifest}: no ground truth in any of the {len(matched)} matched record(s): looked for "
                         f"{looked}; the records have {found}", hint=hint)


def _refuse_other_requests(rows: list[dict], manifest: str, keys, image_root, results: Path) -> dict:
    """An InputError when rows that carry their prompt or images (vlmfast's do) answered other requests than
    their ids name in ``manifest`` now: a line added or removed moves the ids given by position (or by an
    image's rank), and scoring them would judge answers against other questions' truths. Returns the
    manifest's requests by id."""
    import os

    asked = {r.id: r for r in _good_requests(manifest, keys, image_root)}  # read once: the reader keeps the last
    other = []
    for row in rows:
        request, prompt, images = asked.get(str(row["id"])), row.get("prompt"), row.get("images")
        if request is None:
            continue
        question = request.prompt.strip() if request.prompt != "-" else ""  # "-": the record had no prompt of its own
        names = [os.path.basename(str(p)) for p in images] if isinstance(images, list) else None
        if (question and isinstance(prompt, str) and question not in prompt) or (
                names is not None and request.images and names != [os.path.basename(p) for p in request.images]):
            other.append(str(row["id"]))
    if other:
        other = list(dict.fromkeys(other))
        raise InputError(f"{len(other)} row id(s) of {results} answered other requests than {manifest} names by them now "
                         f"({', '.join(other[:5])}{' …' if len(other) > 5 else ''}): another prompt or other images",
                         hint="give the manifest the results were made from (ids by position move when lines are added "
                              "or removed)")
    return asked


def _with_prompts(rows: list[dict], asked: dict) -> list[dict]:
    """``rows``, where one carries no prompt (another tool's: id and text only), with its manifest request's
    prompt, as a row vlmfast wrote carries it: a multiple-choice answer naming an option by its text is read
    from the prompt's options, and a reward function is handed the question."""
    def prompt(row):
        request = asked.get(str(row["id"]))
        return request.prompt if request is not None and request.prompt != "-" else None

    return [row if isinstance(row.get("prompt"), str) or prompt(row) is None else {**row, "prompt": prompt(row)}
            for row in rows]


def rescore_file(results: Path, manifest: str, *, out: Path | None = None, **options) -> dict:
    """Scores of every row of ``results`` (a results JSONL, see :func:`read_result_rows`) against
    ``manifest``: the summary (:func:`vlmfast.evaluation.stats.summarize`) plus what was matched. ``bbox_space``
    None: each row's own ``bbox_space``, else ``resized``; given, it wins over the rows'. With ``out``,
    the rows are written there with their scoring fields (atomically, in the results file's order,
    every other field unchanged). ``reward`` (a :class:`vlmfast.evaluation.rewards.RewardSet` or ``Reward``) scores
    instead of the built-in scorers, as ``infer --reward`` does, each function handed the manifest line's own
    ground truth, columns and data source; ``skip_bad`` records its failures in the rows. ``keys``: a parquet or
    Arrow manifest's columns (:class:`~vlmfast.inputs.datasets.DatasetKeys`), the run's own. ``by``: a column
    (dotted for a nested one) of the manifest's records, or else of the result rows, to give the accuracy
    per value of (``summary["by"]``, :func:`vlmfast.evaluation.stats.by_value`). ``scoring``: the scoring
    settings as a run records them (``scorer``, ``iou``, ``bbox_space``, ``reward``, …); when ``out`` is the
    results file itself and a record of its run lies beside it, the record is brought up to date with them, so
    a later ``infer`` or ``sweep`` resuming onto these rows with other scoring stops and names it instead of
    completing (or ranking) one file scored two ways. ``out`` is written by this process alone
    (:func:`vlmfast.files.held_alone`): rescored in place while an ``infer`` or a sweep still wrote it, the file
    was replaced under the run, whose later rows went to the deleted file, and its record named a scoring its
    rows did not have."""
    if out is None:
        return _rescore_file(results, manifest, out=None, **options)
    from vlmfast.files import held_alone

    with held_alone(Path(out), "--out"):
        return _rescore_file(results, manifest, out=out, **options)


def _rescore_file(results: Path, manifest: str, *, scorer: str = "auto", iou: float = 0.5, bbox_space: str | None = None,
                  out: Path | None = None, reward=None, skip_bad: bool = False, keys=None, by: str | None = None,
                  image_root: str | None = None, scoring: dict | None = None) -> dict:
    results = Path(results)
    if out is not None:
        from vlmfast.files import refuse_inputs_as_out

        refuse_inputs_as_out("--out", Path(out), [Path(manifest)])  # the ground truth (the results may be rescored in place)
        _refuse_another_runs_file(Path(out), results)
    if not results.is_file():
        raise InputError(f"{results}: " + ("a directory, not a results file" if results.is_dir() else "no such results file"), hint="give the --out file of a vlmfast infer run, or any JSONL "
                         'with "id" and "text" per row')
    rows, notes = read_result_rows(results)
    records = read_reward_truths(manifest, keys, image_root)  # read_truths' records, with each truth as written
    rows = rows_under_todays_ids(rows, _good_requests(manifest, keys, image_root), notes, manifest)  # read once, kept
    truths = {rid: (record["ground_truth"], record["scorer"]) for rid, record in records.items()}
    _check_matches(rows, truths, results, manifest, keys)
    asked = _with_prompts(rows, _refuse_other_requests(rows, manifest, keys, image_root, results))
    lines = records if reward is not None or by else None
    values = _column_values(by, lines, rows, manifest, results) if by else None  # checked before anything is written
    if reward is not None:
        scored = [{**row, **fields} for row, fields in zip(rows, reward.score_rows(asked, lines, skip_bad=skip_bad))]
        notes += [n for n in [getattr(reward, "note", None)] if n]  # several functions: what decides "correct"
    else:  # the scoring fields onto the rows as read: a prompt taken from the manifest is not written into them
        scored = [dict(new, prompt=row["prompt"]) if "prompt" in row else {k: v for k, v in new.items() if k != "prompt"}
                  for row, new in zip(rows, rescore(asked, records, default_scorer=scorer, iou=iou, bbox_space=bbox_space))]
    if out is not None:  # a row the manifest does not hold is written as it was (scored against another manifest?)
        kept = [row if str(row["id"]) not in truths else new for row, new in zip(rows, scored)]
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        atomic_write(Path(out), "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept).encode("utf-8"))
        if scoring is not None and Path(out).resolve() == results.resolve():
            notes += _record_scoring(results, scoring)
    unknown = [str(r["id"]) for r in scored if str(r["id"]) not in truths]
    if unknown:
        shown = ", ".join(unknown[:5]) + (" …" if len(unknown) > 5 else "")
        notes.append(f"{len(unknown)} of {len(scored)} row id(s) are not in {manifest} ({shown}): left unscored; ids must be "
                     "the manifest's \"id\" (or its image path where a record has no id)" + (f"; {out} keeps them as they were"
                                                                           if out is not None else ""))
    answered = {str(r["id"]) for r in scored}
    missing = [rid for rid in truths if rid not in answered]  # a partial results file (a run still going, or cut short)
    if missing:
        shown = ", ".join(missing[:5]) + (" …" if len(missing) > 5 else "")
        notes.append(f"{len(missing)} of {len(truths)} manifest id(s) have no row in {results} ({shown}): the figures "
                     "are over the rows there are")
    failed = [r for r in scored if r.get("error") is not None and truths.get(str(r["id"]), (None, None))[0] is not None]
    summary = summarize(scored)
    if failed:  # no answer to score: said, with the accuracy that counts them as wrong beside the one that leaves them out
        right = sum(1 for r in scored if r.get("error") is None and r.get("score") is not None and r.get("correct"))
        counted = (summary["scored"] or 0) + len(failed)
        notes.append(f"{len(failed)} error row(s) with ground truth (the run failed on their input, e.g. {failed[0]['id']}: "
                     f"{str(failed[0]['error'])[:80]}): left out of the accuracy; counted as wrong it is "
                     f"{right / counted:.1%} ({right} of {counted})")
    samples = summary.get("samples") or {}
    if samples.get("requests_with_more_samples"):
        notes.append(f"requests have uneven answer counts: {samples['requests_with_more_samples']} of "
                     f"{samples['requests']} have more than the fewest ({samples['samples_per_request']}); pass@k goes to "
                     f"k={samples['samples_per_request']} (a run cut short mid-request? resume it to even them)")
    summary.update(results=str(results), manifest=manifest, rows=len(scored), manifest_ids_without_rows=len(missing),
                   rows_without_truth=sum(1 for r in scored if truths.get(str(r["id"]), (None, None))[0] is None),
                   rows_not_in_manifest=len(unknown),
                   bbox_spaces=dict(Counter(row_bbox_space(r, bbox_space) for r in scored if r.get("scorer") == "bbox")),
                   notes=notes)
    if by:
        summary["by"] = by_value(scored, values, by)
    return summary


def _record_scoring(results: Path, scoring: dict) -> list[str]:
    """The rows of ``results`` were rescored in place: its run's record (``results.run.json``, an ``infer --out``
    or a sweep's ``step-N.run.json``) now says how they are scored. Returns a note when that changed it."""
    from vlmfast.files import atomic_write
    from vlmfast.run.sweep_record import _differences, _norm, sidecar

    path = sidecar(results)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    settings = data.get("settings") if isinstance(data, dict) else None
    if not isinstance(settings, dict):
        return []
    changed = [line for key, value in scoring.items() if key in settings
               for line in _differences(key, _norm(settings[key]), _norm(value))]
    if not changed:
        return []
    settings.update({key: value for key, value in scoring.items() if key in settings})
    atomic_write(path, (json.dumps(data, indent=1, default=str) + "\n").encode("utf-8"))
    return [f"{path.name} now records this scoring ({'; '.join(changed)}): a rerun of the run that made {results.name} "
            "with its earlier scoring stops and names the difference instead of adding rows scored the other way"]


def _refuse_another_runs_file(out: Path, results: Path) -> None:
    """``--out`` naming another run's results file (one with a record of its settings beside it): rescored rows
    there would be resumed as that run's answers."""
    from vlmfast.run.sweep_record import sidecar

    same = out.exists() and results.exists() and out.resolve() == results.resolve()
    if not same and sidecar(out).is_file():
        raise UsageError(f"--out {out} is another run's results file ({sidecar(out).name} beside it records how its rows "
                         "were made): rows written there would be resumed as that run's answers",
                         hint=f"give another --out, or --out {results} to rescore the results file in place")


def manifest_column(column: str, manifest: str, keys=None, lines: dict[str, dict] | None = None) -> dict[str, object]:
    """id → the value of ``column`` (dotted for a nested one) in each good record of ``manifest`` (``lines``:
    its :func:`read_reward_truths`, when read already; a bad record is in no group, as its error row is in none);
    an error naming the columns there are when no record has it."""
    from vlmfast.inputs.datasets import dig

    records = {rid: line.get("record") for rid, line in (lines or read_reward_truths(manifest, keys, skip_bad=True)).items()}
    values = {rid: dig(record, column) for rid, record in records.items() if isinstance(record, dict)}
    if any(v is not None for v in values.values()):
        return values
    columns = sorted({str(key) for r in records.values() if isinstance(r, dict) for key in r})  # every record's, not the first's
    raise InputError(f"--by {column}: no record of {manifest} has it",
                     hint="name one of the manifest's columns: " + (", ".join(columns) or "(none)"))


def _column_values(column: str, lines: dict[str, dict], rows: list[dict], manifest: str, results: Path) -> dict[str, object]:
    """:func:`manifest_column`, else the value in the result rows (a results file from another tool may carry it)."""
    from vlmfast.inputs.datasets import dig

    try:
        return manifest_column(column, manifest, lines=lines)
    except InputError as exc:
        values = {str(row.get("id")): dig(row, column) for row in rows}
        if any(v is not None for v in values.values()):
            return values
        raise InputError(f"--by {column}: no record of {manifest} and no row of {results} has it", hint=exc.hint) from None


def judge_all_raised(figures: list[dict], tables: dict, groups=None) -> list[str]:
    """A checkpoint whose every answer the reward function raised on (``--skip-bad``) has no accuracy of its
    own. Where the function scored other checkpoints' answers, it works, and these are answers it could not
    take: judged wrong as other steps' raised answers are (figures and per-request table updated in place),
    so the step ranks with the rest. Returns what to say."""
    from vlmfast.evaluation.flags import reward_errors_as_wrong

    if not any(f["accuracy"] is not None for f in figures):
        return []
    said = []
    for f in figures:
        answered = f.get("rows", 0) - f.get("errors", 0)
        if f["accuracy"] is None and answered and f.get("reward_errors") == answered and Path(f["results"]).is_file():
            _rejudge(f, tables, reward_errors_as_wrong(_rows_of(f), True)[0], groups)
            said.append(f"{_name(f)}: the reward function raised on every answer (--skip-bad), where it scored other "
                        "checkpoints': they count as wrong")
    return said


def judge_failed(figures: list[dict], tables: dict, groups=None) -> list[str]:
    """A checkpoint's error rows — the run failed on the input (out of memory even alone, vLLM's unfinished
    rows) — on requests another checkpoint answered and was scored on count as wrong, as raised answers do:
    ranking each step over the requests it happened to finish would compare steps on different requests (a
    step with 8 of 9 right and 3 failures would rank above one with 9 of 12). A failed request counts once, as
    k wrong answers with ``--n k``, however many error rows it has (:func:`vlmfast.evaluation.flags.failed_as_wrong`);
    the note counts requests. Requests no step answered stay out of every step's figures. Figures, ``--by`` groups (``groups``: the column's values by id and its name)
    and per-request tables updated in place; returns what to say."""
    from vlmfast.evaluation.flags import failed_as_wrong, missing_answers, reward_errors_as_wrong

    said = []
    for f in figures:
        if not f.get("errors") or not Path(f["results"]).is_file():
            continue
        elsewhere = set().union(*(set(t) for step, t in tables.items() if step != f["step"]))
        before = _rows_of(f)
        rows, failed, k = failed_as_wrong(before, elsewhere)
        if not failed:
            continue
        _rejudge(f, tables, reward_errors_as_wrong(rows, True)[0], groups)
        made = f" ({missing_answers(before, elsewhere)} wrong answer(s): each made up to {k} answers, as --n)" if k > 1 else ""
        said.append(f"{_name(f)}: {len(failed)} request(s) the run failed on (e.g. {failed[0].get('id')}: "
                    f"{str(failed[0]['error'])[:80]}) count as wrong{made}, as other checkpoints answered those requests")
    return said


def _rows_of(figures: dict) -> list[dict]:
    from vlmfast.run.results import read_existing

    return list(read_existing(Path(figures["results"]), repair=False)[0].values())


def _rejudge(f: dict, tables: dict, rows: list[dict], groups=None) -> None:
    """A step's accuracy, interval, ``--by`` groups and per-request table again, from its rows as judged now."""
    from vlmfast.evaluation.flags import per_request
    from vlmfast.evaluation.samples import request_interval

    scored = [r for r in rows if r.get("error") is None and r.get("correct") is not None]
    tables[f["step"]] = per_request(rows)
    low, high = request_interval([score for score, _, _ in tables[f["step"]].values()])
    f.update(scored=len(scored), accuracy=round(sum(bool(r["correct"]) for r in scored) / len(scored), 4) if scored else None,
             ci_low=None if low is None else round(low, 4), ci_high=None if high is None else round(high, 4))
    if f.get("samples") is not None:  # pass@k, maj@k, mean@k over the same answers as the accuracy
        from vlmfast.evaluation.stats import summarize

        f["samples"] = summarize(rows).get("samples", f["samples"])
    if f.get("by") is not None and groups is not None:
        from vlmfast.evaluation.stats import group_accuracy

        f["by"] = group_accuracy(rows, *groups)


def _name(f: dict) -> str:
    return "base" if f["label"] == "base" else f"step {f['step']}"
