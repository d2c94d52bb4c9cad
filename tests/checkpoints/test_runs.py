"""vlmfast.checkpoints.runs: every checkpoint of a training run, per trainer layout, from tiny fake checkpoint dirs
(a config.json and a hand-written safetensors file: nothing is loaded)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from vlmfast.errors import InputError
from vlmfast.checkpoints.runs import RunCheckpoint, find_run_checkpoints, weights_complete

SWIFT_OLD, SWIFT_NEW, SWIFT_EMPTY = "v0-20250101-000000", "v1-20250102-000000", "v2-20250103-000000"


def _safetensors(path: Path, n: int = 4, cut: int = 0) -> Path:
    """A real safetensors file with one float32 tensor of ``n`` values; ``cut`` bytes short of complete."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]},
                         "__metadata__": {"format": "pt"}}).encode()
    data = struct.pack("<Q", len(header)) + header + struct.pack(f"<{n}f", *range(n))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data[: len(data) - cut])
    return path


def _model(d: Path, cut: int = 0) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text('{"model_type": "qwen2_5_vl"}')
    _safetensors(d / "model.safetensors", cut=cut)
    (d / "training_args.bin").write_bytes(b"pickled arguments")  # HF Trainer's, not weights
    return d


def _adapter(d: Path, cut: int = 0) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "adapter_config.json").write_text('{"base_model_name_or_path": "base", "peft_type": "LORA"}')
    _safetensors(d / "adapter_model.safetensors", cut=cut)
    return d


def _fsdp_step(actor: Path) -> None:
    (actor / "huggingface").mkdir(parents=True)
    (actor / "huggingface" / "config.json").write_text("{}")
    for rank in range(2):
        (actor / f"model_world_size_2_rank_{rank}.pt").write_bytes(b"shard")


def _steps(listing) -> list[tuple[int, str, str]]:
    return [(c.step, c.path.relative_to(listing.run_dir).as_posix(), c.layout) for c in listing.checkpoints]


def test_hf_trainer_checkpoints_in_numeric_step_order(tmp_path):
    for n in (100, 2, 10):
        _model(tmp_path / f"checkpoint-{n}")
    (tmp_path / "checkpoint-5").mkdir()  # nothing written
    (tmp_path / "checkpoint-5" / "training_args.bin").write_bytes(b"")  # the trainer's, not weights
    _model(tmp_path / "checkpoint-7")
    (tmp_path / "checkpoint-7" / "config.json").unlink()  # weights without their config
    _adapter(tmp_path / "checkpoint-20")  # TRL with peft
    listing = find_run_checkpoints(tmp_path)
    assert _steps(listing) == [(2, "checkpoint-2", "hf-trainer"), (10, "checkpoint-10", "hf-trainer"),
                               (20, "checkpoint-20", "lora"), (100, "checkpoint-100", "hf-trainer")]
    assert listing.steps == [2, 10, 20, 100]
    assert [(s.path.name, s.step, s.reason) for s in listing.skipped] == [
        ("checkpoint-5", 5, "no config.json and no weights"), ("checkpoint-7", 7, "weights but no config.json")]


def test_final_model_in_the_run_dir(tmp_path):
    _model(tmp_path / "checkpoint-10")
    _model(tmp_path)  # trainer.save_model(output_dir) at the end
    listing = find_run_checkpoints(tmp_path)
    assert listing.steps == [10]
    assert listing.skipped[0].path == tmp_path and listing.skipped[0].step is None
    assert "no trainer_state.json" in listing.skipped[0].reason
    assert listing.skipped[0].hint == f"evaluate it on its own: vlmfast infer --ckpt {tmp_path}"
    (tmp_path / "trainer_state.json").write_text('{"global_step": 12}')
    assert _steps(find_run_checkpoints(tmp_path))[-1] == (12, ".", "hf-trainer")
    (tmp_path / "trainer_state.json").write_text('{"global_step": 10}')
    listing = find_run_checkpoints(tmp_path)
    assert listing.steps == [10] and "the same step as checkpoint-10" in listing.skipped[0].reason


