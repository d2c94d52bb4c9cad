"""Per-family pieces of the tiny checkpoints: configs, model and processor classes.

:mod:`vlmfast.checkpoints.tiny` trains the tokenizer, saves and stamps; this module knows what differs between
Qwen2-VL, Qwen2.5-VL, Qwen3-VL (dense, MoE) and Qwen3.5 (dense, MoE) at tiny sizes: the real classes,
their config layout, and each family's shapes that matter to a decode loop (DeepStack layers, interleaved
MRoPE, experts, the 3:1 pattern of linear- and full-attention layers). Configs are written in the
layout the released checkpoints use, so both transformers lines read them.
"""

from __future__ import annotations

from vlmfast.errors import UsageError
from vlmfast.checkpoints.families import Family

_TEXT = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2}
_QWEN3_VISION = {"hidden_size": 32, "intermediate_size": 64, "depth": 2, "num_heads": 2, "patch_size": 16,
                 "spatial_merge_size": 2, "temporal_patch_size": 2, "in_channels": 3, "hidden_act": "gelu_pytorch_tanh",
                 "num_position_embeddings": 64}
_EXPERTS = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
_LINEAR = {"linear_conv_kernel_dim": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
           "linear_num_key_heads": 2, "linear_num_value_heads": 4}
_HYBRID_LAYERS = ["linear_attention"] * 3 + ["full_attention"]  # Qwen3.5's pattern: one full layer in four
# demo: ~6M parameters like Qwen2.5-VL's demo preset, big enough that a cache-off decode is plainly slower
_DEMO_TEXT = {"hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 4,
              "num_key_value_heads": 2}
_DEMO_QWEN3_VISION = {**_QWEN3_VISION, "hidden_size": 128, "intermediate_size": 512, "depth": 4, "num_heads": 4}
_DEMO_EXPERTS = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 256}
_DEMO_LINEAR = {"linear_conv_kernel_dim": 4, "linear_key_head_dim": 32, "linear_value_head_dim": 32,
                "linear_num_key_heads": 4, "linear_num_value_heads": 8}

# family key → preset → shapes. Qwen2.5-VL's presets are vlmfast.checkpoints.tiny.PRESETS (its demo and real
# shapes); the other families have the test size. initializer_range 0.1: see vlmfast.checkpoints.tiny.
FAMILY_PRESETS: dict[str, dict[str, dict]] = {
    "qwen2_vl": {"tiny": {
        "text": {**_TEXT, "mrope_section": [2, 3, 3]},
        "vision": {"embed_dim": 32, "mlp_ratio": 2, "depth": 2, "num_heads": 2},
        "initializer_range": 0.1}, "demo": {
        "text": {**_DEMO_TEXT, "mrope_section": [8, 12, 12]},
        "vision": {"embed_dim": 128, "mlp_ratio": 4, "depth": 4, "num_heads": 4},
        "initializer_range": 0.05}},
    "qwen3_vl": {"tiny": {
        "text": {**_TEXT, "head_dim": 16, "mrope_section": [4, 2, 2]},
        "vision": {**_QWEN3_VISION, "deepstack_visual_indexes": [0, 1]},  # DeepStack into both decoder layers
        "initializer_range": 0.1}, "demo": {
        "text": {**_DEMO_TEXT, "head_dim": 64, "mrope_section": [12, 10, 10]},
        "vision": {**_DEMO_QWEN3_VISION, "deepstack_visual_indexes": [1, 3]},
        "initializer_range": 0.05}},
    "qwen3_vl_moe": {"tiny": {
        "text": {**_TEXT, "head_dim": 16, "mrope_section": [4, 2, 2], **_EXPERTS, "decoder_sparse_step": 1},
        "vision": {**_QWEN3_VISION, "deepstack_visual_indexes": [0, 1]},
        "initializer_range": 0.1}, "demo": {
        "text": {**_DEMO_TEXT, "head_dim": 64, "mrope_section": [12, 10, 10], **_DEMO_EXPERTS, "decoder_sparse_step": 1},
        "vision": {**_DEMO_QWEN3_VISION, "deepstack_visual_indexes": [1, 3]},
        "initializer_range": 0.05}},
    "qwen3_5": {"tiny": {
        # head_dim 32 with a quarter rotary: 8 rotary dims, 4 frequencies split 2/1/1 over t/h/w
        "text": {**_TEXT, "num_hidden_layers": 4, "head_dim": 32, "mrope_section": [2, 1, 1], **_LINEAR,
                 "layer_types": _HYBRID_LAYERS},
        "vision": dict(_QWEN3_VISION),
        "initializer_range": 0.1}, "demo": {
        # head_dim 64, a quarter rotary: 16 rotary dims, 8 frequencies split 4/2/2
        "text": {**_DEMO_TEXT, "num_hidden_layers": 8, "head_dim": 64, "mrope_section": [4, 2, 2], **_DEMO_LINEAR,
                 "layer_types": _HYBRID_LAYERS * 2},
        "vision": dict(_DEMO_QWEN3_VISION),
        "initializer_range": 0.05}},
    "qwen3_5_moe": {"tiny": {
        "text": {**_TEXT, "num_hidden_layers": 4, "head_dim": 32, "mrope_section": [2, 1, 1], **_LINEAR,
                 "layer_types": _HYBRID_LAYERS, **_EXPERTS, "shared_expert_intermediate_size": 32},
        "vision": dict(_QWEN3_VISION),
        "initializer_range": 0.1}, "demo": {
        "text": {**_DEMO_TEXT, "num_hidden_layers": 8, "head_dim": 64, "mrope_section": [4, 2, 2], **_DEMO_LINEAR,
                 "layer_types": _HYBRID_LAYERS * 2, **_DEMO_EXPERTS, "shared_expert_intermediate_size": 256},
        "vision": dict(_DEMO_QWEN3_VISION),
        "initializer_range": 0.05}},
}
# Pixel limits the tiny processors ship. Qwen2/2.5-VL: the released defaults. Qwen3 families: the released
# maximum, a small minimum so that test images stay a few tokens each (32x32 px per token).
PIXELS = {14: (3136, 12845056), 16: (4096, 16777216)}


