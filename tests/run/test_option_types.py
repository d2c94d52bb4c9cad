"""The options dataclasses check the types of what a Python caller hands them, as the command line's own
parsing does for its text: a wrong type is a UsageError naming the option as the command line spells it,
the value and its type, never a TypeError from deep inside a check or a crash after the model loaded.
No model, no torch."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import typing

import pytest

from vlmfast.declared import KEY, Cli, Nested, flag_of
from vlmfast.engines.rows import GenerationSettings
from vlmfast.engines.vllm.support import VllmSettings
from vlmfast.errors import UsageError, VlmfastError
from vlmfast.run.bench_options import BenchOptions
from vlmfast.run.options import InferOptions
from vlmfast.run.sweep_options import SweepOptions


def _required(tmp_path) -> dict:
    """Each options dataclass with the fewest valid values it can be made with."""
    return {GenerationSettings: {}, VllmSettings: {}, InferOptions: dict(ckpt="ck"),
            BenchOptions: dict(ckpt="ck", synthetic=2),
            SweepOptions: dict(run_dir="run", out_dir=str(tmp_path / "sweep"),
                               infer=InferOptions(ckpt="run", manifest="m.jsonl"))}


@pytest.mark.parametrize("cls,kwargs,said", [
    (InferOptions, dict(ckpt="ck", max_pixels="abc"), "--max-pixels 'abc': expected an int or None, got str"),
    (InferOptions, dict(ckpt="ck", threads="2"), "--threads '2': expected an int or None, got str"),
    (InferOptions, dict(ckpt="ck", iou="0.5"), "--iou '0.5': expected a number (int or float), got str"),
    (InferOptions, dict(ckpt="ck", iou=None), "--iou None: expected a number (int or float), got NoneType"),
    (InferOptions, dict(ckpt="ck", device=0), "--device 0: expected a str or None, got int"),
    (InferOptions, dict(ckpt=None), "--ckpt None: expected a str, got NoneType"),
    (InferOptions, dict(ckpt="ck", images=["a.png", 3]), "--images ['a.png', 3]: expected a list of str or None"),
    (InferOptions, dict(ckpt="ck", skip_bad="yes"), "--skip-bad 'yes': expected a bool, got str"),
    (GenerationSettings, dict(max_new_tokens="4"), "--max-new-tokens '4': expected an int, got str"),
    (GenerationSettings, dict(max_new_tokens=2.5), "--max-new-tokens 2.5: expected an int, got float"),
    (GenerationSettings, dict(temperature="0.7"), "--temperature '0.7': expected a number"),
    (GenerationSettings, dict(temperature=None), "--temperature None: expected a number"),
    (GenerationSettings, dict(top_p=None), "--top-p None: expected a number"),
    (GenerationSettings, dict(n="2"), "--n '2': expected an int, got str"),
    (GenerationSettings, dict(n=2.5), "--n 2.5: expected an int, got float"),
    (GenerationSettings, dict(n=True), "--n True: expected an int, got bool"),
    (GenerationSettings, dict(seed="1"), "--seed '1': expected an int or None, got str"),
    (GenerationSettings, dict(seed=1.5), "--seed 1.5: expected an int or None, got float"),
    (GenerationSettings, dict(repetition_penalty="1.1"), "--repetition-penalty '1.1': expected a number"),
    (VllmSettings, dict(tensor_parallel_size="2"), "--tensor-parallel-size '2': expected an int, got str"),
])
def test_a_wrong_type_is_a_usage_error_naming_the_flag_value_and_type(cls, kwargs, said):
    with pytest.raises(UsageError) as err:
        cls(**kwargs)
    assert err.value.message.startswith(said), err.value.message
    assert err.value.hint


def test_text_that_holds_a_number_is_answered_with_the_number():
    with pytest.raises(UsageError) as err:
        GenerationSettings(max_new_tokens="4")
    assert err.value.hint == "max_new_tokens=4 (a number, not the text '4')"
    with pytest.raises(UsageError, match=r"--temperature") as err:
        GenerationSettings(temperature="0.7")
    assert err.value.hint == "temperature=0.7 (a number, not the text '0.7')"


def test_every_option_of_every_options_dataclass_refuses_a_value_of_no_type_it_takes(tmp_path):
    """Walked over the fields, so an option added later is checked too: an object() is no int, float, str,
    bool, list or options dataclass, and each option says so under its own flag."""
    checked = 0
    for cls, required in _required(tmp_path).items():
        for f in dataclasses.fields(cls):
            meta = f.metadata.get(KEY)
            if meta is None:
                continue
            with pytest.raises(VlmfastError) as err:
                cls(**{**required, f.name: object()})
            if isinstance(meta, Nested):
                said = f"{cls.__name__}({f.name}=<object"
            else:
                said = f.name.upper() if isinstance(meta, Cli) and meta.argument else flag_of(cls, f.name)
            assert err.value.message.startswith(said), (cls, f.name, err.value.message)
            assert "got object" in err.value.message, (cls, f.name, err.value.message)
            checked += 1
    assert checked > 80


def test_a_lone_path_where_a_list_is_expected_is_a_list_of_one():
    """Not a str iterated one character at a time ("/" read as the filesystem root, an image folder)."""
    options = InferOptions(ckpt="ck", images="imgs/img_000.png", allow_missing="lm_head")
    assert options.images == ["imgs/img_000.png"] and options.allow_missing == ["lm_head"]
    assert BenchOptions(ckpt="ck", images="a.png").images == ["a.png"]
    assert InferOptions(ckpt="ck", images=("a.png", "b.png")).images == ("a.png", "b.png")  # a tuple is a list too


def test_generation_given_as_a_dict_is_made_its_settings():
    options = InferOptions(ckpt="ck", generation={"max_new_tokens": 4, "temperature": 0.7, "seed": 1})
    assert options.generation == GenerationSettings(max_new_tokens=4, temperature=0.7, seed=1)
    assert not options.generation.greedy  # what the runner asks of it
    assert InferOptions(ckpt="ck", vllm={"gpu_memory_utilization": 0.5}, engine="vllm").vllm.gpu_memory_utilization == 0.5
    with pytest.raises(UsageError, match=r"GenerationSettings has no field 'max_tokens'") as err:
        InferOptions(ckpt="ck", generation={"max_tokens": 4})
    assert "max_new_tokens" in err.value.hint
    with pytest.raises(UsageError, match=r"--n 2\.5: expected an int"):  # the dict's values checked as the settings'
        InferOptions(ckpt="ck", generation={"n": 2.5})
    with pytest.raises(UsageError, match=r"InferOptions\(generation=None\): expected GenerationSettings or a dict"):
        InferOptions(ckpt="ck", generation=None)


def test_values_of_the_right_type_are_kept_as_given(tmp_path):
    from pathlib import Path

    options = InferOptions(ckpt=Path("ck"), images=[Path("a.png")], out=str(tmp_path / "r.jsonl"), iou=1, threads=1,
                           reward_threshold=1)
    assert options.ckpt == Path("ck") and options.images == [Path("a.png")] and options.iou == 1
    assert GenerationSettings(temperature=1, top_p=1, repetition_penalty=1).temperature == 1
    assert SweepOptions(run_dir="run", out_dir=tmp_path / "s", poll_s=5, infer=InferOptions(ckpt="run", manifest="m")).out_dir == str(tmp_path / "s")


@pytest.mark.parametrize("kwargs,said", [
    (dict(dtype="bfloat61"), "--dtype bfloat61: unknown"),
    (dict(attn="flash"), "--attn flash: unknown"),
    (dict(device="mps"), "--device mps: unsupported"),
    (dict(device="cuda:x"), "--device cuda:x: unsupported"),
])
@pytest.mark.parametrize("cls,required", [(InferOptions, dict(ckpt="ck")), (BenchOptions, dict(ckpt="ck", synthetic=2))])
def test_device_dtype_and_attention_are_checked_with_the_options(cls, required, kwargs, said):
    """The loader's values, checked when the options are made: a resume with nothing left to do loads no model."""
    with pytest.raises(UsageError, match=said):
        cls(**required, **kwargs)


