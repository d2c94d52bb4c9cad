"""Trainer datasets read as they are (EasyR1 / verl parquet, shard folders, save_to_disk folders, R1-V JSONL):
each gives the requests the equivalent vlmfast JSONL manifest gives, images embedded as bytes included."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import cli, read_jsonl
from PIL import Image

from vlmfast.errors import InputError, UsageError
from vlmfast.inputs.datasets import load_images
from vlmfast.inputs.requests import collect

QUESTIONS = ["How many boxes?", "What colour is the square?", "Count the shapes.", "Is it red?"]
ANSWERS = ["3", "red", "5", "no"]


def _png(path: Path) -> dict:
    return {"bytes": path.read_bytes(), "path": path.name}  # datasets' Image feature: the bytes win


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _ours(images, extra=None) -> list[dict]:
    """The vlmfast JSONL lines equivalent to the datasets below (``extra``: row number → more keys)."""
    extra = extra or {}
    return [{"id": rid, "images": [str(images[i])], "prompt": QUESTIONS[i], "answer": ANSWERS[i], **extra.get(i, {})}
            for i, rid in enumerate(["a", "b", "c", "d"])]


def _easyr1(images) -> pa.Table:
    return pa.table({"id": ["a", "b", "c", "d"], "problem": [f"<image>{q}" for q in QUESTIONS], "answer": ANSWERS,
                     "images": [[_png(images[i])] for i in range(4)]})


def _verl(images) -> pa.Table:
    prompts = [[{"role": "user", "content": f"<image>{q}"}] for q in QUESTIONS]
    prompts[1] = [{"role": "system", "content": "Be brief."}, *prompts[1]]
    return pa.table({
        "data_source": ["hiyouga/geometry3k"] * 4, "prompt": prompts, "images": [[_png(images[i])] for i in range(4)],
        "ability": ["math"] * 4, "reward_model": [{"style": "rule", "ground_truth": a} for a in ANSWERS],
        "extra_info": [{"split": "test", "index": i, "answer": ANSWERS[i], "question": QUESTIONS[i]} for i in range(4)],
    })


def _same_requests(got, want):
    """Ids, prompts, system prompts, truths, sizes and decoded pixels equal, request by request."""
    assert [r.id for r in got] == [r.id for r in want]
    for g, w in zip(got, want):
        assert (g.prompt, g.system, g.truth, g.scorer, g.data_source, g.image_sizes) == \
               (w.prompt, w.system, w.truth, w.scorer, w.data_source, w.image_sizes)
    embedded = load_images(got)
    for g, w in zip(got, want):
        for k, path in enumerate(w.images):
            image = embedded.get((g.id, k)) or Image.open(g.images[k])
            with Image.open(path) as expected:
                assert image.convert("RGB").tobytes() == expected.convert("RGB").tobytes()


def test_easyr1_parquet_gives_the_jsonl_requests(images, tmp_path):
    pq.write_table(_easyr1(images), tmp_path / "val.parquet", row_group_size=3)
    got = collect(manifest=str(tmp_path / "val.parquet"))
    want = collect(manifest=_jsonl(tmp_path / "m.jsonl", _ours(images)))
    _same_requests(got.requests, want.requests)
    assert got.bad == [] and got.order == ["a", "b", "c", "d"]
    label = f"{tmp_path / 'val.parquet'}#row=3/image=0"
    assert got.requests[3].images == (label,) and got.image_sizes[label] == want.image_sizes[str(images[3])]
    # every column travels to the rewards, the images as their labels (not their bytes)
    assert got.requests[3].record == {"id": "d", "problem": "<image>Is it red?", "answer": "no", "images": [label]}
    assert got.requests[3].manifest_truth == "no"


def test_verl_parquet_gives_the_jsonl_requests_with_data_source_and_extra_info(images, tmp_path):
    pq.write_table(_verl(images), tmp_path / "test.parquet")
    got = collect(manifest=str(tmp_path / "test.parquet"))
    extra = {i: {"id": str(i), "data_source": "hiyouga/geometry3k",
                 "extra_info": {"split": "test", "index": i, "answer": ANSWERS[i], "question": QUESTIONS[i]}} for i in range(4)}
    extra[1]["system"] = "Be brief."
    want = collect(manifest=_jsonl(tmp_path / "m.jsonl", _ours(images, extra)))
    _same_requests(got.requests, want.requests)
    assert [r.id for r in got.requests] == ["0", "1", "2", "3"]  # extra_info.index
    truth = got.requests[2].truth_record()
    assert truth["data_source"] == "hiyouga/geometry3k" and truth["manifest_truth"] == "5"
    assert truth["record"]["extra_info"] == {"split": "test", "index": 2, "answer": "5", "question": QUESTIONS[2]}
    assert truth["record"]["reward_model"] == {"style": "rule", "ground_truth": "5"}


def test_easyr1_columns_win_over_verl_ones_and_keys_pick_others(images, tmp_path):
    table = _verl(images).append_column("problem", pa.array([f"<image>P{i}" for i in range(4)])) \
                         .append_column("answer", pa.array(["w", "x", "y", "z"]))
    pq.write_table(table, tmp_path / "both.parquet")
    default = collect(manifest=str(tmp_path / "both.parquet")).requests
    assert [(r.prompt, r.truth) for r in default][:2] == [("P0", "w"), ("P1", "x")]
    verl = collect(manifest=str(tmp_path / "both.parquet"), keys=_keys("prompt", "reward_model.ground_truth")).requests
    assert [(r.prompt, r.truth, r.system) for r in verl][:2] == [(QUESTIONS[0], "3", None), (QUESTIONS[1], "red", "Be brief.")]


def _keys(prompt=None, answer=None, image=None):
    from vlmfast.inputs.datasets import DatasetKeys

    return DatasetKeys(prompt, answer, image)


def test_a_folder_of_shards_reads_as_one_table_in_name_order(images, tmp_path):
    table = _easyr1(images).drop_columns(["id"])
    shards = tmp_path / "data"
    shards.mkdir()
    pq.write_table(table.slice(2), shards / "validation-00001-of-00002.parquet")
    pq.write_table(table.slice(0, 2), shards / "validation-00000-of-00002.parquet")
    (shards / "README.md").write_text("not data")
    got = collect(manifest=str(shards))
    want = collect(manifest=_jsonl(tmp_path / "m.jsonl", _ours(images, {i: {"id": str(i)} for i in range(4)})))
    _same_requests(got.requests, want.requests)  # ids: the row number across the shards
    assert got.requests[2].images == (f"{shards / 'validation-00001-of-00002.parquet'}#row=0/image=0",)


def test_a_save_to_disk_folder_is_read_from_its_arrow_stream(images, tmp_path):
    saved = tmp_path / "saved"
    saved.mkdir()
    table = _easyr1(images)
    with pa.OSFile(str(saved / "data-00000-of-00001.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=3):  # two record batches: the last row lies in the second
            writer.write_batch(batch)
    (saved / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}], "_split": "test"}))
    (saved / "dataset_info.json").write_text("{}")
    got = collect(manifest=str(saved))
    _same_requests(got.requests, collect(manifest=_jsonl(tmp_path / "m.jsonl", _ours(images))).requests)
    assert got.requests[3].image_data[0].chunk == 1


@pytest.mark.parametrize("as_struct", [True, False], ids=["struct", "raw-bytes"])
def test_a_single_image_column(images, tmp_path, as_struct):
    column = [_png(images[i]) if as_struct else images[i].read_bytes() for i in range(4)]
    table = _easyr1(images).drop_columns(["images"]).append_column("image", pa.array(column))
    pq.write_table(table, tmp_path / "one.parquet")
    got = collect(manifest=str(tmp_path / "one.parquet"))
    _same_requests(got.requests, collect(manifest=_jsonl(tmp_path / "m.jsonl", _ours(images))).requests)
    assert got.requests[0].image_data[0].index is None
    assert got.requests[0].record["image"] == f"{tmp_path / 'one.parquet'}#row=0/image=0"


def test_image_paths_resolve_against_the_files_folder(images, tmp_path):
    table = _easyr1(images).set_column(3, "images", pa.array([[os.path.relpath(images[i], tmp_path)] for i in range(4)]))
    pq.write_table(table, tmp_path / "paths.parquet")
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    cwd = os.getcwd()
    os.chdir(elsewhere)
    try:
        got = collect(manifest=str(tmp_path / "paths.parquet"))
    finally:
        os.chdir(cwd)
    assert [r.images for r in got.requests] == [(str(tmp_path / os.path.relpath(images[i], tmp_path)),) for i in range(4)]
    assert all(r.image_data is None for r in got.requests)
    _same_requests(got.requests, collect(manifest=_jsonl(tmp_path / "m.jsonl", _ours(images))).requests)


def test_r1v_jsonl_is_recognised_by_its_keys(images, tmp_path):
    lines = [{"image_path": os.path.relpath(images[i], tmp_path), "question": QUESTIONS[i], "ground_truth": i + 1}
             for i in range(3)]
    got = collect(manifest=_jsonl(tmp_path / "r1v.jsonl", lines))
    ours = [{"image": line["image_path"], "prompt": line["question"], "solution": line["ground_truth"]} for line in lines]
    want = collect(manifest=_jsonl(tmp_path / "m.jsonl", ours))
    _same_requests(got.requests, want.requests)
    assert got.warnings == [] and (got.requests[0].truth, got.requests[0].manifest_truth) == ("1", 1)
    assert got.requests[0].record == lines[0]  # handed to rewards as the line is


def test_bad_embedded_images_are_listed_with_their_labels(images, tmp_path):
    table = _easyr1(images).set_column(3, "images", pa.array([[{"bytes": b"not a png", "path": None}], [_png(images[1])],
                                                              [{"bytes": None, "path": None}], [_png(images[3])]]))
    pq.write_table(table, tmp_path / "bad.parquet")
    got = collect(manifest=str(tmp_path / "bad.parquet"))
    assert [r.id for r in got.requests] == ["b", "d"]
    assert [(b.id, str(b.problems[0]).split(" (")[0]) for b in got.bad] == [
        ("a", f"{tmp_path / 'bad.parquet'}#row=0/image=0: not a readable image"),
        ("c", f"{tmp_path / 'bad.parquet'}#row=2/image=0: neither image bytes nor a path")]


def test_a_key_that_is_not_a_column_names_the_columns(images, tmp_path, grpo_ckpt):
    pq.write_table(_verl(images), tmp_path / "test.parquet")
    with pytest.raises(UsageError) as err:
        collect(manifest=str(tmp_path / "test.parquet"), keys=_keys(answer="reward_model.answer"))
    assert err.value.message == ("--answer-key reward_model.answer: " + str(tmp_path / "test.parquet") + " has no such "
                                 "column (columns: ability, data_source, extra_info, extra_info.answer, extra_info.index, "
                                 "extra_info.question, extra_info.split, images, prompt, reward_model, "
                                 "reward_model.ground_truth, reward_model.style)")
    result = cli("infer", "--ckpt", grpo_ckpt, "--manifest", tmp_path / "test.parquet", "--prompt-key", "question")
    assert result.returncode == 2
    assert "error: --prompt-key question:" in result.stderr and "hint: give --prompt-key one of those columns" in result.stderr
    jsonl = _jsonl(tmp_path / "m.jsonl", _ours(images))
    result = cli("infer", "--ckpt", grpo_ckpt, "--manifest", jsonl, "--image-key", "images")
    assert result.returncode == 2 and "apply to parquet and Arrow datasets" in result.stderr


def test_format_prompt_renders_each_question_as_easyr1_does(images, tmp_path, grpo_ckpt):
    from vlmfast.run.options import InferOptions

    pq.write_table(_easyr1(images), tmp_path / "val.parquet")
    (tmp_path / "math.jinja").write_text("{{ content | trim }} Put the final answer in \\boxed{}.\n")
    got = collect(manifest=str(tmp_path / "val.parquet"), format_prompt=str(tmp_path / "math.jinja"))
    assert [r.prompt for r in got.requests] == [f"{q} Put the final answer in \\boxed{{}}." for q in QUESTIONS]
    with pytest.raises(UsageError, match="--format-prompt and --template r1 both shape the prompt"):
        InferOptions(ckpt=str(grpo_ckpt), manifest=str(tmp_path / "val.parquet"), template="r1",
                     format_prompt=str(tmp_path / "math.jinja"))
    for text in ("", "Think step by step.\n"):  # the question dropped from every prompt
        (tmp_path / "bad.jinja").write_text(text)
        with pytest.raises(InputError, match=r"never uses \{\{ content \}\}") as err:
            collect(manifest=str(tmp_path / "val.parquet"), format_prompt=str(tmp_path / "bad.jinja"))
        assert "{{ content }}" in err.value.hint


def test_without_pyarrow_a_dataset_manifest_says_how_to_install_it(images, tmp_path, monkeypatch):
    pq.write_table(_easyr1(images), tmp_path / "val.parquet")
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow raises ImportError
    with pytest.raises(UsageError) as err:
        collect(manifest=str(tmp_path / "val.parquet"))
    assert (err.value.message, err.value.hint) == (
        "reading parquet or Arrow (save_to_disk) manifests needs pyarrow",
        'pip install "vlmfast[parquet]" (or: pip install "pyarrow>=15")')


def test_infer_on_a_parquet_file_writes_the_rows_of_the_jsonl_manifest(loaded, grpo_ckpt, images, tmp_path):
    from vlmfast.engines.rows import GenerationSettings
    from vlmfast.run.options import InferOptions
    from vlmfast.run.runner import infer

    pq.write_table(_easyr1(images), tmp_path / "val.parquet", row_group_size=2)
    jsonl = _jsonl(tmp_path / "m.jsonl", _ours(images))
    runs = {}
    for name, manifest in (("parquet", str(tmp_path / "val.parquet")), ("jsonl", jsonl)):
        infer(InferOptions(ckpt=str(grpo_ckpt), manifest=manifest, out=str(tmp_path / f"{name}.jsonl"), batch_size=3,
                           generation=GenerationSettings(max_new_tokens=6)), loaded=loaded)
        runs[name] = read_jsonl(tmp_path / f"{name}.jsonl")
    fields = ("id", "prompt", "text", "n_new_tokens", "finish_reason", "correct")
    assert [[r[f] for f in fields] for r in runs["parquet"]] == [[r[f] for f in fields] for r in runs["jsonl"]]
    assert [r["images"] for r in runs["parquet"]] == [[f"{tmp_path / 'val.parquet'}#row={i}/image=0"] for i in range(4)]
    again = infer(InferOptions(ckpt=str(grpo_ckpt), manifest=str(tmp_path / "val.parquet"), out=str(tmp_path / "parquet.jsonl"),
                               generation=GenerationSettings(max_new_tokens=6)), loaded=loaded)
    assert again.notes[0].startswith("nothing to do: 4 row(s)")  # resume keys on the same ids


MEMORY_SCRIPT = r"""
import io, json, sys, tracemalloc
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
from PIL import Image
from vlmfast.inputs import embedded
from vlmfast.inputs.datasets import read_dataset, load_images

