"""VLMEvalKit TSV manifests: a made MMBench-style file (base64 images, options A-D, a hint, a repeated image
named by another row's index, a quoted multi-line question) gives the same rows and accuracy as the JSONL
that names the same images as files, the prompt laid out as VLMEvalKit's multiple-choice datasets build it."""

import base64
import csv
import json

import pytest

from conftest import cli, read_jsonl


def _prompt(question, options, hint=None):
    """VLMEvalKit's ImageMCQDataset.build_prompt, written out by hand."""
    text = (f"Hint: {hint}\n" if hint else "") + f"Question: {question}\n" + "Options:\n"
    text += "".join(f"{k}. {v}\n" for k, v in options.items())
    return text + "Please select the correct answer from the options above. \n"


@pytest.fixture(scope="module")
def sets(tmp_path_factory, images):
    root = tmp_path_factory.mktemp("tsv")
    rows = [
        {"index": "10", "question": "How many shapes?", "A": "1", "B": "2", "C": "3", "D": "4", "answer": "B",
         "hint": "", "category": "count", "image": base64.b64encode(images[0].read_bytes()).decode()},
        {"index": "11", "question": "Which colour is\n the largest shape?", "A": "red", "B": "blue", "C": "", "D": "",
         "answer": "A", "hint": "Look closely.", "category": "colour",
         "image": base64.b64encode(images[1].read_bytes()).decode()},
        {"index": "12", "question": "Is it square?", "A": "yes", "B": "no", "C": "", "D": "", "answer": "A", "hint": "",
         "category": "shape", "image": "10"},  # MMBench: a repeated image names the row that holds it
    ]
    tsv = root / "MMBench_mini.tsv"
    with open(tsv, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), delimiter="\t")
        writer.writeheader()
        writer.writerows(rows)
    files = {"10": images[0], "11": images[1], "12": images[0]}
    printed = {("10", "C"): "3.0", ("10", "D"): "4.0"}  # numbers with gaps: pandas makes the column float
    jsonl = root / "mmbench_mini.jsonl"
    jsonl.write_text("".join(json.dumps({
        "id": r["index"], "image": str(files[r["index"]]), "scorer": "choice", "solution": r["answer"],
        "prompt": _prompt(r["question"], {k: printed.get((r["index"], k), r[k]) for k in "ABCD" if r[k]},
                          r["hint"] or None)}) + "\n" for r in rows))
    return {"tsv": tsv, "jsonl": jsonl, "rows": rows}


def test_the_rows_are_vlmevalkit_s_requests(sets):
    from vlmfast.inputs.requests import read_manifest

    items, notes = read_manifest(str(sets["tsv"]), None)
    assert [r.id for r in items] == ["10", "11", "12"]
    assert items[1].prompt == ("Hint: Look closely.\nQuestion: Which colour is\n the largest shape?\nOptions:\n"
                               "A. red\nB. blue\nPlease select the correct answer from the options above. \n")
    assert [(r.truth, r.scorer) for r in items] == [("B", "choice"), ("A", "choice"), ("A", "choice")]
    assert all(r.image_sizes and r.image_data for r in items) and "category" in notes[0]
    assert "image" not in items[0].record and items[0].record["category"] == "count"
    from vlmfast.inputs.datasets import load_images

    decoded = load_images(items)
    assert decoded[("12", 0)].size == decoded[("10", 0)].size  # the repeated image is row 10's


def test_a_tsv_gives_the_same_rows_and_accuracy_as_its_jsonl(sets, grpo_ckpt, tmp_path):
    runs = {}
    for kind in ("tsv", "jsonl"):
        out = tmp_path / f"{kind}.jsonl"
        r = cli("infer", "--ckpt", grpo_ckpt, "--manifest", sets[kind], "--max-new-tokens", "4", "--device", "cpu",
                "--out", out, "--json")
        assert r.returncode == 0, r.stderr
        runs[kind] = (read_jsonl(out), json.loads(r.stdout)["scores"])
    fields = ("id", "prompt", "text", "token_ids", "answer", "correct", "score", "scorer")
    tsv_rows, jsonl_rows = ([{k: row.get(k) for k in fields} for row in rows] for rows, _ in runs.values())
    assert tsv_rows == jsonl_rows and all(row["scorer"] == "choice" for row in tsv_rows)
    assert runs["tsv"][1]["accuracy"] == runs["jsonl"][1]["accuracy"]
    assert not list(sets["tsv"].parent.glob("*.png"))  # nothing decoded to disk
    score = cli("score", tmp_path / "tsv.jsonl", "--manifest", sets["tsv"], "--json")
    assert score.returncode == 0 and json.loads(score.stdout)["accuracy"] == runs["tsv"][1]["accuracy"]


def _write(path, lines):
    path.write_bytes("".join(lines).encode("utf-8"))
    return path


def _b64(image):
    return base64.b64encode(image.read_bytes()).decode()


