"""Tiny random-weight Qwen-VL checkpoints, built fully offline for tests and the demo.

The real model class of a family (Qwen2.5-VL by default; Qwen2-VL, Qwen3-VL dense and MoE, Qwen3.5 dense
and MoE: see :mod:`vlmfast.checkpoints.tiny_families`) with a locally trained byte-level BPE tokenizer holding the
family's special tokens, the family's stock processor and our own ChatML template; builds and loads with
transformers 4.57 and 5.x (Qwen3.5: 5.x only).
``like="grpo"`` saves ``use_cache: false`` where GRPO trainers leave it (config.json top level and
``text_config``, generation_config.json); ``like="base"`` has none. torch/transformers/PIL are imported
inside functions so that importing this module stays cheap.
"""

from __future__ import annotations

import json
import pathlib
import random
import shutil
import tempfile

from vlmfast.checkpoints.templates import CHAT_TEMPLATE
from vlmfast.errors import UsageError
from vlmfast.checkpoints.families import BY_KEY, QWEN_SPECIAL, Family, family_by_key
from vlmfast.files import publish_directory, replaceable_directory

# initializer_range: greedy decoding must not flip between batch/single or cache on/off. What
# matters is the top-1/top-2 logit gap relative to float noise, and that ratio does NOT improve with
# a larger init: noise grows faster than the logits (sharper attention). Measured over 8-10 seeds,
# 4 images, 32-48 tokens, both transformers versions: these values keep the gap >= 50x the noise
# (logit std ~0.8), while 0.2 on "demo" brought it down to 0.2x.
PRESETS: dict[str, dict] = {
    # Tests: ~0.25M params; builds in ~0.1-0.3 s once transformers is imported.
    "tiny": {
        "text": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                 "num_attention_heads": 4, "num_key_value_heads": 2, "mrope_section": [2, 3, 3]},
        "vision": {"hidden_size": 32, "intermediate_size": 64, "depth": 2, "num_heads": 2,
                   "fullatt_block_indexes": [1]},
        "initializer_range": 0.1,
    },
    # Demo: ~5.9M params, big enough that decoding without a KV cache is plainly slower on a CPU.
    "demo": {
        "text": {"hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 4,
                 "num_attention_heads": 4, "num_key_value_heads": 2, "mrope_section": [8, 12, 12]},
        "vision": {"hidden_size": 128, "intermediate_size": 512, "depth": 4, "num_heads": 4,
                   "fullatt_block_indexes": [1, 3]},
        "initializer_range": 0.05,
    },
    # The published Qwen2.5-VL-3B/-7B-Instruct shapes with random weights (GPU benchmarks on a machine
    # without a model hub). The tokenizer is padded to the real one's size so the special tokens sit at
    # their real ids; the LM head has the real vocabulary; weights are made on the GPU in bfloat16.
    "3b": {
        "text": {"hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
                 "num_attention_heads": 16, "num_key_value_heads": 2, "mrope_section": [16, 24, 24]},
        "vision": {"hidden_size": 1280, "intermediate_size": 3420, "depth": 32, "num_heads": 16,
                   "fullatt_block_indexes": [7, 15, 23, 31]},
        "initializer_range": 0.02, "vocab_size": 151936, "tie_word_embeddings": True,
        "max_position_embeddings": 128000,
    },
    "7b": {
        "text": {"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                 "num_attention_heads": 28, "num_key_value_heads": 4, "mrope_section": [16, 24, 24]},
        "vision": {"hidden_size": 1280, "intermediate_size": 3420, "depth": 32, "num_heads": 16,
                   "fullatt_block_indexes": [7, 15, 23, 31]},
        "initializer_range": 0.02, "vocab_size": 152064, "tie_word_embeddings": False,
        "max_position_embeddings": 128000,
    },
}
LIKES = ("grpo", "base")
DEFAULT_FAMILY = "qwen2_5_vl"
# Filler entries before the special tokens, per family, so a tiny vocabulary puts <|im_end|> at an id of
# its own (real vocabularies differ too: 151645 in Qwen2/2.5/3-VL, 248046 in Qwen3.5).
_TINY_PAD_TO = {"qwen3_5": 700, "qwen3_5_moe": 700}
_REASONING_TAGS = ("<think>", "</think>", "<answer>", "</answer>")
# Qwen2's pre-tokenizer regex; transformers 5 rebuilds Qwen2Tokenizer with it, so we train with it too.
_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# Qwen3.5's: letters may carry combining marks. transformers 5 builds Qwen3_5Tokenizer with it.
_PRETOKENIZE_REGEX_QWEN3_5 = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
STAMP = "vlmfast_tiny.json"
_IMAGE_SIZES = [(56, 56), (112, 84), (84, 112), (112, 112)]  # (width, height)

