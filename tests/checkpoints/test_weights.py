"""Whole weights: checkpoints made damaged here (tensors dropped by prefix, an untied head lost, a shape
changed) are named by doctor and refused by infer (exit 2, nothing written); intact ones of every family,
tied heads included, raise nothing; the expected tensors are cached so a second look imports no torch."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import cli
from vlmfast.checkpoints.families import BY_KEY

FAMILIES = list(BY_KEY)


def _has_class(key: str) -> bool:
    import transformers

    return hasattr(transformers, BY_KEY[key].model_class)


ON_THIS_LINE = [pytest.param(k, marks=pytest.mark.skipif(not _has_class(k), reason="not in this transformers"))
                for k in FAMILIES]


def damaged(src, dst, drop=(), shrink=(), config=None):
    """A copy of ``src`` whose safetensors file lacks the tensors whose names contain a ``drop`` string,
    with the ``shrink`` tensors one row shorter, and ``config`` applied to its config.json."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    tensors = {k: v for k, v in tensors.items() if not any(p in k for p in drop)}
    for name in shrink:
        tensors[name] = tensors[name][:-1].clone()
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    if config is not None:
        data = json.loads((dst / "config.json").read_text())
        config(data)
        (dst / "config.json").write_text(json.dumps(data))
    return dst


def tie(config):
    config["tie_word_embeddings"] = True
    config.get("text_config", {})["tie_word_embeddings"] = True


def _codes(ckpt, base=None):
    from vlmfast.checkpoints.doctor import diagnose

    return {f.code: f for f in diagnose(ckpt, base=base) if f.code.startswith("weights-")}


@pytest.mark.parametrize("key", ON_THIS_LINE)
def test_every_family_damaged_is_named_and_intact_raises_nothing(key, family_ckpts, tmp_path):
    ckpt = family_ckpts(key)
    assert _codes(ckpt) == {}  # intact, untied head saved
    assert _codes(damaged(ckpt, tmp_path / "tied", drop=("lm_head",), config=tie)) == {}  # tied: no head saved
    assert _codes(damaged(ckpt, tmp_path / "tied-saved", config=tie)) == {}  # tied, head saved anyway
    from vlmfast.checkpoints.doctor import diagnose  # ... and its own values: the config and weights disagree

    assert [f.severity for f in diagnose(tmp_path / "tied-saved") if f.code == "tied-head-saved"] == ["error"]

    lost = _codes(damaged(ckpt, tmp_path / "novis", drop=("visual.blocks.1.",)))
    assert set(lost) == {"weights-lost"} and lost["weights-lost"].severity == "error"
    assert "visual.blocks.1.*: 12 missing" in lost["weights-lost"].message
    assert "--allow-missing" in lost["weights-lost"].fix

    head = _codes(damaged(ckpt, tmp_path / "nohead", drop=("lm_head",)))["weights-lost"]
    assert "lm_head.weight: 1 missing" in head.message and "tie_word_embeddings is false" in head.message

    from vlmfast.checkpoints.readers import tensor_index

    norm = next(n for n in tensor_index(ckpt) if n.endswith("layers.0.input_layernorm.weight"))
    shape = _codes(damaged(ckpt, tmp_path / "shape", shrink=(norm,)))
    assert set(shape) == {"weights-shape-mismatch"} and f"{norm}: [63] saved, [64] expected" in shape[
        "weights-shape-mismatch"].message


def test_a_lost_layer_is_one_group_in_the_save_s_own_names(grpo_ckpt, tmp_path):
    lost = _codes(damaged(grpo_ckpt, tmp_path / "nolayer", drop=("model.layers.1.",)))["weights-lost"]
    assert "model.layers.1.*: 12 missing" in lost.message  # Qwen2.5-VL saves model.layers.*, its class names them otherwise


