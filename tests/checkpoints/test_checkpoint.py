import shutil
import sys

import pytest

from conftest import edit_json, model_inputs
from vlmfast.checkpoints.load import choose_runtime, eos_list, load
from vlmfast.checkpoints.readers import cache_off_locations, read_configs, saved_cache_enabled
from vlmfast.errors import CheckpointError, UsageError

ALL_OFF = ["config.json: use_cache", "config.json: text_config.use_cache", "generation_config.json: use_cache"]


def test_cache_off_locations_pure():
    assert cache_off_locations({"use_cache": False, "text_config": {"use_cache": False}}, {"use_cache": False}) == ALL_OFF
    assert cache_off_locations({"text_config": {"use_cache": False}}, {}) == ["config.json: text_config.use_cache"]
    assert cache_off_locations({"use_cache": True}, None) == []


def test_saved_cache_enabled_follows_transformers_resolution():
    # generation_config.json decides when present; a missing key there means on
    assert saved_cache_enabled({"use_cache": False}, {}) is True
    assert saved_cache_enabled({"use_cache": True}, {"use_cache": False}) is False
    # no generation_config.json: 5.x reads the top level, then text_config; 4.x turns it off for a false in either
    for version in ("4.57.6", "5.24.0"):
        assert saved_cache_enabled({"use_cache": False, "text_config": {"use_cache": True}}, None, version) is False
        assert saved_cache_enabled({"text_config": {"use_cache": False}}, None, version) is False
        assert saved_cache_enabled({}, None, version) is True
    assert saved_cache_enabled({"use_cache": True, "text_config": {"use_cache": False}}, None, "5.24.0") is True
    assert saved_cache_enabled({"use_cache": True, "text_config": {"use_cache": False}}, None, "4.57.6") is False


