"""Weight swaps: a head the load left untied stays untied (whatever the config says), and the next
checkpoint's generation config comes along."""

from __future__ import annotations

import json

import torch


def test_a_swap_keeps_an_untied_head_untied_and_takes_the_next_generation_config(tmp_path):
    from vlmfast.checkpoints.load import load
    from vlmfast.checkpoints.locate import locate
    from vlmfast.checkpoints.swap import plan_swap, swap_into
    from vlmfast.checkpoints.tiny import build_checkpoint

    first = build_checkpoint(tmp_path / "a", preset="tiny", like="grpo", seed=1)
    second = build_checkpoint(tmp_path / "b", preset="tiny", like="grpo", seed=2)
    gen = json.loads((second / "generation_config.json").read_text())
    gen["repetition_penalty"] = 1.25
    (second / "generation_config.json").write_text(json.dumps(gen))
    loaded = load(locate(first), device="cpu", dtype="float32")
    model = loaded.model
    model.config.get_text_config().tie_word_embeddings = True  # the config claims tied; the load left them apart
    head = model.get_output_embeddings().weight
    assert head is not model.get_input_embeddings().weight
    swapped = swap_into(loaded, locate(second), plan_swap(loaded, second))
    fresh = load(locate(second), device="cpu", dtype="float32").model
    assert model.get_output_embeddings().weight is head  # the same storage a captured graph reads
    assert torch.equal(head, fresh.get_output_embeddings().weight)
    assert not torch.equal(head, model.get_input_embeddings().weight)
    assert swapped.model.generation_config.repetition_penalty == 1.25 and swapped.model.generation_config.use_cache


def test_a_swap_into_a_checkpoint_without_a_generation_config_derives_it_from_its_config(tmp_path):
    """No generation_config.json saved: the next checkpoint runs with what its config.json gives (as a fresh
    load of it does), not with the last checkpoint's repetition penalty."""
    from vlmfast.checkpoints.load import load
    from vlmfast.checkpoints.locate import locate
    from vlmfast.checkpoints.swap import plan_swap, swap_into
    from vlmfast.checkpoints.tiny import build_checkpoint

    first = build_checkpoint(tmp_path / "a", preset="tiny", like="grpo", seed=1)
    gen = json.loads((first / "generation_config.json").read_text())
    (first / "generation_config.json").write_text(json.dumps({**gen, "repetition_penalty": 1.8}))
    second = build_checkpoint(tmp_path / "b", preset="tiny", like="grpo", seed=2)
    (second / "generation_config.json").unlink()
    loaded = load(locate(first), device="cpu", dtype="float32")
    assert loaded.model.generation_config.repetition_penalty == 1.8
    swapped = swap_into(loaded, locate(second), plan_swap(loaded, second))
    fresh = load(locate(second), device="cpu", dtype="float32").model.generation_config
    ours = swapped.model.generation_config.repetition_penalty
    assert ours == fresh.repetition_penalty and (ours or 1.0) == 1.0  # None on transformers 5: no penalty
    assert swapped.model.generation_config.use_cache


def test_a_checkpoint_with_other_prompting_files_is_loaded_afresh_not_swapped(tmp_path):
    """Another chat template (or a processor file one of them lacks) makes other prompts: the loaded
    processor must not serve it, in place (vlmfast's engine) or reloaded (vLLM's); the same files swap."""
    from vlmfast.checkpoints.load import load
    from vlmfast.checkpoints.locate import locate
    from vlmfast.checkpoints.swap import layout_difference, plan_swap
    from vlmfast.checkpoints.tiny import build_checkpoint

    first = build_checkpoint(tmp_path / "a", preset="tiny", like="grpo", seed=1)
    same = build_checkpoint(tmp_path / "b", preset="tiny", like="grpo", seed=2)
    loaded = load(locate(first), device="cpu", dtype="float32")
    assert plan_swap(loaded, same).files is not None and layout_difference(first, same) is None

    template = same / "chat_template.jinja"
    template.write_text("<|im_start|>system\nBe brief.<|im_end|>\n" + template.read_text())
    plan = plan_swap(loaded, same)
    assert plan.files is None and "chat_template.jinja" in plan.reason
    assert "chat_template.jinja" in layout_difference(first, same)

    lost = build_checkpoint(tmp_path / "c", preset="tiny", like="grpo", seed=3)
    # transformers 5.x saves the image processor's settings in processor_config.json, 4.57 in preprocessor_config.json
    name = next(n for n in ("processor_config.json", "preprocessor_config.json") if (lost / n).is_file())
    (lost / name).unlink()
    plan = plan_swap(loaded, lost)
    assert plan.files is None and plan.reason.endswith(f"loaded ones: {name}")


def test_a_swap_into_a_generation_config_transformers_refuses_stops_before_a_tensor_is_copied(tmp_path):
    """A sweep's next checkpoint whose generation_config.json transformers refuses to load (max_new_tokens 0):
    a CheckpointError (a sweep goes on without it) naming the file, the key and the value, with the loaded model still the last checkpoint's
    (was a ValueError from GenerationConfig after its weights were copied in)."""
    import pytest

    from vlmfast.checkpoints.load import load
    from vlmfast.checkpoints.locate import locate
    from vlmfast.checkpoints.swap import plan_swap, swap_into
    from vlmfast.checkpoints.tiny import build_checkpoint
    from vlmfast.errors import CheckpointError

    first = build_checkpoint(tmp_path / "a", preset="tiny", like="grpo", seed=1)
    second = build_checkpoint(tmp_path / "b", preset="tiny", like="grpo", seed=2)
    gen = json.loads((second / "generation_config.json").read_text())
    (second / "generation_config.json").write_text(json.dumps({**gen, "max_new_tokens": 0}))
    loaded = load(locate(first), device="cpu", dtype="float32")
    before = loaded.model.get_input_embeddings().weight.clone()
    with pytest.raises(CheckpointError, match=r"b/generation_config.json: max_new_tokens 0: transformers refuses") as said:
        swap_into(loaded, locate(second), plan_swap(loaded, second))
    assert said.value.hint == f"vlmfast fix {second} (max_new_tokens dropped)"
    assert torch.equal(loaded.model.get_input_embeddings().weight, before)
