"""Real faults: SIGKILL and SIGINT mid-run, CUDA out-of-memory through the real handling path,
hostile inputs (each a clear error or an error row, never a traceback), pickle weights, no network."""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import cli
from conftest import read_jsonl
from conftest import vlmfast
from vlmfast.engines.hf.engine import Engine, GenerationSettings
from vlmfast.errors import CheckpointError
from vlmfast.run.runner import InferOptions, infer

VLMFAST = Path(sys.executable).parent / "vlmfast"


@pytest.fixture(scope="module")
def many_images(tmp_path_factory):
    from vlmfast.checkpoints.tiny import make_images

    return make_images(tmp_path_factory.mktemp("many"), n=24, sizes=[(56, 56)])


def _start(ckpt, images_dir, out):
    cmd = [str(VLMFAST), "infer", "--ckpt", str(ckpt), "--images", str(images_dir), "--prompt", "p",
           "--max-new-tokens", "48", "--batch-size", "1", "--out", str(out)]
    return subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})


def _wait_for_progress(proc):
    """Block until the run reports its first finished batch (a plain line on a non-terminal stderr)."""
    for line in proc.stderr:
        if line.startswith("progress:"):
            return
    raise AssertionError("the run ended without reporting progress")


def _valid_rows(out):
    lines = out.read_text().splitlines()
    rows = []
    for i, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            assert i == len(lines) - 1, "only the last line may be torn"
    return rows


@pytest.mark.process_mechanism  # a kill and a resume
def test_sigkill_mid_run_then_resume_gives_every_id_exactly_once(grpo_ckpt, many_images, tmp_path):
    out = tmp_path / "r.jsonl"
    proc = _start(grpo_ckpt, many_images[0].parent, out)
    _wait_for_progress(proc)
    proc.kill()  # SIGKILL: no handler runs, no buffer is flushed
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    before = _valid_rows(out)
    assert len(before) >= 1
    again = vlmfast("infer", "--ckpt", grpo_ckpt, "--images", many_images[0].parent, "--prompt", "p",
                    "--max-new-tokens", 48, "--batch-size", 1, "--out", out, "--json")
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    rows = read_jsonl(out)  # every line valid JSON now
    assert sorted(r["id"] for r in rows) == sorted(str(p) for p in many_images)  # each id exactly once
    assert report["skipped_existing"] == len(before) and report["samples"] == len(many_images) - len(before)
    assert all(r["error"] is None and r["n_new_tokens"] >= 1 for r in rows)


@pytest.mark.process_mechanism  # a signal's handling
def test_sigint_finishes_the_write_says_how_to_resume_and_exits_130(grpo_ckpt, many_images, tmp_path):
    out = tmp_path / "r.jsonl"
    proc = _start(grpo_ckpt, many_images[0].parent, out)
    _wait_for_progress(proc)
    proc.send_signal(signal.SIGINT)
    rest = proc.stderr.read()
    proc.wait()
    if proc.returncode == 0:  # the run finished before the signal landed: nothing to check
        assert len(read_jsonl(out)) == len(many_images)
        return
    assert proc.returncode == 130, rest
    assert "rerun the same command to resume" in rest and "Traceback" not in rest
    rows = read_jsonl(out)  # no torn line: the write in progress was finished
    again = vlmfast("infer", "--ckpt", grpo_ckpt, "--images", many_images[0].parent, "--prompt", "p",
                    "--max-new-tokens", 48, "--batch-size", 1, "--out", out)
    assert again.returncode == 0, again.stderr
    assert sorted(r["id"] for r in read_jsonl(out)) == sorted(str(p) for p in many_images)
    assert read_jsonl(out)[: len(rows)] != [] and len(read_jsonl(out)) == len(many_images)


def _oom(*args, **kwargs):
    import torch

    return torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")


def test_out_of_memory_halves_the_batch_and_loses_nothing(loaded, grpo_ckpt, images, tmp_path, monkeypatch):
    opts = dict(ckpt=str(grpo_ckpt), images=[str(p) for p in images], prompt="Count.",
                generation=GenerationSettings(max_new_tokens=8))
    reference = infer(InferOptions(**opts, batch_size=1, out=str(tmp_path / "ref.jsonl")), loaded=loaded)
    real_prefill = Engine.prefill

    def prefill(self, prepared):  # the batch boundary: only one sample fits "on the GPU"
        if len(prepared.requests) > 1:
            raise _oom()
        return real_prefill(self, prepared)

    monkeypatch.setattr(Engine, "prefill", prefill)
    report = infer(InferOptions(**opts, batch_size=4, out=str(tmp_path / "r.jsonl")), loaded=loaded)
    assert report.oom_splits == 4  # 4 → 2+2 → 1+1+1+1, and the last 2 → 1+1
    assert any("halved and retried" in n for n in report.notes)
    assert read_jsonl(tmp_path / "r.jsonl") == read_jsonl(tmp_path / "ref.jsonl")  # same rows, same tokens
    assert [r.token_ids for r in report.results] == [r.token_ids for r in reference.results]


