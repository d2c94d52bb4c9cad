"""A config.json of another family than the saved weights: doctor names the config (not lost tensors, not the
processor), infer and sweep refuse with it before loading, and none of them offers --allow-missing."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import cli, edit_json
from vlmfast.checkpoints.doctor import diagnose
from vlmfast.checkpoints.families import BY_KEY, family_of_tensors
from vlmfast.checkpoints.locate import locate
from vlmfast.checkpoints.readers import tensor_index
from vlmfast.checkpoints.weights import canonical, require_whole
from vlmfast.errors import CheckpointError

WRONG_CLASS = {"weights-lost", "weights-unexpected", "weights-shape-mismatch", "processor-family-mismatch"}


def _has_class(key: str) -> bool:
    import transformers

    return hasattr(transformers, BY_KEY[key].model_class)


ON_THIS_LINE = [pytest.param(k, marks=pytest.mark.skipif(not _has_class(k), reason="not in this transformers"))
                for k in BY_KEY]


def with_config_of(weights, config_from, dst):
    """A copy of the checkpoint ``weights`` whose config.json is ``config_from``'s."""
    d = shutil.copytree(weights, dst)
    shutil.copy(config_from / "config.json", d / "config.json")
    return d


def _by_code(ckpt, **kwargs):
    return {f.code: f for f in diagnose(ckpt, **kwargs)}


@pytest.mark.parametrize("key", ON_THIS_LINE)
def test_each_family_s_saved_names_are_its_own_and_raise_no_mismatch(key, family_ckpts):
    ckpt = family_ckpts(key)
    assert family_of_tensors(canonical(n) for n in tensor_index(ckpt)) is BY_KEY[key]
    assert "config-family-mismatch" not in _by_code(ckpt)


@pytest.mark.parametrize("other, name", [("qwen2_vl", "Qwen2-VL"), ("qwen3_vl", "Qwen3-VL")])
def test_another_family_s_config_is_one_error_naming_both_families(other, name, family_ckpts, base_ckpt, tmp_path):
    ckpt = with_config_of(base_ckpt, family_ckpts(other), tmp_path / "ckpt")
    found = _by_code(ckpt)
    f = found["config-family-mismatch"]
    assert (f.severity, f.location) == ("error", "config.json: model_type")
    assert f"config.json names {name} (model_type '{other}')" in f.message
    saved = next(n for n in tensor_index(ckpt) if n.endswith("visual.blocks.0.mlp.gate_proj.bias"))  # as saved
    assert f"the saved tensors are Qwen2.5-VL's (e.g. {saved})" in f.message
    assert "tensors not saved" in f.message  # how many the wrong class would initialise at random
    assert "restore the checkpoint's own config.json (model_type 'qwen2_5_vl'" in f.fix
    assert "--allow-missing" not in f.fix
    assert not WRONG_CLASS & set(found), "the wrong class's lost tensors, or the processor, were blamed"
    with_base = _by_code(ckpt, base=base_ckpt)["config-family-mismatch"]
    assert f"cp {base_ckpt / 'config.json'} {ckpt}/" in with_base.fix  # a base of the weights' family: its config

    r = cli("doctor", ckpt, "--strict")
    assert r.returncode == 1 and "config-family-mismatch" in r.stderr and "weights-lost" not in r.stderr


def test_the_processor_is_still_checked_against_the_family_the_weights_are(family_ckpts, base_ckpt, tmp_path):
    ckpt = with_config_of(base_ckpt, family_ckpts("qwen2_vl"), tmp_path / "ckpt")
    for name in ("preprocessor_config.json", "processor_config.json"):
        if (ckpt / name).is_file():
            edit_json(ckpt / name, lambda c: c.update(processor_class="Qwen3VLProcessor"))
    (f,) = [f for f in diagnose(ckpt) if f.code == "processor-family-mismatch"]
    assert "Qwen3VLProcessor is Qwen3-VL's processor, but the model is Qwen2.5-VL" in f.message


def test_infer_refuses_another_family_s_config_whatever_allow_missing_says(family_ckpts, base_ckpt, images, tmp_path):
    ckpt = with_config_of(base_ckpt, family_ckpts("qwen2_vl"), tmp_path / "ckpt")
    out = tmp_path / "rows.jsonl"
    args = ("infer", "--ckpt", ckpt, "--images", images[0], "--prompt", "hi", "--max-new-tokens", "3",
            "--device", "cpu", "--out", out)
    for extra in ((), ("--allow-missing", "visual.blocks.0.mlp", "--allow-missing", "visual.blocks.1.mlp")):
        r = cli(*args, *extra)
        assert r.returncode == 2 and not out.exists()
        assert "config.json names Qwen2-VL (model_type 'qwen2_vl') but the saved tensors are Qwen2.5-VL's" in r.stderr
        assert "restore the checkpoint's own config.json" in r.stderr
        assert "--allow-missing" not in r.stderr.split("hint:", 1)[1]


def test_sweep_lists_it_as_not_evaluated_with_its_cause(family_ckpts, base_ckpt, images, tmp_path):
    from vlmfast.engines.rows import GenerationSettings
    from vlmfast.run.options import InferOptions
    from vlmfast.run.sweep import SweepOptions, sweep

    run = tmp_path / "run"
    shutil.copytree(base_ckpt, run / "checkpoint-100")
    with_config_of(base_ckpt, family_ckpts("qwen2_vl"), run / "checkpoint-200")
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"id": "q0", "image": str(images[0]), "prompt": "hi"}) + "\n")
    infer = InferOptions(ckpt=str(run), manifest=str(manifest), generation=GenerationSettings(max_new_tokens=3),
                         device="cpu")
    report = sweep(SweepOptions(run_dir=str(run), out_dir=str(tmp_path / "out"), infer=infer), say=lambda _: None)
    why = {e["step"]: e for e in report["not_evaluated"]}
    assert set(why) == {200}
    assert "config.json names Qwen2-VL" in why[200]["reason"] and "--allow-missing" not in why[200]["hint"]