def test_ms_swift_latest_run_only(tmp_path):
    for n in (2, 4):
        _model(tmp_path / SWIFT_OLD / f"checkpoint-{n}")
    _model(tmp_path / SWIFT_NEW / "checkpoint-6")
    _adapter(tmp_path / SWIFT_NEW / "checkpoint-8")
    (tmp_path / SWIFT_EMPTY).mkdir()  # started, nothing saved yet
    listing = find_run_checkpoints(tmp_path)
    assert _steps(listing) == [(6, f"{SWIFT_NEW}/checkpoint-6", "ms-swift"), (8, f"{SWIFT_NEW}/checkpoint-8", "lora")]
    skipped = [(s.path.relative_to(tmp_path).as_posix(), s.step) for s in listing.skipped]
    assert skipped == [(f"{SWIFT_OLD}/checkpoint-2", 2), (f"{SWIFT_OLD}/checkpoint-4", 4), (SWIFT_EMPTY, None)]
    old = listing.skipped[0]
    assert old.reason == f"in an older ms-swift run ({SWIFT_OLD}); using {SWIFT_NEW}"
    assert old.hint == f"sweep that run on its own: pass {tmp_path / SWIFT_OLD}"
    assert find_run_checkpoints(tmp_path / SWIFT_OLD).steps == [2, 4]  # a vX run dir itself
    assert find_run_checkpoints(tmp_path / SWIFT_OLD).checkpoints[0].layout == "ms-swift"
    _model(tmp_path / SWIFT_NEW / "checkpoint-8-merged")  # swift export --merge_lora
    assert _steps(find_run_checkpoints(tmp_path))[1] == (8, f"{SWIFT_NEW}/checkpoint-8-merged", "ms-swift")


def test_easyr1_merged_steps_and_fsdp_shards_skipped_with_merge_hint(tmp_path):
    _model(tmp_path / "global_step_2" / "actor" / "huggingface")
    _fsdp_step(tmp_path / "global_step_4" / "actor")
    (tmp_path / "global_step_6" / "actor").mkdir(parents=True)  # verl: shards without huggingface/ config
    for rank in range(4):
        (tmp_path / "global_step_6" / "actor" / f"model_world_size_4_rank_{rank}.pt").write_bytes(b"shard")
    listing = find_run_checkpoints(tmp_path)
    assert _steps(listing) == [(2, "global_step_2/actor/huggingface", "easyr1")]
    assert [(s.step, s.reason) for s in listing.skipped] == [
        (4, "2 FSDP shards (model_world_size_2_rank_0.pt, ...) not merged into actor/huggingface"),
        (6, "4 FSDP shards (model_world_size_4_rank_0.pt, ...) not merged into actor/huggingface")]
    actor = tmp_path / "global_step_4" / "actor"
    assert f"scripts/model_merger.py --local_dir {actor}" in listing.skipped[0].hint


def test_all_unmerged_is_an_error_with_the_merge_hint(tmp_path):
    _fsdp_step(tmp_path / "global_step_4" / "actor")
    with pytest.raises(InputError, match="none of its checkpoint dirs can be evaluated") as err:
        find_run_checkpoints(tmp_path)
    assert "model_merger.py" in err.value.hint and len(err.value.problems) == 1


def test_none_evaluable_names_each_dir_and_its_reason_in_the_message(tmp_path):
    """The terminal shows an error's message and hint only: every skipped dir must be in them, as the docs say
    ("exits 2 naming each reason"); a sweep has no --ckpt to point at."""
    _model(tmp_path / "checkpoint-20", cut=3)
    (tmp_path / "checkpoint-30").mkdir()
    (tmp_path / "checkpoint-30" / "config.json").write_text('{"model_type": "qwen2_5_vl"}')
    with pytest.raises(InputError) as err:
        find_run_checkpoints(tmp_path)
    assert "checkpoint-20: the weights are incomplete" in err.value.message
    assert "checkpoint-30: config.json but no weights" in err.value.message
    _fsdp_step(tmp_path / "easy" / "global_step_2" / "actor")
    _fsdp_step(tmp_path / "easy" / "global_step_4" / "actor")
    with pytest.raises(InputError) as err:
        find_run_checkpoints(tmp_path / "easy")
    assert "global_step_2: 2 FSDP shards" in err.value.message and "global_step_4: 2 FSDP shards" in err.value.message
    assert "--ckpt" not in err.value.hint and "rerun the sweep" in err.value.hint
    assert str(tmp_path / "easy" / "global_step_4" / "actor") in err.value.hint  # each step's merge command


