"""vlmfast.checkpoints.lora: adapter dirs, their base, and that unmerged, merged and merge_lora-written models
decode the same greedy tokens."""

from __future__ import annotations

import shutil

import pytest

from conftest import edit_json, retrain_adapter
from vlmfast.checkpoints.load import load
from vlmfast.checkpoints.readers import is_adapter_dir
from vlmfast.errors import CheckpointError
from vlmfast.checkpoints.lora import adapter_base, resolve_base


@pytest.fixture(scope="module")
def lora(layouts):
    return layouts["swift-lora"]


def _tokens(loaded, images, n=8):
    from vlmfast.engines.hf.engine import Engine, GenerationSettings
    from vlmfast.inputs.requests import Request

    engine = Engine(loaded, GenerationSettings(max_new_tokens=n, ignore_eos=True))
    return [engine.generate_batch([Request(str(i), (str(img),), "Describe the image.")])[0][0].token_ids
            for i, img in enumerate(images)]


def test_adapter_dir_and_its_base(lora, base_ckpt, tmp_path):
    assert is_adapter_dir(lora.model_dir) and not is_adapter_dir(lora.base) and not is_adapter_dir(tmp_path / "nope")
    assert adapter_base(lora.model_dir) == str(lora.base)
    assert resolve_base(lora.model_dir) == str(lora.base)
    assert resolve_base(lora.model_dir, base=str(base_ckpt)) == str(base_ckpt)  # --base wins
    d = shutil.copytree(lora.model_dir, tmp_path / "adapter")
    edit_json(d / "adapter_config.json", lambda c: c.update(base_model_name_or_path="/gone/base"))
    with pytest.raises(CheckpointError, match="does not exist here") as err:
        resolve_base(d)
    assert "--base" in err.value.hint
    assert resolve_base(d, base=str(lora.base)) == str(lora.base)
    edit_json(d / "adapter_config.json", lambda c: c.pop("base_model_name_or_path"))
    with pytest.raises(CheckpointError, match="does not name its base"):
        adapter_base(d)
    with pytest.raises(CheckpointError, match="a LoRA adapter"):  # --base must be a full model
        load(str(lora.model_dir), base=str(lora.model_dir), device="cpu")


def test_unmerged_merged_and_merge_lora_give_identical_greedy_tokens(lora, images, tmp_path):
    import torch

    from vlmfast.checkpoints.fix import merge_lora

    some = images[:3]
    unmerged = load(str(lora.model_dir), merge=False, device="cpu")
    merged = load(str(lora.model_dir), merge=True, device="cpu")
    written = load(str(merge_lora(lora.model_dir, tmp_path / "merged").out_dir), device="cpu")
    base = load(str(lora.base), device="cpu")
    assert any("unmerged" in n for n in unmerged.notes) and any("merged into" in n for n in merged.notes)
    assert (unmerged.source, unmerged.base_source, base.base_source) == (str(lora.model_dir), str(lora.base), None)
    # LoRA layers are in the unmerged model only; the merged weights differ from the base's.
    assert any("lora_A" in name for name, _ in unmerged.model.named_parameters())
    assert not any("lora_" in name for name, _ in merged.model.named_parameters())
    q = "model.language_model.layers.0.self_attn.q_proj.weight"
    weights = {name: dict(m.model.named_parameters())[q] for name, m in (("merged", merged), ("written", written), ("base", base))}
    assert torch.equal(weights["merged"], weights["written"]) and not torch.allclose(weights["merged"], weights["base"])

    tokens = _tokens(unmerged, some)
    assert all(len(t) == 8 for t in tokens)
    assert _tokens(merged, some) == tokens
    assert _tokens(written, some) == tokens
    assert _tokens(base, some) != tokens  # the adapter changes what is generated


def test_adapter_dir_with_its_own_processor_uses_it(lora, tmp_path):
    d = shutil.copytree(lora.model_dir, tmp_path / "adapter")
    for f in lora.base.iterdir():
        if f.name.startswith(("preprocessor", "processor", "video_preprocessor", "tokenizer", "vocab", "merges",
                              "chat_template", "special_tokens", "added_tokens")):
            shutil.copyfile(f, d / f.name)
    loaded = load(str(d), device="cpu")
    assert any("processor from the adapter dir" in n for n in loaded.notes)
    assert loaded.processor.tokenizer.padding_side == "left"


