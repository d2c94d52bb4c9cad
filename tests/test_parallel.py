"""Data parallel through accelerate on CPU (gloo): two processes give what one process gives."""

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import read_jsonl

BIN = Path(sys.executable).parent


def _infer(ckpt, images, out, launcher=()):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    cmd = [*launcher, *(["-m", "vlmfast"] if launcher else [str(BIN / "vlmfast")]), "infer", "--ckpt", str(ckpt),
           "--images", str(images), "--prompt", "Count the shapes.", "--max-new-tokens", "6", "--batch-size", "2",
           "--out", str(out), "--json"]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)


def test_two_process_accelerate_run_equals_one_process_run(grpo_ckpt, images, tmp_path):
    accelerate = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                  "--mixed_precision", "no", "--dynamo_backend", "no"]
    one = _infer(grpo_ckpt, images[0].parent, tmp_path / "one.jsonl")
    two = _infer(grpo_ckpt, images[0].parent, tmp_path / "two.jsonl", launcher=accelerate)
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
