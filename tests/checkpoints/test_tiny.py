"""Tests for vlmfast.checkpoints.tiny: offline tiny Qwen2.5-VL checkpoints and synthetic images."""

from __future__ import annotations

import hashlib
import json
import pathlib

import pytest

from vlmfast.errors import UsageError

from vlmfast.checkpoints import tiny

SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
           "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
           "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")


def _digests(d: pathlib.Path) -> dict[str, str]:
    return {p.relative_to(d).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file()}


def _load_json(p: pathlib.Path):
    return json.loads(p.read_text(encoding="utf-8"))


def _find_use_cache(obj, path=""):
    """Every (json path, value) of a use_cache key, at any depth."""
    found = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == "use_cache":
                found.append((f"{path}/{k}", v))
            found += _find_use_cache(v, f"{path}/{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            found += _find_use_cache(v, f"{path}/{i}")
    return found


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return {like: tiny.build_checkpoint(root / like, like=like) for like in tiny.LIKES}


@pytest.fixture(scope="module")
def loaded(ckpts):
    import torch
    from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration

    d = ckpts["grpo"]
    # `dtype` is accepted by 4.57 (as the new name of torch_dtype) and by 5.x.
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(
        d, dtype=torch.float32, attn_implementation="sdpa").eval()
    return model, AutoProcessor.from_pretrained(d)


def test_same_arguments_give_same_bytes(tmp_path):
    a = tiny.build_checkpoint(tmp_path / "a", seed=3)
    b = tiny.build_checkpoint(tmp_path / "nested" / "b", seed=3)
    da, db = _digests(a), _digests(b)
    assert da == db
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json", "chat_template.jinja", "vlmfast_tiny.json"} <= set(da)
    c = tiny.build_checkpoint(tmp_path / "c", seed=4)
    assert _digests(c)["model.safetensors"] != da["model.safetensors"]
    assert not list(tmp_path.glob(".*building*")), "temporary build dirs must be cleaned up"


def test_existing_dir_reused_rejected_or_overwritten(tmp_path):
    d = tiny.build_checkpoint(tmp_path / "ck")
    mtime = (d / "model.safetensors").stat().st_mtime_ns
    assert tiny.build_checkpoint(d) == d
    assert (d / "model.safetensors").stat().st_mtime_ns == mtime  # not rebuilt
    with pytest.raises(UsageError, match="already holds a different tiny checkpoint") as err:
        tiny.build_checkpoint(d, like="base")
    assert "--overwrite" in err.value.hint
    assert _load_json(d / "vlmfast_tiny.json")["like"] == "grpo"  # untouched
    tiny.build_checkpoint(d, like="base", overwrite=True)
    assert _load_json(d / "vlmfast_tiny.json")["like"] == "base"

    (d / "model.safetensors").unlink()  # incomplete build: refuse rather than silently reuse
    with pytest.raises(UsageError, match="incomplete"):
        tiny.build_checkpoint(d, like="base")

    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="not a vlmfast tiny checkpoint"):
        tiny.build_checkpoint(other)
    assert (other / "notes.txt").read_text() == "mine"

    empty = tmp_path / "empty"
    empty.mkdir()
    assert (tiny.build_checkpoint(empty) / "config.json").is_file()

    # a build edited since (`vlmfast fix` turned its cache on): not what these arguments give, so not reused
    config = _load_json(empty / "config.json")
    (empty / "config.json").write_text(json.dumps({**config, "use_cache": True}))
    with pytest.raises(UsageError, match=r"files changed since it was built \(config.json\)") as err:
        tiny.build_checkpoint(empty)
    assert "--overwrite" in err.value.hint
    assert _load_json(tiny.build_checkpoint(empty, overwrite=True) / "config.json") == config


def test_make_checkpoint_says_reused_and_refuses_a_file_as_its_directory(tmp_path):
    from conftest import cli

    first = cli("make-checkpoint", tmp_path / "ck")
    again = cli("make-checkpoint", tmp_path / "ck")
    assert first.returncode == again.returncode == 0 and first.stdout == again.stdout
    assert "wrote a qwen2_5_vl checkpoint" in first.stderr and "reused the qwen2_5_vl checkpoint" in again.stderr
    plain = tmp_path / "notes.jsonl"
    plain.write_text("{}\n")
    for target in (plain, plain / "x"):
        r = cli("make-checkpoint", target, "--overwrite")
        assert r.returncode == 2 and "is a file" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert plain.read_text() == "{}\n"  # --overwrite replaces directories, never a file
    r = cli("demo", "--workdir", plain)
    assert r.returncode == 2 and "--workdir" in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("kwargs, word", [({"preset": "huge"}, "tiny"), ({"like": "sft"}, "grpo")])
