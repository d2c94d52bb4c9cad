"""A ``model.safetensors`` left beside a sharded set: transformers loads the single file and never reads the
index, so doctor names both sets (which one is loaded, each one's newest file), infer and sweep refuse the
checkpoint before loading, and the fingerprint and whole-weights checks see only the file that is loaded."""

import json
import os
import shutil

import pytest

from conftest import cli

OLD, NEW = 1_700_000_000, 1_700_086_400  # a day apart


def _sharded(src, dst):
    """A copy of ``src`` whose weights are two shards and their index (as save_pretrained shards them)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    (dst / "model.safetensors").unlink()
    names = sorted(tensors)
    weight_map = {}
    for i, part in enumerate((names[: len(names) // 2], names[len(names) // 2:])):
        file = f"model-0000{i + 1}-of-00002.safetensors"
        save_file({n: tensors[n] for n in part}, dst / file, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
    (dst / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return dst


def _stale(src, dst, single_newer=True):
    """The sharded copy of ``src`` with another model's ``model.safetensors`` beside it (every tensor changed)."""
    from safetensors.torch import load_file, save_file

    d = _sharded(src, dst)
    tensors = load_file(src / "model.safetensors")
    save_file({k: v + 1 for k, v in tensors.items()}, d / "model.safetensors", metadata={"format": "pt"})
    single, sharded = (NEW, OLD) if single_newer else (OLD, NEW)
    os.utime(d / "model.safetensors", (single, single))
    for p in [*d.glob("model-*.safetensors"), d / "model.safetensors.index.json"]:
        os.utime(p, (sharded, sharded))
    return d


def _when(t):
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


@pytest.mark.parametrize("single_newer", [True, False])
def test_doctor_names_both_sets_the_one_loaded_and_the_older_one(grpo_ckpt, tmp_path, single_newer):
    from vlmfast.checkpoints.doctor import diagnose, strict_exit_code

    d = _stale(grpo_ckpt, tmp_path / "stale", single_newer)
    found = [f for f in diagnose(d) if f.code == "weights-two-sets"]
    assert len(found) == 1 and found[0].severity == "error" and strict_exit_code(diagnose(d)) == 1
    f = found[0]
    assert f.location == "model.safetensors, model.safetensors.index.json"
    n = len(json.loads((d / "model.safetensors.index.json").read_text())["weight_map"])
    newest_single, newest_sharded = (NEW, OLD) if single_newer else (OLD, NEW)
    assert (f"model.safetensors ({n} tensors, newest file {_when(newest_single)}) and model.safetensors.index.json "
            f"and its 2 shards ({n} tensors, newest file {_when(newest_sharded)})") in f.message
    assert "transformers (4.57 and 5.x alike) loads model.safetensors whenever it exists" in f.message
    assert "vLLM loads only the shards the index names" in f.message
    if single_newer:
        assert "most likely model.safetensors.index.json and its 2 shards, the older one" in f.message
        assert f.fix.endswith("rm model.safetensors.index.json model-00001-of-00002.safetensors "
                              "model-00002-of-00002.safetensors")
    else:
        assert "most likely model.safetensors, the older one" in f.message and f.fix.endswith("rm model.safetensors")
    # the whole-weights check looks at the loaded file only: nothing counted twice, nothing unexpected
    assert not [f for f in diagnose(d) if f.code.startswith("weights-") and f.code != "weights-two-sets"]


def test_one_set_raises_nothing_and_the_same_second_names_no_older_set(grpo_ckpt, tmp_path):
    from vlmfast.checkpoints.doctor import diagnose

    sharded = _sharded(grpo_ckpt, tmp_path / "sharded")
    assert not [f for f in diagnose(sharded) if f.code.startswith("weights-")]
    assert not [f for f in diagnose(grpo_ckpt) if f.code.startswith("weights-")]
    d = _stale(grpo_ckpt, tmp_path / "stale")
    for p in d.glob("model*"):
        os.utime(p, (NEW, NEW))
    f = next(f for f in diagnose(d) if f.code == "weights-two-sets")
    assert "most likely" not in f.message and "the same second" in f.fix and "either rm model.safetensors, or rm" in f.fix


