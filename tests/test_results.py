import json

import pytest

from conftest import read_jsonl
from vlmfast.errors import InputError
from vlmfast.results import ResultsWriter, read_existing


def _row(i):
    return {"id": f"id{i}", "text": f"t{i}"}


def test_writes_batches_then_finalizes_in_input_order(tmp_path):
    out = tmp_path / "r.jsonl"
    w = ResultsWriter(out)
    w.write([_row(2), _row(0)], [2, 0])
    assert [r["id"] for r in read_jsonl(out)] == ["id2", "id0"]  # on disk as soon as the batch is done
    w.write([_row(1)], [1])
    w.finalize(["id0", "id1", "id2"])
    assert [r["id"] for r in read_jsonl(out)] == ["id0", "id1", "id2"]


def test_resume_knows_done_ids_and_overwrite_forgets_them(tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_text(json.dumps(_row(0)) + "\n" + json.dumps(_row(1)) + "\n")
    assert set(ResultsWriter(out).done) == {"id0", "id1"}
    assert ResultsWriter(out, overwrite=True).done == {} and not out.exists()


def test_torn_last_line_is_repaired_and_reported(tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_text(json.dumps(_row(0)) + "\n" + '{"id": "id1", "te')
    w = ResultsWriter(out)
    assert set(w.done) == {"id0"} and "torn last line" in w.notes[0]
    assert out.read_text() == json.dumps(_row(0)) + "\n"
    w.write([_row(1)], [1])
    assert [r["id"] for r in read_jsonl(out)] == ["id0", "id1"]


def test_refuses_to_append_to_a_foreign_file(tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_text("hello\n" + json.dumps(_row(0)) + "\n")
    with pytest.raises(InputError, match="not a vlmfast result row"):
        read_existing(out)


def test_stdout_rows_come_out_in_input_order(capsys):
    w = ResultsWriter(None)
    w.write([_row(2)], [2])
    assert capsys.readouterr().out == ""
    w.write([_row(0)], [0])
    w.write([_row(1)], [1])
    assert [json.loads(line)["id"] for line in capsys.readouterr().out.splitlines()] == ["id0", "id1", "id2"]
