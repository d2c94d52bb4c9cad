"""vlmfast.checkpoints.doctor: each finding fires on a checkpoint that has the problem, and never on a clean base."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import edit_json
from vlmfast.checkpoints.doctor import CODES, diagnose, findings_as_dicts, strict_exit_code
from vlmfast.errors import CheckpointError


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _rewrite_weights(d: Path, fn) -> None:
    from safetensors.torch import load_file, save_file

    state = load_file(str(d / "model.safetensors"))
    fn(state)
    save_file(state, str(d / "model.safetensors"), metadata={"format": "pt"})


def _image_processor_json(d: Path) -> tuple[Path, callable]:
    """Where this transformers version keeps image_processor_type (4.x: preprocessor_config.json,
    5.x: nested in processor_config.json), and a setter."""
    if (d / "preprocessor_config.json").is_file():
        return d / "preprocessor_config.json", lambda c, v: c.update(image_processor_type=v)
    return d / "processor_config.json", lambda c, v: c["image_processor"].update(image_processor_type=v)


# Each case: (build the problem in tmp from the clean fixtures) -> (ckpt, diagnose kwargs),
# then the expected (severity, location) of every finding with that code.
def _cache_off(ctx):
    return ctx.grpo, {}


def _eos_missing(ctx):
    return ctx.layouts["easyr1"].root, {}


def _eos_differs(ctx):
    d = _copy(ctx.base, ctx.tmp / "c")
    ids = json.loads((d / "generation_config.json").read_text())["eos_token_id"]
    edit_json(d / "generation_config.json", lambda c: c.update(eos_token_id=[ids[0]]))  # <|im_end|> kept, <|endoftext|> gone
    return d, {"base": ctx.base}


def _eos_short(ctx):
    d, _ = _eos_differs(ctx)  # <|endoftext|> gone, and no base to compare with: the family's list says it
    return d, {}


def _delete(*names):
    def make(ctx):
        d = _copy(ctx.base, ctx.tmp / "c")
        for name in names:
            (d / name).unlink(missing_ok=True)
        return d, {}
    return make


def _no_template(ctx):
    d, _ = _delete("chat_template.jinja", "chat_template.json")(ctx)
    for name in ("tokenizer_config.json", "processor_config.json", "preprocessor_config.json"):
        if (d / name).exists():
            edit_json(d / name, lambda c: c.pop("chat_template", None))
    return d, {}


def _unknown_class(ctx):
    d = _copy(ctx.base, ctx.tmp / "c")
    path, set_type = _image_processor_json(d)
    edit_json(path, lambda c: set_type(c, "Qwen2_5_VLImageProcessor"))  # a name transformers never had
    edit_json(d / "tokenizer_config.json", lambda c: c.update(tokenizer_class="Qwen2TokenizerV0"))
    return d, {}


def _float32(ctx):
    return ctx.base, {"float32_min_bytes": 0}


def _float32_vs_bf16_base(ctx):
    import torch

    half = _copy(ctx.base, ctx.tmp / "bf16")
    _rewrite_weights(half, lambda s: s.update({k: v.to(torch.bfloat16) for k, v in s.items()}))
    return ctx.base, {"base": half}


def _pickle(ctx):
    import torch
    from safetensors.torch import load_file

    d = _copy(ctx.base, ctx.tmp / "c")
    torch.save(load_file(str(d / "model.safetensors")), d / "pytorch_model.bin")
    (d / "model.safetensors").unlink()
    return d, {}


def _auto_map(ctx):
    d = _copy(ctx.base, ctx.tmp / "c")
    edit_json(d / "config.json", lambda c: c.update(auto_map={"AutoModel": "modeling_evil.EvilModel"}))
    (d / "modeling_evil.py").write_text("import os\n")
    return d, {}


def _vocab_mismatch(ctx):
    d = _copy(ctx.base, ctx.tmp / "c")
    edit_json(d / "config.json", lambda c: c["text_config"].update(vocab_size=c["text_config"]["vocab_size"] + 8))
    return d, {}


def _vocab_differs(ctx):
    import torch

    d = _copy(ctx.base, ctx.tmp / "c")  # two tokens added during training, consistently
    _rewrite_weights(d, lambda s: s.update({k: torch.cat([s[k], torch.zeros(2, s[k].shape[1])])
                                            for k in ("model.embed_tokens.weight", "lm_head.weight")}))
    edit_json(d / "config.json", lambda c: c["text_config"].update(vocab_size=c["text_config"]["vocab_size"] + 2))
    return d, {"base": ctx.base}


def _tied(ctx):
    d = _copy(ctx.base, ctx.tmp / "c")  # saved tied: no lm_head tensor, tie_word_embeddings true
    _rewrite_weights(d, lambda s: s.pop("lm_head.weight"))
    edit_json(d / "config.json", lambda c: (c.update(tie_word_embeddings=True), c["text_config"].update(tie_word_embeddings=True)))
    return d, {"base": ctx.base}


def _lost(*prefixes):
    def make(ctx):
        d = _copy(ctx.base, ctx.tmp / "c")
        _rewrite_weights(d, lambda s: [s.pop(k) for k in list(s) if k.startswith(prefixes)])
        return d, {"base": ctx.base}
    return make


def _shrunk(ctx):
    d = _copy(ctx.base, ctx.tmp / "c")
    _rewrite_weights(d, lambda s: s.update({"model.norm.weight": s["model.norm.weight"][:-1].clone()}))
    return d, {}


def _unexpected(ctx):
    import torch

    d = _copy(ctx.base, ctx.tmp / "c")
    _rewrite_weights(d, lambda s: s.update({"extra_head.weight": torch.zeros(2, 2)}))
    return d, {}


def _lora_base_missing(ctx):
    d = _copy(ctx.layouts["swift-lora"].model_dir, ctx.tmp / "adapter")
    edit_json(d / "adapter_config.json", lambda c: c.update(base_model_name_or_path="/nowhere/Qwen2.5-VL-3B-Instruct"))
    return d, {}


def _other_family_processor(ctx):
    d = _copy(ctx.base, ctx.tmp / "c")  # a Qwen2.5-VL save holding Qwen3-VL's processor files
    for name in ("preprocessor_config.json", "processor_config.json"):
        if (d / name).is_file():
            edit_json(d / name, lambda c: (c.update(processor_class="Qwen3VLProcessor"),
                                           (c.get("image_processor") or c).update(patch_size=16)))
    return d, {}


def _other_family_config(ctx):
    from vlmfast.checkpoints.tiny import build_checkpoint

    d = _copy(ctx.base, ctx.tmp / "c")  # Qwen2.5-VL weights under a Qwen2-VL config.json
    shutil.copy(build_checkpoint(ctx.tmp / "qwen2_vl", family="qwen2_vl") / "config.json", d / "config.json")
    return d, {}


def _untested_family(ctx):
    d = _copy(ctx.base, ctx.tmp / "c")  # doctor reads files only: the model type alone decides
    edit_json(d / "config.json", lambda c: c.update(model_type="glm4v"))
    return d, {}


def _unreadable(ctx):
    d = _copy(ctx.base, ctx.tmp / "c")
    (d / "model.safetensors").write_bytes(b"\xff" * 16)
    return d, {}


def _truncated(ctx):
    d = _copy(ctx.base, ctx.tmp / "t")
    weights = d / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # header intact, data cut short
    return d, {}


def _saved_by_v5(ctx):
    """tokenizer_config.json and config.json as transformers 5 writes them, diagnosed as on 4.57 (where it fires)."""
    from test_portable import as_saved_by_v5

    from vlmfast.checkpoints import doctor

    ctx.monkeypatch.setattr(doctor, "installed_transformers", lambda: (4, 57))
    return as_saved_by_v5(ctx.base, ctx.tmp / "v5"), {}


def _train_eval(ctx):
    d = _copy(ctx.base, ctx.tmp / "run" / "checkpoint-1")
    (d / "args.json").write_text(json.dumps({"rlhf_type": "grpo", "temperature": 0.9}))  # ms-swift's key
    return d, {"evaluation": {"temperature": (0.0, "--temperature (default)")}}


def _two_sets(ctx):
    from test_weight_sets import _stale

    return _stale(ctx.base, ctx.tmp / "stale"), {}


def _tied_head_saved(ctx):
    from test_tied_head import _tied

    return _tied(ctx.base, ctx.tmp / "tied"), {}


def _generation(**values):
    def make(ctx):
        d = _copy(ctx.base, ctx.tmp / "c")
        edit_json(d / "generation_config.json", lambda c: c.update(values))
        return d, {}
    return make


CASES = {
    "sampling-temperature-zero": (_generation(do_sample=True, temperature=0), [("error", "generation_config.json: temperature")]),
    "max-length-short": (_generation(max_length=20), None),  # the severity follows the installed generate: below
    "generation-value-refused": (_generation(num_beams=0), [("error", "generation_config.json: num_beams")]),
    "generation-value-misread": (_generation(do_sample="false"), [("warning", "generation_config.json: do_sample")]),
    "train-eval-differs": (_train_eval, [("warning", "args.json")]),
    "cache-off": (_cache_off, [("error", "generation_config.json: use_cache"), ("warning", "config.json: use_cache"),
                               ("warning", "config.json: text_config.use_cache")]),
    "eos-missing-im-end": (_eos_missing, [("error", "generation_config.json: eos_token_id")]),
    "eos-differs-from-base": (_eos_differs, [("warning", "generation_config.json: eos_token_id")]),
    "eos-short-of-family": (_eos_short, [("warning", "generation_config.json: eos_token_id")]),
    "processor-missing": (_delete("preprocessor_config.json", "processor_config.json"), [("error", "preprocessor_config.json")]),
    "tokenizer-missing": (_delete("tokenizer.json", "vocab.json", "merges.txt"), [("error", "tokenizer.json (or vocab.json + merges.txt)")]),
    "chat-template-missing": (_no_template, [("warning", "chat_template.jinja")]),
    "unknown-class": (_unknown_class, None),  # locations differ by version: checked below
    "float32-weights": (_float32, [("warning", "*.safetensors")]),
    "float32-weights-vs-base": (_float32_vs_bf16_base, [("warning", "*.safetensors")]),
    "fsdp-unmerged": (_eos_missing, None),
    "weights-missing": (_delete("model.safetensors"), None),
    "pickle-weights": (_pickle, [("warning", "pytorch_model.bin")]),
    "weights-unreadable": (_unreadable, None),
    "weights-incomplete": (_truncated, None),
    "remote-code": (_auto_map, [("warning", "config.json: auto_map")]),
    "vocab-mismatch": (_vocab_mismatch, [("error", "config.json: vocab_size")]),
    "vocab-differs-from-base": (_vocab_differs, [("warning", "config.json: vocab_size")]),
    "weights-lost": (_lost("visual.blocks.1."), [("error", "*.safetensors")]),
    "weights-shape-mismatch": (_shrunk, [("error", "*.safetensors")]),
    "weights-unexpected": (_unexpected, [("warning", "*.safetensors")]),
    "weights-differ-from-base": (_lost("visual.blocks.1."), [("warning", "*.safetensors")]),
    "tie-embeddings-differs-from-base": (_tied, [("warning", "config.json: tie_word_embeddings")]),
    "lora-adapter": (lambda ctx: (ctx.layouts["swift-lora"].root, {}), None),
    "lora-base-missing": (_lora_base_missing, [("error", "adapter/adapter_config.json: base_model_name_or_path")]),
    "trainer-state": (lambda ctx: (ctx.layouts["vlmr1"].root, {}), [("info", "trainer_state.json")]),
    "swift-args": (lambda ctx: (ctx.layouts["swift"].root, {}), [("info", "args.json")]),
    "resolved": (lambda ctx: (ctx.layouts["vlmr1"].root, {}), None),
    "processor-family-mismatch": (_other_family_processor, None),  # file names differ by version: checked below
    "untested-family": (_untested_family, [("info", "config.json: model_type")]),
    "config-family-mismatch": (_other_family_config, [("error", "config.json: model_type")]),
    "saved-by-transformers-5": (_saved_by_v5, [("warning", "tokenizer_config.json, config.json")]),
    "weights-two-sets": (_two_sets, [("error", "model.safetensors, model.safetensors.index.json")]),
    "tied-head-saved": (_tied_head_saved, [("error", "config.json: tie_word_embeddings, "
                                                     "config.json: text_config.tie_word_embeddings")]),
}


class _Ctx:
    def __init__(self, base, grpo, layouts, tmp, monkeypatch=None):
        self.base, self.grpo, self.layouts, self.tmp, self.monkeypatch = base, grpo, layouts, tmp, monkeypatch


def test_every_code_has_a_case():
    assert {case.removesuffix("-vs-base") for case in CASES} == set(CODES)


@pytest.mark.parametrize("case", sorted(CASES))
def test_finding_fires_on_its_fixture(case, base_ckpt, grpo_ckpt, layouts, tmp_path, monkeypatch):
    make, expected = CASES[case]
    code = case.removesuffix("-vs-base")
    ckpt, kwargs = make(_Ctx(base_ckpt, grpo_ckpt, layouts, tmp_path, monkeypatch))
    found = [f for f in diagnose(ckpt, **kwargs) if f.code == code]
    assert found, f"{code} did not fire"
    if expected is not None:
        assert [(f.severity, f.location) for f in found] == expected
    for f in found:
        assert f.message and (f.fix or f.severity == "info")


def test_a_generation_config_without_eos_is_what_generate_stops_on(base_ckpt, tmp_path):
    """generate reads generation_config.json alone when it is there (no EOS of config.json is merged in): one
    without eos_token_id stops on nothing; doctor said config.json's list, a warning at the wrong place."""
    d = _copy(base_ckpt, tmp_path / "c")
    edit_json(d / "generation_config.json", lambda c: c.pop("eos_token_id"))
    found = [f for f in diagnose(d) if f.code.startswith("eos-")]
    assert [(f.severity, f.code, f.location) for f in found] == [("error", "eos-missing-im-end", "generation_config.json: eos_token_id")]
    assert found[0].message.startswith("EOS list [] lacks <|im_end|>")


