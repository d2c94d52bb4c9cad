"""A command that a fresh run refuses is refused as well when its --out is already complete and the run
has nothing left to do (it loads no model): an unknown --dtype, --attn or --device, and what this machine
cannot run (a CUDA device, flash-attn, CUDA graphs on a machine without CUDA). Exit 2, nothing written."""

from __future__ import annotations

import json

import pytest

from conftest import cli


@pytest.fixture
def no_cuda(monkeypatch):
    """A machine without CUDA, whatever this one has."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture(scope="module")
def done(grpo_ckpt, images, tmp_path_factory):
    """A results file an earlier run completed (on the CPU), and the command that wrote it."""
    import torch

    out = tmp_path_factory.mktemp("done") / "o1.jsonl"
    args = ["infer", "--ckpt", grpo_ckpt, "--images", images[0], images[1], "--prompt", "p", "--max-new-tokens", 4,
            "--out", out]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.cuda, "is_available", lambda: False)
        r = cli(*args)
    assert r.returncode == 0, r.stderr
    return args, out


REFUSED = [
    (["--dtype", "bfloat61"], "--dtype bfloat61: unknown"),
    (["--attn", "flash"], "--attn flash: unknown"),
    (["--device", "tpu"], "--device tpu: unsupported"),
    (["--attn", "flash_attention_2"], "--attn flash_attention_2 needs a CUDA device"),
    (["--device", "cuda:7"], "--device cuda:7: CUDA is not available here"),
    (["--cuda-graphs"], "--cuda-graphs needs a CUDA device"),
    (["--device", ""], "--device '': unsupported"),  # an unset shell variable was read as auto
    (["--decoder", "hf", "--cuda-graphs"], "--compile and --cuda-graphs apply to vlmfast's decoder"),
    (["--decoder", "hf", "--compile"], "--compile and --cuda-graphs apply to vlmfast's decoder"),
]


@pytest.mark.parametrize("extra,said", REFUSED)
def test_a_finished_resume_refuses_what_a_fresh_run_refuses(done, no_cuda, tmp_path, extra, said):
    args, out = done
    record = out.with_name("o1.run.json")
    before = out.read_bytes(), record.read_bytes()
    r = cli(*args, *extra)
    assert r.returncode == 2 and f"error: {said}" in r.stderr, (r.returncode, r.stderr)
    assert (out.read_bytes(), record.read_bytes()) == before  # nothing written
    fresh = cli(*args[:-1], tmp_path / "fresh.jsonl", *extra)  # the same words as a run that would load
    assert fresh.returncode == 2 and f"error: {said}" in fresh.stderr, fresh.stderr
    assert not (tmp_path / "fresh.jsonl").exists()


def test_a_finished_resume_with_json_says_the_error_as_json(done, no_cuda):
    args, _ = done
    r = cli(*args, "--dtype", "x", "--json")
    assert r.returncode == 2
    assert json.loads(r.stdout)["error"]["message"] == "--dtype x: unknown"


def test_a_finished_resume_that_this_machine_can_run_has_nothing_to_do(done, no_cuda):
    args, _ = done
    for extra in ([], ["--device", "cpu", "--dtype", "bf16", "--attn", "eager"], ["--no-cuda-graphs"]):
        r = cli(*args, *extra)
        assert r.returncode == 0 and "nothing to do" in r.stderr, r.stderr