def test_a_sample_that_never_fits_becomes_an_error_row(loaded, grpo_ckpt, images, tmp_path, monkeypatch):
    real_prefill = Engine.prefill
    image_id = loaded.model.config.image_token_id

    def prefill(self, prepared):  # a 112×112 image (16 image tokens) never fits
        if any(int((g.inputs["input_ids"] == image_id).sum(dim=1).max()) >= 16 for g in prepared.groups):
            raise _oom()
        return real_prefill(self, prepared)

    monkeypatch.setattr(Engine, "prefill", prefill)
    report = infer(InferOptions(ckpt=str(grpo_ckpt), images=[str(p) for p in images], prompt="Count.",
                                batch_size=2, out=str(tmp_path / "r.jsonl"),
                                generation=GenerationSettings(max_new_tokens=4)), loaded=loaded)
    rows = read_jsonl(tmp_path / "r.jsonl")
    assert [r["id"] for r in rows] == [str(p) for p in images]  # nothing lost, input order
    failed = [r["id"] for r in rows if r["error"]]
    assert failed == [str(images[3])] and "out of memory even alone" in rows[3]["error"]
    assert all(r["n_new_tokens"] == 4 for r in rows if not r["error"])
    assert report.errors == 1 and report.oom_splits == 1


def _corrupt_png_data(path):
    """A PNG whose compressed pixel data is garbage but whose chunk CRCs are right: the cheap header
    check (Pillow's verify) passes, decoding fails — the case only the engine can catch."""
    import struct
    import zlib

    data = bytearray(path.read_bytes())
    i = data.index(b"IDAT") - 4
    length = struct.unpack(">I", data[i:i + 4])[0]
    garbage = bytes((b * 7 + 3) % 256 for b in range(length))
    data[i + 8:i + 8 + length] = garbage
    data[i + 8 + length:i + 12 + length] = struct.pack(">I", zlib.crc32(b"IDAT" + garbage))
    path.write_bytes(bytes(data))
    return path


def _png(path, size):
    from PIL import Image

    Image.new("RGB", size, (10, 20, 30)).save(path)
    return path


def test_hostile_inputs_are_error_rows_never_a_traceback(grpo_ckpt, images, tmp_path):
    from PIL import Image

    good = images[0]
    trunc = _corrupt_png_data(shutil.copyfile(images[3], tmp_path / "corrupt.png"))
    with pytest.raises(Exception):
        Image.open(trunc).load()
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    fake = tmp_path / "fake.png"
    fake.write_text("not an image at all")
    big = _png(tmp_path / "big.png", (1500, 1000))  # over --max-image-pixels
    bomb = _png(tmp_path / "bomb.png", (4000, 4000))  # over twice the limit: Pillow refuses it outright
    manifest = tmp_path / "m.jsonl"
    records = [
        {"id": "long", "image": str(good), "prompt": "word " * 40000},  # longer than the 32768 context
        {"id": "trunc", "image": str(trunc), "prompt": "p"},
        {"id": "ok", "image": str(good), "prompt": "p"},
    ]
    manifest.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    out = tmp_path / "r.jsonl"
    args = ["infer", "--ckpt", grpo_ckpt, "--images", empty, fake, big, bomb, "--manifest", manifest,
            "--prompt", "p", "--max-new-tokens", 3, "--max-image-pixels", 1_000_000, "--out", out]

    strict = vlmfast(*args)
    assert strict.returncode == 2 and "Traceback" not in strict.stderr and not out.exists()
    for name in ("empty.png", "fake.png", "big.png", "bomb.png"):
        assert name in strict.stderr

    r = vlmfast(*args, "--skip-bad")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    rows = {row["id"]: row for row in read_jsonl(out)}
    assert "empty file" in rows[str(empty)]["error"]
    assert "not a readable image" in rows[str(fake)]["error"]
    assert "over the limit of 1000000" in rows[str(big)]["error"]
    assert "decompression bomb" in rows[str(bomb)]["error"]
    assert "the model's context is 32768" in rows["long"]["error"]
    assert "not a readable image" in rows["trunc"]["error"]  # its header reads: decoding it found the cut
    assert rows["ok"]["error"] is None and rows["ok"]["n_new_tokens"] >= 1


