import json

import pytest

from conftest import read_jsonl
from vlmfast.errors import InputError
from vlmfast.run.results import ResultsWriter, clear_out, finalize, part_path, prepare_out, read_existing


def _row(i):
    return {"id": f"id{i}", "text": f"t{i}", "finish_reason": "eos", "error": None}


def _write(path, rows, tail=""):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)


def test_writes_batches_then_finalizes_in_input_order(tmp_path):
    out = tmp_path / "r.jsonl"
    w = ResultsWriter(out)
    w.write([_row(2), _row(0)], [2, 0])
    assert [r["id"] for r in read_jsonl(out)] == ["id2", "id0"]  # on disk as soon as the batch is done
    w.write([_row(1)], [1])
    w.close()
    finalize(out, ["id0", "id1", "id2"])
    assert [r["id"] for r in read_jsonl(out)] == ["id0", "id1", "id2"]


def test_overwrite_takes_no_rows_and_removes_the_old_ones_only_when_told(tmp_path):
    """--overwrite: no rows are taken, but the old file and leftover parts stay until the run is ready to
    write (clear_out), so a run that fails before that loses nothing."""
    out = tmp_path / "r.jsonl"
    _write(out, [_row(0)])
    _write(part_path(out, 1), [_row(1)])
    assert prepare_out(out, overwrite=True) == ({}, [])
    assert read_jsonl(out) == [_row(0)] and part_path(out, 1).exists()
    clear_out(out)
    assert not out.exists() and not part_path(out, 1).exists()


def test_torn_last_line_is_repaired_and_reported(tmp_path):
    out = tmp_path / "r.jsonl"
    _write(out, [_row(0)], tail='{"id": "id1", "te')
    _, notes = prepare_out(out, overwrite=False)
    assert "torn last line" in notes[0]
    assert out.read_text() == json.dumps(_row(0)) + "\n"
    assert set(read_existing(out)[0]) == {"id0"}


def test_parts_of_a_killed_parallel_run_are_recovered_once(tmp_path):
    out = tmp_path / "r.jsonl"
    _write(out, [_row(0)])
    _write(part_path(out, 0), [_row(0), _row(1)])  # id0 already merged: not duplicated
    _write(part_path(out, 1), [_row(2)], tail='{"id": "id3"')  # torn tail: not taken
    rows, notes = prepare_out(out, overwrite=False)
    assert sorted(rows) == ["id0", "id1", "id2"]
    assert any("recovered 2 row(s)" in n for n in notes) and any("torn last line" in n for n in notes)
    assert [r["id"] for r in read_jsonl(out)] == ["id0", "id1", "id2"]
    assert not part_path(out, 0).exists() and not part_path(out, 1).exists()
    finalize(out, ["id2", "id1", "id0"])
    assert [r["id"] for r in read_jsonl(out)] == ["id2", "id1", "id0"]


@pytest.mark.parametrize("text", [
    "hello\n" + json.dumps(_row(0)) + "\n",  # garbage first
    json.dumps(_row(0)) + "\nnot json but complete\n",  # a complete last line is not a torn write
    '{"id": "q1", "image": "a.png", "prompt": "p"}\n',  # a manifest given as --out by mistake
])
def test_refuses_to_touch_a_foreign_file(tmp_path, text):
    out = tmp_path / "r.jsonl"
    out.write_text(text)
    with pytest.raises(InputError, match="not a vlmfast result row"):
        prepare_out(out, overwrite=False)
    assert out.read_text() == text  # not a byte changed


def test_overwrite_into_a_new_directory(tmp_path):
    out = tmp_path / "new" / "dir" / "r.jsonl"
    assert prepare_out(out, overwrite=True) == ({}, [])
    ResultsWriter(out).write([_row(0)], [0])
    assert read_jsonl(out) == [_row(0)]


def test_stdout_rows_come_out_in_input_order(capsys):
    ResultsWriter(None).write([_row(0)], [0])  # a library call without a file: nothing printed
    assert capsys.readouterr().out == ""
    w = ResultsWriter(None, stdout=True)
    w.write([_row(2)], [2])
    assert capsys.readouterr().out == ""
    w.write([_row(0)], [0])
    w.write([_row(1)], [1])
    assert [json.loads(line)["id"] for line in capsys.readouterr().out.splitlines()] == ["id0", "id1", "id2"]


def test_rows_held_for_input_order_are_printed_when_the_run_is_cut_short(capsys):
    """Ctrl-C with rows on stdout: finished rows still waiting for an earlier one are printed (out of input
    order, each with its id) rather than lost, and the message counts them."""
    from vlmfast.run.results import interrupted as _interrupted

    w = ResultsWriter(None, stdout=True)
    w.write([_row(2), _row(1)], [2, 1])  # row 0 never finished
    assert capsys.readouterr().out == "" and w.printed == 0
    assert w.release_held() == 2 and w.printed == 2
    assert [json.loads(line)["id"] for line in capsys.readouterr().out.splitlines()] == ["id1", "id2"]
    said = _interrupted(2, None, held=2)
    assert said.message == "interrupted after 2 row(s) on stdout (2 of them out of input order: they finished before an earlier one)"
    assert _interrupted(0, None).message == "interrupted after 0 row(s) on stdout"


