"""Converters from VLM-R1 and ms-swift files to manifests with ground truth (no model, no images)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import cli
from vlmfast.inputs.convert import convert_file, read_truths, write_manifest
from vlmfast.errors import InputError, UsageError
from vlmfast.inputs.requests import Request, read_manifest
from vlmfast.evaluation.scoring import rescore, truth_text
from vlmfast.evaluation.stats import summarize

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_vlmr1_rec_example():
    rows = convert_file(str(CONFIGS / "vlmr1_rec.example.json"), "vlmr1", image_root="/data/coco")
    assert len(rows) == 4
    assert rows[0] == {
        "id": "00000_COCO_train2014_000000581857",
        "image": "/data/coco/train2014/COCO_train2014_000000581857.jpg",
        "prompt": "Please provide the bounding box coordinate of the region this sentence describes: "
                  "the lady with the blue shirt.",
        "solution": [103, 299, 359, 633],  # no scorer written: auto reads a box as one, --scorer may choose another
    }
    assert len({r["id"] for r in rows}) == 4  # two expressions share one image, ids still differ
    assert rows[3]["solution"] == [4.2, 41.7, 230.5, 471.0]
    assert convert_file(str(CONFIGS / "vlmr1_rec.example.json"), "auto", image_root="/data/coco") == rows
    assert convert_file(str(CONFIGS / "vlmr1_rec.example.json"))[0]["image"] == "train2014/COCO_train2014_000000581857.jpg"


def test_vlmr1_jsonl_conversations_and_math(tmp_path):
    src = tmp_path / "r1.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in [
        {"id": 7, "image": "clevr/a.png", "conversations": [
            {"from": "human", "value": "<image>What number of purple balls are there?"},
            {"from": "gpt", "value": "<answer> 0 </answer>"}]},
        {"image": ["gui/before.png", "gui/after.png"], "conversations": [
            {"from": "human", "value": "<image><image>Which defect?"}, {"from": "gpt", "value": "No Defect"}]},
        {"image": "m/q.png", "problem": "Which option?\nA. 1\nB. 2", "solution": "<answer>B</answer>", "accu_reward_method": "mcq"},
        {"image": "m/r.png", "question": "How far?", "answer": 12.5},
        {"image": "m/s.png", "problem": "Where is it?", "solution": "<answer>[1, 2, 30, 40]</answer>"},
    ]) + "\n")
    rows = convert_file(str(src), "auto", image_root="root")
    # the ground truth as the trainer's reward functions get it (VLM-R1's loader re-wraps the second turn)
    assert rows[0] == {"id": "7", "image": "root/clevr/a.png", "prompt": "What number of purple balls are there?",
                       "solution": "<answer> 0 </answer>"}
    assert rows[1]["images"] == ["root/gui/before.png", "root/gui/after.png"] and rows[1]["prompt"] == "Which defect?"
    assert rows[1]["id"] == "00001_before" and rows[1]["solution"] == "<answer> No Defect </answer>" and "scorer" not in rows[1]
    assert (rows[2]["solution"], rows[2]["scorer"]) == ("<answer>B</answer>", "choice")
    assert (rows[3]["prompt"], rows[3]["solution"]) == ("How far?", 12.5)
    assert rows[4]["solution"] == "<answer>[1, 2, 30, 40]</answer>" and "scorer" not in rows[4]
    # the built-in scorers read inside: what a manifest of these rows gives them
    assert [truth_text(r["solution"]) for r in rows] == ["0", "No Defect", "B", "12.5", [1, 2, 30, 40]]


def test_swift_example():
    rows = convert_file(str(CONFIGS / "swift.example.jsonl"), "swift")
    # id-less records: the first image as written, the id --manifest gives them read as they are
    assert [r["id"] for r in rows] == ["images/img_000.png", "images/img_001.png", "images/img_002.png", "swift-grounding-1"]
    assert rows[0]["prompt"] == "How many items are there in the image?"
    assert rows[0]["system"].startswith("A conversation between User and Assistant")
    assert rows[0]["solution"] == "<answer> 3 </answer>" and truth_text(rows[0]["solution"]) == "3"  # as written
    assert rows[1]["solution"] == "B" and "system" not in rows[1]
    assert rows[2]["solution"] == "yes"  # the assistant reply stands in for a missing solution
    assert (rows[3]["solution"], rows[3]["scorer"]) == ("<answer>[10, 12, 70, 90]</answer>", "bbox")  # the record's own
    assert all("<image>" not in r["prompt"] for r in rows)


def test_swift_variants(tmp_path):
    src = tmp_path / "s.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in [
        {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Count."}]}],
         "images": [{"path": "/abs/x.png"}], "solution": 4},
        {"messages": [{"role": "user", "content": "<image>Q1"}, {"role": "assistant", "content": "old"},
                      {"role": "user", "content": "<image>Q2"}], "images": ["a.png"]},
    ]) + "\n")
    rows = convert_file(str(src), image_root="/img")
    assert rows[0] == {"id": "/abs/x.png", "image": "/abs/x.png", "prompt": "Count.", "solution": 4}
    assert rows[1]["prompt"] == "Q2" and "solution" not in rows[1]  # "old" answers Q1, not Q2
    assert rows[1]["image"] == "/img/a.png"


def test_bad_jsonl_records_are_listed_together(tmp_path):
    src = tmp_path / "bad.jsonl"
    lines = [
        json.dumps({"image": "a.jpg", "problem": "ok", "solution": [1, 2, 3, 4]}),
        "{not json",
        json.dumps(["a list"]),
        json.dumps({"problem": "no image", "solution": [1, 2, 3, 4]}),
        json.dumps({"image": "b.jpg", "solution": [1, 2, 3, 4], "conversations": []}),
        json.dumps({"image": "c.jpg", "problem": "three numbers", "solution": [1, 2, 3]}),
        json.dumps({"image": "d.jpg", "problem": "reversed", "solution": [30, 40, 10, 20]}),
        json.dumps({"id": "x", "image": "e.jpg", "problem": "p"}),
        json.dumps({"id": "x", "image": "f.jpg", "problem": "p"}),
        json.dumps({"image": "g.jpg", "caption": "which format?"}),
        json.dumps({"image": "h.jpg", "problem": "p", "scorer": "fuzzy"}),
        json.dumps({"messages": [{"role": "system", "content": "s"}], "images": ["i.jpg"]}),
    ]
    src.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError) as exc:
        convert_file(str(src))
    problems = exc.value.problems
    assert [p.split(":")[1] for p in problems] == ["2", "3", "4", "5", "6", "7", "9", "10", "11", "12"]
    text = "\n".join(problems)
    for needle in ("invalid JSON", "not a JSON object", "no image", "no question", "3 numbers",
                   "reversed", "duplicate id 'x'", "cannot tell the format", "unknown scorer", "no user turn"):
        assert needle in text
    assert exc.value.hint and "10 bad record(s)" in exc.value.message


def test_bad_records_in_a_json_array_keep_their_lines(tmp_path):
    src = tmp_path / "bad.json"
    src.write_text('[\n  {"image": "a.jpg", "problem": "p", "solution": [1, 2, 3, 4]},\n'
                   '  {"image": "b.jpg",\n   "problem": "q", "solution": [5, 5, 1, 1]},\n'
                   '  {"problem": "r"}\n]\n')
    with pytest.raises(InputError) as exc:
        convert_file(str(src), "vlmr1")
    assert [p.split(": ", 1)[0] for p in exc.value.problems] == [f"{src}:3", f"{src}:5"]


@pytest.mark.parametrize("text, where", [
    ('[\n {"image": "a.jpg", "problem": "p"}\n {"image": "b.jpg"}\n]', ":3"),  # the missing comma
    ('[\n {"image": "a.jpg", "problem": "p"},\n', ":"),
    ("[]", None),
    ("", None),
    ("\n\n", None),
])
def test_unreadable_or_empty_files(tmp_path, text, where):
    src = tmp_path / "f.json"
    src.write_text(text)
    with pytest.raises(InputError) as exc:
        convert_file(str(src))
    if where is None:
        assert "holds no records" in exc.value.message
    else:
        assert exc.value.problems and f"{src}{where}" in exc.value.problems[0]


def test_bad_arguments(tmp_path):
    with pytest.raises(UsageError):
        convert_file(str(CONFIGS / "swift.example.jsonl"), "llava")
    with pytest.raises(InputError):
        convert_file(str(tmp_path / "missing.jsonl"))


def test_written_manifest_runs_and_scores(tmp_path):
    rows = convert_file(str(CONFIGS / "vlmr1_rec.example.json"), image_root="/data/coco")
    out = write_manifest(rows, str(tmp_path / "sub" / "rec.jsonl"))
    assert [json.loads(line) for line in out.read_text().splitlines()] == rows
    items, _ = read_manifest(str(out), None)  # the run reads it like any manifest
    assert all(isinstance(r, Request) for r in items) and [r.id for r in items] == [r["id"] for r in rows]
    assert items[0].truth == [103, 299, 359, 633] and items[0].scorer is None
    truths = read_truths(str(out))
    assert truths[rows[0]["id"]] == ([103, 299, 359, 633], None)
    # Qwen2.5-VL answers in the resized image (here half size): mapped back, the box matches.
    results = [{"id": rows[0]["id"], "error": None, "text": "<think>t</think><answer>[{\"bbox_2d\": [51, 150, 180, 316]}]</answer>",
                "answer": '[{"bbox_2d": [51, 150, 180, 316]}]', "image_sizes": [[640, 640]], "model_image_sizes": [[320, 320]]}]
    scored = rescore(results, truths)
    assert scored[0]["correct"] is True and scored[0]["iou"] > 0.95
    assert summarize(scored)["by_scorer"]["bbox"]["accuracy"] == 1.0


def test_read_truths_of_the_scored_example():
    truths = read_truths(str(CONFIGS / "scored.example.jsonl"))
    assert truths == {
        "count-1": ("3", None), "mcq-1": ("C", "choice"), "ground-1": ([8, 10, 60, 96], "bbox"),
        "caption-1": ("yes", None), "free-1": ("gradient", "contains"),
    }
    swift = read_truths(str(CONFIGS / "swift.example.jsonl"))  # id-less records: the image path as written
    assert swift["images/img_002.png"] == ("yes", None)
    assert swift["swift-grounding-1"] == ([10, 12, 70, 90], "bbox")


def test_read_truths_reports_bad_lines(tmp_path):
    src = tmp_path / "m.jsonl"
    src.write_text('{"id": "a", "image": "a.png", "answer": "1"}\n[1]\n{"id": "b", "image": "b.png", "answer": "2", "scorer": "fuzzy"}\n')
    with pytest.raises(InputError) as exc:
        read_truths(str(src))
    assert [p.split(":")[1] for p in exc.value.problems] == ["2", "3"]


def test_convert_refuses_its_source_and_rebases_relative_images(tmp_path):
    """--out naming the dataset would replace it with its manifest; a manifest written elsewhere names the
    same image files as the dataset did (relative paths are read against a manifest's own folder)."""
    import shutil

    data = tmp_path / "data"
    shutil.copytree(CONFIGS, data)
    source = data / "swift.example.jsonl"
    before = source.read_bytes()
    same = cli("convert", source, "--out", source)
    assert same.returncode == 2 and "is one of this run's inputs" in same.stderr and source.read_bytes() == before
    elsewhere = tmp_path / "out" / "m.jsonl"
    assert cli("convert", source, "--out", elsewhere).returncode == 0
    rows = [json.loads(line) for line in elsewhere.read_text().splitlines()]
    assert rows[0]["image"] == "../data/images/img_000.png"
    items, _ = read_manifest(str(elsewhere), None)
    assert Path(items[0].images[0]).resolve() == (data / "images" / "img_000.png").resolve()
    beside = data / "m.jsonl"  # in the source's folder: paths as written
    assert cli("convert", source, "--out", beside).returncode == 0
    assert json.loads(beside.read_text().splitlines()[0])["image"] == "images/img_000.png"


def test_a_manifest_s_ids_do_not_depend_on_how_its_path_is_spelled(tmp_path, monkeypatch):
    """Records without an id take their first image as written: the same id from /abs/m.jsonl and from
    m.jsonl, so a resume or a score run from another directory finds the rows."""
    monkeypatch.chdir(CONFIGS)
    relative = [r.id for r in read_manifest("swift.example.jsonl", None)[0]]
    absolute = [r.id for r in read_manifest(str(CONFIGS / "swift.example.jsonl"), None)[0]]
    assert relative == absolute and relative[0] == "images/img_000.png"


def test_problems_in_file_order_and_records_of_a_one_line_array_by_number(tmp_path):
    """Invalid JSON and bad records are listed in the file's order, whichever check found them; records of an
    array written on one line are told apart by their number in it."""
    lines = tmp_path / "m.jsonl"
    lines.write_text("\n".join([json.dumps({"image": "a.jpg", "problem": "p"}), json.dumps({"image": "b.jpg"}),
                                "{not json", json.dumps({"problem": "no image"})]) + "\n")
    with pytest.raises(InputError) as exc:
        convert_file(str(lines))
    assert [p.split(":")[1] for p in exc.value.problems] == ["2", "3", "4"]
    one_line = tmp_path / "a.json"
    one_line.write_text(json.dumps([{"image": "a.jpg", "problem": "p"}, {"image": "b.jpg"}, {"problem": "q"}]))
    with pytest.raises(InputError) as exc:
        convert_file(str(one_line))
    assert [p.split(": ", 1)[0] for p in exc.value.problems] == [f"{one_line}:1 (record 2)", f"{one_line}:1 (record 3)"]


def test_convert_says_how_many_records_have_no_ground_truth(tmp_path):
    src = tmp_path / "s.jsonl"
    src.write_text(json.dumps({"image": "a.jpg", "problem": "p", "solution": "1"}) + "\n"
                   + json.dumps({"image": "b.jpg", "problem": "q"}) + "\n")
    r = cli("convert", src, "--out", tmp_path / "m.jsonl")
    assert r.returncode == 0 and "1 of them without ground truth" in r.stderr


@pytest.mark.parametrize("layout", ["indented", "one line"])
def test_a_json_array_given_as_manifest_is_one_error_naming_convert(tmp_path, layout, grpo_ckpt):
    """A VLM-R1 REC file (a JSON array) given to --manifest: one error that says what it is and the convert
    command that makes a manifest of it, not an "invalid JSON" error for every line; and that command works."""
    source = tmp_path / "refcoco_val.json"
    text = json.dumps(json.loads((CONFIGS / "vlmr1_rec.example.json").read_text()), indent=2 if layout == "indented" else None)
    source.write_text(text)
    with pytest.raises(InputError) as err:
        read_manifest(str(source), None)
    assert err.value.message == f"{source} is a JSON array, not a manifest (one JSON object per line)"
    assert f"vlmfast convert {source} --out refcoco_val.jsonl" in err.value.hint and not err.value.problems
    r = cli("infer", "--ckpt", grpo_ckpt, "--manifest", source, "--out", tmp_path / "r.jsonl")
    assert r.returncode == 2 and r.stderr.count("error:") == 1 and "invalid JSON" not in r.stderr
    r = cli("convert", source, "--image-root", "/data/coco", "--out", tmp_path / "refcoco_val.jsonl")
    assert r.returncode == 0 and len(read_manifest(str(tmp_path / "refcoco_val.jsonl"), None)[0]) == 4
    assert "--image-root /data/coco is not a folder here" in r.stderr  # a manifest for another machine: said


def test_the_truth_is_written_as_the_source_holds_it_and_only_a_json_box_is_checked(tmp_path):
    """A trainer's reward is handed the manifest's value as written: a converted manifest gave ms-swift's
    accuracy ORM a decoded list (0.0 where the source scored 1.0) and VLM-R1's iou_reward a list it could not
    search (TypeError). Four numbers in a text may be any answer (a ranking): only a JSON list is a REC box."""
    src = tmp_path / "s.jsonl"
    truths = ["<answer>[2, 5, 7, 9]</answer>", '["cat", "dog"]', '<answer>{"bbox_2d": [1,2,3,4]}</answer>',
              "<answer>[4, 3, 2, 1]</answer>", "[2, 5]"]
    src.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"<image>Q{i}"}], "images": [f"{i}.png"],
                                       "solution": t}) + "\n" for i, t in enumerate(truths)))
    assert [r["solution"] for r in convert_file(str(src))] == truths
    src.write_text(json.dumps({"image": "a.png", "problem": "p", "solution": [4, 3, 2, 1]}) + "\n")
    with pytest.raises(InputError, match="reversed"):  # a VLM-R1 REC record's solution is its box
        convert_file(str(src))
    ranking = {"messages": [{"role": "user", "content": "<image>Rank"}], "images": ["a.png"], "solution": [4, 3, 2, 1]}
    src.write_text(json.dumps(ranking) + "\n")  # an ms-swift list: a box only where it names a box scorer
    assert convert_file(str(src))[0]["solution"] == [4, 3, 2, 1]
    src.write_text(json.dumps({**ranking, "scorer": "bbox"}) + "\n")
    with pytest.raises(InputError, match="reversed"):
        convert_file(str(src))