def test_doctor_cli_strict_exits_1_and_json_carries_the_finding(grpo_ckpt, tmp_path):
    d = _stale(grpo_ckpt, tmp_path / "stale")
    r = cli("doctor", d, "--json", "--strict")
    assert r.returncode == 1
    codes = {f["code"] for f in json.loads(r.stdout)["findings"]}
    assert "weights-two-sets" in codes


def test_fingerprint_and_tensor_index_cover_only_the_loaded_file(grpo_ckpt, tmp_path):
    from vlmfast.checkpoints.fingerprint import fingerprint
    from vlmfast.checkpoints.readers import tensor_index

    d = _stale(grpo_ckpt, tmp_path / "stale")
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy2(d / "model.safetensors", alone / "model.safetensors")
    n = len(tensor_index(grpo_ckpt))
    assert len(tensor_index(d)) == n
    assert fingerprint(d) == fingerprint(alone) and fingerprint(d)["tensors"] == n and fingerprint(d)["files"] == 1
    sharded = _sharded(grpo_ckpt, tmp_path / "sharded")  # one set: its shards, as before
    assert fingerprint(sharded)["files"] == 2 and fingerprint(sharded)["tensors"] == n
    assert fingerprint(sharded)["digest"] != fingerprint(d)["digest"]


def test_infer_refuses_before_loading_with_either_engine_and_writes_nothing(grpo_ckpt, images, tmp_path):
    d = _stale(grpo_ckpt, tmp_path / "stale")
    out = tmp_path / "rows.jsonl"
    for engine in (("--device", "cpu"), ("--engine", "vllm")):
        r = cli("infer", "--ckpt", d, "--images", images[0], "--prompt", "Count.", "--max-new-tokens", "2",
                *engine, "--out", out)
        assert r.returncode == 2 and not out.exists()
        assert "two sets of weights" in r.stderr and "loads model.safetensors whenever it exists" in r.stderr
        assert "hint: remove the stale set" in r.stderr


def test_the_loader_and_sweep_s_check_refuse_it(grpo_ckpt, tmp_path):
    from vlmfast.checkpoints.load import load
    from vlmfast.checkpoints.locate import locate
    from vlmfast.checkpoints.readers import require_loadable
    from vlmfast.checkpoints.weights import require_whole
    from vlmfast.errors import CheckpointError

    d = _stale(grpo_ckpt, tmp_path / "stale")
    for refuse in (lambda: require_whole(locate(d)), lambda: require_loadable(d), lambda: load(str(d), device="cpu")):
        with pytest.raises(CheckpointError, match="two sets of weights") as exc:
            refuse()
        assert exc.value.hint.startswith("remove the stale set")
    assert require_whole(locate(_sharded(grpo_ckpt, tmp_path / "sharded"))).whole


def test_a_sweep_lists_it_as_not_evaluated(grpo_ckpt, tmp_path):
    from types import SimpleNamespace

    from vlmfast.run.sweep import _Entry, _refuse

    d = _stale(grpo_ckpt, tmp_path / "run" / "checkpoint-2")
    refused, notes, said = [], [], []
    options = SimpleNamespace(infer=SimpleNamespace(allow_missing=(), engine="hf"))
    assert _refuse(_Entry(2, d, "checkpoint-2"), options, refused, notes, said.append)
    assert refused[0]["step"] == 2 and "two sets of weights" in refused[0]["reason"]
    assert said == notes and notes[0].startswith("step 2 not evaluated: ")
    assert notes[0].endswith(f" ({refused[0]['hint']})")  # what to do, as report.json's not_evaluated has it
