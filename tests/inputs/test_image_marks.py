"""<image> marks that do not match the images: refused with file:line, never run as another question."""

import json

import numpy as np
import pytest
from PIL import Image

from vlmfast.errors import InputError


def _png(path):
    Image.fromarray(np.zeros((32, 40, 3), dtype=np.uint8)).save(path)
    return path.name


def test_jsonl_marks_must_match_images(tmp_path):
    from vlmfast.inputs.requests import collect

    a, b = _png(tmp_path / "a.png"), _png(tmp_path / "b.png")
    lines = [{"id": "ok", "images": [a, b], "prompt": "<image><image>Which is larger?"},
             {"id": "none", "images": [a, b], "prompt": "Which is larger?"},
             {"id": "two-marks-one-image", "image": a, "prompt": "Compare <image> with <image>."},
             {"id": "swift", "messages": [{"role": "user", "content": "<image><image>Compare"}], "images": [a]},
             # fewer marks than images: ms-swift adds the missing ones before the first message; the prompt's own
             # fewer marks are refused
             {"id": "swift-fewer", "messages": [{"role": "user", "content": "<image>Compare"}], "images": [a, b]},
             {"id": "prompt-fewer", "images": [a, b], "prompt": "<image>Compare"}]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(x) + "\n" for x in lines))
    c = collect(manifest=str(manifest))
    assert [(r.id, r.prompt) for r in c.requests] == [("ok", "Which is larger?"), ("none", "Which is larger?"),
                                                      ("swift-fewer", "Compare")]
    assert len(c.requests[2].images) == 2 and {b.id for b in c.bad} == {"two-marks-one-image", "swift", "prompt-fewer"}
    bad = {b.id: b.error for b in c.bad}
    assert "m.jsonl:3" in bad["two-marks-one-image"] and "2 <image> mark(s)" in bad["two-marks-one-image"]


def test_parquet_marks_must_match_images(tmp_path):
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from vlmfast.inputs.requests import collect

    buf = io.BytesIO()
    Image.fromarray(np.zeros((32, 40, 3), dtype=np.uint8)).save(buf, "PNG")
    image = {"bytes": buf.getvalue(), "path": None}
    pq.write_table(pa.table({"problem": ["<image>What?", "<image><image>Compare"], "answer": ["1", "2"],
                             "images": [[image], [image]]}), tmp_path / "t.parquet")
    c = collect(manifest=str(tmp_path / "t.parquet"))
    assert [r.id for r in c.requests] == ["0"]
    assert [b.id for b in c.bad] == ["1"] and "2 <image> mark(s)" in c.bad[0].error
    # ms-swift's rows in parquet ("messages"): fewer marks than images are completed by ms-swift, as in JSONL
    from vlmfast.inputs.datasets import DatasetKeys

    turns = [{"role": "user", "content": "<image>Which is bigger?"}, {"role": "assistant", "content": "left"}]
    pq.write_table(pa.table({"messages": [turns], "images": [[image, image]], "solution": ["left"]}), tmp_path / "s.parquet")
    c = collect(manifest=str(tmp_path / "s.parquet"), keys=DatasetKeys(prompt="messages"))
    assert [(r.prompt, len(r.images)) for r in c.requests] == [("Which is bigger?", 2)] and not c.bad


def test_convert_reads_what_manifest_reads(tmp_path):
    """A byte-order mark and a U+2028 inside a string: --manifest reads both; convert must too."""
    from vlmfast.inputs.convert import convert_file

    a = _png(tmp_path / "a.png")
    record = {"image": a, "problem": "Line one\u2028line two", "solution": [1, 2, 3, 4]}
    jsonl = tmp_path / "x.jsonl"
    jsonl.write_bytes(b"\xef\xbb\xbf" + (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))
    rows = convert_file(str(jsonl))
    assert len(rows) == 1 and rows[0]["prompt"] == "Line one\u2028line two"
    array = tmp_path / "x.json"
    array.write_bytes(b"\xef\xbb\xbf" + json.dumps([record]).encode("utf-8"))
    assert len(convert_file(str(array))) == 1


def test_converted_vlmr1_lines_ask_what_the_lines_ask(tmp_path):
    """vlmfast convert of VLM-R1 lines gives the prompts --manifest gives the lines themselves (the trainer's)."""
    from vlmfast.inputs.convert import convert_file, write_manifest
    from vlmfast.inputs.requests import collect

    a = _png(tmp_path / "a.png")
    line = {"image": a, "conversations": [{"from": "human", "value": "<image>\nHow many objects are there?"},
                                          {"from": "gpt", "value": "3"}]}
    source = tmp_path / "vlmr1.jsonl"
    source.write_text(json.dumps(line) + "\n")
    converted = write_manifest(convert_file(str(source)), str(tmp_path / "converted.jsonl"))
    direct, via = collect(manifest=str(source)).requests, collect(manifest=str(converted)).requests
    assert [(r.id, r.prompt) for r in via] == [(r.id, r.prompt) for r in direct]