def transformers_class(name: str, family: Family):
    """A class of the installed transformers, or a UsageError saying which version has it."""
    import transformers

    cls = getattr(transformers, name, None)
    if cls is None:
        hint = (f"{family.name} needs transformers >= 5 (it ships in the 5.x line only)" if family.since == "5"
                else f"{family.name} needs transformers >= {family.since}")
        raise UsageError(f"transformers {transformers.__version__} has no {name}",
                         hint=hint + ": pip install -U transformers")
    return cls


def model_class(family: Family):
    """The family's model class in the installed transformers (UsageError with a hint when absent)."""
    return transformers_class(family.model_class, family)


def make_processor(family: Family, tokenizer, chat_template: str):
    """The family's processor around ``tokenizer``: its image and video processors at the tiny pixel limits."""
    lo, hi = PIXELS[family.patch_size]
    image = transformers_class(family.image_processor_class, family)
    extra = {} if family.patch_size == 14 else {"patch_size": 16, "image_mean": [0.5] * 3, "image_std": [0.5] * 3}
    video = transformers_class(family.video_processor_class, family)
    return transformers_class(family.processor_class, family)(
        image_processor=image(min_pixels=lo, max_pixels=hi, **extra), tokenizer=tokenizer,
        video_processor=video(), chat_template=chat_template,
    )


def adjust_weights(model, family: Family) -> None:
    """Make a tiny model's linear-attention layers remember: transformers draws each head's decay rate A
    from U(0.01, 16), so most heads forget a token within one or two steps, and a random model's decode
    would barely read the state prefill leaves — a loop that lost it would still give generate's tokens.
    Rates spread over [0.02, 0.2] keep 75-97% of the state per step."""
    import torch

    for layer in model.model.language_model.layers:
        attn = getattr(layer, "linear_attn", None)
        if attn is not None:
            with torch.no_grad():
                attn.A_log.copy_(torch.linspace(0.02, 0.2, attn.A_log.numel()).log())


def model_config(family: Family, spec: dict, like: str, ids: dict, vocab_size: int):
    """The config object of a tiny ``family`` model with ``spec``'s shapes, ``ids`` the special-token ids."""
    t = dict(spec["text"])
    eot, im_end = ids["<|endoftext|>"], ids["<|im_end|>"]
    text = {
        "vocab_size": vocab_size, "hidden_act": "silu",
        "max_position_embeddings": spec.get("max_position_embeddings", 32768),
        "tie_word_embeddings": spec.get("tie_word_embeddings", False), "rms_norm_eps": 1e-6,
        "initializer_range": spec["initializer_range"],
        # GRPO trainers turn the cache off for gradient checkpointing and save it that way.
        "use_cache": like != "grpo", "bos_token_id": eot, "eos_token_id": im_end, "pad_token_id": eot,
    }
    section = list(t.pop("mrope_section"))
    head_dim = t.get("head_dim") or t["hidden_size"] // t["num_attention_heads"]
    rotary = head_dim // 4 if family.linear_attention else head_dim  # Qwen3.5 rotates a quarter of each head
    if 2 * sum(section) != rotary:
        raise ValueError(f"mrope_section {section} must sum to {rotary // 2} (half the rotary dims)")
    if family.key in ("qwen2_vl", "qwen2_5_vl"):
        text.update(rope_theta=1000000.0, use_sliding_window=False, max_window_layers=t["num_hidden_layers"],
                    rope_scaling={"type": "mrope", "mrope_section": section})
    elif family.linear_attention:
        text.update(rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                                     "mrope_section": section, "mrope_interleaved": True})
    else:
        text.update(rope_theta=5000000.0, rope_scaling={"rope_type": "default", "mrope_section": section,
                                                        "mrope_interleaved": True})
    text.update(t)
    vision = {"initializer_range": spec["initializer_range"],
              **{k: (list(v) if isinstance(v, list) else v) for k, v in spec["vision"].items()}}
    if family.key == "qwen2_5_vl":
        # patch 14, merge 2, temporal 2 as the real model: one image token per 28x28 pixel block.
        vision = {"in_channels": 3, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
                  "tokens_per_second": 2, "window_size": 112, "hidden_act": "silu", "out_hidden_size": t["hidden_size"],
                  **vision}
    elif family.key == "qwen2_vl":
        vision = {"in_channels": 3, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
                  "hidden_act": "quick_gelu", "hidden_size": t["hidden_size"], **vision}
    else:
        vision["out_hidden_size"] = t["hidden_size"]
    config_class = transformers_class(family.model_class.replace("ForConditionalGeneration", "Config"), family)
    return config_class(
        text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"], bos_token_id=eot, eos_token_id=im_end,
        tie_word_embeddings=spec.get("tie_word_embeddings", False),
    )
