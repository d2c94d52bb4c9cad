"""vlmfast.checkpoints.locate: one way to find a checkpoint, and errors that come fast and say what to do."""

from __future__ import annotations

import http.server
import os
import shutil
import socket
import subprocess
import sys
import threading

import pytest

from conftest import cli
from vlmfast.errors import CheckpointError
from vlmfast.checkpoints.locate import locate, require


def test_checkpoint_n_picks_highest_numeric_with_weights(grpo_ckpt, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    for n in (9, 10, 100):
        shutil.copytree(grpo_ckpt, out / f"checkpoint-{n}")
    (out / "checkpoint-100" / "model.safetensors").unlink()  # an interrupted save: no weights
    (out / "checkpoint-1000").mkdir()  # empty
    found = require(locate(str(out)), "model")
    assert found.source == str(out / "checkpoint-10") and found.is_local
    assert "checkpoint-10" in found.note
    assert "skipped checkpoint-1000 (no config.json), checkpoint-100 (config.json but no weights)" in found.note
    (out / "checkpoint-10" / "generation_config.json").write_text('{"use_cache": fal')  # a save cut short too
    found = require(locate(str(out)), "model")
    assert found.source == str(out / "checkpoint-9") and "checkpoint-10 (generation_config.json unreadable: a save " \
        "cut short?)" in found.note
    for name in os.listdir(grpo_ckpt):  # TRL's final save_model at the top of its output dir: taken, and said
        shutil.copy(grpo_ckpt / name, out / name)
    found = require(locate(str(out)), "model")
    assert found.source == str(out) and found.note == (
        "using the model saved at the top of run/ (a trainer's final save), not its checkpoint-1000, checkpoint-100, "
        "checkpoint-10 … (give one as --ckpt for it)")
    assert require(locate(str(grpo_ckpt)), "model").note is None  # a model dir alone: nothing to say


def test_locate_errors(tmp_path):
    with pytest.raises(CheckpointError, match="no such directory"):
        locate(str(tmp_path / "nope"))
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        locate(str(tmp_path))
    (tmp_path / "checkpoint-5").mkdir()
    with pytest.raises(CheckpointError, match="none of its checkpoint-N"):
        locate(str(tmp_path))
    (tmp_path / "checkpoint-5").rmdir()
    (tmp_path / "config.json").write_text("{}")
    assert locate(str(tmp_path)).kind == "incomplete"
    with pytest.raises(CheckpointError, match="no weights"):
        require(locate(str(tmp_path)), "model")
    with pytest.raises(CheckpointError, match="reads local directories only") as err:
        locate("Qwen/Qwen2.5-VL-3B-Instruct")  # hub ids only where a command can load from the hub
    assert "huggingface-cli download Qwen/Qwen2.5-VL-3B-Instruct" in err.value.hint


def test_training_args_bin_alone_is_not_weights(tmp_path):
    d = tmp_path / "checkpoint-3"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "training_args.bin").write_bytes(b"pickled TrainingArguments")  # HF Trainer writes it into every checkpoint
    assert locate(str(d)).kind == "incomplete"
    with pytest.raises(CheckpointError, match="none of its checkpoint-N dirs"):
        locate(str(tmp_path))


class _Hub(http.server.BaseHTTPRequestHandler):
    """A hub that knows no model: answers every request the way the real one answers a missing repo."""

    requests: list[str] = []

    def do_GET(self):  # noqa: N802 - http.server's name
        type(self).requests.append(self.path)
        self.send_response(404)
        self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("X-Error-Message", "Repository not found")
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"error": "Repository not found"}')

    do_HEAD = do_GET

    def log_message(self, *args):
        pass


def _probe(env: dict) -> subprocess.CompletedProcess:
    """locate() in a fresh interpreter: the hub endpoint is read when huggingface_hub is imported."""
    code = ("from vlmfast.checkpoints.locate import locate\n"
            "from vlmfast.errors import CheckpointError\n"
            "try:\n    print(locate('nobody/no-such-model', hub=True))\n"
            "except CheckpointError as e:\n    print('ERROR', e.message, '|', e.hint)\n")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**clean, "HF_HOME": env.pop("HF_HOME"), **env})


