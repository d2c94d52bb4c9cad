"""A config.json of another family than the saved weights: doctor names the config (not lost tensors, not the
processor), infer and sweep refuse with it before loading, and none of them offers --allow-missing. An adapter
whose weight file is cut short: doctor names the file, and infer and sweep refuse with it, not blaming --base."""

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


def _cut_adapter(layouts, dst):
    d = shutil.copytree(layouts["swift-lora"].model_dir, dst)
    weights = d / "adapter_model.safetensors"
    data = weights.read_bytes()
    head = 8 + int.from_bytes(data[:8], "little")
    weights.write_bytes(data[: head + (len(data) - head) // 2])  # header whole, tensors cut short
    return d, f"adapter_model.safetensors: {head + (len(data) - head) // 2:,} of the {len(data):,} bytes its header says"


def test_a_cut_adapter_is_named_by_doctor_and_refused_by_infer_before_any_load(layouts, images, tmp_path):
    d, said = _cut_adapter(layouts, tmp_path / "adapter")
    base = layouts["swift-lora"].base
    found = _by_code(d, base=base)
    f = found["weights-incomplete"]
    assert f.severity == "error" and said in f.message
    assert "save the adapter again" in f.fix and "--base" not in f.fix
    assert "lora-adapter" in found  # still said: it is an adapter
    assert cli("doctor", d, "--base", base, "--strict").returncode == 1

    out = tmp_path / "rows.jsonl"
    r = cli("infer", "--ckpt", d, "--base", base, "--images", images[0], "--prompt", "hi", "--max-new-tokens", "3",
            "--device", "cpu", "--out", out)
    assert r.returncode == 2 and not out.exists()
    assert f"the adapter's weights are incomplete: {said}" in r.stderr
    hint = r.stderr.split("hint:", 1)[1]
    assert "save the adapter again" in hint and "--base" not in hint and "cannot apply" not in r.stderr

    from vlmfast.checkpoints.load import load  # other commands load through here: the same error, base unloaded

    with pytest.raises(CheckpointError, match="adapter's weights are incomplete") as err:
        load(str(d), base=str(base), device="cpu")
    assert said in err.value.message
    assert "--base" not in err.value.hint
    r = cli("fix", d, "--merge-lora", tmp_path / "merged", "--processor-from", base)
    assert r.returncode == 2 and said in r.stderr and not (tmp_path / "merged").exists()
    (d / "adapter_model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no adapter weights"):
        require_whole(locate(d))


def test_sweep_lists_both_as_not_evaluated_with_their_cause(family_ckpts, base_ckpt, layouts, images, tmp_path):
    from vlmfast.engines.rows import GenerationSettings
    from vlmfast.run.options import InferOptions
    from vlmfast.run.sweep import SweepOptions, sweep

    run = tmp_path / "run"
    shutil.copytree(base_ckpt, run / "checkpoint-100")
    with_config_of(base_ckpt, family_ckpts("qwen2_vl"), run / "checkpoint-200")
    said = _cut_adapter(layouts, run / "checkpoint-300")[1]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"id": "q0", "image": str(images[0]), "prompt": "hi"}) + "\n")
    infer = InferOptions(ckpt=str(run), manifest=str(manifest), generation=GenerationSettings(max_new_tokens=3),
                         device="cpu")
    report = sweep(SweepOptions(run_dir=str(run), out_dir=str(tmp_path / "out"), infer=infer), say=lambda _: None)
    why = {e["step"]: e for e in report["not_evaluated"]}
    assert set(why) == {200, 300}
    assert "config.json names Qwen2-VL" in why[200]["reason"] and "--allow-missing" not in why[200]["hint"]
    assert said in why[300]["reason"]