_CORPUS = """\
Look at the image and describe what you see. The picture shows a red box on a blue table.
Count the objects in the image. There are three circles and two squares, so the count is five.
What color is the large shape? The large shape is green, and the small shape is yellow.
First think about the question, then give the answer. Think step by step before you answer.
The answer is a single number. The answer is a short phrase. The answer is one word.
Describe the scene in one sentence. A cat sits near a window while the sun sets behind the hills.
Find the bounding box of the dog. The box starts at the top left corner and ends at the bottom right.
How many people are in the photo? I count four people standing in a row, so the answer is 4.
Give the coordinates of the box as four numbers: left, top, right, bottom, measured in pixels.
The question asks about the video. The video shows a car moving from left to right across the frame.
Let me count: one, two, three, four, five, six, seven, eight, nine, ten. Numbers 0 to 9 are common.
The reasoning should be brief. Long thinking without an answer is not useful to anyone.
The user asks a question about an image, and the assistant looks at the image and answers it.
Explain your answer. I looked at each part of the image and counted every object exactly once.
Answer the question using the image. If you are not sure, say that you are not sure.
Think first, answer second. Keep the thinking short and the answer exact.
"""
_COLORS = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white")
_SHAPES = ("box", "circle", "square", "triangle", "line", "ellipse", "rectangle", "dot")
_PLACES = ("at the top", "at the bottom", "on the left", "on the right", "in the center", "near the edge")


def _corpus() -> str:
    # Handwritten sentences plus systematic color/shape/count phrases, so the vocabulary learns
    # whole words for what the tests and demo prompts say.
    lines = [_CORPUS]
    for i, color in enumerate(_COLORS):
        for j, shape in enumerate(_SHAPES):
            place = _PLACES[(i + j) % len(_PLACES)]
            lines.append(f"The {color} {shape} is {place} of the image; count {i + j} of them.\n")
    return "".join(lines)


