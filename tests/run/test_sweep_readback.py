"""A sweep reads each step's results file once per invocation (the rows infer finalized go on to the figures and
report.html), checks its inputs once before its first checkpoint, and leaves a finished step's file as it is when
a rerun changes nothing in it (rewritten where it is repaired or put back in order)."""

import json
import os
from collections import Counter
from pathlib import Path

from conftest import read_jsonl
from test_sweep import _options, run

FIXTURES = (run,)  # test_sweep's run dir (three checkpoints, a base, a manifest), a fixture here too


def _spy(monkeypatch, module, name):
    """Count the calls of ``module.name`` by their first argument (as text)."""
    calls = Counter()
    real = getattr(module, name)

    def spied(first, *args, **kwargs):
        calls[str(first)] += 1
        return real(first, *args, **kwargs)

    monkeypatch.setattr(module, name, spied)
    return calls


def _finished(run, out_dir):
    from vlmfast.run.sweep import sweep
    from vlmfast.run.sweep_page import write_sweep_dir

    report = sweep(_options(run, out_dir, steps=(100, 200)))
    write_sweep_dir(report, out_dir)
    return report


def _files(out_dir: Path) -> dict[str, tuple]:
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(out_dir.glob("step-*.jsonl"))}


def test_a_finished_sweeps_rerun_reads_each_results_file_once_and_rewrites_none(run, tmp_path, monkeypatch):
    import vlmfast.run.results as results
    from vlmfast.run.sweep import sweep
    from vlmfast.run.sweep_page import write_sweep_dir

    out = tmp_path / "s"
    _finished(run, out)
    before, page = _files(out), (out / "report.html").read_bytes()
    reads = _spy(monkeypatch, results, "read_existing")
    writes = _spy(monkeypatch, results, "atomic_write")
    report = sweep(_options(run, out, steps=(100, 200)))  # nothing to do: every row is there
    write_sweep_dir(report, out)  # report.json, report.html: as the command line writes them
    assert reads == {str(out / "step-100.jsonl"): 1, str(out / "step-200.jsonl"): 1}
    assert not writes  # no results file rewritten: the same inode, times and bytes
    assert _files(out) == before and (out / "report.html").read_bytes() == page
    assert [c["read_back"] for c in report["checkpoints"]] == [True, True]


def test_a_sweep_checks_its_inputs_once_for_every_checkpoint(run, tmp_path, monkeypatch):
    import vlmfast.run.runner as runner

    checked = _spy(monkeypatch, runner, "check_inputs")
    _finished(run, tmp_path / "s")  # two checkpoints decoded
    assert sum(checked.values()) == 1


def test_the_rows_a_sweep_hands_the_page_are_its_files_rows(run, tmp_path):
    from vlmfast.run.results import read_existing
    from vlmfast.run.sweep_page import write_sweep_html

    out = tmp_path / "s"
    report = _finished(run, out)  # decoded in this run: the rows infer made, not read back
    assert set(report.rows_by_step) == {100, 200}
    for c in report["checkpoints"]:
        assert report.rows_by_step[c["step"]] == list(read_existing(Path(c["results"]), repair=False)[0].values())
    assert "rows_by_step" not in report and json.loads((out / "report.json").read_text()) == report
    read_back = write_sweep_html(report, tmp_path / "read.html", rows_by_step=None)  # the page from the files alone
    assert read_back.read_bytes() == (out / "report.html").read_bytes()


def test_a_results_file_out_of_order_or_without_its_last_newline_is_still_rewritten(run, tmp_path):
    from vlmfast.run.sweep import sweep

    out = tmp_path / "s"
    _finished(run, out)
    whole = {name: data for name, (_, _, data) in _files(out).items()}
    lines = whole["step-100.jsonl"].splitlines(keepends=True)
    (out / "step-100.jsonl").write_bytes(b"".join(reversed(lines)))  # the rows, out of input order
    (out / "step-200.jsonl").write_bytes(whole["step-200.jsonl"].rstrip(b"\n"))  # the last newline cut
    inode = (out / "step-100.jsonl").stat().st_ino
    sweep(_options(run, out, steps=(100, 200)))
    assert {name: data for name, (_, _, data) in _files(out).items()} == whole  # in input order, whole lines again
    assert (out / "step-100.jsonl").stat().st_ino != inode  # replaced atomically
    assert [r["id"] for r in read_jsonl(out / "step-100.jsonl")] == ["q0", "q1", "q2", "q3"]