@pytest.mark.parametrize("name", ["bench.tsv", "train.parquet"])
def test_a_tsv_or_parquet_needs_no_converting(tmp_path, name):
    src = tmp_path / name
    src.write_text("index\tquestion\n0\tq\n")
    with pytest.raises(UsageError, match="needs no converting") as exc:
        convert_file(str(src))
    assert f"--manifest {src}" in exc.value.hint


def test_ms_swift_rows_keep_their_ids_converted_or_read_as_they_are(tmp_path):
    """An ms-swift file run as it is and its converted manifest name each record alike (its first image as
    written, ranked where several records ask about one image; under --image-root too, which moves the paths
    but not the ids), so rows of either run score against, and resume into, the other. VLM-R1 lines, and a
    record's own id, keep theirs; a REC record's position id counts no image rank, as --manifest counts none."""
    from PIL import Image

    from conftest import FakeBackend
    from vlmfast.run.options import InferOptions
    from vlmfast.run.rescore import rescore_file
    from vlmfast.run.runner import infer

    for name in ("a.png", "b.png"):
        Image.new("RGB", (28, 28)).save(tmp_path / name)

    def ask(question):
        return [{"role": "user", "content": f"<image>{question}"}]

    src = tmp_path / "swift.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in [
        {"messages": ask("How many?"), "images": ["a.png"], "solution": "2"},
        {"image": "a.png", "conversations": [{"from": "human", "value": "<image>Colour?"}, {"from": "gpt", "value": "red"}]},
        {"messages": ask("How many more?"), "images": ["a.png"], "solution": "3"},
        {"messages": ask("Which?"), "images": [{"path": "b.png"}], "solution": "B"},
        {"id": "own", "messages": ask("Again?"), "images": ["a.png"], "solution": "no"},
        {"messages": ask("Last?"), "images": ["a.png", "b.png"], "solution": "yes"},
    ]))
    direct = [r.id for r in read_manifest(str(src), None)[0]]
    assert direct == ["a.png", "00001_a", "a.png#2", "b.png", "own", "a.png#3"]
    assert [r["id"] for r in convert_file(str(src), image_root="/elsewhere")] == direct
    converted = write_manifest(convert_file(str(src)), str(tmp_path / "converted.jsonl"))
    assert [r.id for r in read_manifest(str(converted), None)[0]] == direct
    out = tmp_path / "r.jsonl"
    assert infer(InferOptions(ckpt="fake", manifest=str(src), out=str(out)), backend=FakeBackend()).samples == 6
    assert infer(InferOptions(ckpt="fake", manifest=str(converted), out=str(out)), backend=FakeBackend()).samples == 0
    summary = rescore_file(out, str(converted))
    assert (summary["scored"], summary["rows_not_in_manifest"], summary["manifest_ids_without_rows"]) == (6, 0, 0)


