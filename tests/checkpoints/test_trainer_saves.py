"""What trainers leave on disk: a final save still being written, DeepSpeed ZeRO shards, an index that does not
name every tensor of its shards (locate, runs, swap, doctor)."""

from __future__ import annotations

import importlib.metadata
import json
import shutil

import pytest

from vlmfast.checkpoints.doctor import diagnose
from vlmfast.checkpoints.locate import locate, require
from vlmfast.checkpoints.readers import tensor_index
from vlmfast.checkpoints.runs import find_run_checkpoints
from vlmfast.checkpoints.weights import require_whole
from vlmfast.errors import CheckpointError


def _run_with_cut_final_save(grpo_ckpt, tmp_path):
    """HF Trainer / open-r1: checkpoint-N dirs, then save_state() (trainer_state.json at the top, the last step)
    and save_model() into the run dir itself, whose model.safetensors is still being written."""
    run = tmp_path / "run"
    for n in (5, 10):
        shutil.copytree(grpo_ckpt, run / f"checkpoint-{n}")
    for f in grpo_ckpt.iterdir():
        shutil.copy(f, run / f.name)
    whole = (grpo_ckpt / "model.safetensors").read_bytes()
    (run / "model.safetensors").write_bytes(whole[: len(whole) // 3])
    (run / "trainer_state.json").write_text(json.dumps({"global_step": 12, "log_history": []}))
    return run


def test_a_cut_final_save_is_skipped_not_listed(grpo_ckpt, tmp_path):
    run = _run_with_cut_final_save(grpo_ckpt, tmp_path)
    listing = find_run_checkpoints(run)
    assert listing.steps == [5, 10]  # not step 12: its weights are a third written
    (final,) = [s for s in listing.skipped if s.path == run]
    assert final.step == 12 and "incomplete" in final.reason and not final.pending
    assert find_run_checkpoints(run, complete_only=True).skipped[-1].pending  # --watch waits for it


def test_locate_passes_over_a_cut_final_save(grpo_ckpt, tmp_path):
    run = _run_with_cut_final_save(grpo_ckpt, tmp_path)
    found = require(locate(str(run)), "model")
    assert found.path == run / "checkpoint-10"
    assert "skipped the model saved at the top of run/" in found.note
    shutil.copy(grpo_ckpt / "model.safetensors", run / "model.safetensors")  # the save finished: taken
    assert locate(str(run)).path == run


def test_swap_does_not_copy_from_a_cut_file(loaded, grpo_ckpt, tmp_path):
    from vlmfast.checkpoints.swap import plan_swap

    cut = shutil.copytree(grpo_ckpt, tmp_path / "cut")
    whole = (grpo_ckpt / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(whole[: len(whole) // 3])
    plan = plan_swap(loaded, cut)
    assert plan.files is None and "incomplete" in plan.reason  # a full load names the file instead of crashing
    assert plan_swap(loaded, grpo_ckpt).files is not None


def _zero3(grpo_ckpt, d):
    """HF Trainer under ZeRO-3 without stage3_gather_16bit_weights_on_model_save: configs, the ZeRO shards, no weights."""
    shutil.copytree(grpo_ckpt, d, ignore=shutil.ignore_patterns("model.safetensors"))
    (d / "global_step30").mkdir()
    (d / "global_step30" / "mp_rank_00_model_states.pt").write_bytes(b"pickle")
    (d / "global_step30" / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"pickle")
    (d / "latest").write_text("global_step30")
    (d / "zero_to_fp32.py").write_text("# DeepSpeed's script\n")
    return d


def test_deepspeed_zero_shards_are_named_with_their_fix(grpo_ckpt, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(grpo_ckpt, run / "checkpoint-20")
    d = _zero3(grpo_ckpt, run / "checkpoint-30")
    with pytest.raises(CheckpointError, match="DeepSpeed ZeRO shards in global_step30/ not consolidated") as err:
        require(locate(str(d)), "model")
    assert "zero_to_fp32.py" in err.value.hint
    assert "checkpoint-30 (DeepSpeed ZeRO shards not consolidated)" in locate(str(run)).note
    (skip,) = find_run_checkpoints(run, complete_only=True).skipped
    assert "DeepSpeed" in skip.reason and "zero_to_fp32.py" in skip.hint and not skip.pending  # never written: no wait
    (missing,) = [f for f in diagnose(d) if f.code == "weights-missing"]
    assert "zero_to_fp32.py" in missing.fix and "save again" not in missing.fix


def test_zero3_s_empty_placeholder_weights_are_named_with_their_fix(grpo_ckpt, tmp_path):
    """ZeRO-3 without gathering on save can also write model.safetensors with every tensor of shape [0]: not a
    vocabulary to resize nor a config.json to swap, but placeholders whose weights are in the ZeRO shards."""
    import torch
    from safetensors.torch import load_file, save_file

    d = _zero3(grpo_ckpt, tmp_path / "checkpoint-30")
    state = load_file(str(grpo_ckpt / "model.safetensors"))
    save_file({k: torch.empty(0, dtype=v.dtype) for k, v in state.items()}, str(d / "model.safetensors"),
              metadata={"format": "pt"})
    findings = diagnose(d)
    assert not [f for f in findings if f.code == "vocab-mismatch"]
    (shapes,) = [f for f in findings if f.code == "weights-shape-mismatch"]
    assert f"{len(state)} of them saved empty" in shapes.message and "ZeRO-3" in shapes.message
    assert f"python {d / 'zero_to_fp32.py'} {d} {d}" in shapes.fix and "config.json" not in shapes.fix
    with pytest.raises(CheckpointError, match=f"{len(state)} tensor.s. saved empty") as err:
        require_whole(locate(str(d)))
    assert "zero_to_fp32.py" in err.value.hint and "move the empty model" in err.value.hint
    # one empty tensor among real ones is a broken save, not ZeRO-3's placeholders
    mixed = {k: (torch.empty(0, dtype=v.dtype) if k == "lm_head.weight" else v) for k, v in state.items()}
    save_file(mixed, str(d / "model.safetensors"), metadata={"format": "pt"})
    (shapes,) = [f for f in diagnose(d) if f.code == "weights-shape-mismatch"]
    assert "ZeRO-3" not in shapes.message and "zero_to_fp32" not in shapes.fix


def test_a_tensor_the_index_does_not_name_is_lost_on_v4(grpo_ckpt, tmp_path, monkeypatch):
    from safetensors.torch import load_file, save_file

    d = shutil.copytree(grpo_ckpt, tmp_path / "sharded", ignore=shutil.ignore_patterns("model.safetensors"))
    state = load_file(str(grpo_ckpt / "model.safetensors"))
    names = sorted(state)
    weight_map = {}
    for i, part in enumerate((names[::2], names[1::2])):
        shard = f"model-0000{i + 1}-of-00002.safetensors"
        save_file({k: state[k] for k in part}, str(d / shard), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, shard))
    del weight_map["lm_head.weight"]  # in its shard, not in the index: 4.57 initialises it at random
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda n: "5.24.0" if n == "transformers" else real(n))
    assert "lm_head.weight" in tensor_index(d)  # 5.x reads every tensor of the shards it opens
    monkeypatch.setattr(importlib.metadata, "version", lambda n: "4.57.6" if n == "transformers" else real(n))
    assert "lm_head.weight" not in tensor_index(d)


def test_a_run_whose_every_checkpoint_is_zero3_shards_names_the_consolidation_command(grpo_ckpt, images, tmp_path):
    """HF Trainer / VLM-R1 under ZeRO-3 for the whole run: no checkpoint-N holds weights. infer, doctor and fix on
    the run dir name the highest step's zero_to_fp32.py command, as they do on that checkpoint itself."""
    from conftest import cli

    run = tmp_path / "run"
    _zero3(grpo_ckpt, run / "checkpoint-10")
    d = _zero3(grpo_ckpt, run / "checkpoint-30")
    found = locate(str(run))
    assert found.path == d and found.kind == "incomplete" and "DeepSpeed ZeRO shards not consolidated" in found.note
    with pytest.raises(CheckpointError, match="DeepSpeed ZeRO shards in global_step30/ not consolidated") as err:
        require(found, "model")
    assert f"python {d / 'zero_to_fp32.py'} {d} {d} --safe_serialization" in err.value.hint
    (missing,) = [f for f in diagnose(run) if f.code == "weights-missing"]
    assert missing.location == str(d) and f"python {d / 'zero_to_fp32.py'}" in missing.fix
    result = cli("infer", "--ckpt", run, "--images", images[0], "--prompt", "hi", "--out", tmp_path / "o.jsonl")
    assert result.returncode == 2 and f"python {d / 'zero_to_fp32.py'}" in result.stderr
    assert not (tmp_path / "o.jsonl").exists()


def _fsdp_sharded(d, step):
    """HF Trainer / TRL under FSDP with SHARDED_STATE_DICT: save_model writes nothing (transformers trainer.py,
    save_model), _save_checkpoint writes accelerate's pytorch_model_fsdp_0/ and optimizer_0/; no config.json."""
    for sub in ("pytorch_model_fsdp_0", "optimizer_0"):
        (d / sub).mkdir(parents=True)
        (d / sub / "__0_0.distcp").write_bytes(b"dcp")
        (d / sub / ".metadata").write_bytes(b"dcp")
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (d / "scheduler.pt").write_bytes(b"pickle")
    return d


def test_an_fsdp_sharded_state_dict_is_named_with_accelerates_merge_command(tmp_path):
    run = tmp_path / "run"
    low, high = _fsdp_sharded(run / "checkpoint-10", 10), _fsdp_sharded(run / "checkpoint-20", 20)
    merge = f"accelerate merge-weights {high / 'pytorch_model_fsdp_0'} {high}"
    with pytest.raises(CheckpointError, match="FSDP sharded state dict in pytorch_model_fsdp_0/ not consolidated") as err:
        locate(str(high))
    assert merge in err.value.hint and "config.json" in err.value.hint and "from the base model" in err.value.hint
    with pytest.raises(CheckpointError, match=r"checkpoint-20 \(FSDP sharded state dict not consolidated\)") as err:
        locate(str(run))
    assert merge in err.value.hint
    listing = find_run_checkpoints(run, complete_only=True)
    assert [(s.step, "FSDP sharded state dict" in s.reason, s.pending) for s in listing.skipped] == [(10, True, False),
                                                                                                     (20, True, False)]
    assert f"accelerate merge-weights {low / 'pytorch_model_fsdp_0'} {low}" in listing.skipped[0].hint
    findings = diagnose(run)
    assert [(f.severity, f.code, f.location) for f in findings] == [
        ("error", "weights-missing", str(high)), ("info", "resolved", str(high)), ("info", "trainer-state", "trainer_state.json")]
    assert merge in findings[0].fix


def test_a_shard_lost_from_a_sharded_save_is_named_before_the_tensors_it_held(grpo_ckpt, tmp_path):
    """An interrupted sharded save: the index names model-00002-of-00002.safetensors, which is absent. The refusal
    (infer, sweep, bench: require_whole) and doctor name the missing file, never --allow-missing for its tensors."""
    from safetensors.torch import load_file, save_file

    d = shutil.copytree(grpo_ckpt, tmp_path / "cut", ignore=shutil.ignore_patterns("model.safetensors"))
    state = load_file(str(grpo_ckpt / "model.safetensors"))
    names = sorted(state)
    parts = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
             "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for file, part in parts.items():
        save_file({n: state[n] for n in part}, str(d / file), metadata={"format": "pt"})
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {n: file for file, part in parts.items() for n in part}}))
    (d / "model-00002-of-00002.safetensors").unlink()  # the save was interrupted
    for allow in ((), ("visual", "lm_head", "model")):
        with pytest.raises(CheckpointError, match="model-00002-of-00002.safetensors: missing") as err:
            require_whole(locate(str(d)), allow)
        assert "--allow-missing" not in err.value.hint
    codes = [f.code for f in diagnose(d)]
    assert "weights-incomplete" in codes and "weights-lost" not in codes
