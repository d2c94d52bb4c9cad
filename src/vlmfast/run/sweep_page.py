"""What ``report.html`` shows of a sweep, gathered from its files: every step's rows (read back from their
results files), the manifest's ground truth, each answer's predicted box in the image's pixels, and the
requests that flipped against base. :func:`vlmfast.report.html.write_html_report` renders it; and
:func:`write_sweep_dir` writes the sweep's own files (report.json, report.html, plot.png)."""

from __future__ import annotations

from pathlib import Path

ANSWER_CHARS = 240  # an answer longer than this is cut in the page (the results file has it whole)
PROMPT_CHARS = 1500  # a prompt or a ground truth longer than this is cut in the page (the manifest has it whole)


class SweepReport(dict):
    """A sweep's report (what report.json holds, schema vlmfast.sweep/1), and ``rows_by_step``: each step's rows as
    the sweep read them from its results file, for the page (:func:`write_sweep_dir` reads again only a file
    changed since). Not part of the report's items: report.json and ``--json`` print the dict alone."""

    def __init__(self, report: dict, rows_by_step: dict[int, list[dict]] | None = None):
        super().__init__(report)
        self.rows_by_step = rows_by_step
        self.files = {c["step"]: _file_state(c.get("results")) for c in report.get("checkpoints", [])}

    def rows_as_filed(self) -> dict[int, list[dict]]:
        """The steps' rows whose results file is as it was when the sweep ended (the others are read again)."""
        return {c["step"]: self.rows_by_step[c["step"]] for c in self["checkpoints"] if c["step"] in (self.rows_by_step or {})
                and self.files.get(c["step"]) == _file_state(c["results"])}


def _file_state(path) -> tuple | None:
    """A file's identity, size and modification time (None: no such file)."""
    try:
        st = Path(path).stat()
    except (OSError, TypeError):  # TypeError: no path
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def write_sweep_html(report: dict, path, *, rows_by_step: dict[int, list[dict]] | None = None,
                     truths: dict | None = None) -> Path:
    """Write ``report.html`` of a sweep ``report`` (schema vlmfast.sweep/1) to ``path``; returns the path. Each
    step's rows are read from its ``results`` file unless given in ``rows_by_step`` (step → rows); the ground
    truth from ``report["manifest"]`` unless given in ``truths`` (id → truth)."""
    from vlmfast.report.html import write_html_report

    return write_html_report(page_data(report, rows_by_step, truths), path)


def page_data(report: dict, rows_by_step: dict[int, list[dict]] | None = None, truths: dict | None = None) -> dict:
    """The page's data for a sweep ``report`` (schema vlmfast.sweep/1): ``checkpoints``, ``flags``, ``notes`` and
    ``best`` as they are, plus ``samples`` (id, prompt, truth, image path and size, true box), ``answers`` per
    step (per sample: [answer, correct 1/0/None, score, predicted box] or None) and ``flips`` per step
    against base (sample indices). ``truths`` (id → truth) stands in for reading ``report["manifest"]``."""
    from vlmfast.evaluation.flags import flipped, judged_tables
    from vlmfast.run.results import read_existing

    rows_by_step = dict(rows_by_step or {})
    for c in report["checkpoints"]:
        if c["step"] not in rows_by_step and Path(c["results"]).is_file():
            rows_by_step[c["step"]] = list(read_existing(Path(c["results"]), repair=False)[0].values())
    truths = {str(k): v for k, v in truths.items()} if truths is not None else _truths(report.get("manifest"), report.get("settings"))
    samples, index = [], {}
    for c in report["checkpoints"]:
        for row in rows_by_step.get(c["step"], []):
            rid = str(row["id"])
            if rid not in index:
                index[rid] = len(samples)
                samples.append(_sample(row, truths.get(rid), _image_bases(report)))
    answers = {c["step"]: _answers(rows_by_step.get(c["step"], []), index) for c in report["checkpoints"]}
    base = next((c for c in report["checkpoints"] if c["label"] == "base"), None)
    flips = {}
    if base is not None:  # failed requests and raised rewards count as wrong, as in report.json's vs_base
        tables = judged_tables({c["step"]: rows_by_step.get(c["step"], []) for c in report["checkpoints"]})
        for c in report["checkpoints"]:
            if c is not base:
                got = flipped(tables[c["step"]], tables[base["step"]])
                flips[c["step"]] = {k: [index[rid] for rid in ids] for k, ids in got.items()}
    return {"run_dir": report["run_dir"], "best": report.get("best"), "flags": report.get("flags", []),
            "notes": report.get("notes", []), "checkpoints": report["checkpoints"], "samples": samples,
            "answers": answers, "flips": flips}


