"""``vlmfast score --by COLUMN``: the accuracy per value of a manifest column (VLMEvalKit's ``category``, a
dataset's ``data_source``), read from the manifest's records, or from the rows where the manifest has none."""

import base64
import json

import pyarrow as pa
import pyarrow.parquet as pq
from conftest import cli
from test_truths import _results


def test_accuracy_per_tsv_category(images, tmp_path):
    image = base64.b64encode(images[0].read_bytes()).decode()
    tsv = tmp_path / "mmb.tsv"
    tsv.write_text("index\timage\tquestion\tA\tB\tanswer\tcategory\n"
                   f"0\t{image}\tRed?\tyes\tno\tA\tcolor\n"
                   f"1\t0\tBlue?\tyes\tno\tB\tcolor\n"
                   f"2\t0\tHow many?\tone\ttwo\tA\tcount\n"
                   f"3\t0\tLeft?\tyes\tno\tA\t\n")
    results = _results(tmp_path / "results.jsonl", [("0", "A"), ("1", "A"), ("2", "A"), ("3", "B")])
    r = cli("score", results, "--manifest", tsv, "--by", "category", "--json")
    assert r.returncode == 0, r.stderr
    by = json.loads(r.stdout)["by"]
    assert by["column"] == "category" and by["rows_without_value"] == 1
    assert list(by["groups"]) == ["color", "count"]  # the largest group first
    assert by["groups"]["color"] == {"rows": 2, "requests": 2, "scored": 2, "accuracy": 0.5, "mean_score": 0.5, "answer_parse_failures": 0}
    assert by["groups"]["count"]["accuracy"] == 1.0
    assert "by category" in r.stderr and "1 row without a category" in r.stderr


def test_accuracy_per_nested_dataset_column(images, tmp_path):
    table = pa.table({"id": ["a", "b", "c"], "problem": ["Q1", "Q2", "Q3"], "answer": ["1", "2", "3"],
                      "images": [[{"bytes": images[0].read_bytes(), "path": None}]] * 3,
                      "extra_info": [{"split": "geo"}, {"split": "geo"}, {"split": "chart"}]})
    pq.write_table(table, tmp_path / "val.parquet")
    results = _results(tmp_path / "results.jsonl", [("a", "1"), ("b", "0"), ("c", "3")])
    r = cli("score", results, "--manifest", tmp_path / "val.parquet", "--by", "extra_info.split", "--json")
    assert r.returncode == 0, r.stderr
    groups = json.loads(r.stdout)["by"]["groups"]
    assert {k: (g["scored"], g["accuracy"]) for k, g in groups.items()} == {"geo": (2, 0.5), "chart": (1, 1.0)}


def test_a_column_the_rows_carry_and_one_no_one_has(tmp_path):
    manifest = tmp_path / "val.jsonl"
    manifest.write_text("".join(json.dumps({"id": str(k), "image": "x.png", "prompt": "Q", "solution": str(k)}) + "\n"
                                for k in range(3)))
    rows = [{"id": "0", "text": "<answer>0</answer>", "split": "a"}, {"id": "1", "text": "<answer>9</answer>", "split": "a"},
            {"id": "2", "text": "<answer>2</answer>", "split": "b"}]
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = cli("score", results, "--manifest", manifest, "--by", "split", "--json")
    assert r.returncode == 0, r.stderr
    assert {k: g["accuracy"] for k, g in json.loads(r.stdout)["by"]["groups"].items()} == {"a": 0.5, "b": 1.0}

    out = tmp_path / "scored.jsonl"
    r = cli("score", results, "--manifest", manifest, "--by", "category", "--out", out, "--json")
    assert r.returncode == 2
    assert "--by category" in r.stderr and "solution" in r.stderr  # the columns there are
    assert not out.exists()  # nothing written
    assert json.loads(r.stdout)["error"]