def test_unknown_choices_list_valid_ones(tmp_path, kwargs, word):
    with pytest.raises(UsageError, match=word):
        tiny.build_checkpoint(tmp_path / "x", **kwargs)
    assert not (tmp_path / "x").exists()


def test_grpo_like_has_use_cache_false_everywhere(ckpts):
    d = ckpts["grpo"]
    cfg, gen = _load_json(d / "config.json"), _load_json(d / "generation_config.json")
    assert cfg["use_cache"] is False
    assert cfg["text_config"]["use_cache"] is False
    assert gen["use_cache"] is False


def test_base_like_has_no_use_cache_false(ckpts):
    d = ckpts["base"]
    cfg, gen = _load_json(d / "config.json"), _load_json(d / "generation_config.json")
    assert all(v is not False for _, v in _find_use_cache(cfg))
    assert "use_cache" not in gen


@pytest.mark.parametrize("like", tiny.LIKES)
def test_special_token_ids_match_config(ckpts, like):
    from transformers import AutoTokenizer

    d = ckpts[like]
    tok = AutoTokenizer.from_pretrained(d)
    cfg, gen = _load_json(d / "config.json"), _load_json(d / "generation_config.json")
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL}
    assert len(set(ids.values())) == len(SPECIAL)
    for t in SPECIAL:  # each special string is one special token, never split
        assert tok.encode(t, add_special_tokens=False) == [ids[t]]
        assert t in tok.all_special_tokens or t == "<|endoftext|>" and tok.pad_token == t
    for t in ("<think>", "</think>", "<answer>", "</answer>"):
        assert len(tok.encode(t, add_special_tokens=False)) == 1
        assert t not in tok.all_special_tokens
    assert cfg["image_token_id"] == ids["<|image_pad|>"]
    assert cfg["video_token_id"] == ids["<|video_pad|>"]
    assert cfg["vision_start_token_id"] == ids["<|vision_start|>"]
    assert cfg["vision_end_token_id"] == ids["<|vision_end|>"]
    assert cfg["text_config"]["vocab_size"] == len(tok)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert tok.padding_side == "left"
    assert gen["eos_token_id"] == [ids["<|im_end|>"], ids["<|endoftext|>"]]
    assert gen["pad_token_id"] == gen["bos_token_id"] == ids["<|endoftext|>"]
    assert 300 <= len(tok) <= 2100
    assert tok.decode(tok.encode("Count the red boxes in the image.")) == "Count the red boxes in the image."


