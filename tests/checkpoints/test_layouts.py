"""Trainer output layouts (layouts.build_layout): where they resolve, that they are deterministic, and that
infer runs on each (EasyR1 after its shards are merged; ms-swift LoRA through its base)."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from layouts import LAYOUTS, build_layout, merge_fsdp_shards
from vlmfast.checkpoints.load import load
from vlmfast.errors import CheckpointError
from vlmfast.checkpoints.locate import locate, require
from vlmfast.checkpoints.tiny import build_checkpoint


def _digests(d: Path) -> dict[str, str]:
    return {p.relative_to(d).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file()}


def _generate(loaded, image, n=4):
    from vlmfast.engines.hf.engine import Engine, GenerationSettings
    from vlmfast.inputs.requests import Request

    results, _ = Engine(loaded, GenerationSettings(max_new_tokens=n)).generate_batch(
        [Request("a", (str(image),), "Describe the image.")])
    return results[0]


def test_each_layout_has_its_trainer_files(layouts):
    vlmr1 = layouts["vlmr1"]
    assert sorted(p.name for p in vlmr1.root.iterdir() if p.is_dir()) == ["checkpoint-10", "checkpoint-2"]
    assert {"trainer_state.json", "training_args.bin", "model.safetensors", "config.json"} <= {p.name for p in vlmr1.model_dir.iterdir()}
    easy = layouts["easyr1"]
    assert sorted(p.name for p in easy.actor.glob("*.pt")) == ["model_world_size_2_rank_0.pt", "model_world_size_2_rank_1.pt"]
    assert not list(easy.model_dir.glob("*.safetensors")) and (easy.model_dir / "config.json").is_file()
    assert (layouts["swift"].model_dir / "args.json").is_file() and (layouts["swift"].model_dir.parent / "args.json").is_file()
    lora = layouts["swift-lora"]
    assert {"adapter_config.json", "adapter_model.safetensors", "args.json"} <= {p.name for p in lora.model_dir.iterdir()}
    assert not (lora.model_dir / "config.json").exists() and (lora.base / "model.safetensors").is_file()


@pytest.mark.parametrize("like", LAYOUTS)
def test_layout_locates_where_documented(layouts, like):
    info = layouts[like]
    found = locate(info.root)
    assert found.path == info.model_dir
    assert found.kind == {"easyr1": "fsdp", "swift-lora": "adapter"}.get(like, "model")
    assert (found.note is None) == (like == "base")


def test_layout_deterministic_and_base_is_build_checkpoint(tmp_path, layouts):
    again = build_layout(tmp_path / "vlmr1", "vlmr1")
    assert _digests(again.root) == _digests(layouts["vlmr1"].root)
    base = build_layout(tmp_path / "base", "base")
    assert _digests(base.root) == _digests(build_checkpoint(tmp_path / "plain", like="base"))
    # swift-lora records the base's absolute path; everything else is byte-identical.
    lora = build_layout(tmp_path / "swift-lora", "swift-lora")
    mine, theirs = _digests(lora.root), _digests(layouts["swift-lora"].root)
    path_bound = {f for f in mine if f.endswith(("adapter_config.json", "args.json"))}
    assert {f: h for f, h in mine.items() if f not in path_bound} == {f: h for f, h in theirs.items() if f not in path_bound}
    old = (layouts["swift-lora"].model_dir / "adapter_config.json").read_text()
    assert (lora.model_dir / "adapter_config.json").read_text() == old.replace(str(layouts["swift-lora"].root.resolve()), str(lora.root.resolve()))
    with pytest.raises(ValueError, match="unknown layout"):
        build_layout(tmp_path / "x", "trl")


@pytest.mark.parametrize("like", ["vlmr1", "swift", "base"])
def test_infer_runs_on_full_weight_layouts(layouts, images, like):
    info = layouts[like]
    loaded = load(str(info.root), device="cpu")
    assert loaded.source == str(info.model_dir)
    assert _generate(loaded, images[0]).n_new_tokens >= 1


def test_easyr1_unmerged_says_how_to_merge_then_runs_once_merged(layouts, images, tmp_path):
    root = tmp_path / "easyr1"
    shutil.copytree(layouts["easyr1"].root, root)
    actor = root / "global_step_4" / "actor"
    with pytest.raises(CheckpointError, match="FSDP shards") as err:
        load(str(root), device="cpu")
    assert "scripts/model_merger.py" in err.value.hint and f"--local_dir {actor}" in err.value.hint
    (actor / "fsdp_config.json").write_text('{"FSDP_version": 1, "world_size": 2}')  # as verl saves it beside the shards
    with pytest.raises(CheckpointError, match="FSDP shards") as err:
        load(str(root), device="cpu")
    assert err.value.hint.startswith(f"merge the shards with verl: python -m verl.model_merger merge --backend fsdp "
                                     f"--local_dir {actor} --target_dir {actor / 'huggingface'}, then point --ckpt")
    (actor / "fsdp_config.json").unlink()
    merged = merge_fsdp_shards(actor)
    loaded = load(str(root), device="cpu")
    assert loaded.source == str(merged) and "global_step_4" in loaded.notes[0]
    assert any("lacks <|im_end|>" in n for n in loaded.notes)  # the lost EOS is caught at load time too
    assert _generate(loaded, images[0]).n_new_tokens >= 1


def test_highest_step_with_weights_wins_across_layouts(layouts, tmp_path):
    root = tmp_path / "easyr1"
    shutil.copytree(layouts["easyr1"].root, root)
    merge_fsdp_shards(root / "global_step_2" / "actor")  # only the older step is merged
    r = require(locate(str(root)), "model")
    assert r.source == str(root / "global_step_2" / "actor" / "huggingface")
    assert "skipped global_step_4" in r.note


def test_swift_lora_needs_its_base_and_runs_with_it(layouts, images):
    info = layouts["swift-lora"]
    with pytest.raises(CheckpointError, match="LoRA adapter") as err:
        require(locate(str(info.root)), "model")  # callers that cannot take an adapter are told what to do
    assert "--merge-lora" in err.value.hint and str(info.base) in err.value.message
    resolved = require(locate(str(info.root)), "model", "adapter")
    assert (resolved.kind, resolved.source) == ("adapter", str(info.model_dir))
    loaded = load(str(info.root), device="cpu")  # the loader takes the base named in adapter_config.json
    assert (loaded.source, loaded.base_source) == (str(info.model_dir), str(info.base))
    assert any("processor from the base" in n for n in loaded.notes)
    assert _generate(loaded, images[0]).n_new_tokens >= 1


def test_swift_merged_lora_beside_the_adapter_wins(layouts, tmp_path):
    from vlmfast.checkpoints.fix import merge_lora

    root = tmp_path / "swift-lora"
    shutil.copytree(layouts["swift-lora"].root, root)
    adapter = root / "v0-20250101-000000" / "checkpoint-4"
    merge_lora(adapter, adapter.with_name("checkpoint-4-merged"))  # what `swift export --merge_lora` writes
    r = locate(str(root))
    assert (r.kind, r.source) == ("model", str(adapter.with_name("checkpoint-4-merged")))
    assert "checkpoint-4-merged" in r.note