def test_doctor_with_base_names_what_the_base_has_and_the_save_lost(grpo_ckpt, base_ckpt, tmp_path):
    found = _codes(damaged(grpo_ckpt, tmp_path / "novis", drop=("visual.blocks.1.",)), base=base_ckpt)
    assert "visual.blocks.1.*: 12 in the base, not here" in found["weights-differ-from-base"].message
    assert "weights-differ-from-base" not in _codes(grpo_ckpt, base=base_ckpt)


def test_infer_refuses_with_exit_2_and_writes_nothing_unless_the_prefixes_are_allowed(grpo_ckpt, images, tmp_path):
    ckpt = damaged(grpo_ckpt, tmp_path / "novis", drop=("visual.blocks.1.",))
    out = tmp_path / "rows.jsonl"
    args = ("infer", "--ckpt", ckpt, "--images", images[0], "--prompt", "Count.", "--max-new-tokens", "3",
            "--device", "cpu", "--out", out)
    r = cli(*args)
    assert r.returncode == 2 and not out.exists()
    assert "error:" in r.stderr and "visual.blocks.1.*: 12 missing" in r.stderr and "hint:" in r.stderr
    r = cli(*args, "--allow-missing", "visual.blocks.1")
    assert r.returncode == 0 and len(out.read_text().splitlines()) == 1
    assert "tensors missing as --allow-missing allows (visual.blocks.1.*: 12)" in r.stderr
    r = cli(*args, "--allow-missing", "visual.blocks.0", "--overwrite")  # another prefix does not cover them
    assert r.returncode == 2
    out.unlink()
    r = cli("infer", "--ckpt", ckpt, "--images", images[0], "--prompt", "Count.", "--engine", "vllm", "--out", out)
    assert r.returncode == 2 and not out.exists()  # the vLLM path: refused before its engine starts
    assert "visual.blocks.1.*: 12 missing" in r.stderr


def test_the_expected_tensors_are_cached_and_a_second_look_imports_no_torch(grpo_ckpt, tmp_path, monkeypatch):
    import vlmfast.checkpoints.expected as expected
    from vlmfast.checkpoints.readers import read_json_object

    env = {**os.environ, "VLMFAST_CACHE": str(tmp_path / "cache")}
    code = ("import sys; from vlmfast.checkpoints.doctor import diagnose; "
            f"found = [f.code for f in diagnose({str(grpo_ckpt)!r}) if f.code.startswith('weights-')]; "
            "print(found, 'torch' in sys.modules)")
    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    second = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert first.stdout.split() == ["[]", "True"] and second.stdout.split() == ["[]", "False"]
    assert len(list((tmp_path / "cache" / "expected-tensors").glob("*.json"))) == 1
    monkeypatch.setenv("VLMFAST_CACHE", str(tmp_path / "other"))
    config = read_json_object(grpo_ckpt / "config.json")
    apart = expected.expected_tensors(grpo_ckpt, config, apart=True)  # infer's way: in a child process
    assert apart == expected.expected_tensors(grpo_ckpt, config) and len(apart.tensors) > 50
    monkeypatch.setattr(expected, "_build_expected", lambda *a: pytest.fail("built again"))
    assert expected.expected_tensors(grpo_ckpt, config, apart=True) == apart  # cached


