"""Test helper: trainer output layouts around a tiny checkpoint, what users point ``--ckpt`` at after
an RL run — VLM-R1 ``checkpoint-N``, EasyR1 ``global_step_N/actor`` with
FSDP shards, ms-swift ``vX-…/checkpoint-N`` (full or LoRA) — for doctor/fix/resolution tests and demos.
Deterministic: ms-swift's run dir name is fixed.
"""

from __future__ import annotations

import pathlib
import shutil
import tempfile
import warnings
from dataclasses import dataclass

from vlmfast.files import publish_directory
from vlmfast.checkpoints.tiny import PRESETS, STAMP, _build_into, _existing_checkpoint, _read_json, _write_json, build_checkpoint

LAYOUTS = ("vlmr1", "easyr1", "swift", "swift-lora", "base")
_SWIFT_RUN = "v0-20250101-000000"
_LORA = {"r": 4, "lora_alpha": 8, "b_std": 0.05,
         "target": r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"}


@dataclass(frozen=True)
class LayoutInfo:
    """Where :func:`build_layout` put things. ``root`` is the trainer output dir (what a user passes
    to ``--ckpt``); ``model_dir`` is where resolution should land (``checkpoint-10``,
    ``global_step_4/actor/huggingface``, the adapter dir, or ``root``); ``base`` is the base checkpoint
    a LoRA adapter names; ``actor`` the EasyR1 dir holding the FSDP shards."""

    like: str
    root: pathlib.Path
    model_dir: pathlib.Path
    base: pathlib.Path | None = None
    actor: pathlib.Path | None = None


def _layout_info(out: pathlib.Path, like: str) -> LayoutInfo:
    swift_ckpt = out / _SWIFT_RUN / "checkpoint-4"
    actor = out / "global_step_4" / "actor"
    return {
        "base": LayoutInfo(like, out, out),
        "vlmr1": LayoutInfo(like, out, out / "checkpoint-10"),
        "easyr1": LayoutInfo(like, out, actor / "huggingface", actor=actor),
        "swift": LayoutInfo(like, out, swift_ckpt),
        "swift-lora": LayoutInfo(like, out, swift_ckpt, base=out / "base"),
    }[like]


def build_layout(out_dir, like: str, preset: str = "tiny", seed: int = 0, overwrite: bool = False) -> LayoutInfo:
    """Build a trainer's output directory structure around a tiny checkpoint in ``out_dir``.

    ``like``: ``vlmr1`` (``checkpoint-2``, ``checkpoint-10``: HF Trainer files, trainer_state.json,
    saved cache-off), ``easyr1`` (``global_step_{2,4}/actor/``: FSDP shards
    ``model_world_size_2_rank_{0,1}.pt`` and ``huggingface/`` with configs and processor but no merged
    weights; its generation_config lost ``<|im_end|>`` as in EasyR1 PR#11007), ``swift``
    (``v0-20250101-000000/checkpoint-4``: full weights, args.json with train_type "full"),
    ``swift-lora`` (same path: a real peft LoRA adapter with nonzero B, naming ``out_dir/base``, which is
    built too; args.json train_type "lora") or ``base`` (exactly :func:`build_checkpoint` like="base").
    Same arguments and ``out_dir`` give the same bytes (swift-lora records the base's absolute path).
    Reuse/overwrite rules and the atomic move into place are those of :func:`build_checkpoint`.
    """
    if like not in LAYOUTS:
        raise ValueError(f"unknown layout {like!r}; valid layouts: {', '.join(LAYOUTS)}")
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; valid presets: {', '.join(PRESETS)}")
    out = pathlib.Path(out_dir)
    if like == "base":
        build_checkpoint(out, preset, "base", seed, overwrite)
        return _layout_info(out, like)
    import transformers

    stamp = {"builder": "vlmfast.tiny", "format": 1, "like": like, "preset": preset, "seed": int(seed),
             "transformers_version": transformers.__version__}
    if not overwrite and _existing_checkpoint(out, stamp):
        return _layout_info(out, like)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.building-", dir=out.parent))
    try:
        spec, seed = PRESETS[preset], int(seed)
        if like == "swift-lora":
            _swift_lora(tmp, out.resolve(), spec, seed)
        else:
            model = tmp / ".model"
            _build_into(model, spec, "grpo", seed)
            {"vlmr1": _vlmr1, "easyr1": _easyr1, "swift": _swift}[like](tmp, model, seed)
            shutil.rmtree(model)
        files = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file())
        _write_json(tmp / STAMP, {**stamp, "files": files})
        publish_directory(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return _layout_info(out, like)


def _copy_model(src: pathlib.Path, dst: pathlib.Path, skip=()) -> None:
    dst.mkdir(parents=True)
    for f in sorted(src.iterdir()):
        if f.is_file() and f.name not in skip:
            shutil.copyfile(f, dst / f.name)


def _trainer_state(d: pathlib.Path, step: int, max_steps: int) -> None:
    # The fields doctor reads, as HF Trainer writes them (VLM-R1 and ms-swift use HF Trainer).
    _write_json(d / "trainer_state.json", {
        "best_metric": None, "best_model_checkpoint": None, "epoch": round(step / max_steps, 4),
        "global_step": step, "is_world_process_zero": True, "max_steps": max_steps,
        "log_history": [{"epoch": round(step / max_steps, 4), "learning_rate": 1e-06, "loss": 0.0,
                         "reward": round(0.25 + 0.05 * step, 4), "step": step}],
    })


def _vlmr1(out: pathlib.Path, model: pathlib.Path, seed: int) -> None:
    import torch

    for step in (2, 10):
        d = out / f"checkpoint-{step}"
        _copy_model(model, d)
        _trainer_state(d, step, 10)
        # HF Trainer pickles its TrainingArguments here: a .bin that is not weights (doctor must not flag it).
        torch.save({"output_dir": "output/vlmr1", "seed": seed}, d / "training_args.bin")


def _easyr1(out: pathlib.Path, model: pathlib.Path, seed: int) -> None:
    import torch
    from safetensors.torch import load_file

    state = load_file(str(model / "model.safetensors"))
    for step in (2, 4):
        actor = out / f"global_step_{step}" / "actor"
        _copy_model(model, actor / "huggingface", skip=("model.safetensors",))
        gen = _read_json(actor / "huggingface" / "generation_config.json")
        gen["eos_token_id"] = gen["pad_token_id"]  # <|endoftext|> only: <|im_end|> lost (EasyR1 PR#11007)
        _write_json(actor / "huggingface" / "generation_config.json", gen)
        # FSDP Shard(0) stand-in: rank r holds chunk r of dim 0 of every tensor (plain tensors, not
        # DTensors). clone(): torch.save of a view would write the whole storage.
        for rank in range(2):
            torch.save({k: v.tensor_split(2, dim=0)[rank].clone() for k, v in state.items()},
                       actor / f"model_world_size_2_rank_{rank}.pt")


def merge_fsdp_shards(actor_dir) -> pathlib.Path:
    """Stand-in for EasyR1's ``scripts/model_merger.py`` on :func:`build_layout` ``easyr1`` shards:
    concatenate the ranks' chunks and write ``actor_dir/huggingface/model.safetensors``. Returns the
    ``huggingface`` dir. (Real EasyR1 shards are DTensors: use EasyR1's script for those.)"""
    import torch
    from safetensors.torch import save_file

    actor = pathlib.Path(actor_dir)
    shards = sorted(actor.glob("model_world_size_*_rank_*.pt"), key=lambda p: int(p.stem.rsplit("_", 1)[1]))
    parts = [torch.load(p, map_location="cpu", weights_only=True) for p in shards]
    if not parts:
        raise ValueError(f"{actor}: no model_world_size_*_rank_*.pt shards")
    save_file({k: torch.cat([p[k] for p in parts], dim=0).contiguous() for k in parts[0]},
              str(actor / "huggingface" / "model.safetensors"), metadata={"format": "pt"})
    return actor / "huggingface"


def _swift_args(d: pathlib.Path, model: str, train_type: str, seed: int) -> None:
    args = {"model": model, "model_type": "qwen2_5_vl", "train_type": train_type, "rlhf_type": "grpo",
            "torch_dtype": "bfloat16", "output_dir": f"output/{_SWIFT_RUN}", "gradient_checkpointing": True,
            "num_train_epochs": 1, "seed": seed}
    if train_type == "lora":
        args.update(lora_rank=_LORA["r"], lora_alpha=_LORA["lora_alpha"], target_modules=["all-linear"])
    for where in (d.parent, d):  # ms-swift writes args.json in the run dir and in each checkpoint
        _write_json(where / "args.json", args)


def _swift(out: pathlib.Path, model: pathlib.Path, seed: int) -> None:
    d = out / _SWIFT_RUN / "checkpoint-4"
    _copy_model(model, d)
    _trainer_state(d, 4, 4)
    _swift_args(d, "Qwen/Qwen2.5-VL-3B-Instruct", "full", seed)


def _swift_lora(out: pathlib.Path, final: pathlib.Path, spec: dict, seed: int) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2_5_VLForConditionalGeneration
    from transformers.utils import logging as hf_logging

    _build_into(out / "base", spec, "base", seed)
    d = out / _SWIFT_RUN / "checkpoint-4"
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # 5.x: peft calls a deprecated checkpointing alias
            model = Qwen2_5_VLForConditionalGeneration.from_pretrained(str(out / "base"), dtype=torch.float32)
            torch.manual_seed(seed)  # lora_A's kaiming init draws from the global generator
            peft_model = get_peft_model(model, LoraConfig(
                r=_LORA["r"], lora_alpha=_LORA["lora_alpha"], lora_dropout=0.0, target_modules=_LORA["target"],
                task_type="CAUSAL_LM"))
        # Trained LoRA has B != 0 (peft initialises B to zero, which would make merged == base).
        gen = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for name, p in peft_model.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=gen) * _LORA["b_std"])
        peft_model.save_pretrained(str(d))
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    (d / "README.md").unlink(missing_ok=True)  # peft's model card: versions and paths, not needed
    cfg = _read_json(d / "adapter_config.json")
    cfg["base_model_name_or_path"] = str(final / "base")  # peft recorded the temporary build path
    _write_json(d / "adapter_config.json", cfg)
    _trainer_state(d, 4, 4)
    _swift_args(d, str(final / "base"), "lora", seed)