def test_a_trl_conversational_prompt_is_read_as_its_turns(tmp_path):
    """TRL's conversational format: "prompt" is a list of turns (an image part, a text part). It was refused as
    'no prompt: give "prompt" in the record'; its last user turn is the prompt, as for ms-swift's messages."""
    from vlmfast.inputs.requests import collect

    a = _png(tmp_path / "a.png")
    turns = [{"role": "system", "content": "Be brief."},
             {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]}]
    lines = [{"id": "q", "image": a, "prompt": turns, "solution": "x"},
             {"id": "two", "image": a, "prompt": [{"role": "user", "content": "<image><image>Compare"}]}]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    c = collect(manifest=str(tmp_path / "m.jsonl"))
    assert [(r.id, r.prompt, r.system, r.truth) for r in c.requests] == [("q", "What is this?", "Be brief.", "x")]
    assert [b.id for b in c.bad] == ["two"] and "2 <image> mark(s)" in c.bad[0].error


def test_a_data_uri_is_named_as_one_and_not_echoed_whole(tmp_path):
    import base64
    import io

    from vlmfast.inputs.requests import collect

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (32, 40, 3), dtype=np.uint8)).save(buf, "PNG")
    uri = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    (tmp_path / "m.jsonl").write_text(json.dumps({"id": "u", "image": uri, "prompt": "What?"}) + "\n")
    (bad,) = collect(manifest=str(tmp_path / "m.jsonl")).bad
    assert "a data URI: images are read from local files" in bad.error and uri not in bad.error


def test_base64_image_data_where_a_path_goes_is_named_as_such_and_not_echoed(tmp_path):
    """ms-swift lines may hold an image as a base64 string: refused as base64 data (its length said), never
    echoed whole (not as the line's id either: a line without an id is named by its position), by --manifest
    and by convert alike."""
    import base64
    import io

    from vlmfast.inputs.convert import convert_file
    from vlmfast.inputs.requests import collect

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(buf, "PNG")
    data = base64.b64encode(buf.getvalue()).decode()
    line = {"messages": [{"role": "user", "content": "<image>What is this?"}], "images": [data]}
    (tmp_path / "swift.jsonl").write_text(json.dumps(line) + "\n")
    (bad,) = collect(manifest=str(tmp_path / "swift.jsonl")).bad
    assert bad.id == "swift.jsonl:1" and f"base64 data ({len(data):,} characters)" in bad.error
    assert data[:100] not in bad.error
    with pytest.raises(InputError) as err:
        convert_file(str(tmp_path / "swift.jsonl"))
    assert "base64 data" in err.value.message and data[:100] not in err.value.message


def test_a_trainer_s_problem_line_is_refused_with_the_convert_command_even_with_prompt(tmp_path):
    """An EasyR1 / VLM-R1 dataset line ("problem", "answer", "images") has no "prompt": --prompt would have asked
    every line the same generic question, noted only as an ignored field; it is a bad line naming convert."""
    from vlmfast.inputs.requests import collect

    a = _png(tmp_path / "a.png")
    (tmp_path / "easyr1.jsonl").write_text(json.dumps({"images": [a], "problem": "<image>Find x.", "answer": "3"}) + "\n")
    for prompt in (None, "Describe."):
        c = collect(manifest=str(tmp_path / "easyr1.jsonl"), prompt=prompt)
        assert c.requests == [] and "holds \"problem\"" in c.bad[0].error
        assert f"vlmfast convert {tmp_path / 'easyr1.jsonl'} --out easyr1.manifest.jsonl" in c.bad[0].error


def test_a_null_solution_leaves_the_answer_as_the_truth(tmp_path):
    """"solution": null beside "answer" (a dataset export that writes every column): the answer is the truth, in
    --manifest and in convert, not hidden by the null."""
    from vlmfast.inputs.convert import convert_file
    from vlmfast.inputs.requests import collect

    a = _png(tmp_path / "a.png")
    (tmp_path / "m.jsonl").write_text(json.dumps({"id": "n1", "image": a, "prompt": "Q", "solution": None, "answer": "B"}) + "\n")
    assert [r.truth for r in collect(manifest=str(tmp_path / "m.jsonl")).requests] == ["B"]
    swift = {"messages": [{"role": "user", "content": "<image>Q"}], "images": [a], "solution": None, "answer": "B"}
    (tmp_path / "s.jsonl").write_text(json.dumps(swift) + "\n")
    assert [row["solution"] for row in convert_file(str(tmp_path / "s.jsonl"))] == ["B"]