def test_a_quote_inside_a_field_is_a_quote_as_pandas_reads_it(images, tmp_path):
    """pandas (VLMEvalKit's reader) opens a quoted field only at a field's start: a quote further in is text,
    and every row after it is still a row of its own."""
    from vlmfast.inputs.datasets import load_images
    from vlmfast.inputs.requests import read_manifest

    rows = [("0", 'Is the 6" ruler red?', "A"), ("1", "Is it blue?", "A"), ("2", 'How tall, 5" or 7"?', "B"),
            ("3", '"Quoted" first, then 6" more?', "A")]
    tsv = _write(tmp_path / "quotes.tsv", ["index\timage\tquestion\tA\tB\tanswer\n"]
                 + [f"{i}\t{_b64(images[k])}\t{q}\tyes\tno\t{a}\n" for k, (i, q, a) in enumerate(rows)])
    items, _ = read_manifest(str(tsv), None)
    assert [(r.id, r.truth, r.scorer) for r in items] == [("0", "A", "choice"), ("1", "A", "choice"),
                                                           ("2", "B", "choice"), ("3", "A", "choice")]
    assert items[0].prompt.startswith('Question: Is the 6" ruler red?\n')
    assert items[3].prompt.startswith('Question: Quoted first, then 6" more?\n')  # as pandas unquotes it
    from PIL import Image

    decoded = load_images(items)  # each row read again from its own byte offset
    assert [decoded[(r.id, 0)].size for r in items] == [Image.open(images[k]).size for k in range(4)]


@pytest.mark.parametrize("bad, line", [
    ('1\txx\t"unclosed question\tyes\tno\tA\n', 3),  # a quoted field open to the end of the file
    ('1\txx\tq?\tyes\tno\t"A\n2\txx\tq"\tyes\tno\tB\n', 3),  # a quoted field swallowing a row: too many fields
])
def test_rows_that_cannot_be_told_apart_are_an_error_naming_the_line(tmp_path, bad, line):
    from vlmfast.errors import InputError
    from vlmfast.inputs.requests import read_manifest

    tsv = _write(tmp_path / "bad.tsv", ["index\timage\tquestion\tA\tB\tanswer\n", "0\txx\tfine?\tyes\tno\tA\n",
                                        bad, "3\txx\tlast?\tyes\tno\tB\n"])
    with pytest.raises(InputError) as caught:
        read_manifest(str(tsv), None)
    assert f"bad.tsv:{line}:" in str(caught.value) and "quote" in caught.value.hint


def test_blank_lines_are_skipped_not_bad_rows(images, tmp_path, grpo_ckpt):
    from vlmfast.inputs.requests import read_manifest

    image = _b64(images[0])
    tsv = _write(tmp_path / "blank.tsv", ["index\timage\tquestion\tanswer\r\n", f"0\t{image}\tOne?\t1\r\n", "\r\n",
                                          f"1\t{image}\tTwo?\t2\r\n", "\r\n"])
    items, _ = read_manifest(str(tsv), None)
    assert [(type(r).__name__, r.id, r.truth) for r in items] == [("Request", "0", "1"), ("Request", "1", "2")]
    out = tmp_path / "out.jsonl"
    r = cli("infer", "--ckpt", grpo_ckpt, "--manifest", tsv, "--max-new-tokens", "2", "--device", "cpu",
            "--skip-bad", "--out", out)
    assert r.returncode == 0, r.stderr
    assert [(row["id"], row["error"]) for row in read_jsonl(out)] == [("0", None), ("1", None)]


def test_an_image_cell_naming_a_row_without_an_image_is_a_problem_when_read_and_no_crash_for_truths(images, tmp_path):
    """Row 2 names row 3, whose own cell names row 1: with images read, row 2 is a bad row saying so; read for
    ground truths only (score), every row gives its truth, as before."""
    from vlmfast.inputs.tsv import read_tsv

    tsv = _write(tmp_path / "chain.tsv", ["index\timage\tquestion\tA\tB\tanswer\n", f"1\t{_b64(images[0])}\tq1?\tx\ty\tA\n",
                                          "2\t3\tq2?\tx\ty\tB\n", "3\t1\tq3?\tx\ty\tB\n"])
    items, _ = read_tsv(str(tsv), None, images=True)
    assert [i.id for i in items if not hasattr(i, "truth")] == ["2"]
    assert "names row 3, which holds no image of its own" in items[1].problems[0].what
    items, _ = read_tsv(str(tsv), None, images=False)
    assert [(i.id, i.truth) for i in items] == [("1", "A"), ("2", "B"), ("3", "B")]


def test_a_repeated_index_names_both_rows(images, tmp_path):
    from vlmfast.errors import InputError
    from vlmfast.inputs.requests import collect, raise_for_problems

    tsv = _write(tmp_path / "dup.tsv", ["index\timage\tquestion\tA\tB\tanswer\n", f"1\t{_b64(images[0])}\tq1?\tx\ty\tA\n",
                                        f"1\t{_b64(images[1])}\tq2?\tx\ty\tB\n"])
    with pytest.raises(InputError) as err:
        raise_for_problems(collect(manifest=str(tsv)))
    assert f"duplicate id (2 records: {tsv}#row=0, {tsv}#row=1)" in str(err.value) and "a TSV's \"index\"" in str(err.value)