def test_an_intact_3b_shape_index_raises_nothing_from_headers_alone(grpo_ckpt, tmp_path):
    """The published Qwen2.5-VL-3B shapes (tied head, two shards and their index), written as headers over
    sparse files: the check reads headers only, so this costs no disk and no memory."""
    from vlmfast.checkpoints.tiny import PRESETS
    from vlmfast.checkpoints.expected import expected_tensors

    d = tmp_path / "q3b"
    shutil.copytree(grpo_ckpt, d)
    (d / "model.safetensors").unlink()
    config = json.loads((d / "config.json").read_text())
    spec = PRESETS["3b"]
    text = {k: v for k, v in spec["text"].items() if k != "mrope_section"}
    config["text_config"].update(text, vocab_size=spec["vocab_size"], tie_word_embeddings=True, max_window_layers=36)
    config["text_config"].pop("layer_types", None)
    config["text_config"]["rope_scaling"] = {"type": "mrope", "mrope_section": spec["text"]["mrope_section"]}
    config.update({k: v for k, v in text.items() if k in config}, tie_word_embeddings=True)
    config["vision_config"].update(spec["vision"], out_hidden_size=text["hidden_size"])
    (d / "config.json").write_text(json.dumps(config))
    expected = expected_tensors(d, config)
    assert expected.tied_head and len(expected.tensors) > 800
    # saved as Qwen2.5-VL checkpoints name them (model.*, visual.*), the tied head not saved
    saved = {n.replace("model.language_model.", "model.").replace("model.visual.", "visual."): shape
             for n, shape in expected.tensors.values() if n != "lm_head.weight"}
    _header_only_shards(d, saved)
    from vlmfast.checkpoints.readers import weights_complete

    assert weights_complete(d) and _codes(d) == {}