rows, path, step = int(sys.argv[1]), sys.argv[2], sys.argv[3]
if step == "write":  # in a process of its own: the reading process's arrow peak is the reader's alone
    rng = np.random.default_rng(0)
    def png():
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (24, 24, 3), dtype=np.uint8)).save(buf, format="PNG")
        return buf.getvalue()
    images = [png() for _ in range(rows)]
    pq.write_table(pa.table({"problem": ["q"] * rows, "answer": ["a"] * rows,
                             "images": [[{"bytes": b, "path": None}] for b in images]}),
                   path, row_group_size=100)  # as datasets' to_parquet writes image data
    print(json.dumps({"total": sum(map(len, images))}))
    sys.exit()
pool = pa.default_memory_pool()
base = pool.max_memory()
tracemalloc.start()
items, _ = read_dataset(path, None)
scan_peak, held = tracemalloc.get_traced_memory()[1], tracemalloc.get_traced_memory()[0]
tracemalloc.reset_peak()
spread = items[:: max(1, rows // 8)]  # rows from all over the file, fetched at once
decoded = load_images(spread)
fetch_peak = tracemalloc.get_traced_memory()[1] - tracemalloc.get_traced_memory()[0]
print(json.dumps({"arrow_peak": pool.max_memory() - base, "scan_transient": scan_peak - held,
                  "fetch_transient": fetch_peak, "decoded": len(decoded), "batch_rows": embedded.BATCH_ROWS}))
"""


def _memory(rows: int, tmp_path: Path) -> dict:
    """What reading a ``rows``-row parquet file of embedded PNGs took, measured in a fresh process."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    figures = {}
    for step in ("write", "read"):
        done = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, str(rows), str(tmp_path / f"{rows}.parquet"), step],
                              capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr
        figures.update(json.loads(done.stdout))
    return figures


def test_reading_holds_one_record_batch_of_image_bytes_whatever_the_row_count(tmp_path):
    small, large = _memory(200, tmp_path), _memory(2000, tmp_path)
    per_row = large["total"] / 2000  # a 24×24 noise PNG: about 1.8 kB
    batch = per_row * large["batch_rows"]
    assert large["decoded"] == 8 and small["decoded"] == 8
    for figures in (small, large):
        # what is held at once: a record batch of image bytes (arrow, then its Python copy), not the file
        assert figures["arrow_peak"] < 4 * batch + (1 << 20), figures  # + the page buffer
        assert figures["scan_transient"] < 3 * batch, figures
        assert figures["fetch_transient"] < 3 * batch, figures
    assert large["arrow_peak"] < 0.3 * large["total"]  # the whole image column would be 3.6 MB
    assert large["arrow_peak"] <= small["arrow_peak"] + batch  # ten times the rows: no more memory


def test_rewards_get_a_verl_parquet_row_as_the_trainers_hand_it_over(images, tmp_path):
    from conftest import FakeBackend

    from vlmfast.run.options import InferOptions
    from vlmfast.run.runner import infer

    pq.write_table(_verl(images), tmp_path / "test.parquet")
    seen = tmp_path / "seen.jsonl"
    (tmp_path / "rewards.py").write_text(f'''import json
def _say(*what):
    with open({str(seen)!r}, "a") as f:
        f.write(json.dumps(what) + "\\n")

def verl_score(data_source, solution_str, ground_truth, extra_info=None):
    _say("verl", data_source, ground_truth, extra_info)
    return 1.0

def trl_cols(completions, solution, **kwargs):
    _say("trl", solution, kwargs["reward_model"], kwargs["images"], kwargs["ability"])
    return [1.0 for _ in completions]
''')
    specs = [f"{tmp_path / 'rewards.py'}:verl_score", f"{tmp_path / 'rewards.py'}:trl_cols"]
    infer(InferOptions(ckpt="fake", manifest=str(tmp_path / "test.parquet"), out=str(tmp_path / "r.jsonl"), reward=specs,
                       batch_size=4), backend=FakeBackend())
    calls = read_jsonl(seen)[2:]  # after the check that calls each function once before anything generates
    verl, trl = [c for c in calls if c[0] == "verl"], [c for c in calls if c[0] == "trl"]
    assert len(verl) == 4 and verl[:2] == [
        ["verl", "hiyouga/geometry3k", "3", {"split": "test", "index": 0, "answer": "3", "question": QUESTIONS[0],
                                              "num_turns": None, "rollout_reward_scores": {}}],
        ["verl", "hiyouga/geometry3k", "red", {"split": "test", "index": 1, "answer": "red", "question": QUESTIONS[1],
                                                "num_turns": None, "rollout_reward_scores": {}}]]
    assert trl == [["trl", ANSWERS, [{"style": "rule", "ground_truth": a} for a in ANSWERS],
                        [[f"{tmp_path / 'test.parquet'}#row={i}/image=0"] for i in range(4)], ["math"] * 4]]


def test_a_sweep_on_a_parquet_file_writes_the_rows_of_the_jsonl_manifest(grpo_ckpt, images, tmp_path):
    """Two checkpoints swept on the parquet file and on the equivalent JSONL: the same rows per step, and the
    page and records written for both (the manifest digest covers the parquet file)."""
    import shutil

    from vlmfast.engines.rows import GenerationSettings
    from vlmfast.run.options import InferOptions
    from vlmfast.run.sweep import SweepOptions, sweep
    from vlmfast.run.sweep_page import write_sweep_dir

    for step in (100, 200):
        shutil.copytree(grpo_ckpt, tmp_path / "run" / f"checkpoint-{step}")
    pq.write_table(_easyr1(images), tmp_path / "val.parquet", row_group_size=2)
    jsonl = _jsonl(tmp_path / "m.jsonl", _ours(images))
    fields = ("id", "prompt", "text", "n_new_tokens", "correct")
    rows = {}
    for name, manifest in (("parquet", str(tmp_path / "val.parquet")), ("jsonl", jsonl)):
        infer = InferOptions(ckpt=str(tmp_path / "run"), manifest=manifest, device="cpu",
                             generation=GenerationSettings(max_new_tokens=6))
        report = sweep(SweepOptions(run_dir=str(tmp_path / "run"), out_dir=str(tmp_path / name), infer=infer))
        write_sweep_dir(report, tmp_path / name)
        rows[name] = {s: [[r[f] for f in fields] for r in read_jsonl(tmp_path / name / f"step-{s}.jsonl")] for s in (100, 200)}
        assert (tmp_path / name / "report.html").is_file() and report["settings"]["manifest_sha256"]
    assert rows["parquet"] == rows["jsonl"] and len(rows["parquet"][100]) == 4


def test_score_and_the_sweep_page_read_a_dataset_with_the_runs_columns(images, tmp_path):
    """`score --manifest DATASET --answer-key …` reads the truths from the column the run read (not the
    default one), and the sweep page takes that column from the sweep's recorded settings, a folder too."""
    from vlmfast.run.sweep_page import _truths

    table = _easyr1(images).append_column("label", pa.array(["4", "blue", "5", "yes"]))  # another truth column
    (tmp_path / "shards").mkdir()
    pq.write_table(table, tmp_path / "shards" / "part-0.parquet")
    results = _jsonl(tmp_path / "results.jsonl", [{"id": rid, "text": f"<answer>{a}</answer>"}
                                                  for rid, a in zip("abcd", ["4", "red", "5", "no"])])
    r = cli("score", results, "--manifest", tmp_path / "shards", "--answer-key", "label", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["accuracy"] == 0.5  # "4" and "5" are right against label; with answer it would be 0.75
    default = cli("score", results, "--manifest", tmp_path / "shards", "--json")
    assert default.returncode == 0 and json.loads(default.stdout)["accuracy"] == 0.75
    assert _truths(str(tmp_path / "shards"), {"answer_key": "label"}) == dict(zip("abcd", ["4", "blue", "5", "yes"]))
    assert _truths(str(tmp_path / "shards"), None) == dict(zip("abcd", ANSWERS))


def test_an_image_mark_is_the_images_place_in_every_manifest_format(images, tmp_path):
    """"<image>How many boxes?" is the same prompt in a parquet, a JSONL line and an ms-swift turn: the mark
    is dropped and the image goes first, never sent as the text "<image>"."""
    pq.write_table(_easyr1(images), tmp_path / "easyr1.parquet")
    lines = [{**line, "prompt": f"<image>{line['prompt']}"} for line in _ours(images)]
    swift = [{"id": line["id"], "images": line["images"], "answer": line["answer"],
              "messages": [{"role": "user", "content": line["prompt"]}]} for line in lines]
    parquet = collect(manifest=str(tmp_path / "easyr1.parquet")).requests
    for manifest in (_jsonl(tmp_path / "ours.jsonl", lines), _jsonl(tmp_path / "swift.jsonl", swift)):
        got = collect(manifest=manifest).requests
        assert [r.prompt for r in got] == [r.prompt for r in parquet] == QUESTIONS


def test_vlmr1_jsonl_is_read_as_it_is_like_its_converted_manifest(grpo_ckpt, images, tmp_path):
    """VLM-R1's training / evaluation JSONL ("image", "conversations": question then solution,
    "accu_reward_method") needs no convert step: infer, score and sweep read it as its trainer does, and the
    requests are those of the manifest `vlmfast convert` writes from it."""
    from vlmfast.inputs.convert import convert_file, write_manifest

    folder = images[0].parent
    lines = [{"id": "r0", "image": images[0].name, "accu_reward_method": "default",
              "conversations": [{"from": "human", "value": "<image>Where is the red box?"},
                                {"from": "gpt", "value": "[10, 20, 60, 70]"}]},
             {"image": images[1].name, "accu_reward_method": "mcq",
              "conversations": [{"from": "human", "value": "<image>Which shape? A. circle B. square"},
                                {"from": "gpt", "value": "<answer>B</answer>"}]}]
    manifest = _jsonl(folder / "vlmr1_rec.jsonl", lines)
    try:
        converted = write_manifest(convert_file(manifest, image_root=str(folder)), str(tmp_path / "converted.jsonl"))
        got, want = collect(manifest=manifest), collect(manifest=str(converted))
        assert got.bad == [] and got.warnings == []
        assert [(r.id, r.images, r.prompt, r.truth, r.scorer) for r in got.requests] == \
               [(r.id, r.images, r.prompt, r.truth, r.scorer) for r in want.requests]
        assert [r.id for r in got.requests] == ["r0", f"00001_{images[1].stem}"]
        assert got.requests[0].truth == [10, 20, 60, 70] and got.requests[1].scorer == "choice"
        out = tmp_path / "r.jsonl"
        r = cli("infer", "--ckpt", grpo_ckpt, "--manifest", manifest, "--max-new-tokens", 2, "--device", "cpu", "--out", out)
        assert r.returncode == 0, r.stderr
        assert [(row["id"], row["prompt"]) for row in read_jsonl(out)] == [
            ("r0", "Where is the red box?"), (f"00001_{images[1].stem}", "Which shape? A. circle B. square")]
    finally:
        os.remove(manifest)  # the images folder is shared by the session's tests


@pytest.mark.parametrize("kind", ["parquet", "arrow"])
def test_a_dotted_image_key_reads_the_images_inside_a_struct(images, tmp_path, kind):
    """--image-key media.picture reads the field of a struct column, as a dotted --prompt-key or --answer-key does."""
    table = pa.table({"id": ["a", "b", "c", "d"], "question": QUESTIONS,
                      "media": [{"picture": _png(images[i]), "kind": "photo"} for i in range(4)],
                      "label": [{"text": a} for a in ANSWERS]})
    if kind == "parquet":
        manifest = tmp_path / "nested.parquet"
        pq.write_table(table, manifest, row_group_size=3)
    else:
        manifest = tmp_path / "saved"
        manifest.mkdir()
        with pa.OSFile(str(manifest / "data.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            for batch in table.to_batches(max_chunksize=3):
                writer.write_batch(batch)
        (manifest / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data.arrow"}]}))
    got = collect(manifest=str(manifest), keys=_keys("question", "label.text", "media.picture"))
    assert not got.bad
    _same_requests(got.requests, collect(manifest=_jsonl(tmp_path / "m.jsonl", _ours(images))).requests)
    # the struct travels with the row, its image as the label (not the bytes), its other fields as they are
    assert got.requests[3].record["media"] == {"picture": got.requests[3].images[0], "kind": "photo"}


def test_a_dataset_without_a_prompt_column_is_one_error_naming_the_columns(images, tmp_path):
    pq.write_table(_easyr1(images).rename_columns(["id", "question", "answer", "images"]), tmp_path / "q.parquet")
    with pytest.raises(UsageError) as err:
        collect(manifest=str(tmp_path / "q.parquet"))
    assert err.value.message == f"{tmp_path / 'q.parquet'} has no prompt column (problem or prompt; columns: id, question, answer, images)"
    assert "--prompt-key" in err.value.hint
    assert [r.prompt for r in collect(manifest=str(tmp_path / "q.parquet"), keys=_keys("question")).requests] == QUESTIONS
    assert [r.prompt for r in collect(manifest=str(tmp_path / "q.parquet"), prompt="Describe.").requests] == ["Describe."] * 4


def test_relative_image_paths_of_a_dataset_are_read_under_the_image_root(images, tmp_path):
    """EasyR1's data.image_dir: a dataset's relative image paths are under a folder of their own."""
    root = tmp_path / "imgs"
    root.mkdir()
    for k, path in enumerate(images[:2]):
        Image.open(path).save(root / f"{k}.png")
    pq.write_table(pa.table({"id": ["a", "b"], "problem": ["Q1", "Q2"], "answer": ["1", "2"],
                             "images": [["0.png"], ["1.png"]]}), tmp_path / "val.parquet")
    alone = collect(manifest=str(tmp_path / "val.parquet"))
    assert len(alone.bad) == 2 and all("file not found" in b.error for b in alone.bad)  # beside the parquet: none
    got = collect(manifest=str(tmp_path / "val.parquet"), image_root=str(root))
    assert not got.bad and [r.images for r in got.requests] == [(str(root / "0.png"),), (str(root / "1.png"),)]
    assert [r.image_sizes for r in got.requests] == [(Image.open(p).size,) for p in images[:2]]


def test_verl_rows_of_two_sources_sharing_an_index_are_named_by_source_and_index(images, tmp_path):
    """verl's preprocessing restarts extra_info.index for each dataset; a file joining two of them held
    duplicate ids and could not run."""
    png = images[0].read_bytes()
    pq.write_table(pa.table({
        "data_source": ["geo3k", "geo3k", "chartqa", "chartqa"],
        "prompt": [[{"role": "user", "content": f"<image>Q{k}"}] for k in range(4)],
        "images": [[{"bytes": png, "path": None}]] * 4,
        "reward_model": [{"ground_truth": str(k)} for k in range(4)],
        "extra_info": [{"index": k % 2} for k in range(4)]}), tmp_path / "test.parquet")
    got = collect(manifest=str(tmp_path / "test.parquet"))
    assert not got.fatal and [r.id for r in got.requests] == ["geo3k:0", "geo3k:1", "chartqa:0", "chartqa:1"]
    pq.write_table(pa.table({"data_source": ["geo3k"] * 2, "prompt": [[{"role": "user", "content": "<image>Q"}]] * 2,
                             "images": [[{"bytes": png, "path": None}]] * 2, "reward_model": [{"ground_truth": "1"}] * 2,
                             "extra_info": [{"index": 0}, {"index": 1}]}), tmp_path / "one.parquet")
    assert [r.id for r in collect(manifest=str(tmp_path / "one.parquet")).requests] == ["0", "1"]  # unique: as before


def _tagged_easyr1(images, tmp_path) -> str:
    """An EasyR1 parquet file whose answer column writes row a's truth in answer tags."""
    table = _easyr1(images).set_column(2, "answer", pa.array(["<answer>3</answer>", "3", "5", "no"]))
    pq.write_table(table, tmp_path / "val.parquet")
    return str(tmp_path / "val.parquet")


def test_r1v_counting_gets_a_dataset_s_answer_column_as_written(images, tmp_path):
    """EasyR1 hands its answer column to the reward untouched (verl/utils/dataset.py: example["ground_truth"] =
    example.pop(self.answer_key)), as R1-V's script compares with its line's ground_truth: a reference scorer
    compares with "<answer>3</answer>", where vlmfast's own scorers read the 3 inside."""
    results = _jsonl(tmp_path / "r.jsonl", [{"id": rid, "text": "<think>t</think><answer>3</answer>"} for rid in "ab"])
    r = cli("score", results, "--manifest", _tagged_easyr1(images, tmp_path), "--scorer", "r1v-counting",
            "--out", tmp_path / "s.jsonl", "--json")
    assert r.returncode == 0, r.stderr
    assert [row["correct"] for row in read_jsonl(tmp_path / "s.jsonl")] == [False, True]
    own = cli("score", results, "--manifest", tmp_path / "val.parquet", "--out", tmp_path / "own.jsonl", "--json")
    assert own.returncode == 0 and [row["correct"] for row in read_jsonl(tmp_path / "own.jsonl")] == [True, True]


def test_easyr1_math_gets_a_dataset_s_answer_column_as_written(images, tmp_path):
    pytest.importorskip("mathruler", reason="easyr1-math grades with mathruler (pip install mathruler sympy pylatexenc)")
    pytest.importorskip("pylatexenc", reason="mathruler's grade_answer needs pylatexenc")
    from vlmfast.run.rescore import rescore_file

    results = tmp_path / "r.jsonl"
    _jsonl(results, [{"id": rid, "text": "<think>t</think> so \\boxed{3}"} for rid in "ab"])
    rescore_file(results, _tagged_easyr1(images, tmp_path), scorer="easyr1-math", out=tmp_path / "s.jsonl")
    assert [row["correct"] for row in read_jsonl(tmp_path / "s.jsonl")] == [False, True]  # EasyR1: 0, then 1