def test_not_a_run(tmp_path):
    with pytest.raises(InputError, match="no such directory"):
        find_run_checkpoints(tmp_path / "nope")
    with pytest.raises(InputError, match=r"no checkpoints found \(looked for checkpoint-N/, vX-\*/checkpoint-N/"):
        find_run_checkpoints(tmp_path)
    assert find_run_checkpoints(tmp_path, complete_only=True).checkpoints == []  # a run that has not saved yet
    model = _model(tmp_path / "model")
    with pytest.raises(InputError, match="a single checkpoint") as err:
        find_run_checkpoints(model)
    assert err.value.hint == f"evaluate it with: vlmfast infer --ckpt {model}"
    for single in (_adapter(tmp_path / "adapter"), _model(tmp_path / "global_step_9" / "actor" / "huggingface").parent.parent):
        with pytest.raises(InputError, match="a single checkpoint"):
            find_run_checkpoints(single)


def test_steps_filter(tmp_path):
    for n in (2, 10, 100):
        _model(tmp_path / f"checkpoint-{n}")
    (tmp_path / "checkpoint-5").mkdir()
    assert find_run_checkpoints(tmp_path, steps=[100, 2]).steps == [2, 100]
    assert find_run_checkpoints(tmp_path, steps=[2]).skipped == []
    with pytest.raises(InputError, match="no checkpoint for step 3, 7") as err:
        find_run_checkpoints(tmp_path, steps=[3, 2, 7])
    assert err.value.hint == "steps found: 2, 10, 100"
    with pytest.raises(InputError, match=r"step 5 \(step 5: no config.json and no weights\)"):
        find_run_checkpoints(tmp_path, steps=[5])
    assert find_run_checkpoints(tmp_path, steps=[2, 300], complete_only=True).steps == [2]  # 300: not saved yet


def test_complete_only_lists_half_written_checkpoints_as_pending(tmp_path):
    _model(tmp_path / "checkpoint-2")
    _model(tmp_path / "checkpoint-4", cut=3)  # weights still being written
    (tmp_path / "checkpoint-6").mkdir()  # just created
    _adapter(tmp_path / "checkpoint-8", cut=1)
    (tmp_path / "checkpoint-10").mkdir()
    (tmp_path / "checkpoint-10" / "config.json").write_text("{}")
    (tmp_path / "checkpoint-10" / "training_args.bin").write_bytes(b"x")  # arguments written, no weights yet
    everything = find_run_checkpoints(tmp_path)  # a half-written save is listed as skipped, never loaded
    assert everything.steps == [2] and [s.step for s in everything.skipped] == [4, 6, 8, 10]
    assert all("weights are incomplete" in s.reason for s in everything.skipped if s.step in (4, 8))
    assert everything.skipped[3].reason == "config.json but no weights (*.safetensors / *.bin)"
    ready = find_run_checkpoints(tmp_path, complete_only=True)
    assert ready.checkpoints == [RunCheckpoint(2, tmp_path / "checkpoint-2", "hf-trainer")]
    assert [(s.step, s.pending) for s in ready.skipped] == [(4, True), (6, True), (8, True), (10, True)]
    assert not any(s.pending for s in everything.skipped)


def test_weights_complete_safetensors_lengths(tmp_path):
    assert weights_complete(_model(tmp_path / "full"))
    assert not weights_complete(_model(tmp_path / "short", cut=1))
    assert not weights_complete(_model(tmp_path / "header", cut=60))  # inside the JSON header
    assert weights_complete(_adapter(tmp_path / "adapter"))
    assert not weights_complete(_adapter(tmp_path / "adapter-short", cut=1))
    assert not weights_complete(tmp_path / "nothing")
    bin_model = tmp_path / "bin"
    bin_model.mkdir()
    (bin_model / "config.json").write_text("{}")
    (bin_model / "pytorch_model.bin").write_bytes(b"")
    assert not weights_complete(bin_model)  # an empty .bin: not written yet
    (bin_model / "pytorch_model.bin").write_bytes(b"PK")
    assert weights_complete(bin_model)