def test_the_values_the_loader_takes_are_taken():
    for device, dtype, attn in [("auto", "auto", "auto"), ("CPU", "bf16", "sdpa"), ("cuda", "Float16", "eager"),
                                ("cuda:1", "fp32", "flash_attention_2"), (None, None, None)]:
        InferOptions(ckpt="ck", device=device, dtype=dtype, attn=attn)


def test_checking_device_choices_imports_no_torch():
    code = ("import sys; from vlmfast.run.options import InferOptions; "
            "InferOptions(ckpt='ck', device='cuda:0', dtype='bf16', attn='flash_attention_2'); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr


def test_threads_beyond_the_machines_cores_are_refused_naming_them():
    cores = os.cpu_count()
    assert InferOptions(ckpt="ck", threads=cores).threads == cores
    with pytest.raises(UsageError, match=rf"--threads {cores + 1}: more than the {cores} cores of this machine") as err:
        InferOptions(ckpt="ck", threads=cores + 1)
    assert f"--threads {cores} or fewer" in err.value.hint
    with pytest.raises(UsageError, match="--threads 1000000"):
        InferOptions(ckpt="ck", threads=1_000_000)


def test_the_check_reads_annotations_it_knows():
    """Every option field's annotation is one the check reads (a new kind would pass unchecked)."""
    from vlmfast.declared import _members

    known = {int, float, str, bool, type(None)}
    for cls in (GenerationSettings, VllmSettings, InferOptions, BenchOptions, SweepOptions):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if isinstance(f.metadata.get(KEY), Cli):
                for member in _members(hints[f.name]):
                    inner = typing.get_args(member)[:1] if typing.get_origin(member) in (list, tuple) else (member,)
                    assert set(inner) <= known, (cls.__name__, f.name, member)


def test_threads_beyond_the_cores_on_the_command_line_exit_2_before_anything_loads(tmp_path):
    from conftest import cli

    cores = os.cpu_count()
    r = cli("infer", "--ckpt", tmp_path, "--images", tmp_path / "a.png", "--prompt", "p", "--threads", 1_000_000)
    assert r.returncode == 2 and f"error: --threads 1000000: more than the {cores} cores of this machine" in r.stderr, r.stderr
    assert f"--threads {cores} or fewer" in r.stderr


def test_reward_values_are_checked_with_match_training_too_and_take_what_python_callers_give():
    """--match-training may take the reward from the trainer's config, so "--reward-threshold nan" was let
    through and every row scored wrong; TRL gives reward_weights as a list, numpy gives its own floats."""
    import numpy as np

    for kwargs in (dict(reward_threshold=float("nan")), dict(reward_weights="1,inf")):
        with pytest.raises(UsageError, match="finite"):
            InferOptions(ckpt="ck", match_training=True, **kwargs)
    with pytest.raises(UsageError, match="--reward-weights without --reward"):
        InferOptions(ckpt="ck", reward_weights="1")
    assert InferOptions(ckpt="ck", match_training=True, reward_weights="1,0.5").reward_weights == "1,0.5"
    listed = InferOptions(ckpt="ck", reward=["a.py:f", "a.py:g"], reward_weights=[1, 0.5])
    assert listed.reward_weights == "1.0,0.5"
    assert InferOptions(ckpt="ck", reward="a.py:f", reward_threshold=np.float32(0.5)).reward_threshold == 0.5
    numpy = InferOptions(ckpt="ck", skip_bad=np.bool_(True), batch_size=np.int64(4), reward="a.py:f",
                         reward_threshold=np.float32(0.5), generation={"max_new_tokens": np.int32(8)})
    assert type(numpy.skip_bad) is bool and numpy.skip_bad and type(numpy.reward_threshold) is float
    assert type(numpy.generation.max_new_tokens) is int and numpy.generation.max_new_tokens == 8
