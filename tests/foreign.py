"""Test helper: a tiny GLM-4.1V checkpoint — a real ``AutoModelForImageTextToText`` class that is not in
vlmfast's family table — to show that a model of an untested family runs through plain generate.

GLM-4.1V is a family GRPO users train (verl, ms-swift) with its own tokens (``<|begin_of_image|>``,
``<|image|>``, ``<|user|>`` …), its own processor and rotary layout, and ships in transformers 4.57 and
5.x. Built offline from vlmfast.checkpoints.tiny's tokenizer trainer, with a GLM-style chat template.
"""

from __future__ import annotations

import pathlib
import tempfile

from vlmfast.checkpoints.tiny import _read_json, _train_tokenizer, _write_json

SPECIAL = ("<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
           "<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>", "<|end_of_video|>", "<|image|>", "<|video|>")
EOS = ("<|endoftext|>", "<|user|>", "<|observation|>")  # GLM-4.1V's generation_config stops on all three
TEMPLATE = r"""[gMASK]<sop>
{%- for turn in messages -%}
{{- '<|' + turn['role'] + '|>\n' -}}
{%- if turn['content'] is string -%}{{- turn['content'] -}}{%- else -%}
{%- for part in turn['content'] -%}
{%- if part.get('type') in ('image', 'image_url') or 'image' in part -%}{{- '<|begin_of_image|><|image|><|end_of_image|>' -}}
{%- elif 'text' in part -%}{{- part['text'] -}}{%- endif -%}
{%- endfor -%}{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|assistant|>\n' -}}{%- endif -%}
"""


def build_glm4v(out: pathlib.Path, seed: int = 0) -> pathlib.Path:
    """A random-weight GLM-4.1V (hidden 64, 2 layers, vision depth 2) with processor and template in ``out``."""
    import torch
    from transformers import (AutoTokenizer, Glm4vConfig, Glm4vForConditionalGeneration, Glm4vImageProcessor,
                              Glm4vProcessor, Glm4vVideoProcessor, GenerationConfig, PreTrainedTokenizerFast)
    from transformers.utils import logging as hf_logging

    out = pathlib.Path(out)
    with tempfile.TemporaryDirectory() as scratch:
        PreTrainedTokenizerFast(tokenizer_object=_train_tokenizer(special_tokens=SPECIAL), eos_token="<|endoftext|>",
                                pad_token="<|endoftext|>", padding_side="left").save_pretrained(scratch)
        tokenizer = AutoTokenizer.from_pretrained(scratch)
    tokenizer.chat_template = TEMPLATE
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL}
    processor = Glm4vProcessor(image_processor=Glm4vImageProcessor(), tokenizer=tokenizer,
                               video_processor=Glm4vVideoProcessor(), chat_template=TEMPLATE)
    processor.save_pretrained(str(out))
    eos = [ids[t] for t in EOS]
    config = Glm4vConfig(
        text_config={"vocab_size": len(tokenizer), "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "num_key_value_heads": 2, "initializer_range": 0.1,
                     "partial_rotary_factor": 0.5, "rope_theta": 10000.0,
                     "rope_scaling": {"type": "default", "mrope_section": [2, 1, 1]},
                     "eos_token_id": eos, "pad_token_id": ids["<|endoftext|>"], "use_cache": False},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "depth": 2, "num_heads": 2, "out_hidden_size": 64,
                       "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "image_size": 56,
                       "initializer_range": 0.1},
        image_token_id=ids["<|image|>"], video_token_id=ids["<|video|>"],
        image_start_token_id=ids["<|begin_of_image|>"], image_end_token_id=ids["<|end_of_image|>"],
        video_start_token_id=ids["<|begin_of_video|>"], video_end_token_id=ids["<|end_of_video|>"],
    )
    torch.manual_seed(seed)
    model = Glm4vForConditionalGeneration(config)
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=ids["<|endoftext|>"], use_cache=False)
    hf_logging.disable_progress_bar()  # 5.x draws a "Writing model shards" bar
    model.save_pretrained(str(out))
    cfg = _read_json(out / "config.json")  # saved as a GRPO run leaves it: cache off everywhere
    cfg["use_cache"] = cfg["text_config"]["use_cache"] = False
    _write_json(out / "config.json", cfg)
    return out