def test_a_cut_header_and_a_corrupt_one_are_told_apart_and_named(tmp_path):
    """A header the file ends inside is a save still being written; a full-length file whose header bytes are
    not safetensors is corrupt: the reason says which, naming the file (not "shorter than its header says")."""
    from vlmfast.checkpoints.readers import incomplete_said

    cut = _model(tmp_path / "run" / "checkpoint-1", cut=60)
    corrupt = _model(tmp_path / "run" / "checkpoint-2")
    weights = next(corrupt.glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[8:40] = b"\xff" * 32  # inside the JSON header, every byte still there
    weights.write_bytes(bytes(data))
    garbage = _model(tmp_path / "run" / "checkpoint-3")
    weights3 = next(garbage.glob("*.safetensors"))
    weights3.write_bytes(b"\xff" * 8 + weights3.read_bytes()[8:])
    assert incomplete_said(cut).endswith("its header cannot be read (cut short, or still being written)")
    assert incomplete_said(corrupt) == (f"the weights are incomplete: {weights.name}: its header is not valid safetensors "
                                        "JSON though every byte of it is there (a corrupt file: save it again)")
    assert "not a safetensors file: its first 8 bytes are no header length" in incomplete_said(garbage)
    _model(tmp_path / "run" / "checkpoint-4")
    reasons = {s.step: s.reason for s in find_run_checkpoints(tmp_path / "run").skipped}
    assert reasons == {1: incomplete_said(cut), 2: incomplete_said(corrupt), 3: incomplete_said(garbage)}


def test_weights_complete_sharded(tmp_path):
    d = tmp_path / "sharded"
    d.mkdir()
    (d / "config.json").write_text("{}")
    names = [f"model-0000{i}-of-00002.safetensors" for i in (1, 2)]
    _safetensors(d / names[0])
    assert not weights_complete(d)  # first shard written, no index yet: save_pretrained writes it last
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": {"a": names[0], "b": names[1]}}))
    assert not weights_complete(d)  # the index names a shard that is not there
    _safetensors(d / names[1], cut=2)
    assert not weights_complete(d)
    _safetensors(d / names[1])
    assert weights_complete(d)


def test_a_merged_export_whose_adapter_dir_is_gone_is_its_step(tmp_path):
    """ms-swift: checkpoint-50/ (an adapter) and checkpoint-100-merged/ (swift export --merge_lora), the step-100
    adapter dir deleted: step 100 is the merged model, for a sweep and for --ckpt on the run."""
    from vlmfast.checkpoints.locate import locate

    run = tmp_path / SWIFT_NEW
    _adapter(run / "checkpoint-50")
    merged = _model(run / "checkpoint-100-merged")
    assert _steps(find_run_checkpoints(tmp_path)) == [(50, f"{SWIFT_NEW}/checkpoint-50", "lora"),
                                                      (100, f"{SWIFT_NEW}/checkpoint-100-merged", "ms-swift")]
    assert locate(str(tmp_path)).path == merged and locate(str(run)).path == merged
    assert "highest of 2 checkpoint-N dirs" in locate(str(run)).note
    _adapter(run / "checkpoint-100")  # the adapter kept beside its export: one step 100, the merged model
    assert _steps(find_run_checkpoints(run)) == [(50, "checkpoint-50", "lora"), (100, "checkpoint-100-merged", "ms-swift")]
    assert locate(str(run)).path == merged


def test_two_dirs_of_one_step_give_one_checkpoint_and_the_other_is_skipped(tmp_path):
    """checkpoint-100 and checkpoint-0100 would both be step 100 and write one step-100.jsonl, the second replacing
    the first's rows with a false "the weights changed" note; the plain spelling stands for the step."""
    _model(tmp_path / "checkpoint-100")
    _model(tmp_path / "checkpoint-0100")
    _model(tmp_path / "checkpoint-200")
    listing = find_run_checkpoints(tmp_path)
    assert [(c.step, c.path.name) for c in listing.checkpoints] == [(100, "checkpoint-100"), (200, "checkpoint-200")]
    assert [(s.step, s.path.name) for s in listing.skipped] == [(100, "checkpoint-0100")]
    assert "another dir of step 100 (checkpoint-100) stands for it" in listing.skipped[0].reason