@pytest.mark.parametrize("temperature", [0, 0.0, -1])
def test_sampling_at_temperature_zero_is_an_error_and_greedy_or_positive_is_not(base_ckpt, tmp_path, temperature):
    """Plain generate builds its temperature warper only when sampling, and that raises at 0 or below (4.57.6 and
    5.24); greedy with temperature 0 (transformers warns only) and a positive temperature are no finding."""
    d, _ = _generation(do_sample=True, temperature=temperature)(_Ctx(base_ckpt, None, None, tmp_path))
    found = [f for f in diagnose(d) if f.code == "sampling-temperature-zero"]
    assert [(f.severity, f.location) for f in found] == [("error", "generation_config.json: temperature")]
    assert "raises ValueError" in found[0].message and found[0].fix.startswith(f"vlmfast fix {d}")
    for other in ({"do_sample": False, "temperature": 0}, {"do_sample": True, "temperature": 0.7},
                  {"temperature": 0}):
        edit_json(d / "generation_config.json", lambda c: (c.pop("do_sample", None), c.update(other)))
        assert "sampling-temperature-zero" not in {f.code for f in diagnose(d)}, other


@pytest.mark.parametrize("installed, values, expected", [
    ((5, 24), {"max_length": 20}, "error"),  # 5.x: 20 tokens in all, a longer prompt raises
    ((4, 57), {"max_length": 20}, "warning"),  # 4.57 takes its own default as none given: 20 new tokens
    ((4, 57), {"max_length": 512}, "error"),  # shorter than one image at vlmfast's default pixel cap (1280)
    ((5, 24), {"max_length": 2048}, "warning"),  # a prompt of one such image leaves 768 for the answer
    ((5, 24), {"max_length": 2048, "max_new_tokens": 1024}, None),  # max_new_tokens wins on both lines
    ((5, 24), {"max_length": 32768}, None),
])
def test_a_short_max_length_is_said_as_the_installed_generate_treats_it(base_ckpt, tmp_path, monkeypatch, installed,
                                                                        values, expected):
    from vlmfast.checkpoints import generation_values

    monkeypatch.setattr(generation_values, "installed_transformers", lambda: installed)
    d, _ = _generation(**values)(_Ctx(base_ckpt, None, None, tmp_path))
    found = [(f.severity, f.location) for f in diagnose(d) if f.code == "max-length-short"]
    assert found == ([(expected, "generation_config.json: max_length")] if expected else [])