def test_an_adapter_for_another_model_is_a_clear_error(lora, tmp_path):
    d = shutil.copytree(lora.model_dir, tmp_path / "adapter")
    edit_json(d / "adapter_config.json", lambda c: c.update(target_modules=r".*\.no_such_proj"))
    with pytest.raises(CheckpointError, match="cannot apply the adapter") as err:
        load(str(d), device="cpu")
    assert "--base" in err.value.hint


def test_an_adapter_fingerprint_covers_its_files_and_its_base_weights(lora, tmp_path):
    """An adapter's rows are made by its base's weights as much as by its own: its fingerprint changes when
    either changes, and says what it covers (a hub id base counts by name only)."""
    from vlmfast.checkpoints.fingerprint import fingerprint, weights_fingerprint
    from vlmfast.checkpoints.locate import locate
    from vlmfast.checkpoints.tiny import build_checkpoint

    base = shutil.copytree(lora.base, tmp_path / "base")
    d = shutil.copytree(lora.model_dir, tmp_path / "adapter")
    edit_json(d / "adapter_config.json", lambda c: c.update(base_model_name_or_path=str(base)))
    first = weights_fingerprint(locate(d))
    assert first is not None and first["digest"].startswith("sampled:")
    assert first["base"] == {"source": str(base), "digest": fingerprint(base)["digest"]} and str(base) in first["of"]
    assert first["adapter"]["files"] == 1 and first["adapter"]["tensors"] > 0
    assert first["tensors"] == first["adapter"]["tensors"] + fingerprint(base)["tensors"]
    assert weights_fingerprint(locate(lora.model_dir))["digest"] == first["digest"]  # the same bytes elsewhere
    assert weights_fingerprint(locate(d), "full")["digest"].startswith("full:")

    retrain_adapter(d / "adapter_model.safetensors")  # the adapter file saved over
    retrained = weights_fingerprint(locate(d))
    assert retrained["digest"] != first["digest"] and retrained["base"] == first["base"]
    assert weights_fingerprint(locate(d), base=str(lora.base))["digest"] == retrained["digest"]  # --base: same bytes

    shutil.copyfile(build_checkpoint(tmp_path / "seed1", seed=1) / "model.safetensors", base / "model.safetensors")
    rebased = weights_fingerprint(locate(d))  # the base's weights replaced, the adapter's kept
    assert rebased["digest"] not in (first["digest"], retrained["digest"]) and rebased["adapter"] == retrained["adapter"]

    edit_json(d / "adapter_config.json", lambda c: c.update(base_model_name_or_path="Qwen/Qwen2.5-VL-3B-Instruct"))
    hub = weights_fingerprint(locate(d))
    assert hub["base"] == {"source": "Qwen/Qwen2.5-VL-3B-Instruct", "digest": None} and "hub id" in hub["of"]
    assert hub["tensors"] == hub["adapter"]["tensors"] and hub["digest"] != rebased["digest"]
    other_hub = weights_fingerprint(locate(d), base="Qwen/Qwen2.5-VL-7B-Instruct")
    assert other_hub["digest"] != hub["digest"]  # the base's name counts
    edit_json(d / "adapter_config.json", lambda c: c.update(base_model_name_or_path="/gone/base"))
    gone = weights_fingerprint(locate(d))
    assert gone["base"]["digest"] is None and "not a local model directory" in gone["of"]


def _rename_keys(d, rename):
    from safetensors.torch import load_file, save_file

    state = load_file(str(d / "adapter_model.safetensors"))
    save_file({rename(k): v for k, v in state.items()}, str(d / "adapter_model.safetensors"), metadata={"format": "pt"})


def test_an_adapter_saved_in_the_pre_4_52_layout_is_applied(lora, images, tmp_path):
    """Adapters trained on transformers < 4.52 (VLM-R1 pins 4.49) name ``model.layers.*`` / ``visual.*``: on 5.x
    peft finds no rename on the class, and the adapter's tensors were silently left out (the base's tokens)."""
    d = shutil.copytree(lora.model_dir, tmp_path / "old")
    _rename_keys(d, lambda k: k.replace("model.language_model.", "model.").replace("model.visual.", "visual."))
    some = images[:2]
    assert _tokens(load(str(d), device="cpu"), some) == _tokens(load(str(lora.model_dir), device="cpu"), some)