def _train_tokenizer(pad_to: int | None = None, special_tokens=QWEN_SPECIAL, regex: str = _PRETOKENIZE_REGEX):
    """Train the byte-level BPE (deterministic: same corpus and settings give the same merges). With
    ``pad_to``, filler entries (never produced: no merge leads to them) fill the vocabulary up to that
    size before the special tokens are added, so those get the ids they have in Qwen's tokenizer."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, trainers
    from tokenizers.models import BPE

    # Same pipeline as Qwen2's tokenizer.json so both transformers versions tokenize identically.
    tok = Tokenizer(BPE(unk_token=None, continuing_subword_prefix="", end_of_word_suffix="",
                        fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1024, min_frequency=1, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus().splitlines(keepends=True), trainer=trainer)
    if pad_to is not None:
        data = json.loads(tok.to_str())
        vocab = data["model"]["vocab"]
        vocab.update({f"<|vlmfast_filler_{i}|>": i for i in range(len(vocab), pad_to)})
        tok = Tokenizer.from_str(json.dumps(data))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special_tokens])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in _REASONING_TAGS])
    return tok


def _write_json(path: pathlib.Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def _read_json(path: pathlib.Path):
    return json.loads(path.read_text(encoding="utf-8"))


def _save_tokenizer_and_processor(d: pathlib.Path, pad_to: int | None, family: Family):
    """Write tokenizer, processor and chat template files into ``d``; return the loaded tokenizer."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from vlmfast.checkpoints.tiny_families import make_processor

    regex = _PRETOKENIZE_REGEX_QWEN3_5 if family.vocabulary == "qwen3_5" else _PRETOKENIZE_REGEX
    backend = _train_tokenizer(pad_to, family.special_tokens, regex)
    with tempfile.TemporaryDirectory() as scratch:
        # Save a generic fast tokenizer, relabel it Qwen2Tokenizer and reload it, so the processor gets
        # the class each transformers version expects (Qwen2TokenizerFast in 4.x, Qwen2Tokenizer in 5.x).
        PreTrainedTokenizerFast(
            tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>",
            additional_special_tokens=list(family.special_tokens[1:]), padding_side="left",
            model_max_length=32768, clean_up_tokenization_spaces=False,
        ).save_pretrained(scratch)
        cfg_path = pathlib.Path(scratch) / "tokenizer_config.json"
        cfg = _read_json(cfg_path)
        # unk_token null as in Qwen's release (the Qwen2 classes would otherwise default it).
        cfg.update(tokenizer_class=family.tokenizer_class, unk_token=None)
        _write_json(cfg_path, cfg)
        tokenizer = AutoTokenizer.from_pretrained(scratch)
    tokenizer.chat_template = CHAT_TEMPLATE  # the tokenizer alone must also find the template
    make_processor(family, tokenizer, CHAT_TEMPLATE).save_pretrained(str(d))
    # transformers 5 records how the scratch copy was loaded; that is not a tokenizer setting.
    cfg = _read_json(d / "tokenizer_config.json")
    for key in ("is_local", "local_files_only"):
        cfg.pop(key, None)
    _write_json(d / "tokenizer_config.json", cfg)
    # vocab.json/merges.txt as in released checkpoints (the slow tokenizer and other tools read them).
    model = json.loads(backend.to_str())["model"]
    _write_json(d / "vocab.json", model["vocab"])
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    (d / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    return tokenizer


def _build_into(d: pathlib.Path, spec: dict, like: str, seed: int, family: Family = BY_KEY[DEFAULT_FAMILY]) -> None:
    import torch
    from transformers import GenerationConfig
    from transformers.utils import logging as hf_logging

    from vlmfast.checkpoints.tiny_families import adjust_weights, model_class, model_config

    model_cls = model_class(family)  # before any file is written: a UsageError on a transformers without it
    real_size = "vocab_size" in spec
    pad_to = family.real_first_special if real_size else _TINY_PAD_TO.get(family.key)
    tokenizer = _save_tokenizer_and_processor(d, pad_to, family)
    ids = {tok: tokenizer.convert_tokens_to_ids(tok) for tok in family.special_tokens}
    config = model_config(family, spec, like, ids, vocab_size=spec.get("vocab_size", len(tokenizer)))
    torch.manual_seed(seed)
    if real_size:  # billions of parameters: made where they are fastest to make, in the dtype they ship in
        device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)
        try:
            with torch.device(device):
                model = model_cls(config)
        finally:
            torch.set_default_dtype(dtype)
    else:
        model = model_cls(config)
    adjust_weights(model, family)
    eot, im_end = ids["<|endoftext|>"], ids["<|im_end|>"]
    model.generation_config = GenerationConfig(bos_token_id=eot, eos_token_id=[im_end, eot], pad_token_id=eot)
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # 5.x draws a "Writing model shards" bar; a library stays quiet
    try:
        model.save_pretrained(str(d))
    finally:
        if bars:
            hf_logging.enable_progress_bar()

    # transformers decides on its own where use_cache lands (5.x drops the top-level key, and may add
    # it to generation_config.json); rewrite both files so each `like` has exactly its layout.
    cfg = _read_json(d / "config.json")
    cfg["use_cache"] = like != "grpo"
    cfg["text_config"]["use_cache"] = like != "grpo"
    _write_json(d / "config.json", cfg)
    gen = _read_json(d / "generation_config.json")
    gen.pop("use_cache", None)
    gen.update({"use_cache": False} if like == "grpo" else {})
    gen.update(bos_token_id=eot, eos_token_id=[im_end, eot], pad_token_id=eot)
    if real_size:  # the real shapes decode as the released Instruct checkpoints do: with their repetition penalty
        gen["repetition_penalty"] = 1.05
    _write_json(d / "generation_config.json", gen)