def test_generation_value_findings_fail_doctor_strict(base_ckpt, tmp_path):
    from conftest import cli

    d, _ = _generation(do_sample=True, temperature=0.0, max_length=20)(_Ctx(base_ckpt, None, None, tmp_path))
    r = cli("doctor", d, "--json", "--strict")
    assert r.returncode == 1
    codes = {row["code"]: row for row in json.loads(r.stdout)["findings"]}
    assert {"sampling-temperature-zero", "max-length-short"} <= set(codes)
    assert codes["max-length-short"]["location"] == "generation_config.json: max_length"


def test_clean_base_has_no_findings(base_ckpt, layouts):
    assert diagnose(base_ckpt) == []
    assert diagnose(base_ckpt, base=base_ckpt) == []
    assert diagnose(layouts["base"].root, base=base_ckpt) == []
    assert strict_exit_code([]) == 0


def test_fixes_name_the_exact_command(grpo_ckpt, layouts, base_ckpt, tmp_path):
    cache = [f for f in diagnose(grpo_ckpt) if f.code == "cache-off"]
    assert all(f.fix == f"vlmfast fix {grpo_ckpt} (sets it to true)" for f in cache)
    findings = diagnose(layouts["easyr1"].root, base=base_ckpt)
    assert findings[0].code == "fsdp-unmerged"  # the merge first: the fixes after it edit the configs it writes
    easy = {f.code: f for f in findings}
    actor = layouts["easyr1"].actor
    assert f"python3 scripts/model_merger.py --local_dir {actor}" in easy["fsdp-unmerged"].fix
    assert str(actor / "huggingface") in easy["fsdp-unmerged"].fix
    assert easy["eos-missing-im-end"].fix.startswith(f"vlmfast fix {actor / 'huggingface'} --processor-from {base_ckpt}")
    assert "lacks <|im_end|>" in easy["eos-missing-im-end"].message
    unknown = diagnose(_unknown_class(_Ctx(base_ckpt, None, None, tmp_path))[0])
    fixes = {f.location.split(": ")[1]: f.fix for f in unknown if f.code == "unknown-class"}
    assert set(fixes) >= {"tokenizer_class"} and any("'Qwen2VLImageProcessor'" in fx for fx in fixes.values())
    lora = next(f for f in diagnose(layouts["swift-lora"].root) if f.code == "lora-adapter")
    assert f"--base {layouts['swift-lora'].base}" in lora.fix and "--merge-lora" in lora.fix
    moved = [f for f in diagnose(_lora_base_missing(_Ctx(base_ckpt, None, layouts, tmp_path))[0]) if f.code == "lora-adapter"]
    assert "--base BASE" in moved[0].fix and "/nowhere" not in moved[0].fix  # not the path it says is missing