def test_an_adapter_whose_tensors_find_no_layer_is_an_error_not_the_base(lora, tmp_path):
    d = shutil.copytree(lora.model_dir, tmp_path / "nowhere")
    _rename_keys(d, lambda k: k.replace("layers.", "blocks."))
    with pytest.raises(CheckpointError, match="would not be applied"):
        load(str(d), device="cpu")


def test_an_adapter_fingerprint_covers_its_config(lora, tmp_path):
    from vlmfast.checkpoints.fingerprint import weights_fingerprint
    from vlmfast.checkpoints.locate import locate

    d = shutil.copytree(lora.model_dir, tmp_path / "adapter")
    before = weights_fingerprint(locate(d))["digest"]
    edit_json(d / "adapter_config.json", lambda c: c.update(lora_alpha=4 * c["lora_alpha"]))  # B·A at 4× the scale
    assert weights_fingerprint(locate(d))["digest"] != before


def test_merge_lora_keeps_the_adapter_dirs_own_chat_template(lora, tmp_path):
    from vlmfast.checkpoints.fix import merge_lora

    d = shutil.copytree(lora.model_dir, tmp_path / "adapter")
    for f in lora.base.iterdir():
        if f.name.startswith(("preprocessor", "processor", "tokenizer", "vocab", "merges", "chat_template")):
            shutil.copyfile(f, d / f.name)
    template = next(d.glob("chat_template.*"))
    template.write_text("{{- '<|im_start|>system\\nBe careful.<|im_end|>\\n' -}}\n" + template.read_text())
    merged = merge_lora(d, tmp_path / "merged").out_dir
    assert (merged / template.name).read_text() == template.read_text()
    assert load(str(merged), device="cpu").processor.chat_template == load(str(d), device="cpu").processor.chat_template


def test_a_sweep_base_other_than_the_adapters_base_is_said(lora, tmp_path):
    from vlmfast.checkpoints.tiny import build_checkpoint
    from vlmfast.run.sweep import _Entry
    from vlmfast.run.sweep_engine import base_notes

    other = build_checkpoint(tmp_path / "q2", family="qwen2_vl", like="base")
    said = base_notes([_Entry(0, other, "base"), _Entry(4, lora.model_dir, "lora")])
    assert any("not the base the run's LoRA adapters run on" in n for n in said)
    assert any("qwen2_vl model" in n for n in said)
    assert base_notes([_Entry(0, lora.base, "base"), _Entry(4, lora.model_dir, "lora")]) == []


def test_a_sweep_of_adapters_whose_named_base_is_elsewhere_runs_them_on_its_base(lora, images, tmp_path):
    """Trainers record the base's path on the training machine: every step was "not evaluated: its base does not
    exist here" with the hint to pass --base, which the sweep had been given. They now run on the sweep's --base,
    said once, with the same tokens as the adapter on that base given to infer."""
    import json

    from vlmfast.run.options import InferOptions
    from vlmfast.run.runner import infer
    from vlmfast.run.sweep import SweepOptions, sweep

    run = tmp_path / "run"
    for step in (1, 2):
        shutil.copytree(lora.model_dir, run / f"checkpoint-{step}")
        edit_json(run / f"checkpoint-{step}" / "adapter_config.json",
                  lambda c: c.update(base_model_name_or_path="/mnt/trainer/models/Qwen2.5-VL"))
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"id": f"q{i}", "image": str(p), "prompt": "Count.", "answer": "3"}) + "\n"
                                for i, p in enumerate(images[:2])))
    settings = dict(manifest=str(manifest), device="cpu")
    said = []
    report = sweep(SweepOptions(run_dir=str(run), out_dir=str(tmp_path / "s"), base=str(lora.base),
                                infer=InferOptions(ckpt=str(run), **settings)), say=said.append)
    assert [c["step"] for c in report["checkpoints"]] == [0, 1, 2] and report["not_evaluated"] == []
    assert any(s.endswith("checkpoint-1: loaded afresh (its LoRA adapter loads with the sweep's --base)") for s in said), said
    assert any(n.startswith("the run's LoRA adapters name /mnt/trainer/models/Qwen2.5-VL as their base") for n in report["notes"])
    alone = infer(InferOptions(ckpt=str(run / "checkpoint-1"), base=str(lora.base), out=str(tmp_path / "one.jsonl"), **settings))
    assert alone.samples == 2
    swept = (tmp_path / "s" / "step-1.jsonl").read_text().splitlines()
    assert [json.loads(r)["text"] for r in swept] == [json.loads(r)["text"] for r in (tmp_path / "one.jsonl").read_text().splitlines()]