# files up to this size are stamped with their digest (configs, tokenizer, template: what `fix` edits); larger
# ones (weights) with their size, so that reusing a build stays quick for the real shapes
_DIGESTED_BYTES = 4 << 20


def _file_stamps(d: pathlib.Path, files: list[str]) -> dict:
    import hashlib

    stamps = {}
    for name in files:
        path = d / name
        size = path.stat().st_size
        stamps[name] = hashlib.sha256(path.read_bytes()).hexdigest() if size <= _DIGESTED_BYTES else size
    return stamps


def _changed_since_built(out: pathlib.Path, found: dict) -> list[str]:
    """The files of a build that differ from its stamp (stamps before digests: none checked)."""
    stamps = found.get("stamps") or {}
    return [name for name, stamp in _file_stamps(out, list(stamps)).items() if stamp != stamps[name]]


def _existing_checkpoint(out: pathlib.Path, want: dict) -> bool:
    """True if ``out`` holds a complete build with the same arguments, False if it is missing or an
    empty directory; UsageError if it holds anything else."""
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return False
    try:
        found = _read_json(out / STAMP)
    except (OSError, ValueError):
        found = None
    if found is None:
        reason = "files that are not a vlmfast tiny checkpoint"
    elif ({k: found.get(k) for k in want} != want
          or found.get("family", DEFAULT_FAMILY) != want.get("family", DEFAULT_FAMILY)):
        what = ", ".join(f"{k}={found.get(k, DEFAULT_FAMILY if k == 'family' else None)!r}"
                         for k in ("family", "preset", "like", "seed", "transformers_version"))
        reason = f"a different tiny checkpoint ({what})"
    elif not (found.get("files") and all((out / f).is_file() for f in found["files"])):
        reason = "an incomplete tiny checkpoint"
    elif changed := _changed_since_built(out, found):
        reason = f"a tiny checkpoint whose files changed since it was built ({', '.join(changed)})"
    else:
        return True
    raise UsageError(
        f"{out} already holds {reason}; wanted family={want.get('family', DEFAULT_FAMILY)!r}, "
        f"preset={want['preset']!r}, like={want['like']!r}, seed={want['seed']!r} with transformers "
        f"{want['transformers_version']}",
        hint="choose another directory, or replace it (--overwrite)",
    )