def test_a_prompt_that_leaves_less_room_than_max_new_tokens_is_said(grpo_ckpt, images, tmp_path):
    """Prompt + --max-new-tokens past the model's context: vLLM stops such an answer at the context, vlmfast's
    engine decodes on past it (as plain generate does); the engines' rows differ there, and the report says so."""
    ckpt = tmp_path / "short-context"
    shutil.copytree(grpo_ckpt, ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    for part in (config, config.get("text_config") or {}):
        part["max_position_embeddings"] = 160
    (ckpt / "config.json").write_text(json.dumps(config))
    report = infer(InferOptions(ckpt=str(ckpt), images=[str(images[0])], prompt="p", out=str(tmp_path / "r.jsonl"),
                                generation=GenerationSettings(max_new_tokens=150, ignore_eos=True)))
    said = [n for n in report.notes if "passes the model's context (160 tokens)" in n]
    assert len(said) == 1 and said[0].startswith("1 request(s)") and "--max-new-tokens 150" in said[0]
    assert read_jsonl(tmp_path / "r.jsonl")[0]["n_new_tokens"] == 150  # decoded on past it, as plain generate


def test_pickle_weights_need_allow_pickle(grpo_ckpt, images, tmp_path):
    import torch
    from safetensors.torch import load_file

    ckpt = tmp_path / "pickled"
    shutil.copytree(grpo_ckpt, ckpt)
    torch.save(load_file(ckpt / "model.safetensors"), ckpt / "pytorch_model.bin")
    (ckpt / "model.safetensors").unlink()
    r = cli("infer", "--ckpt", ckpt, "--images", images[0], "--prompt", "p", "--max-new-tokens", 2, "--device", "cpu")
    assert r.returncode == 2 and "pickle" in r.stderr and "--allow-pickle" in r.stderr
    ok = cli("infer", "--ckpt", ckpt, "--images", images[0], "--prompt", "p", "--max-new-tokens", 2, "--device", "cpu",
             "--allow-pickle")
    assert ok.returncode == 0, ok.stderr


def test_unreadable_checkpoint_dir_is_a_clear_error(grpo_ckpt, monkeypatch):
    from vlmfast.checkpoints.locate import locate

    # Tests run as root, which reads any directory: simulate the permission check's answer.
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    with pytest.raises(CheckpointError, match="not readable"):
        locate(str(grpo_ckpt))


def test_offline_nothing_touches_the_network(loaded, grpo_ckpt, images, tmp_path, monkeypatch):
    import socket

    def refuse(*args, **kwargs):
        raise AssertionError("network access attempted")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    report = infer(InferOptions(ckpt=str(grpo_ckpt), images=[str(images[0])], prompt="p", out=str(tmp_path / "r.jsonl"),
                                generation=GenerationSettings(max_new_tokens=2)))
    assert report.samples == 1 and report.errors == 0


def test_the_failed_attempts_tensors_are_freed_before_the_halves_retry(loaded, grpo_ckpt, images, tmp_path, monkeypatch):
    """What the failed attempt allocated (here a stand-in for its prefill caches) is gone before the retry:
    a retry inside the except block would keep it alive through the exception's traceback."""
    import weakref

    import torch

    held = []
    real_prefill = Engine.prefill

    def prefill(self, prepared):
        if len(prepared.requests) > 1:
            activations = torch.empty(1024)  # what this attempt holds when it runs out of memory
            held.append(weakref.ref(activations))
            raise _oom()
        alive = sum(ref() is not None for ref in held)
        assert alive == 0, f"{alive} tensor(s) of a failed attempt still alive at the retry"
        return real_prefill(self, prepared)

    monkeypatch.setattr(Engine, "prefill", prefill)
    report = infer(InferOptions(ckpt=str(grpo_ckpt), images=[str(p) for p in images[:2]], prompt="Count.", batch_size=2,
                                out=str(tmp_path / "r.jsonl"), generation=GenerationSettings(max_new_tokens=4)),
                   loaded=loaded)
    assert held and report.oom_splits == 1 and report.errors == 0