def test_a_record_of_vlmfast_0_17_resumes_onto_the_same_adapter(lora, tmp_path):
    """0.17 fingerprinted an adapter without its adapter_config.json settings: its records are of the same weights,
    not 'weight files changed since' (infer refused the resume; a sweep evaluated every adapter step again)."""
    import hashlib
    import json

    from vlmfast.checkpoints.fingerprint import adapter_fingerprint
    from vlmfast.run.sweep_record import forget_if_changed, refuse_other_weights, sidecar

    now = adapter_fingerprint(lora.model_dir)
    h = hashlib.sha256(b"adapter\0" + now["adapter"]["digest"].encode() + b"\0base\0" + now["base"]["digest"].encode())
    then = f"{now['digest'].split(':')[0]}:{h.hexdigest()[:16]}"  # what 0.17's adapter_fingerprint recorded
    assert then != now["digest"]
    out = tmp_path / "out.jsonl"
    out.write_text(json.dumps({"id": "q0", "text": "x"}) + "\n")
    sidecar(out).write_text(json.dumps({"settings": {}, "fingerprint": then}))
    refuse_other_weights(out, now)  # no error
    assert forget_if_changed(out, now) is None and out.is_file()


def test_an_adapters_hub_base_the_hub_cannot_give_names_the_adapter_and_base(lora, images, tmp_path, monkeypatch):
    """adapter_config.json names a hub id, and the hub is unreachable (faked: model_info raises ConnectionError; and
    offline with an empty cache): infer, merge-lora and a sweep say it is the adapter's base and to pass --base."""
    import json

    from huggingface_hub import HfApi, constants

    from conftest import cli
    from vlmfast.checkpoints.fix import merge_lora

    run = tmp_path / "run"
    for step in (5, 10):
        d = shutil.copytree(lora.model_dir, run / f"checkpoint-{step}")
        edit_json(d / "adapter_config.json", lambda c: c.update(base_model_name_or_path="Qwen/Qwen2.5-VL-3B-Instruct"))

    def unreachable(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(HfApi, "model_info", unreachable)
    said = f"{d}: its base 'Qwen/Qwen2.5-VL-3B-Instruct' (from adapter_config.json): no such directory"
    with pytest.raises(CheckpointError) as err:
        load(str(d), device="cpu")
    assert err.value.message.startswith(said) and "cannot be reached (ConnectionError)" in err.value.message
    assert "--base LOCAL_DIR" in err.value.hint
    with pytest.raises(CheckpointError) as err:
        merge_lora(d, tmp_path / "merged")
    assert err.value.message.startswith(said) and "--processor-from LOCAL_DIR" in err.value.hint
    with pytest.raises(CheckpointError, match="--base bigger: no such directory"):  # --base given: its own words
        load(str(d), base="bigger", device="cpu")

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"id": "a", "image": str(images[0]), "prompt": "hi", "solution": "1"}) + "\n")
    result = cli("sweep", run, "--manifest", manifest, "--out-dir", tmp_path / "sw", "--max-new-tokens", "2", "--json")
    error = json.loads(result.stdout)["error"]
    assert result.returncode == 2 and "--base LOCAL_DIR" in error["hint"]
    assert [p.split(": its base")[0] for p in error["problems"]] == [f"step 5: {run / 'checkpoint-5'}",
                                                                      f"step 10: {run / 'checkpoint-10'}"]
    assert all("not in the local Hugging Face cache (HF_HUB_OFFLINE is set)" in p for p in error["problems"])