def test_score_out_keeps_rows_the_manifest_lacks_refuses_another_runs_file_and_makes_its_folder(tmp_path):
    manifest = tmp_path / "val.jsonl"
    manifest.write_text("".join(json.dumps({"id": str(k), "image": "x.png", "prompt": "Q", "solution": str(k)}) + "\n"
                                for k in range(2)))
    rows = [{"id": "0", "text": "<answer>0</answer>"}, {"id": "1", "text": "<answer>9</answer>"},
            {"id": "7", "text": "<answer>7</answer>", "score": 1.0, "correct": True, "scorer": "number"}]
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = cli("score", results, "--manifest", manifest, "--out", results, "--json")  # in place, with a smaller manifest
    assert r.returncode == 0, r.stderr
    got = {row["id"]: row for row in map(json.loads, results.read_text().splitlines())}
    assert got["7"]["score"] == 1.0 and got["7"]["correct"] is True  # scored against another manifest: kept as it was
    assert got["0"]["correct"] is True and got["1"]["correct"] is False
    assert json.loads(r.stdout)["accuracy"] == 0.5  # row 7 is not in the figures

    other = tmp_path / "other.jsonl"  # another run's results file, with its record beside it
    other.write_text(json.dumps({"id": "0", "text": "x"}) + "\n")
    (tmp_path / "other.run.json").write_text("{}")
    r = cli("score", results, "--manifest", manifest, "--out", other, "--json")
    assert r.returncode == 2 and "is another run's results file" in r.stderr
    assert other.read_text() == json.dumps({"id": "0", "text": "x"}) + "\n"

    r = cli("score", results, "--manifest", manifest, "--out", tmp_path / "new" / "dir" / "s.jsonl", "--json")
    assert r.returncode == 0, r.stderr
    assert len((tmp_path / "new" / "dir" / "s.jsonl").read_text().splitlines()) == 3


def test_a_column_is_read_past_a_bad_record_and_score_reads_images_under_the_image_root(images, tmp_path):
    """sweep --by with --skip-bad: a bad record (its error row in no group) does not stop reading the column;
    score --image-root hands a reward function the image paths infer --image-root did (VLM-R1's image_path)."""
    from vlmfast.run.rescore import manifest_column

    root = tmp_path / "imgs"
    root.mkdir()
    (root / "a.png").write_bytes(images[0].read_bytes())
    lines = [{"id": "a", "image": "a.png", "conversations": [{"from": "human", "value": "<image>Q?"},
                                                            {"from": "gpt", "value": "<answer>1</answer>"}], "kind": "x"},
             {"id": "b", "image": "a.png", "prompt": "Q", "scorer": "exactt", "kind": "y"}]  # a bad scorer
    manifest = tmp_path / "m" / "val.jsonl"
    manifest.parent.mkdir()
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert manifest_column("kind", str(manifest)) == {"a": "x"}
    manifest.write_text(json.dumps(lines[0]) + "\n")
    reward = tmp_path / "seen.py"
    reward.write_text("import os\n\ndef seen(completions, image_path, **kwargs):\n"
                      "    return [float(os.path.exists(p[0])) for p in image_path]\n")
    results = _results(tmp_path / "r.jsonl", [("a", "1")])
    r = cli("score", results, "--manifest", manifest, "--reward", f"{reward}:seen", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["accuracy"] == 0.0  # under the manifest's folder: not there
    r = cli("score", results, "--manifest", manifest, "--image-root", root, "--reward", f"{reward}:seen", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["accuracy"] == 1.0, r.stderr
    r = cli("score", results, "--manifest", manifest, "--image-root", tmp_path / "nope", "--json")
    assert r.returncode == 2 and "no such folder" in r.stderr


def test_score_refuses_rows_that_answered_other_requests_than_their_ids_name_now(images, tmp_path):
    """A line inserted at the top of a manifest whose lines have no ids moves the ids of the later lines about the
    same image: the rows (which carry their prompt and images) are refused, not judged against other truths."""
    image = str(images[0])
    manifest = tmp_path / "m.jsonl"
    lines = [{"image": image, "prompt": q, "solution": a} for q, a in (("What color?", "red"), ("How many?", "2"))]
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    rows = [{"id": image, "text": "<answer>red</answer>", "prompt": "What color?", "images": [image]},
            {"id": f"{image}#2", "text": "<answer>2</answer>", "prompt": "How many?", "images": [image]}]
    results = tmp_path / "r.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = cli("score", results, "--manifest", manifest, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["accuracy"] == 1.0
    manifest.write_text("".join(json.dumps(line) + "\n" for line in [{"image": image, "prompt": "Light?", "solution": "no"}]
                                + lines))
    r = cli("score", results, "--manifest", manifest, "--json")
    assert r.returncode == 2 and "answered other requests than" in r.stderr, r.stderr


def test_the_by_hint_names_every_record_s_columns_not_only_the_first_s(tmp_path):
    manifest = tmp_path / "val.jsonl"
    manifest.write_text(json.dumps({"id": "0", "image": "x.png", "prompt": "Q", "solution": "0"}) + "\n" +
                        json.dumps({"id": "1", "image": "x.png", "prompt": "Q", "answer": "B", "system": "Be brief."}) + "\n")
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps({"id": k, "text": "<answer>0</answer>"}) + "\n" for k in ("0", "1")))
    r = cli("score", results, "--manifest", manifest, "--by", "category")
    assert r.returncode == 2
    hint = next(line for line in r.stderr.splitlines() if line.startswith("hint:"))
    assert "system" in hint and "answer" in hint and "solution" in hint  # --by system works: the hint names it