def test_finalize_leaves_a_file_it_read_alone_only_while_it_is_unchanged(tmp_path):
    from vlmfast.run.results import finalize, read_existing

    out = tmp_path / "r.jsonl"
    rows = [{"id": f"q{i}", "text": "a", "finish_reason": "eos", "error": None} for i in range(3)]
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    read, _ = read_existing(out)
    stat = os.stat(out)
    finalize(out, ["q0", "q1", "q2"], read)
    assert (os.stat(out).st_ino, os.stat(out).st_mtime_ns) == (stat.st_ino, stat.st_mtime_ns)
    read["q1"]["text"] = "b"  # a row changed in memory (scored again): written
    finalize(out, ["q0", "q1", "q2"], read)
    assert os.stat(out).st_ino != stat.st_ino and read_jsonl(out)[1]["text"] == "b"
    read, _ = read_existing(out)
    with open(out, "a") as f:  # the file changed after it was read: written as the rows say
        f.write(json.dumps({**rows[0], "id": "q9"}) + "\n")
    finalize(out, ["q0", "q1", "q2"], read)
    assert [r["id"] for r in read_jsonl(out)] == ["q0", "q1", "q2"]


def test_inputs_checked_once_are_checked_again_when_an_image_is_deleted_or_replaced(tmp_path):
    """A sweep hands its inputs, checked before its first step, to every step; an image deleted since (a long
    --watch) refuses the step as a run of its own would (it became a permanent error row), and an image replaced
    by one of another size gives the new size."""
    import pytest

    from vlmfast.checkpoints.tiny import make_images
    from vlmfast.errors import InputError
    from vlmfast.run.options import InferOptions
    from vlmfast.run.parallel import Distributed
    from vlmfast.run.work import check_inputs, collect_work

    paths = make_images(tmp_path / "images", n=3, sizes=[(56, 42)])
    options = InferOptions(ckpt="unused", images=[str(p) for p in paths], prompt="Count.")
    collected = check_inputs(options)
    assert collect_work(options, Distributed(), collected=collected).todo == collected.requests  # unchanged: as handed in

    make_images(tmp_path / "other", n=1, sizes=[(84, 63)])[0].replace(paths[1])
    work = collect_work(options, Distributed(), collected=collected)
    assert [r.image_sizes for r in work.todo] == [((56, 42),), ((84, 63),), ((56, 42),)]

    paths[2].unlink()
    with pytest.raises(InputError, match="file not found"):
        collect_work(options, Distributed(), collected=collected)


def _calls(monkeypatch, module, name) -> list:
    """The calls of ``module.name`` (looked up where it is called), one entry each."""
    calls, real = [], getattr(module, name)
    monkeypatch.setattr(module, name, lambda *args, **kwargs: calls.append(args) or real(*args, **kwargs))
    return calls


def test_a_sweep_summarizes_each_steps_rows_once(run, tmp_path, monkeypatch):
    import vlmfast.evaluation.health as health
    import vlmfast.evaluation.stats as stats
    from vlmfast.run.sweep import sweep

    out = tmp_path / "s"
    summaries, shapes = _calls(monkeypatch, stats, "summarize"), _calls(monkeypatch, health, "health")
    decoded = _finished(run, out)  # two checkpoints decoded, report.json and report.html written
    assert (len(summaries), len(shapes)) == (2, 2)
    summaries.clear(), shapes.clear()
    read_back = sweep(_options(run, out, steps=(100, 200)))  # nothing to do: both read back
    assert (len(summaries), len(shapes)) == (2, 2)
    assert [{k: v for k, v in c.items() if k not in ("read_back",)} for c in read_back["checkpoints"]] == \
        [{k: v for k, v in c.items() if k not in ("read_back",)} for c in decoded["checkpoints"]]


def test_finalize_writes_rows_changed_in_place_at_any_depth_added_or_removed(tmp_path):
    from vlmfast.run.results import finalize, read_existing

    out = tmp_path / "r.jsonl"
    rows = [{"id": f"q{i}", "text": "a", "finish_reason": "eos", "error": None, "images": ["x.png"],
             "rewards": {"f": 1.0}} for i in range(3)]
    whole = "".join(json.dumps(r) + "\n" for r in rows)
    edits = [lambda read: read["q1"]["images"].append("y.png"), lambda read: read["q2"]["rewards"].update(f=0.0),
             lambda read: read["q0"].pop("rewards"), lambda read: read.pop("q2"),
             lambda read: read.update(q3={**rows[0], "id": "q3"}), lambda read: read["q1"]["images"].sort(reverse=True)]
    for k, edit in enumerate(edits):
        out.write_text(whole)
        read, _ = read_existing(out)
        inode = os.stat(out).st_ino
        edit(read)
        finalize(out, ["q0", "q1", "q2", "q3"], read)
        assert read_jsonl(out) == list(read.values()), k
        assert (os.stat(out).st_ino != inode) == (k != 5), k  # a sort that leaves the list as it was: the same bytes