def test_sigterm_ends_a_command_as_ctrl_c_does_after_the_write_in_progress(tmp_path):
    """What Slurm, `timeout` and `kill` send: a write in progress completes, then the command ends as on
    Ctrl-C (KeyboardInterrupt → the runner says what is on disk and how to resume; exit 130)."""
    import os
    import signal

    import typer

    from vlmfast.cli.common import guarded
    from vlmfast.errors import EXIT_INTERRUPTED
    from vlmfast.run.results import sigint_deferred

    before = signal.getsignal(signal.SIGTERM)
    out = tmp_path / "r.jsonl"
    with pytest.raises(KeyboardInterrupt):
        with sigint_deferred():
            os.kill(os.getpid(), signal.SIGTERM)  # arrives mid-write: held back until the rows are on disk
            ResultsWriter(out).write([_row(0)], [0])
    assert read_jsonl(out) == [_row(0)]

    def terminated():
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(10_000):  # the handler runs between bytecodes: it cannot get past this loop
            pass
        raise AssertionError("SIGTERM did not interrupt the command")

    with pytest.raises(typer.Exit) as exc:
        guarded(terminated)
    assert exc.value.exit_code == EXIT_INTERRUPTED
    assert signal.getsignal(signal.SIGTERM) == before  # restored after the command


def test_a_whole_last_row_whose_newline_was_cut_is_kept_and_the_next_append_starts_a_line(tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_text(json.dumps(_row(0)) + "\n" + json.dumps(_row(1)))  # a write cut between the row and its newline
    rows, note = read_existing(out)
    assert list(rows) == [_row(0)["id"], _row(1)["id"]] and note is None
    assert out.read_text().endswith("\n")
    writer = ResultsWriter(out)
    writer.write([_row(2)], [2])
    writer.close()
    assert [r["id"] for r in read_jsonl(out)] == [_row(k)["id"] for k in range(3)]  # three rows, none glued


def test_an_interrupt_outside_the_decode_loop_claims_nothing_about_what_is_on_disk(capsys):
    """A Ctrl-C while a finished run's rows are read back and its report made reaches the command's guard with every
    row on disk: it said "interrupted before any result was written", and --json told a script nothing exists."""
    import typer

    from vlmfast.cli.common import guarded
    from vlmfast.errors import EXIT_INTERRUPTED

    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(typer.Exit) as exc:
        guarded(interrupted, json_out=True)
    assert exc.value.exit_code == EXIT_INTERRUPTED
    said = json.loads(capsys.readouterr().out)["error"]
    assert said["message"] == "interrupted" and said["hint"] == "rerun the same command"  # each command says more
    assert "before any result" not in said["message"] + said["hint"]


def test_ids_convert_0_18_9_gave_map_to_today_s_only_where_they_name_that_record(tmp_path):
    """convert in 0.18.9 and earlier named an id-less ms-swift record NNNNN_<image stem> (its position, its first image); today
    by its first image as written, ranked. A row id maps to today's id of the record at that position only where
    no record has the row's id, that record's first image has the stem, its id is that image (not one of its own)
    and the row asked its question; a row already under today's id is kept over the earlier one."""
    from vlmfast.inputs.requests import read_manifest
    from vlmfast.run.results import converted_ids, renamed_legacy_ids

    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in [
        {"id": "a.png", "image": "a.png", "prompt": "Q0"},
        {"id": "a.png#2", "image": "a.png", "prompt": "Q1"},
        {"id": "own", "image": "b.png", "prompt": "Q2"},
        {"id": "00003_c", "image": "c.png", "prompt": "Q3"},  # a real id of that form (a VLM-R1 line's) stays
        {"id": "c.png", "image": "c.png", "prompt": "Q4"},
    ]))
    requests, _ = read_manifest(str(manifest), None, images=False)

    def row(rid, prompt, answer="A", image=None):
        return {"id": rid, "prompt": prompt, "images": [str(tmp_path / f"{image or rid[-1]}.png")], "text": answer,
                "answer": answer, "finish_reason": "eos", "error": None}

    rows = [row("00000_a", "Q0"), row("00001_a", "Q1"), row("00002_b", "Q2"), row("00003_c", "Q3"),
            row("00004_x", "Q4"), row("0004_c", "Q4"), row("000004_c", "Q4"), row("00004_c", "another question")]
    assert converted_ids(rows, requests) == {"00000_a": "a.png", "00001_a": "a.png#2"}
    assert converted_ids([row("00004_c", "Q4")], requests) == {"00004_c": "c.png"}
    assert converted_ids([row("00004_c", "Q4", image="d")], requests) == {}  # answered about another image
    assert converted_ids([row("00000_a", "Q0")], requests, bad_ids=["00000_a"]) == {}

    existing = {r["id"]: r for r in [row("00000_a", "Q0", "old"), row("a.png", "Q0", "new", "a"), row("00001_a", "Q1")]}
    notes = []
    renamed = renamed_legacy_ids(existing, requests, notes)
    assert {k: r["answer"] for k, r in renamed.items()} == {"a.png": "new", "a.png#2": "A"}
    assert notes == ["1 row(s) an earlier vlmfast wrote under another id (an image's resolved path, a manifest line's "
                     "path, convert's NNNNN_<image stem>) now carry today's; 1 more were dropped: a row under today's "
                     "id was there already"]