def build_checkpoint(out_dir, preset: str = "tiny", like: str = "grpo", seed: int = 0,
                     overwrite: bool = False, family: str = DEFAULT_FAMILY) -> pathlib.Path:
    """Build a tiny random-weight checkpoint of ``family`` in ``out_dir`` and return its path.

    ``family`` is a key of :data:`vlmfast.checkpoints.families.BY_KEY` (``qwen2_vl``, ``qwen2_5_vl``, ``qwen3_vl``,
    ``qwen3_vl_moe``, ``qwen3_5``, ``qwen3_5_moe``); a family the installed transformers lacks (Qwen3.5 on
    4.57) is a UsageError. ``preset`` is a key of :data:`PRESETS` for Qwen2.5-VL, ``"tiny"`` for the other
    families; ``like`` is ``"grpo"`` (saved with ``use_cache: false``
    like GRPO trainers do) or ``"base"``. Same arguments in the same environment give byte-identical
    files. An existing complete build with the same arguments (per its ``vlmfast_tiny.json`` stamp) is
    returned as is; any other existing content raises UsageError unless ``overwrite`` is true.
    The build happens in a sibling temporary directory and is moved into place when complete.
    """
    from vlmfast.checkpoints.tiny_families import FAMILY_PRESETS, model_class

    fam = family_by_key(family)
    presets = PRESETS if family == DEFAULT_FAMILY else FAMILY_PRESETS[family]
    if preset not in presets:
        raise UsageError(f"unknown preset {preset!r} for {fam.name}; valid presets: {', '.join(presets)}",
                         hint="vlmfast make-checkpoint --help lists them")
    if like not in LIKES:
        raise UsageError(f"unknown like {like!r}; valid choices: {', '.join(LIKES)}", hint="grpo saves the cache off, as trainers do")
    model_class(fam)  # UsageError now, before anything is written, if this transformers lacks the family
    import transformers

    if not 0 <= int(seed) < 2 ** 63:  # torch's seeds are 64-bit integers
        raise UsageError(f"--seed {seed}: expected a whole number from 0 to 2^63 − 1", hint="e.g. --seed 1")
    out = replaceable_directory(out_dir, command="make-checkpoint", overwrite=overwrite, marker=STAMP)
    stamp = {"builder": "vlmfast.tiny", "format": 1, "like": like, "preset": preset, "seed": int(seed),
             "transformers_version": transformers.__version__}
    if family != DEFAULT_FAMILY:  # Qwen2.5-VL stamps stay as they were: same bytes as before families
        stamp["family"] = family
    if not overwrite and _existing_checkpoint(out, stamp):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.building-", dir=out.parent))
    try:
        _build_into(tmp, presets[preset], like, int(seed), fam)
        files = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file())
        _write_json(tmp / STAMP, {**stamp, "files": files, "stamps": _file_stamps(tmp, files)})  # last: marks it complete
        if not overwrite and _existing_checkpoint(out, stamp):  # a concurrent build finished first
            shutil.rmtree(tmp)
            return out
        publish_directory(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def make_images(out_dir, n: int = 8, seed: int = 0,
                sizes: list[tuple[int, int]] | None = None) -> list[pathlib.Path]:
    """Write ``n`` deterministic PNGs (``img_000.png``...) into ``out_dir`` and return their paths.

    Each image is a two-color gradient with a few rectangles and ellipses. ``sizes`` is a list of
    (width, height) cycled over the images; the default mixes sizes so that a batch has different
    image-token counts (28x28 px = 1 image token).
    """
    from PIL import Image, ImageDraw

    sizes = list(sizes) if sizes else list(_IMAGE_SIZES)
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        # String seeds hash with SHA-512, independent of PYTHONHASHSEED: stable across processes.
        rng = random.Random(f"vlmfast-tiny-image:{seed}:{i}")
        w, h = sizes[i % len(sizes)]

        def color():
            return tuple(rng.randrange(256) for _ in range(3))
        mask = Image.linear_gradient("L")
        if rng.random() < 0.5:
            mask = mask.transpose(Image.Transpose.ROTATE_90)
        img = Image.composite(Image.new("RGB", (w, h), color()), Image.new("RGB", (w, h), color()),
                              mask.resize((w, h)))
        draw = ImageDraw.Draw(img)
        for _ in range(rng.randint(2, 4)):
            x0, x1 = sorted(rng.randrange(w) for _ in range(2))
            y0, y1 = sorted(rng.randrange(h) for _ in range(2))
            shape = draw.rectangle if rng.random() < 0.5 else draw.ellipse
            shape((x0, y0, x1 + 4, y1 + 4), fill=color(), outline=color())
        path = out / f"img_{i:03d}.png"
        img.save(path, format="PNG")
        paths.append(path)
    return paths