def test_a_missing_hub_repo_is_told_apart_from_no_network(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        missing = _probe({"HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": f"http://127.0.0.1:{server.server_port}"})
    finally:
        server.shutdown()
    assert "ERROR nobody/no-such-model: no such model on the hub" in missing.stdout, missing.stderr
    assert "hf auth login" in missing.stdout
    assert [r for r in _Hub.requests if "no-such-model" in r] == ["/api/models/nobody/no-such-model"]  # no retries

    with socket.socket() as s:  # a port nobody listens on: connection refused, as with no network
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dead = _probe({"HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": f"http://127.0.0.1:{port}"})
    assert (f"ERROR nobody/no-such-model: no such directory, and as a hub id the hub at http://127.0.0.1:{port} "
            "cannot be reached") in dead.stdout, dead.stderr
    assert "HTTPS_PROXY" in dead.stdout and "no such model" not in dead.stdout

    offline = _probe({"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"})
    assert ("ERROR nobody/no-such-model: no such directory, and as a hub id it is not in the local Hugging Face cache "
            "(HF_HUB_OFFLINE is set)") in offline.stdout


@pytest.mark.process_mechanism  # what a process imports: the same modules under every transformers
def test_path_errors_and_doctor_import_neither_torch_nor_transformers(grpo_ckpt, tmp_path):
    """A wrong --ckpt is reported before the heavy imports, and doctor's config checks need none."""
    code = ("import sys\nfrom vlmfast.cli import main\n"
            "sys.argv = ['vlmfast'] + sys.argv[1:]\n"
            "try:\n    main()\nexcept SystemExit as e:\n"
            "    print('exit', e.code, 'torch' in sys.modules, 'transformers' in sys.modules, file=sys.stderr)\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    image = tmp_path / "i.png"
    image.write_bytes(b"")  # never opened: the checkpoint is checked first
    # the tensors a config's model class expects are built once (that imports torch), then read from the cache
    env = {**os.environ, "COLUMNS": "200", "VLMFAST_CACHE": str(tmp_path / "cache")}
    subprocess.run([sys.executable, "-m", "vlmfast", "doctor", str(grpo_ckpt)], capture_output=True, env=env, timeout=120)
    for args, said in (
        (["infer", "--ckpt", tmp_path / "nope", "--images", image, "--prompt", "p"], "no such directory"),
        (["infer", "--ckpt", empty, "--images", image, "--prompt", "p"], "not a checkpoint"),
        (["doctor", grpo_ckpt], "cache-off"),
    ):
        r = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, timeout=120,
                           env=env)
        assert said in r.stderr, r.stderr
        assert r.stderr.strip().endswith(("exit 2 False False", "exit 0 False False")), r.stderr


def test_a_mistyped_local_path_says_no_such_directory_first(tmp_path):
    """`outs/my-run` looks like org/name: offline, and for commands that read local dirs only, the first
    words are "no such directory", not a hub problem."""
    from conftest import cli

    r = cli("doctor", "outs/my-run")
    assert r.returncode == 2 and "outs/my-run: no such directory" in r.stdout + r.stderr
    (tmp_path / "im.png").write_bytes(b"")
    r = cli("infer", "--ckpt", "outs/my-run", "--images", tmp_path / "im.png", "--prompt", "p")
    assert r.returncode == 2 and "outs/my-run: no such directory" in r.stderr



def test_a_path_an_option_named_is_said_with_the_option(grpo_ckpt, tmp_path):
    """Four commands take a second checkpoint; an error about it names the flag, and a command that reads
    local directories only does not offer hub ids."""
    for args, said in ((["doctor", grpo_ckpt, "--base", tmp_path / "nope"], "--base"),
                       (["fix", grpo_ckpt, "--processor-from", tmp_path / "nope"], "--processor-from")):
        r = cli(*args)
        assert r.returncode == 2 and f"{said} {tmp_path / 'nope'}: no such directory" in r.stderr, r.stderr
        assert "hub ids" not in r.stderr
    with pytest.raises(CheckpointError, match=rf"^--compare-base {tmp_path / 'nope'}: no such directory"):
        locate(tmp_path / "nope", hub=True, option="--compare-base")