def test_chat_template_layout(loaded):
    _, proc = loaded
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe it."}]},
            {"role": "assistant", "content": "A box."},
            {"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "And this?"}]}]
    text = proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == ("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe it.<|im_end|>\n"
                    "<|im_start|>assistant\nA box.<|im_end|>\n"
                    "<|im_start|>user\n<|vision_start|><|video_pad|><|vision_end|>And this?<|im_end|>\n"
                    "<|im_start|>assistant\n")
    # The tokenizer alone finds the same template (tools that skip the processor rely on it).
    assert proc.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == text
    plain = proc.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert plain == "<|im_start|>user\nhi<|im_end|>\n"


def test_processor_and_greedy_generate_round_trip(loaded, tmp_path):
    import torch
    from PIL import Image

    model, proc = loaded
    ip = proc.image_processor
    assert (ip.size["shortest_edge"], ip.size["longest_edge"]) == (3136, 12845056)
    paths = tiny.make_images(tmp_path, n=4)
    text = proc.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Count the shapes."}]}],
        tokenize=False, add_generation_prompt=True)
    cfg = model.config
    suppress = [cfg.image_token_id, cfg.video_token_id, cfg.vision_start_token_id, cfg.vision_end_token_id]
    eos = set(model.generation_config.eos_token_id)

    def greedy(imgs, use_cache):
        enc = proc(text=[text] * len(imgs), images=[Image.open(p) for p in imgs], padding=True,
                   return_tensors="pt")
        with torch.inference_mode():
            out = model.generate(**enc, max_new_tokens=12, do_sample=False, use_cache=use_cache,
                                 suppress_tokens=suppress)
        rows = out[:, enc["input_ids"].shape[1]:].tolist()
        # Batched rows keep padding after EOS; compare up to and including the first EOS.
        return enc, [r[:next((i + 1 for i, t in enumerate(r) if t in eos), len(r))] for r in rows]

    enc, batch = greedy(paths, use_cache=True)
    # 28x28 px = 1 image token: token counts follow the image sizes, so the batch is left-padded.
    n_img = (enc["input_ids"] == cfg.image_token_id).sum(1).tolist()
    assert n_img == [(w // 28) * (h // 28) for w, h in [(56, 56), (112, 84), (84, 112), (112, 112)]]
    assert (enc["attention_mask"][:, -1] == 1).all() and (enc["attention_mask"][:, 0] == 0).any()
    assert all(len(r) > 0 for r in batch)
    assert greedy(paths, use_cache=False)[1] == batch
    assert [greedy([p], use_cache=True)[1][0] for p in paths] == batch


def test_loaded_grpo_checkpoint_reports_cache_off(loaded):
    model, _ = loaded
    assert model.generation_config.use_cache is False
    assert model.config.get_text_config().use_cache is False


def test_make_images_deterministic(tmp_path):
    from PIL import Image

    a = tiny.make_images(tmp_path / "a", n=6, seed=1)
    b = tiny.make_images(tmp_path / "b", n=6, seed=1)
    assert [p.name for p in a] == [f"img_{i:03d}.png" for i in range(6)]
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
    assert [Image.open(p).size for p in a] == [(56, 56), (112, 84), (84, 112), (112, 112), (56, 56), (112, 84)]
    c = tiny.make_images(tmp_path / "c", n=6, seed=2)
    assert all(p.read_bytes() != q.read_bytes() for p, q in zip(a, c))
    d = tiny.make_images(tmp_path / "d", n=2, sizes=[(30, 20)])
    assert [Image.open(p).size for p in d] == [(30, 20), (30, 20)]
    assert Image.open(d[0]).mode == "RGB"


def test_real_vocabulary_puts_special_tokens_at_qwens_ids(tmp_path, monkeypatch, images):
    """The 3b/7b presets' tokenizer: padded so Qwen's special tokens sit at their real ids, with the
    real LM-head size; checked on tiny shapes (the real ones need a GPU to build quickly)."""
    from vlmfast.checkpoints.load import load
    from vlmfast.engines.hf.engine import Engine, GenerationSettings
    from vlmfast.inputs.requests import Request
    from vlmfast.checkpoints.tiny import PRESETS, build_checkpoint

    monkeypatch.setitem(PRESETS, "tiny-real-vocab", {**PRESETS["tiny"], "vocab_size": 151936, "tie_word_embeddings": True})
    ckpt = build_checkpoint(tmp_path / "c", preset="tiny-real-vocab")
    loaded = load(str(ckpt), device="cpu")
    tok = loaded.processor.tokenizer
    assert [tok.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|image_pad|>")] == [
        151643, 151644, 151645, 151655]
    assert loaded.model.config.get_text_config().vocab_size == 151936 and len(tok) == 151661
    assert loaded.model.lm_head.weight is loaded.model.get_input_embeddings().weight  # tied, as the real 3B
    engine = Engine(loaded, GenerationSettings(max_new_tokens=4, ignore_eos=True))
    result, _ = engine.generate_batch([Request("a", (str(images[0]),), "Count.")])
    assert result[0].n_new_tokens == 4 and all(0 <= t < 151936 for t in result[0].token_ids)


def test_make_checkpoint_never_takes_the_current_directory_or_replaces_what_it_did_not_build(tmp_path, monkeypatch):
    """A build is made beside its directory and then replaces it whole: "" (an unset shell variable) and "."
    would delete the directory the user stands in, and --overwrite must not delete a folder of other files."""
    from conftest import cli

    here = tmp_path / "work"
    (here / "sub").mkdir(parents=True)
    (here / "precious.txt").write_text("mine")
    monkeypatch.chdir(here)
    for target in ("", ".", "..", str(here), "sub/.."):
        with pytest.raises(UsageError, match="empty text|current directory"):
            tiny.build_checkpoint(target, overwrite=True)
    for target in ("", "."):
        r = cli("make-checkpoint", target, "--overwrite")
        assert r.returncode == 2 and "current directory" in r.stderr and "Traceback" not in r.stderr, r.stderr
    (here / "sub" / "x.txt").write_text("also mine")
    for target in ("sub", here / "sub"):
        with pytest.raises(UsageError, match="not an earlier build"):
            tiny.build_checkpoint(target, overwrite=True)
    with pytest.raises(UsageError, match="--seed"):
        tiny.build_checkpoint(here / "new", seed=2 ** 70)
    assert (here / "precious.txt").read_text() == "mine" and (here / "sub" / "x.txt").read_text() == "also mine"
    assert sorted(p.name for p in here.rglob("*")) == ["precious.txt", "sub", "x.txt"]  # nothing built, nothing left