def _header_only_shards(d, tensors: dict):
    items = sorted(tensors.items())
    weight_map = {}
    for i, part in enumerate((items[: len(items) // 2], items[len(items) // 2:])):
        name, header, offset = f"model-0000{i + 1}-of-00002.safetensors", {}, 0
        for tensor, shape in part:
            size = 2
            for dim in shape:
                size *= dim
            header[tensor] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
            offset += size
            weight_map[tensor] = name
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        with open(d / name, "wb") as f:
            f.write(len(raw).to_bytes(8, "little"))
            f.write(raw)
            f.truncate(8 + len(raw) + offset)  # sparse: the full length, no data written
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def test_grouping_per_expert_saves_and_ignored_names():
    from vlmfast.checkpoints.expected import Expected
    from vlmfast.checkpoints.weights import compare

    want = {"layers.0.mlp.experts.gate_up_proj": ("model.language_model.layers.0.mlp.experts.gate_up_proj", (4, 64, 32)),
            "layers.0.mlp.experts.down_proj": ("model.language_model.layers.0.mlp.experts.down_proj", (4, 32, 16)),
            "embed_tokens.weight": ("model.language_model.embed_tokens.weight", (10, 8)),
            "lm_head.weight": ("lm_head.weight", (10, 8))}
    expected = Expected(want, tied_head=False, head="lm_head.weight", ignore_unexpected=(r"^mtp\.",))
    per_expert = {f"model.language_model.layers.0.mlp.experts.{e}.{p}.weight": ("BF16", [16, 8], 0)
                  for e in range(4) for p in ("gate_proj", "up_proj", "down_proj")}
    saved = {**per_expert, "model.language_model.embed_tokens.weight": ("BF16", [10, 8], 0),
             "lm_head.weight": ("BF16", [10, 8], 0), "mtp.fc.weight": ("BF16", [8, 8], 0)}
    check = compare(expected, saved)
    assert check.whole and not check.unexpected  # per-expert tensors fuse on load; mtp.* is the class's to drop
    transposed = {**saved, "model.language_model.layers.0.mlp.experts.gate_up_proj": ("BF16", [4, 32, 64], 0)}
    transposed = {k: v for k, v in transposed.items() if ".experts.0." not in k and ".experts.1." not in k
                  and ".experts.2." not in k and ".experts.3." not in k}
    check = compare(expected, transposed)
    assert not check.mismatched and [g.label for g in check.missing] == ["model.language_model.layers.0.mlp.experts.down_proj"]
    lost = compare(expected, {"model.language_model.embed_tokens.weight": ("BF16", [10, 8], 0), **per_expert})
    assert lost.head_lost and lost.summary() == "lm_head.weight: 1 missing"
    allowed = compare(expected, {"model.language_model.embed_tokens.weight": ("BF16", [10, 8], 0), **per_expert},
                      allow_missing=("lm_head.*",))
    assert allowed.whole and [g.as_dict() for g in allowed.allowed] == [{"prefix": "lm_head.weight", "count": 1}]


# -- fingerprints ---------------------------------------------------------------------------------
def test_fingerprints_differ_between_checkpoints_and_are_equal_across_reruns(grpo_ckpt, base_ckpt, tmp_path):
    from vlmfast.checkpoints.fingerprint import fingerprint
    from vlmfast.checkpoints.tiny import build_checkpoint

    other, third = build_checkpoint(tmp_path / "seed1", seed=1), build_checkpoint(tmp_path / "seed2", seed=2)
    copy = shutil.copytree(grpo_ckpt, tmp_path / "copy")
    sampled = {p: fingerprint(p)["digest"] for p in (grpo_ckpt, other, third)}
    assert len(set(sampled.values())) == 3 and all(d.startswith("sampled:") for d in sampled.values())
    assert fingerprint(base_ckpt) == fingerprint(grpo_ckpt)  # other configs, the same weights (seed 0)
    assert fingerprint(copy) == fingerprint(grpo_ckpt)  # the same bytes elsewhere: the same weights
    full = fingerprint(grpo_ckpt, full=True)
    assert full["digest"].startswith("full:") and full["digest"] != fingerprint(other, full=True)["digest"]
    assert full["tensors"] == fingerprint(grpo_ckpt)["tensors"] > 0


def test_infer_reports_the_fingerprint_of_the_weights_it_ran(grpo_ckpt, images, tmp_path):
    from vlmfast.checkpoints.fingerprint import fingerprint

    r = cli("infer", "--ckpt", grpo_ckpt, "--images", images[0], "--prompt", "Count.", "--max-new-tokens", "2",
            "--device", "cpu", "--out", tmp_path / "rows.jsonl", "--json")
    assert r.returncode == 0
    report = json.loads(r.stdout)
    assert report["fingerprint"] == fingerprint(grpo_ckpt) and report["fingerprint"]["digest"] in r.stderr


def test_a_swap_that_did_not_land_is_caught_before_any_row(grpo_ckpt, tmp_path, monkeypatch):
    """The in-place copy made to fail on purpose (nothing copied): the read-back check names the tensor."""
    from vlmfast.checkpoints.load import load
    from vlmfast.checkpoints.locate import locate
    from vlmfast.checkpoints.swap import StaleSwap, plan_swap, swap_into
    from vlmfast.checkpoints.tiny import build_checkpoint

    loaded = load(str(grpo_ckpt), device="cpu")
    other = locate(build_checkpoint(tmp_path / "seed1", seed=1))
    plan = plan_swap(loaded, other.path)
    assert plan.files is not None
    swapped = swap_into(loaded, other, plan)  # the real copy passes the check
    import safetensors

    real = safetensors.safe_open

    class Stale:  # every tensor read for the copy comes back as what the model holds already
        def __init__(self, path, framework, device):
            self.inner = real(path, framework=framework, device=device)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def get_tensor(self, name):
            from vlmfast.checkpoints.swap import normal_name

            state = swapped.model.state_dict()
            homes = {normal_name(n): n for n in state}
            return state[homes[normal_name(name)]].clone() if Stale.during_copy else self.inner.get_tensor(name)

    Stale.during_copy = True
    monkeypatch.setattr(safetensors, "safe_open", Stale)
    import vlmfast.checkpoints.fingerprint as fp

    original = fp.readback_mismatch

    def checked(*args, **kw):
        Stale.during_copy = False  # the read-back reads the files as they are
        return original(*args, **kw)

    monkeypatch.setattr(fp, "readback_mismatch", checked)
    with pytest.raises(StaleSwap) as caught:
        swap_into(swapped, locate(grpo_ckpt), plan_swap(swapped, grpo_ckpt))
    assert "holds other values than" in caught.value.message and caught.value.hint


def test_tensors_the_loader_converts_are_whole_as_saved(tmp_path):
    """transformers 5 saves Qwen4-Exp's n-gram embedding as shards and concatenates them on load (its
    checkpoint conversion mapping): the class's ``ngram_embedding.weight`` is in the save, not missing, and
    the shards are not unexpected. The check asks transformers' own renaming, as the loader does."""
    import torch
    import transformers

    from vlmfast.checkpoints.readers import tensor_index
    from vlmfast.checkpoints.weights import check_weights

    if not hasattr(transformers, "Qwen4ExpForConditionalGeneration"):
        pytest.skip("this transformers has no Qwen4-Exp (added in the 5.x line)")
    text = dict(eos_token_id=2, hidden_size=64, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                head_dim=32, vocab_size=256, linear_key_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                linear_value_head_dim=16, moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=4,
                num_experts_per_tok=2, hc_count=2, hc_lowrank=8, ple_layer_ids=[2], ple_embed_dim=64,
                ngram_vocab_size_base=1000, heads_per_ngram=2, split_ngram_parts=4, make_ngram_vocab_size_divisible_by=8,
                indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=32, indexer_budget=64, indexer_compress_ratio=4,
                rope_parameters={"mrope_interleaved": True, "mrope_section": [2, 1, 1], "partial_rotary_factor": 0.25,
                                 "rope_theta": 1e7, "rope_type": "default"})
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, num_position_embeddings=64,
                  out_hidden_size=64, patch_size=16)
    config = transformers.Qwen4ExpConfig(text_config=text, vision_config=vision, tie_word_embeddings=False)
    torch.manual_seed(0)
    transformers.Qwen4ExpForConditionalGeneration(config).save_pretrained(tmp_path)
    index = tensor_index(tmp_path)
    shards = [n for n in index if ".ngram_embedding.shard_" in n]
    assert len(shards) == 4 and not any(n.endswith(".ngram_embedding.weight") for n in index)  # saved as shards
    config = json.loads((tmp_path / "config.json").read_text())
    check = check_weights(tmp_path, config, index)
    assert check is not None and check.whole and not check.unexpected, check.summary() or check.unexpected
    lost = check_weights(tmp_path, config, {n: meta for n, meta in index.items() if n != shards[1]})  # a shard lost
    (name, saved, expected), = lost.mismatched  # the loader would refuse the size, as it says it: rows short
    assert not lost.whole and name.endswith("ngram_embedding.weight") and saved == [expected[0] * 3 // 4, *expected[1:]]


def test_a_lost_expert_of_a_per_expert_save_is_not_whole(family_ckpts):
    """Per-expert MoE saves are fused on load (transformers 5): one expert's tensors lost, or of another size,
    leave the fused tensor short, which the loader refuses."""
    import transformers

    from vlmfast.checkpoints.readers import read_json_object, tensor_index
    from vlmfast.checkpoints.weights import check_weights

    if not hasattr(transformers, "Qwen3_5MoeForConditionalGeneration"):
        pytest.skip("this transformers has no Qwen3.5-MoE (5.x only)")
    ckpt = family_ckpts("qwen3_5_moe")
    index, config = tensor_index(ckpt), read_json_object(ckpt / "config.json")
    experts = [n for n in index if ".experts.1." in n and ".layers.0." in n]
    assert experts and check_weights(ckpt, config, index).whole  # saved one tensor per expert, as trainers do
    lost = check_weights(ckpt, config, {n: m for n, m in index.items() if n != experts[0]})
    assert not lost.whole and any(".layers.0.mlp.experts." in n for n, _, _ in lost.mismatched), lost.summary()
    dtype, shape, size = index[experts[0]]
    shrunk = check_weights(ckpt, config, {**index, experts[0]: (dtype, [shape[0] - 1, *shape[1:]], size)})
    assert not shrunk.whole, shrunk.summary()