def _truths(manifest: str | None, settings: dict | None = None) -> dict:
    """id → truth, read with the columns the sweep read (a dataset folder too)."""
    if not manifest or not Path(manifest).exists():
        return {}
    from vlmfast.inputs.convert import read_truths
    from vlmfast.inputs.datasets import DatasetKeys

    s = settings or {}
    try:
        return {rid: truth for rid, (truth, _) in read_truths(manifest, DatasetKeys(s.get("prompt_key"), s.get("answer_key"),
                                                                                     s.get("image_key"))).items()}
    except Exception:  # noqa: BLE001 - a manifest changed since the sweep: the page shows no truths, not an error
        return {}


def _image_bases(report: dict) -> list[Path]:
    """Where a row's relative image path may lie besides the working directory: the rows keep it as the run that
    wrote them resolved it (against its own working directory), and a resumed sweep or a page written later may
    run elsewhere: the manifest's folder and --image-root."""
    bases = [Path((report.get("settings") or {}).get("image_root") or "")]
    if report.get("manifest"):
        bases.append(Path(report["manifest"]).parent)
    return [b for b in bases if str(b) not in ("", ".")]


def _on_disk(path: str | None, bases: list[Path]) -> str | None:
    """``path`` where it is found: as written, else under the first of ``bases`` that holds it; as written when
    none does (the page links it and says so)."""
    if not path or Path(path).is_absolute() or Path(path).exists():
        return path
    return next((str(b / path) for b in bases if (b / path).exists()), path)


def _sample(row: dict, truth, bases: list[Path] = ()) -> dict:
    from vlmfast.evaluation.scoring import parse_box

    images = row.get("images") or []
    sizes = row.get("image_sizes") or []
    is_box = row.get("scorer") == "bbox" or (truth is not None and not isinstance(truth, (int, float))
                                              and parse_box(truth) is not None and row.get("scorer") in (None, "bbox"))
    return {"id": str(row["id"]), "prompt": cut(row.get("prompt") or "", PROMPT_CHARS, "the manifest"),
            "truth": cut(_text(truth), PROMPT_CHARS, "the manifest"),
            "image_path": _on_disk(images[0], list(bases)) if images else None, "size": sizes[0] if sizes else None,
            "truth_box": parse_box(truth) if is_box else None}


def _answers(rows: list[dict], index: dict[str, int]) -> list:
    """Per sample, its answer in this step (the first sample's with several answers per request)."""
    from vlmfast.evaluation.answers import predicted_box

    out: list = [None] * len(index)
    for row in rows:
        at = index.get(str(row["id"]))
        if at is None or (row.get("sample") or 0) != 0:
            continue
        text = row.get("error") or row.get("answer") or row.get("text") or ""
        text = cut(text, ANSWER_CHARS, "the results file")
        correct = None if row.get("correct") is None else int(bool(row["correct"]))
        score = row.get("iou") if row.get("scorer") == "bbox" else row.get("score")
        out[at] = [text, correct, None if score is None else round(float(score), 3),
                   predicted_box(row) if row.get("scorer") == "bbox" else None]
    return out


def cut(text: str, limit: int, whole_in: str) -> str:
    """``text`` up to ``limit`` characters, then a marker saying how much was left out and where it is whole."""
    return text if len(text) <= limit else f"{text[:limit]} … [{len(text) - limit:,} more characters in {whole_in}]"


def _text(value) -> str:
    if value is None:
        return ""
    import json

    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def write_sweep_dir(report: dict, directory) -> list[str]:
    """``report.json``, ``report.html`` and (with the plot extra) ``plot.png`` in the sweep's output dir; what
    was written. A :class:`SweepReport` brings its steps' rows: the page then reads no results file."""
    import json

    from vlmfast.files import atomic_write
    from vlmfast.report.plot import plot_available, write_sweep_plot

    directory = Path(directory)
    atomic_write(directory / "report.json", (json.dumps(report, indent=1) + "\n").encode("utf-8"))
    said = [f"wrote {directory / 'report.json'}"]
    if report["checkpoints"]:
        rows = report.rows_as_filed() if isinstance(report, SweepReport) else None
        said.append(f"wrote {write_sweep_html(report, directory / 'report.html', rows_by_step=rows)} (open it in a browser)")
    if not any(c["accuracy"] is not None for c in report["checkpoints"]):
        return said
    if plot_available():
        said.append(f"wrote {write_sweep_plot(report, directory / 'plot.png')}")
    else:
        said.append("no plot: matplotlib is not installed (pip install 'vlmfast[plot]')")
    return said
