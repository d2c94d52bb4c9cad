"""The ``image_grid_thw`` a TRL / VLM-R1 reward is handed is the processor's own (VLM-R1's Qwen module hands
``prompt_inputs['image_grid_thw']``): size / 16 for Qwen3-VL, size / 14 for Qwen2.5-VL, written into each
results row by the engine so that ``score`` (no model loaded) hands the same grid."""

from __future__ import annotations

import json

import pytest
from conftest import cli, read_jsonl
from PIL import Image

SPY = '''
import json
import os

def spy(completions, image_grid_thw, **kwargs):
    with open(os.environ["VLMFAST_TEST_GRIDS"], "a") as f:
        f.write(json.dumps([list(map(int, g)) for g in image_grid_thw]) + "\\n")
    return [0.0 for _ in completions]
'''


@pytest.mark.parametrize("key, patch", [("qwen3_vl", 16), ("qwen2_5_vl", 14)])
def test_a_reward_gets_the_processors_grid_in_infer_and_in_score(key, patch, family_ckpts, tmp_path, monkeypatch):
    from transformers import AutoProcessor

    sizes = [(200, 120), (90, 300)]
    lines = []
    for i, size in enumerate(sizes):
        Image.new("RGB", size, (40 * i, 90, 160)).save(tmp_path / f"im{i}.png")
        lines.append({"id": f"q{i}", "image": str(tmp_path / f"im{i}.png"), "prompt": "Where?", "solution": "[1, 2, 3, 4]"})
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    (tmp_path / "spy.py").write_text(SPY)
    grids = tmp_path / "grids.jsonl"
    monkeypatch.setenv("VLMFAST_TEST_GRIDS", str(grids))
    ckpt, out = family_ckpts(key), tmp_path / "r.jsonl"
    r = cli("infer", "--ckpt", ckpt, "--manifest", manifest, "--max-new-tokens", 2, "--device", "cpu",
            "--max-pixels", 40000, "--reward", f"{tmp_path / 'spy.py'}:spy", "--out", out)
    assert r.returncode == 0, r.stderr
    rows = {row["id"]: row for row in read_jsonl(out)}

    processor = AutoProcessor.from_pretrained(ckpt)
    assert processor.image_processor.patch_size == patch
    theirs = []
    for i in range(len(sizes)):  # the processor on the image the model saw, as VLM-R1's trainer calls it
        width, height = rows[f"q{i}"]["model_image_sizes"][0]
        image = Image.open(tmp_path / f"im{i}.png").convert("RGB").resize((width, height))
        theirs.append(processor.image_processor(images=[image], return_tensors="pt", do_resize=False)["image_grid_thw"].tolist()[0])
    assert [rows[f"q{i}"]["image_grid_thw"] for i in range(len(sizes))] == [[grid] for grid in theirs]
    assert any(grid != [1, h // 14, w // 14] for grid, (w, h) in zip(theirs, (rows[f"q{i}"]["model_image_sizes"][0]
                                                                                for i in range(len(sizes))))) == (patch != 14)

    handed = [json.loads(line) for line in grids.read_text().splitlines()]
    # the rows' call during infer, most expensive first (before it: the check call before the model loads)
    assert sorted(handed[-1]) == sorted(theirs)
    grids.unlink()
    r = cli("score", out, "--manifest", manifest, "--reward", f"{tmp_path / 'spy.py'}:spy")
    assert r.returncode == 0, r.stderr
    assert [json.loads(line) for line in grids.read_text().splitlines()] == [theirs]
