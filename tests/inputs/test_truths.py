"""Reading ground truths (``vlmfast score``, a sweep's truths) needs ids and answers only: a TSV's or a
dataset's images are neither decoded nor checked, so a missing or broken image scores as it does in a
JSONL manifest."""

import base64
import json

import pyarrow as pa
import pyarrow.parquet as pq
from conftest import cli


def _results(path, answers):
    path.write_text("".join(json.dumps({"id": rid, "text": f"<answer>{a}</answer>"}) + "\n" for rid, a in answers))
    return path


def test_score_on_a_tsv_with_a_broken_image(images, tmp_path):
    image = base64.b64encode(images[0].read_bytes()).decode()
    tsv = tmp_path / "set.tsv"
    tsv.write_text("index\timage\tquestion\tA\tB\tanswer\n"
                   f"0\t{image}\tRed?\tyes\tno\tA\n"
                   f"1\t{base64.b64encode(b'not an image').decode()}\tBlue?\tyes\tno\tB\n"  # cut or corrupt
                   f"2\t\tGreen?\tyes\tno\tA\n")  # no image at all
    from vlmfast.inputs.convert import read_truths

    assert read_truths(str(tsv)) == {"0": ("A", "choice"), "1": ("B", "choice"), "2": ("A", "choice")}
    results = _results(tmp_path / "results.jsonl", [("0", "A"), ("1", "B"), ("2", "B")])
    r = cli("score", results, "--manifest", tsv, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["accuracy"] == 2 / 3


def test_score_on_a_dataset_with_missing_and_broken_images(images, tmp_path):
    table = pa.table({"id": ["a", "b", "c"], "problem": ["Q1", "Q2", "Q3"], "answer": ["1", "2", "3"],
                      "images": [[{"bytes": images[0].read_bytes(), "path": None}],
                                 [{"bytes": b"not a png", "path": None}],
                                 [{"bytes": None, "path": "gone.png"}]]})  # a path that is not there
    pq.write_table(table, tmp_path / "val.parquet")
    from vlmfast.inputs.convert import read_reward_truths, read_truths

    assert read_truths(str(tmp_path / "val.parquet")) == {"a": ("1", None), "b": ("2", None), "c": ("3", None)}
    assert read_reward_truths(str(tmp_path / "val.parquet"))["c"]["record"]["images"] == [str(tmp_path / "gone.png")]
    results = _results(tmp_path / "results.jsonl", [("a", "1"), ("b", "2"), ("c", "4")])
    r = cli("score", results, "--manifest", tmp_path / "val.parquet", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["accuracy"] == 2 / 3