def test_processor_of_another_family_names_both_places(base_ckpt, tmp_path):
    found = [f for f in diagnose(_other_family_processor(_Ctx(base_ckpt, None, None, tmp_path))[0])
             if f.code == "processor-family-mismatch"]
    by = {f.severity: f for f in found}  # errors come first
    assert len(found) == 2 and by["warning"].location.endswith(": processor_class")
    assert by["error"].location.split(": ")[1] in ("patch_size", "image_processor.patch_size")
    assert "Qwen3-VL's processor" in by["warning"].message and "16-pixel patches" in by["error"].message
    assert "takes 14" in by["error"].message


def test_float32_is_quiet_below_the_threshold_and_reports_sizes(base_ckpt):
    assert not [f for f in diagnose(base_ckpt) if f.code == "float32-weights"]
    (f,) = [f for f in diagnose(base_ckpt, float32_min_bytes=0) if f.code == "float32-weights"]
    size = (base_ckpt / "model.safetensors").stat().st_size
    assert f"{size / 2**20:.1f} MiB on disk" in f.message or f"{(size - 1) / 2**20:.1f} MiB" in f.message
    assert "in bfloat16" in f.message


def test_training_args_bin_is_not_pickle_weights(layouts):
    assert not [f for f in diagnose(layouts["vlmr1"].root) if f.code == "pickle-weights"]


