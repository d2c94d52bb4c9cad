"""Data parallel through accelerate on CPU (gloo): two processes give what one process gives, and a
failure on one process ends the run on every process at the next batch boundary."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import read_jsonl

BIN = Path(sys.executable).parent
# port 0: accelerate picks a free port, where its default (29500) refuses a launch while another test's holds it
ACCELERATE = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--main_process_port", "0", "--mixed_precision", "no", "--dynamo_backend", "no"]


def _infer(ckpt, images, out, launcher=(), batch_size=2, env=None, extra=()):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
           "CUDA_VISIBLE_DEVICES": "", **(env or {})}  # gloo on the CPU, whatever the machine has
    cmd = [*launcher, *(["-m", "vlmfast"] if launcher else [str(BIN / "vlmfast")]), "infer", "--ckpt", str(ckpt),
           "--images", str(images), "--prompt", "Count the shapes.", "--max-new-tokens", "6", "--batch-size",
           str(batch_size), "--out", str(out), "--json", *map(str, extra)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)


def test_two_process_accelerate_run_equals_one_process_run(grpo_ckpt, images, tmp_path):
    one = _infer(grpo_ckpt, images[0].parent, tmp_path / "one.jsonl")
    two = _infer(grpo_ckpt, images[0].parent, tmp_path / "two.jsonl", launcher=ACCELERATE)
    assert one.returncode == 0, one.stderr
    assert two.returncode == 0, two.stderr
    rows_one, rows_two = read_jsonl(tmp_path / "one.jsonl"), read_jsonl(tmp_path / "two.jsonl")
    assert rows_two == rows_one  # same ids, once each, same order, same text
    assert len({r["id"] for r in rows_two}) == len(images)
    report = json.loads(two.stdout)  # only the main process prints the report
    assert [p["rank"] for p in report["processes"]] == [0, 1]
    assert sum(p["samples"] for p in report["processes"]) == report["samples"] == len(images)
    assert report["new_tokens"] == sum(p["new_tokens"] for p in report["processes"])
    assert not list(tmp_path.glob(".two.jsonl.part*"))  # parts merged and removed
    assert two.stderr.count("vlmfast infer") == 1


@pytest.mark.process_mechanism  # the seed shared by launched processes
def test_two_processes_sampling_without_a_seed_draw_with_one_seed(grpo_ckpt, images, tmp_path):
    """No --seed, two processes: both draw with the one seed recorded beside --out, so one process given that
    seed draws the same answers for every request (each process once drew its own)."""
    sampled = ["--temperature", "1.0", "--ignore-eos"]
    two = _infer(grpo_ckpt, images[0].parent, tmp_path / "two.jsonl", launcher=ACCELERATE, extra=sampled)
    assert two.returncode == 0, two.stderr
    seed = json.loads((tmp_path / "two.run.json").read_text())["settings"]["generation"]["seed"]
    assert f"--seed {seed} drawn for this run" in two.stderr
    one = _infer(grpo_ckpt, images[0].parent, tmp_path / "one.jsonl", extra=[*sampled, "--seed", seed])
    assert one.returncode == 0, one.stderr
    assert read_jsonl(tmp_path / "two.jsonl") == read_jsonl(tmp_path / "one.jsonl")


FAULT = '''
import os
if os.environ.get("RANK") == "1":  # the second process fails in its second batch
    import vlmfast.engines.hf.engine as engine
    real, calls = engine.Engine.generate_batch, []

    def failing(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("injected fault on rank 1")
        return real(self, *args, **kwargs)

    engine.Engine.generate_batch = failing
'''


@pytest.mark.process_mechanism  # one launched process failing
def test_a_failure_on_one_process_stops_every_process_and_the_run_resumes(grpo_ckpt, images, tmp_path):
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(FAULT)  # imported by every interpreter at start-up
    out = tmp_path / "r.jsonl"
    failed = _infer(grpo_ckpt, images[0].parent, out, launcher=ACCELERATE, batch_size=1,
                    env={"PYTHONPATH": str(inject)})
    assert failed.returncode != 0
    assert "1 of 2 processes failed (process 1: RuntimeError: injected fault on rank 1)" in failed.stderr
    assert failed.stderr.count("rerun the same command to resume") == 1  # said once, by the main process
    parts = sorted(tmp_path.glob(".r.jsonl.part*"))
    kept = [row for p in parts for row in read_jsonl(p)]
    assert [p.name for p in parts] == [".r.jsonl.part0", ".r.jsonl.part1"]
    # rank 0 stopped at the boundary where rank 1 failed: 2 of its 3 rows; rank 1 kept its first
    assert len(read_jsonl(parts[0])) == 2 and len(read_jsonl(parts[1])) == 1
    again = _infer(grpo_ckpt, images[0].parent, out)
    assert again.returncode == 0, again.stderr
    rows = read_jsonl(out)
    assert sorted(r["id"] for r in rows) == sorted(str(p) for p in images)  # every id exactly once
    assert json.loads(again.stdout)["skipped_existing"] == len(kept)


def test_more_processes_than_gpus_is_refused_before_loading():
    from vlmfast.errors import UsageError
    from vlmfast.run.parallel import check_devices

    check_devices(2, cuda=False, device_count=0)  # CPU processes over gloo: fine
    check_devices(2, cuda=True, device_count=2)
    with pytest.raises(UsageError, match="2 processes but this machine has 1 CUDA device") as err:
        check_devices(2, cuda=True, device_count=1)
    assert "--num_processes 1" in err.value.hint