def test_r1v_lines_convert_to_the_rows_manifest_reads_of_them(tmp_path):
    """R1-V's lines ({"image_path", "question", "ground_truth"}) convert like the other JSON formats --manifest also
    reads as they are: each row the id, question and images the line gets read as it is (an image asked about again
    is ranked, IMAGE#2), its truth as the line holds it. A JSON array of them, which --manifest refuses, converts too."""
    records = [
        {"image_path": "imgs/000.png", "question": "How many cubes?", "ground_truth": 3},
        {"image_path": "imgs/000.png", "question": "<image> What colour is the sphere?", "ground_truth": "<answer> red </answer>"},
        {"image_path": ["imgs/001.png", "imgs/002.png"], "question": "<image><image>Same?", "ground_truth": "no",
         "system": "Think first.", "scorer": "exact"},
        {"id": "own", "image_path": "imgs/000.png", "question": "Again?", "ground_truth": "4"},
    ]
    src = tmp_path / "r1v.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    direct, _ = read_manifest(str(src), None, images=False)
    rows = convert_file(str(src))
    assert [r["id"] for r in rows] == [r.id for r in direct] == ["imgs/000.png", "imgs/000.png#2", "imgs/001.png", "own"]
    assert [r["solution"] for r in rows] == [3, "<answer> red </answer>", "no", "4"]  # as the lines hold them
    assert rows[2] == {"id": "imgs/001.png", "images": ["imgs/001.png", "imgs/002.png"], "prompt": "Same?",
                       "system": "Think first.", "solution": "no", "scorer": "exact"}
    converted, _ = read_manifest(str(write_manifest(rows, str(tmp_path / "m.jsonl"))), None, images=False)
    assert [(r.id, r.prompt, r.system, r.truth, r.scorer, [Path(i).name for i in r.images]) for r in converted] == \
        [(r.id, r.prompt, r.system, r.truth, r.scorer, [Path(i).name for i in r.images]) for r in direct]
    array = tmp_path / "r1v.json"
    array.write_text(json.dumps(records, indent=1))
    assert convert_file(str(array)) == rows == convert_file(str(src), "r1v")
    swift = tmp_path / "swift.jsonl"
    swift.write_text(json.dumps({"messages": [{"role": "user", "content": "Q"}], "images": ["a.png"]}) + "\n")
    with pytest.raises(InputError, match=r"swift.jsonl:1: not an R1-V line"):
        convert_file(str(swift), "r1v")