def test_saved_cache_enabled_reads_the_version_without_importing_transformers():
    """readers (and doctor's config checks) import no transformers: a checkpoint without generation_config.json
    must not change that."""
    import subprocess
    import sys

    code = ("import sys\nfrom vlmfast.checkpoints.readers import saved_cache_enabled\n"
            "saved_cache_enabled({'use_cache': True, 'text_config': {'use_cache': False}}, None)\n"
            "print('transformers' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "False", r.stderr


def _copy(ckpt, tmp_path, name="c"):
    dst = tmp_path / name
    shutil.copytree(ckpt, dst)
    return dst


def test_tiny_grpo_checkpoint_hides_cache_off_everywhere(grpo_ckpt, base_ckpt):
    assert cache_off_locations(*read_configs(grpo_ckpt)) == ALL_OFF
    assert cache_off_locations(*read_configs(base_ckpt)) == []


def _decoder_lengths(model, run):
    """Sequence length of every language-model forward during ``run()``: with the KV cache each
    decode step feeds 1 position; without it, the whole sequence again."""
    lengths = []
    decoder = model.model.language_model

    def hook(module, args, kwargs):
        x = kwargs.get("inputs_embeds")
        if x is None:
            x = kwargs.get("input_ids", args[0] if args else None)
        lengths.append(x.shape[1])

    handle = decoder.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        run()
    finally:
        handle.remove()
    return lengths


@pytest.mark.parametrize("where", ["top", "text_config", "generation_config", "generation_config_missing",
                                   "no_generation_config_text_off", "no_generation_config_top_off",
                                   "no_generation_config_only_text_off"])
def test_cache_forced_on_wherever_it_hides(base_ckpt, images, tmp_path, where):
    import transformers
    from transformers import AutoModelForImageTextToText

    from vlmfast.engines.hf.engine import Engine, GenerationSettings
    from vlmfast.inputs.requests import Request

    ckpt = _copy(base_ckpt, tmp_path)
    if where == "top":
        edit_json(ckpt / "config.json", lambda c: c.update(use_cache=False))
    elif where == "text_config":
        edit_json(ckpt / "config.json", lambda c: c["text_config"].update(use_cache=False))
    elif where == "generation_config":
        edit_json(ckpt / "generation_config.json", lambda c: c.update(use_cache=False))
    else:  # no generation_config.json: transformers derives it from config.json
        (ckpt / "generation_config.json").unlink()
        top, text = {"generation_config_missing": (False, False), "no_generation_config_text_off": (True, False),
                     "no_generation_config_top_off": (False, True), "no_generation_config_only_text_off": (None, False)}[where]
        edit_json(ckpt / "config.json", lambda c: (c.update(use_cache=top) if top is not None else c.pop("use_cache", None),
                                                   c["text_config"].update(use_cache=text)))

    engine = Engine(load(str(ckpt), device="cpu"), GenerationSettings(max_new_tokens=6, ignore_eos=True))
    inputs = model_inputs(engine, [Request("a", (str(images[0]),), "Describe.")])
    # What plain generate does with the checkpoint as saved — and our model of it must agree:
    # generation_config.json decides when present (a top-level/text_config false alone is harmless).
    plain = AutoModelForImageTextToText.from_pretrained(str(ckpt))
    plain_lengths = _decoder_lengths(plain, lambda: plain.generate(**inputs, max_new_tokens=6, min_new_tokens=6))
    recomputes = len(set(plain_lengths)) == 6 and plain_lengths == sorted(plain_lengths)
    # measured: 4.x turns the cache off for a false in either place of config.json, 5.x reads the top level first
    off = {"generation_config", "generation_config_missing", "no_generation_config_top_off", "no_generation_config_only_text_off"}
    if transformers.__version__.startswith("4."):
        off.add("no_generation_config_text_off")
    assert recomputes == (where in off)
    assert engine.loaded.cache.saved_enabled is not recomputes
    expected = {"top": ["config.json: use_cache"], "text_config": ["config.json: text_config.use_cache"],
                "generation_config": ["generation_config.json: use_cache"],
                "no_generation_config_text_off": ["config.json: text_config.use_cache"],
                "no_generation_config_top_off": ["config.json: use_cache"],
                "no_generation_config_only_text_off": ["config.json: text_config.use_cache"],
                "generation_config_missing": ["config.json: use_cache", "config.json: text_config.use_cache"]}
    assert engine.loaded.cache.found_off == expected[where]
    # vlmfast: one prefill, then one position per step, whatever was saved.
    assert engine.loaded.model.generation_config.use_cache is True and engine.loaded.cache.forced_on
    lengths = _decoder_lengths(engine.loaded.model, lambda: engine.generate(inputs))
    assert lengths[0] == inputs["input_ids"].shape[1] and lengths[1:] == [1] * 5


def test_a_flash_attn_that_does_not_import_is_said_as_such(tmp_path, monkeypatch):
    """A flash-attn built for another torch fails on import: "not installed" would send the user to install it
    again; the note names the import error, and --attn flash_attention_2 is refused with it."""
    from vlmfast.checkpoints.load import flash_attn_state

    package = tmp_path / "flash_attn"
    package.mkdir()
    (package / "__init__.py").write_text("raise ImportError('flash_attn_2_cuda.so: undefined symbol: _ZN3c104cuda9SetDevice')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "flash_attn", raising=False)
    usable, problem = flash_attn_state()
    assert not usable and problem.startswith("flash-attn is installed but does not import (ImportError: ")
    assert "undefined symbol" in problem
    runtime = choose_runtime(cuda_available=True, flash_attn_available=usable, flash_attn_problem=problem)
    assert runtime.attn == "sdpa" and runtime.notes[0].startswith(problem) and "--force-reinstall" in runtime.notes[0]
    with pytest.raises(UsageError, match="does not import") as err:
        choose_runtime(attn="flash_attention_2", cuda_available=True, flash_attn_available=usable, flash_attn_problem=problem)
    assert "--attn sdpa" in err.value.hint


def test_choose_runtime():
    cpu = choose_runtime(cuda_available=False, flash_attn_available=False)
    assert (cpu.device, cpu.dtype, cpu.attn) == ("cpu", "float32", "sdpa")
    gpu = choose_runtime(cuda_available=True, flash_attn_available=True)
    assert (gpu.device, gpu.dtype, gpu.attn, gpu.notes) == ("cuda", "bfloat16", "flash_attention_2", ())
    fallback = choose_runtime(cuda_available=True, flash_attn_available=False)
    assert fallback.attn == "sdpa" and "flash-attn is not installed" in fallback.notes[0]
    assert choose_runtime(dtype="bf16", cuda_available=False, flash_attn_available=False).dtype == "bfloat16"
    with pytest.raises(UsageError, match="needs a CUDA device"):
        choose_runtime(attn="flash_attention_2", cuda_available=False, flash_attn_available=False)
    with pytest.raises(UsageError, match="only in bfloat16"):
        choose_runtime(attn="flash_attention_2", dtype="float32", cuda_available=True, flash_attn_available=True)
    with pytest.raises(UsageError, match="CUDA is not available"):
        choose_runtime(device="cuda", cuda_available=False, flash_attn_available=False)
    with pytest.raises(UsageError, match="unknown"):
        choose_runtime(dtype="int3", cuda_available=False, flash_attn_available=False)
    # a device index past the machine's devices was left to torch, which failed after the model was read
    with pytest.raises(UsageError, match=r"--device cuda:7: this machine has 2 CUDA device\(s\), cuda:0 to cuda:1"):
        choose_runtime(device="cuda:7", cuda_available=True, flash_attn_available=True, cuda_devices=2)
    assert choose_runtime(device="cuda:1", cuda_available=True, flash_attn_available=True, cuda_devices=2).device == "cuda:1"
    with pytest.raises(UsageError, match="--device '': unsupported"):  # "" (an unset variable) is not auto
        choose_runtime(device="", cuda_available=False, flash_attn_available=False)


def test_eos_list_adds_im_end(loaded):
    tok = loaded.processor.tokenizer
    im_end, eot = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")
    assert loaded.eos_token_ids == [im_end, eot]
    ids, note = eos_list(eot, tok)  # a merged checkpoint that lost <|im_end|>
    assert ids == [eot, im_end] and "lacks <|im_end|>" in note
    assert eos_list([im_end, eot], tok) == ([im_end, eot], None)
    # a token written as text is no id: left out and said (a list of its characters crashed the decode loop)
    ids, note = eos_list("<|im_end|>", tok)
    assert ids == [im_end] and note.startswith("eos_token_id holds '<|im_end|>', not token ids: left out; EOS list [] lacks")
    assert eos_list([eot, "<|im_end|>"], tok)[0] == [eot, im_end]


def test_load_reports_what_it_found(loaded, grpo_ckpt):
    assert loaded.cache.found_off == ALL_OFF and loaded.cache.forced_on
    assert loaded.runtime.attn == "sdpa" and loaded.runtime.dtype == "float32"
    assert loaded.processor.tokenizer.padding_side == "left"
    cfg = loaded.model.config
    assert loaded.suppress_token_ids == [cfg.image_token_id, cfg.video_token_id, cfg.vision_start_token_id, cfg.vision_end_token_id]


def test_missing_processor_is_a_clear_error(grpo_ckpt, tmp_path):
    ckpt = _copy(grpo_ckpt, tmp_path)
    for name in ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json"):
        (ckpt / name).unlink(missing_ok=True)
    # transformers 5 builds an 18-token tokenizer from what is left; 4.57 fails to load: both are caught
    with pytest.raises(CheckpointError, match="the tokenizer files are not whole") as err:
        load(str(ckpt), device="cpu")
    assert "base model" in err.value.hint


def test_vocab_and_merges_without_the_special_tokens_ids_are_not_a_tokenizer(base_ckpt, tmp_path):
    """A save by transformers 5 lists no added_tokens_decoder: without tokenizer.json, vocab.json + merges.txt give
    <|im_end|> another token's id, and the run decoded other tokens while doctor found nothing wrong."""
    import json

    from vlmfast.checkpoints.doctor import diagnose

    ckpt = _copy(base_ckpt, tmp_path)
    (ckpt / "tokenizer.json").unlink()
    (ckpt / "added_tokens.json").unlink(missing_ok=True)  # 4.57 writes the ids there too
    config = json.loads((ckpt / "tokenizer_config.json").read_text())
    (ckpt / "tokenizer_config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "added_tokens_decoder"}))
    assert [(f.code, f.location) for f in diagnose(ckpt) if f.code == "tokenizer-missing"] == [("tokenizer-missing", "tokenizer.json")]
    with pytest.raises(CheckpointError, match="the tokenizer files are not whole"):
        load(str(ckpt), device="cpu")
    (ckpt / "tokenizer_config.json").write_text(json.dumps(config))
    if config.get("added_tokens_decoder"):  # a save by 4.57 lists the ids: vocab.json + merges.txt do
        assert not [f for f in diagnose(ckpt) if f.code == "tokenizer-missing"]


def test_a_chat_template_kept_in_tokenizer_config_only_is_the_one_used(grpo_ckpt, tmp_path):
    """An older save keeps the template in tokenizer_config.json alone: doctor counts it, and the run took
    the released Qwen2-VL one instead (other tokens), saying the checkpoint had none."""
    import json

    ckpt = _copy(grpo_ckpt, tmp_path)
    own = load(str(grpo_ckpt), device="cpu").processor.chat_template
    for name in ("chat_template.jinja", "chat_template.json"):
        (ckpt / name).unlink(missing_ok=True)
    for name in ("processor_config.json", "preprocessor_config.json"):
        if (ckpt / name).exists():
            edit_json(ckpt / name, lambda c: c.pop("chat_template", None))
    config = json.loads((ckpt / "tokenizer_config.json").read_text())
    (ckpt / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": own}))
    loaded = load(str(ckpt), device="cpu")
    assert loaded.processor.chat_template == own
    assert not any("has no chat template" in n for n in loaded.notes)
    assert any("the chat template is the tokenizer's" in n for n in loaded.notes)


def test_missing_chat_template_falls_back_to_chatml_and_says_so(grpo_ckpt, images, tmp_path):
    from vlmfast.engines.hf.engine import Engine, GenerationSettings
    from vlmfast.inputs.requests import Request

    ckpt = _copy(grpo_ckpt, tmp_path)
    for name in ("chat_template.jinja", "chat_template.json"):
        (ckpt / name).unlink(missing_ok=True)
    for name in ("tokenizer_config.json", "processor_config.json", "preprocessor_config.json"):
        if (ckpt / name).exists():
            edit_json(ckpt / name, lambda c: c.pop("chat_template", None))
    loaded = load(str(ckpt), device="cpu")
    # a Qwen2.5-VL checkpoint: its family's released template, default system turn included, as training had it
    assert any(n.startswith("the checkpoint has no chat template: using Qwen2-VL's released one") for n in loaded.notes)
    prompt = loaded.processor.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {"type": "text",
                                                   "text": "Describe."}]}], add_generation_prompt=True, tokenize=False)
    assert prompt == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n<|vision_start|>"
                      "<|image_pad|><|vision_end|>Describe.<|im_end|>\n<|im_start|>assistant\n")
    results, _ = Engine(loaded, GenerationSettings(max_new_tokens=3)).generate_batch(
        [Request("a", (str(images[0]),), "Describe.")])
    assert results[0].n_image_tokens == 4 and results[0].n_new_tokens >= 1