def test_cache_off_in_config_json_is_an_error_without_generation_config(base_ckpt, tmp_path):
    d = _copy(base_ckpt, tmp_path / "c")
    (d / "generation_config.json").unlink()
    edit_json(d / "config.json", lambda c: (c.pop("use_cache", None), c["text_config"].update(use_cache=False)))
    assert [(f.severity, f.location) for f in diagnose(d) if f.code == "cache-off"] == [("error", "config.json: text_config.use_cache")]


def test_a_top_level_true_over_a_text_config_false_is_an_error_only_where_generate_recomputes(base_ckpt, tmp_path):
    """Without generation_config.json, 5.x's generate reads config.json's top-level true and keeps the cache;
    4.x's fills its default from text_config and recomputes (measured in test_cache_forced_on_wherever_it_hides)."""
    import transformers

    d = _copy(base_ckpt, tmp_path / "c")
    (d / "generation_config.json").unlink()
    edit_json(d / "config.json", lambda c: (c.update(use_cache=True), c["text_config"].update(use_cache=False)))
    found = [(f.severity, f.location) for f in diagnose(d) if f.code == "cache-off"]
    severity = "error" if transformers.__version__.startswith("4.") else "warning"
    assert found == [(severity, "config.json: text_config.use_cache")]


def test_strict_exit_code_and_dicts(grpo_ckpt, layouts):
    findings = diagnose(grpo_ckpt)
    assert strict_exit_code(findings) == 1
    assert strict_exit_code(diagnose(layouts["swift-lora"].root)) == 0  # warning + info only
    rows = json.loads(json.dumps(findings_as_dicts(findings)))
    assert rows[0] == {"severity": "error", "code": "cache-off", "location": "generation_config.json: use_cache",
                       "message": findings[0].message, "fix": findings[0].fix}
    assert [f.severity for f in findings] == sorted((f.severity for f in findings), key=["error", "warning", "info"].index)


