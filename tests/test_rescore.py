"""Scores in the product: infer writes them into every row, `vlmfast score` recomputes them without a
model, `vlmfast convert` makes manifests with ground truth, bench gates on accuracy."""

import json
import shutil
from pathlib import Path

from conftest import cli, read_jsonl
from vlmfast.bench import BASE, CKPT, gate
from vlmfast.engine import GenerationSettings
from vlmfast.runner import InferOptions, infer

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
SCORE_FIELDS = ("score", "correct", "format_ok", "scorer", "iou", "parse_failed", "bbox_unmapped")


def _scored_manifest(tmp_path, images) -> Path:
    """configs/scored.example.jsonl beside the test images (its paths are relative to itself)."""
    (tmp_path / "images").mkdir()
    for i in range(4):
        shutil.copyfile(images[i], tmp_path / "images" / f"img_{i:03d}.png")
    manifest = tmp_path / "scored.jsonl"
    shutil.copyfile(CONFIGS / "scored.example.jsonl", manifest)
    return manifest


def test_infer_writes_scores_and_score_recomputes_them_without_a_model(loaded, grpo_ckpt, images, tmp_path):
    manifest = _scored_manifest(tmp_path, images)
    out = tmp_path / "r.jsonl"
    report = infer(InferOptions(ckpt=str(grpo_ckpt), manifest=str(manifest), template="r1", out=str(out),
                                generation=GenerationSettings(max_new_tokens=8)), loaded=loaded)
    rows = read_jsonl(out)
    truths = [json.loads(line) for line in manifest.read_text().splitlines()]
    assert [r["id"] for r in rows] == [t["id"] for t in truths]
    assert [r["scorer"] for r in rows] == ["number", "choice", "bbox", "exact", "contains"][:len(rows)]
    assert all(r["score"] is not None and r["correct"] is (r["score"] == 1.0) for r in rows)
    assert rows[2]["iou"] is not None and rows[2]["bbox_unmapped"] is False  # sizes known: mapped back
    assert report.scores["scored"] == len(rows) and report.scores["accuracy"] == sum(r["correct"] for r in rows) / len(rows)

    rescored = tmp_path / "again.jsonl"
    r = cli("score", out, "--manifest", manifest, "--out", rescored, "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert [{k: row[k] for k in SCORE_FIELDS} for row in read_jsonl(rescored)] == [{k: row[k] for k in SCORE_FIELDS} for row in rows]
    assert summary["accuracy"] == report.scores["accuracy"] and summary["rows"] == len(rows)
    assert "vlmfast score" in r.stderr


def test_score_on_known_answers(tmp_path, images):
    manifest = _scored_manifest(tmp_path, images)
    rows = [
        {"id": "count-1", "text": "<think>one two three</think><answer>3</answer>", "answer": "3"},
        {"id": "mcq-1", "text": "<think>c</think><answer>(C) blue</answer>", "answer": "(C) blue"},
        {"id": "ground-1", "text": "<think>b</think><answer>[{\"bbox_2d\": [8, 10, 60, 96]}]</answer>",
         "answer": "[{\"bbox_2d\": [8, 10, 60, 96]}]", "image_sizes": [[112, 112]], "model_image_sizes": [[112, 112]]},
        {"id": "caption-1", "text": "<answer>no</answer>", "answer": "no"},
        {"id": "free-1", "text": "<think>x</think><answer>unclosed", "answer": None},
    ]
    results = tmp_path / "known.jsonl"
    results.write_text("".join(json.dumps({"finish_reason": "eos", "error": None, **r}) + "\n" for r in rows))
    r = cli("score", results, "--manifest", manifest, "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["scored"] == 5 and summary["accuracy"] == 3 / 5  # count, choice, box right; "no" and unclosed wrong
    assert summary["format_rate"] == 3 / 5 and summary["answer_parse_failures"] == 1
    assert summary["by_scorer"]["bbox"]["accuracy"] == 1.0 and summary["by_scorer"]["exact"]["accuracy"] == 0.0
    bad = cli("score", tmp_path / "missing.jsonl", "--manifest", manifest)
    assert bad.returncode == 2 and "no such results file" in bad.stderr


def test_convert_through_the_cli(tmp_path):
    out = tmp_path / "rec.jsonl"
    r = cli("convert", CONFIGS / "vlmr1_rec.example.json", "--out", out, "--image-root", "/data/coco")
    assert r.returncode == 0, r.stderr
    rows = read_jsonl(out)
    assert rows and all(row["scorer"] == "bbox" and row["image"].startswith("/data/coco/") for row in rows)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [], "images": ["a.png"]}\n')
    r = cli("convert", bad, "--out", tmp_path / "x.jsonl", "--format", "swift")
    assert r.returncode == 2 and f"{bad}:1" in r.stderr and not (tmp_path / "x.jsonl").exists()


def test_accuracy_gate_exits_5_on_a_less_accurate_checkpoint():
    report = {"cache": {"found_off": []}, "scenarios": [
        {"name": CKPT, "batch_size": 8, "tokens_per_s": 100.0, "accuracy": 0.50},
        {"name": BASE, "batch_size": 8, "tokens_per_s": 100.0, "accuracy": 0.70}]}
    code, messages = gate(report, None, False, fail_if_less_accurate=0.05)
    assert code == 5 and "accuracy 0.500 < base 0.700 − 0.05 = 0.650" in messages[0]
    assert gate(report, None, False, fail_if_less_accurate=0.25) == (0, [])  # within the allowed drop
    unscored = {**report, "scenarios": [{**s, "accuracy": None} for s in report["scenarios"]]}
    code, messages = gate(unscored, None, False, fail_if_less_accurate=0.05)
    assert code == 2 and "no ground truth" in messages[0]
    both = gate(report, 1.0, True, fail_if_less_accurate=0.05)  # every tripped gate is reported
    assert both[0] == 5 and len(both[1]) == 1
