"""`--engine vllm` through the CLI, where vLLM imports (.venv-vllm): rows in input order with an error
row for a broken image, a kill -9 and a resume with every id exactly once, and bench's side-by-side
columns with the engines' token agreement. Each vLLM start costs 20-50 s on 2 CPU cores; where a test's
point is not vLLM's processes (a kill, two launched processes), its engine runs inside the CLI's process
(``IN_PROCESS``), which starts in ~16 s instead of ~40 s and decodes the same tokens."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from conftest import VLMFAST, read_jsonl, vlmfast  # noqa: E402

IN_PROCESS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}  # vLLM's engine core and worker inside the CLI's process


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    from vlmfast.checkpoints.tiny import build_checkpoint

    return build_checkpoint(tmp_path_factory.mktemp("vllm-cli") / "demo", preset="demo", like="grpo")


@pytest.fixture(scope="module")
def image_dir(tmp_path_factory) -> Path:
    """8 images and a truncated PNG (an error row with --skip-bad)."""
    from vlmfast.checkpoints.tiny import make_images

    d = tmp_path_factory.mktemp("vllm-cli-images")
    paths = make_images(d, n=8)
    (d / "img_003b.png").write_bytes(paths[0].read_bytes()[:300])
    return d


def _infer(demo, image_dir, out, *extra):
    return [str(VLMFAST), "infer", "--engine", "vllm", "--ckpt", str(demo), "--images", str(image_dir),
            "--prompt", "Describe the image.", "--max-new-tokens", "24", "--batch-size", "2", "--skip-bad", "--out", str(out),
            *extra]


def test_killed_run_resumes_with_every_id_once_and_rows_in_input_order(demo, image_dir, tmp_path):
    out = tmp_path / "r.jsonl"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
    proc = subprocess.Popen(_infer(demo, image_dir, out), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env=env, start_new_session=True)
    try:
        for line in proc.stderr:
            if line.startswith("progress:"):
                break
    finally:  # killed whatever happened: its own session is out of reach of whoever stops this test
        os.killpg(proc.pid, signal.SIGKILL)  # the CLI and vLLM's engine process, no handler runs
        proc.wait()
    before = [json.loads(line) for line in out.read_text().splitlines() if line.endswith("}")]
    assert 0 < len(before) < 9  # killed part-way

    # the resume's engine inside its process: the kill above is what needed vLLM's own processes
    again = subprocess.run(_infer(demo, image_dir, out, "--json"), capture_output=True, text=True, env={**env, **IN_PROCESS},
                           timeout=600)
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    rows = read_jsonl(out)
    ids = sorted(str(p) for p in image_dir.iterdir())
    assert [r["id"] for r in rows] == ids  # every id once, in input order
    assert report["engine"] == "vllm" and report["engine_settings"]["vllm_version"] and report["versions"]["vllm"]
    startup = report["engine_settings"]["startup_s"]  # read after vLLM started, not before
    assert isinstance(startup, float) and 0 < startup <= report["load_s"]
    assert report["skipped_existing"] == len(before) and report["samples"] == 9 - len(before)
    broken = next(r for r in rows if r["id"].endswith("img_003b.png"))
    assert "not a readable image" in broken["error"]
    assert report["cache"]["found_off"]  # the checkpoint's own configs, saved cache-off, not the overlay's
    assert all(r["error"] is None and 1 <= r["n_new_tokens"] <= 24 for r in rows if r is not broken)


def test_bench_puts_both_engines_side_by_side(demo, image_dir, tmp_path):
    images = sorted(p for p in image_dir.iterdir() if p.name != "img_003b.png")
    r = vlmfast("bench", "--ckpt", demo, "--engines", "hf,vllm", "--images", *images, "--max-new-tokens", 24,
                "--batch-sizes", 8, "--warmup", 0, "--repeats", 1, "--no-as-saved", "--json",
                env={"VLLM_LOGGING_LEVEL": "WARNING", **IN_PROCESS}, timeout=900)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert [(s["name"], s["batch_size"]) for s in report["scenarios"]] == [("ckpt", 8), ("ckpt-vllm", 8)]
    assert all(s["tokens_per_s"] > 0 and s["mean_new_tokens"] > 0 for s in report["scenarios"])
    assert report["fidelity"]["hf_vs_vllm"] >= 7 / 8  # greedy tokens of the two engines
    assert "vllm_vs_ckpt@8" in report["ratios"]


def test_two_launched_processes_run_two_vllm_engines_and_give_what_one_gives(demo, image_dir, tmp_path):
    """accelerate launch, two processes: each starts its own vLLM engine on its half of the requests; the main
    process merges the halves into the rows one process writes (chunks of 2 requests on both sides, so every
    vLLM call sees the same prompts) and reports both processes."""
    images = sorted(str(p) for p in image_dir.iterdir() if p.name != "img_003b.png")
    args = ["infer", "--engine", "vllm", "--ckpt", str(demo), "--images", *images, "--prompt", "Describe the image.",
            "--max-new-tokens", "12", "--batch-size", "2", "--json"]
    one = vlmfast(*args, "--out", tmp_path / "one.jsonl", env={"VLLM_LOGGING_LEVEL": "WARNING", **IN_PROCESS}, timeout=600)
    assert one.returncode == 0, one.stderr
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--main_process_port", "0",  # a free port: another suite may hold 29500
              "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "vlmfast"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "WARNING", "CUDA_VISIBLE_DEVICES": "",
           "PATH": f"{VLMFAST.parent}{os.pathsep}{os.environ['PATH']}"}
    two = subprocess.run([*launch, *args, "--out", str(tmp_path / "two.jsonl")], capture_output=True, text=True, env=env,
                         timeout=900)
    assert two.returncode == 0, two.stderr
    assert read_jsonl(tmp_path / "two.jsonl") == read_jsonl(tmp_path / "one.jsonl")  # ids once, in order, same tokens
    report = json.loads(two.stdout)  # the main process's report, over both
    assert [(p["rank"], p["samples"]) for p in report["processes"]] == [(0, 4), (1, 4)]
    assert report["engine_settings"]["data_parallel_engines"] == 2
    assert report["new_tokens"] == sum(p["new_tokens"] for p in report["processes"])
    assert not list(tmp_path.glob(".two.jsonl.part*"))  # the halves merged and removed