def test_hub_ids_and_missing_paths_are_clear_errors(tmp_path):
    with pytest.raises(CheckpointError, match="reads local directories only") as err:
        diagnose("Qwen/Qwen2.5-VL-3B-Instruct")
    assert "huggingface-cli download" in err.value.hint
    with pytest.raises(CheckpointError, match="no such directory"):
        diagnose(tmp_path / "nope")


def test_truncated_weights_are_a_finding_and_a_run_falls_back_to_its_highest_complete_checkpoint(grpo_ckpt, tmp_path):
    """`head -c 300000` on the newest checkpoint's weights: doctor names it; infer on the run dir uses the
    highest complete checkpoint and says which it skipped and why."""
    import shutil

    from vlmfast.checkpoints.doctor import diagnose
    from vlmfast.checkpoints.locate import locate

    run = tmp_path / "run"
    for step in (100, 300):
        shutil.copytree(grpo_ckpt, run / f"checkpoint-{step}")
    weights = run / "checkpoint-300" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:300_000])
    codes = {f.code for f in diagnose(run / "checkpoint-300")}
    assert "weights-incomplete" in codes
    found = locate(run)
    assert found.path == run / "checkpoint-100" and "checkpoint-300 (weights incomplete" in found.note
    assert "weights-incomplete" not in {f.code for f in diagnose(run)}


def test_incomplete_weights_name_the_file_and_every_lost_group(base_ckpt, tmp_path):
    """A shard the index names and the disk lacks, a file cut short: doctor and the loader name the file; and the
    --allow-missing hint lists every group of lost tensors, so one rerun is enough."""
    from vlmfast.checkpoints.readers import incomplete_weights, require_loadable
    from vlmfast.checkpoints.weights import WeightsCheck, Group, fix_hint

    d = _copy(base_ckpt, tmp_path / "s")
    index = {"metadata": {}, "weight_map": {"a.weight": "model.safetensors", "b.weight": "model-00002-of-00002.safetensors"}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    assert incomplete_weights(d) == ["model-00002-of-00002.safetensors: missing (named by model.safetensors.index.json)"]
    (f,) = [f for f in diagnose(d) if f.code == "weights-incomplete"]
    assert "model-00002-of-00002.safetensors: missing" in f.message
    weights = d / "model.safetensors"
    size = weights.stat().st_size
    weights.write_bytes(weights.read_bytes()[: size // 2])
    with pytest.raises(CheckpointError) as err:
        require_loadable(d)
    assert f"model.safetensors: {size // 2:,} of the {size:,} bytes its header says" in str(err.value)
    lost = tuple(Group(f"model.layers.{i}", 9) for i in range(7))
    hint = fix_hint(WeightsCheck(expected=100, saved=37, tied_head=True, missing=lost, allowed=(), unexpected=(),
                                 mismatched=(), head_lost=False))
    assert all(f"--allow-missing model.layers.{i}" in hint for i in range(7))
