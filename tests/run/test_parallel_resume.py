"""Data-parallel edge cases, without launching processes: Ctrl-C while a process waits at a batch
boundary, part files that hold a retried answer, and commands that cannot run under a launcher."""

import json

import pytest

from vlmfast.engines.rows import SampleResult
from vlmfast.errors import Interrupted
from vlmfast.inputs.records import Request
from vlmfast.run.options import InferOptions
from vlmfast.run.runner import Work, run_batches


class _Dist:
    """Two processes, this one rank 0; Ctrl-C lands while it waits for the other at the first boundary."""

    world, rank, is_main = 2, 0, True

    def split(self, items):
        return list(items)[:1]

    def reduce_max(self, value):
        return value

    def any(self, flag):
        raise KeyboardInterrupt


class _Backend:
    device = "cpu"

    def plan(self, requests, image_sizes, batch_size):
        return [[i] for i in range(len(requests))]

    def batches(self, requests, image_sizes, planned):
        for r in requests:
            yield [(None, [SampleResult(r.id, list(r.images), r.prompt, text="x", finish_reason="length",
                                        n_new_tokens=1)], None)]

    def facts(self):  # run_batches reads peak_mem_kind from it (whose memory the peak is)
        from vlmfast.engines.facts import EngineFacts

        return EngineFacts(engine="hf", checkpoint="c", load_s=0.0, cache={}, device="cpu", dtype="float32",
                           attn="sdpa", decoder="vlmfast", cuda_graphs=False, compiled=False, max_pixels=None,
                           max_pixels_capped=False)


def test_ctrl_c_at_a_batch_boundary_says_the_rows_are_kept_in_part_files(tmp_path):
    out = tmp_path / "r.jsonl"
    requests = [Request("a", ("a.png",), "p"), Request("b", ("b.png",), "p")]
    work = Work(requests, [], ["a", "b"], {}, {}, 0, [])
    try:
        run_batches(_Backend(), InferOptions(ckpt="c", out=str(out)), work, 1, _Dist(), None)
    except BaseException as exc:  # noqa: BLE001 - a bare KeyboardInterrupt is the bug: the CLI then says "before any result"
        said = exc
    assert isinstance(said, Interrupted), repr(said)
    assert ".r.jsonl.part0" in said.message and "rerun" in said.hint
    assert [json.loads(line)["id"] for line in (tmp_path / ".r.jsonl.part0").read_text().splitlines()] == ["a"]


def test_a_part_files_retried_answer_replaces_the_error_row_it_retried(tmp_path):
    """An interrupted parallel --retry-errors run wrote a new answer for an id whose error row is in --out: the
    rerun keeps the answer (as one process, whose answer follows the error row in the same file, does)."""
    from vlmfast.run.results import prepare_out

    out = tmp_path / "r.jsonl"
    old = {"id": "a", "text": None, "finish_reason": None, "error": "bad image"}
    new = {"id": "a", "text": "3", "finish_reason": "eos", "error": None}
    out.write_text(json.dumps(old) + "\n")
    (tmp_path / ".r.jsonl.part1").write_text(json.dumps(new) + "\n")
    rows, _ = prepare_out(out, overwrite=False)
    assert rows["a"]["error"] is None and rows["a"]["text"] == "3"
    from vlmfast.run.results import read_existing

    assert read_existing(out)[0]["a"]["error"] is None


@pytest.mark.parametrize("command", ["sweep", "bench"])
def test_sweep_and_bench_refuse_a_launcher(command, monkeypatch):
    from vlmfast.errors import UsageError
    from vlmfast.run.parallel import refuse_launched

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(UsageError, match=f"{command} runs in one process"):
        refuse_launched(command)
    monkeypatch.setenv("WORLD_SIZE", "1")
    refuse_launched(command)


def test_world_size_without_a_launcher_is_a_clear_error(monkeypatch):
    """WORLD_SIZE exported by hand (or left from another job) without the launcher's MASTER_ADDR: accelerate's
    raw ValueError traceback before; now an error that says what is missing and how to run."""
    from vlmfast.errors import UsageError
    from vlmfast.run.parallel import Distributed

    monkeypatch.setenv("WORLD_SIZE", "2")
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(UsageError, match="not started by a launcher"):
        Distributed()


def test_rows_left_in_part_files_are_checked_against_the_settings_like_rows_in_out(grpo_ckpt, images, tmp_path):
    """A parallel run that failed or was interrupted leaves its rows only in part files (``--out`` itself does
    not exist yet): a rerun with other settings must be refused as it is when the rows are in ``--out``,
    not fold them in and complete one file from two runs."""
    from vlmfast.engines.rows import GenerationSettings
    from vlmfast.errors import UsageError
    from vlmfast.run.runner import infer

    out = tmp_path / "r.jsonl"
    opts = dict(ckpt=str(grpo_ckpt), images=[str(p) for p in images[:3]], prompt="Count.", out=str(out),
                batch_size=2)
    infer(InferOptions(**opts, generation=GenerationSettings(max_new_tokens=4)))
    lines = out.read_text().splitlines()
    (tmp_path / ".r.jsonl.part0").write_text(lines[0] + "\n")  # what a killed two-process run leaves
    (tmp_path / ".r.jsonl.part1").write_text(lines[2] + "\n")
    out.unlink()
    with pytest.raises(UsageError, match="other settings"):
        infer(InferOptions(**opts, generation=GenerationSettings(max_new_tokens=2)))
    assert sorted(p.name for p in tmp_path.glob(".r.jsonl.part*")) == [".r.jsonl.part0", ".r.jsonl.part1"]  # kept
    report = infer(InferOptions(**opts, generation=GenerationSettings(max_new_tokens=4)))  # the same command resumes
    assert report.skipped_existing == 2 and report.samples == 1


def test_a_launch_for_vllm_leaves_cuda_untouched_so_vllms_forked_processes_can_start_it(tmp_path):
    """``Distributed(gloo=True)`` (``--engine vllm`` under accelerate launch) must not ask torch about CUDA:
    ``torch.cuda.is_available()`` calls cudaGetDeviceCount, which marks every later fork of this process as a bad
    fork (torch then refuses CUDA in it: "Cannot re-initialize CUDA in forked subprocess"), and vLLM forks its engine
    core on CUDA machines. Checked in a fresh interpreter (another test may have asked CUDA in this one); needs a
    torch built with CUDA, where the check means something (no GPU needed)."""
    import os
    import subprocess
    import sys
    import textwrap

    torch = pytest.importorskip("torch")
    if not torch.cuda._is_compiled():
        pytest.skip("a CPU-only torch never poisons fork")
    script = textwrap.dedent("""
        import os, sys
        import accelerate
        import torch

        class FakeState:  # the launch's process group, without a second process to meet
            def __init__(self, cpu=False):
                self.process_index, self.num_processes, self.device = 0, 2, torch.device("cpu")

        accelerate.PartialState = FakeState
        from vlmfast.run.parallel import Distributed

        Distributed(gloo=True)
        pid = os.fork()
        if pid == 0:
            os._exit(3 if torch._C._cuda_isInBadFork() else 0)
        _, status = os.waitpid(pid, 0)
        sys.exit(os.waitstatus_to_exitcode(status))
    """)
    env = {**os.environ, "WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "29500"}
    env.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"a fork after Distributed(gloo=True) is a bad fork for CUDA ({done.returncode}): {done.stderr}"
