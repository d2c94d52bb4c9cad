"""scripts/ci_check.sh — the ready-made CI gate — on a GRPO-like and a base-like checkpoint (the
suite's tiny ones: the gates are the script's exit codes, whatever the model's size)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ci_check.sh"


@pytest.mark.process_mechanism  # the script's exit codes
@pytest.mark.parametrize("kind,code,says", [("grpo", 4, "saved with use_cache false"), ("base", 0, "OK")])
def test_ci_check_gates_a_grpo_like_and_a_base_like_checkpoint(grpo_ckpt, base_ckpt, tmp_path, kind, code, says):
    base = base_ckpt
    ckpt = grpo_ckpt if kind == "grpo" else base_ckpt
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
