"""scripts/ci_check.sh — the ready-made CI gate — on a GRPO-like and a base-like demo checkpoint."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ci_check.sh"


@pytest.fixture(scope="module")
def demo_ckpts(tmp_path_factory):
    from vlmfast.checkpoints.tiny import build_checkpoint

    d = tmp_path_factory.mktemp("demo")
    return build_checkpoint(d / "grpo", preset="demo", like="grpo"), build_checkpoint(d / "base", preset="demo", like="base")


@pytest.mark.process_mechanism  # the script's exit codes
@pytest.mark.parametrize("kind,code,says", [("grpo", 4, "saved with use_cache false"), ("base", 0, "OK")])
def test_ci_check_gates_demo_checkpoints(demo_ckpts, tmp_path, kind, code, says):
    grpo, base = demo_ckpts
    ckpt = grpo if kind == "grpo" else base
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "REPORT_DIR": str(tmp_path / "rep"), "SYNTHETIC": "2", "SYNTHETIC_SIZE": "56", "REPEATS": "1", "MAX_NEW_TOKENS": "4", "FAIL_IF_SLOWER": "1000"}
    r = subprocess.run(["bash", str(SCRIPT), str(ckpt), str(base)], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == code, r.stdout + r.stderr
    assert says in r.stdout
    report = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert report["gates"]["exit_code"] == code and [s["name"] for s in report["scenarios"]] == ["ckpt", "base"]


def test_ci_check_usage():
    r = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True)
    assert r.returncode == 2 and "usage" in r.stderr
