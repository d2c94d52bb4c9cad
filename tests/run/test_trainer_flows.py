"""Each seed trainer's layout goes doctor → fix → infer through the CLI, without a hand edit (the CLI called in
this process: nothing here needs a process of its own, and each would import torch and transformers again)."""

import json

import pytest

from conftest import cli
from conftest import read_jsonl


def _doctor(path, *extra):
    r = cli("doctor", path, "--json", "--strict", *extra)
    return r.returncode, {f["code"] for f in json.loads(r.stdout)["findings"] if f["severity"] == "error"}


def _infer(path, images, out, *extra):
    r = cli("infer", "--ckpt", path, "--images", images[0], images[1], "--prompt", "Count.", "--device", "cpu",
            "--max-new-tokens", 4, "--out", out, *extra)
    assert r.returncode == 0, r.stderr
    rows = read_jsonl(out)
    assert len(rows) == 2 and all(row["error"] is None and row["n_new_tokens"] >= 1 for row in rows)
    return r


@pytest.mark.parametrize("like", ["vlmr1", "swift"])
def test_full_weight_trainer_outputs(layouts, images, tmp_path, like):
    info = layouts[like]
    assert _doctor(info.root) == (1, {"cache-off"})
    fixed = cli("fix", info.root)  # the trainer output dir: fix finds the checkpoint like --ckpt does
    assert fixed.returncode == 0, fixed.stderr
    assert (info.model_dir / "config.json.orig").exists() and (info.model_dir / "generation_config.json.orig").exists()
    assert _doctor(info.root) == (0, set())
    r = _infer(info.root, images, tmp_path / "r.jsonl", "--json")
    assert json.loads(r.stdout)["cache"]["found_off"] == []  # nothing left to force


def test_easyr1_unmerged_shards_then_merged(layouts, images, tmp_path):
    from layouts import merge_fsdp_shards

    info = layouts["easyr1"]
    code, errors = _doctor(info.root)
    assert code == 1 and errors == {"cache-off", "eos-missing-im-end", "fsdp-unmerged"}
    blocked = cli("infer", "--ckpt", info.root, "--images", images[0], "--prompt", "p")
    assert blocked.returncode == 2 and "model_merger.py" in blocked.stderr
    merge_fsdp_shards(info.actor)  # stands in for EasyR1's scripts/model_merger.py
    fixed = cli("fix", info.root)
    assert fixed.returncode == 0, fixed.stderr
    assert _doctor(info.root) == (0, set())
    eos = json.loads((info.model_dir / "generation_config.json").read_text())["eos_token_id"]
    assert len(eos) == 2  # <|im_end|> is back
    _infer(info.root, images, tmp_path / "r.jsonl")


def test_swift_lora_runs_unmerged_merged_and_as_a_merged_checkpoint(layouts, images, tmp_path):
    info = layouts["swift-lora"]
    assert _doctor(info.root)[0] == 0  # an adapter is a warning (needs its base), not an error
    a = _infer(info.root, images, tmp_path / "a.jsonl")
    b = _infer(info.root, images, tmp_path / "b.jsonl", "--merge")
    assert "LoRA adapter" in a.stderr and "merged into the weights" in b.stderr
    out = tmp_path / "merged"
    m = cli("fix", info.model_dir, "--merge-lora", out)
    assert m.returncode == 0, m.stderr
    assert _doctor(out) == (0, set())
    _infer(out, images, tmp_path / "c.jsonl")
    texts = [[row["text"] for row in read_jsonl(tmp_path / f"{x}.jsonl")] for x in "abc"]
    assert texts[0] == texts[1] == texts[2]  # same greedy output, unmerged, merged, and written out


def test_base_is_clean_and_fix_has_nothing_to_do(layouts):
    info = layouts["base"]
    assert _doctor(info.root) == (0, set())
    r = cli("fix", info.root)
    assert r.returncode == 0 and "nothing to fix" in r.stderr
    assert not list(info.model_dir.glob("*.orig"))
