"""The setup scripts refuse an install that cannot fit, before pip starts it.

A multi-GB pip install that runs out of disk halfway leaves a broken environment and pip's
"No space left on device"; `need_disk` says where and how much instead. `df` is replaced by a
script on PATH that reports a chosen free space, so nothing here depends on this machine's disk."""

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_need_disk(tmp_path, free_kb, want_gb="7"):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake_df = bin_dir / "df"
    fake_df.write_text(
        "#!/bin/sh\n"
        'echo "Filesystem 1024-blocks Used Available Capacity Mounted on"\n'
        f'echo "/dev/fake 999999999 1 {free_kb} 1% /fake"\n'
    )
    fake_df.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "TMPDIR": str(tmp_path)}
    script = f'source "{ROOT}/scripts/need_disk.sh"; need_disk {want_gb} ".venv (torch)"; echo fits'
    return subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True)


def test_an_install_that_cannot_fit_is_refused_with_where_and_how_much(tmp_path):
    done = run_need_disk(tmp_path, free_kb=900 * 1024)
    assert done.returncode == 1
    assert "fits" not in done.stdout
    assert ".venv (torch) needs ~7 GiB free" in done.stderr
    assert "/fake" in done.stderr


def test_an_install_that_fits_goes_on(tmp_path):
    done = run_need_disk(tmp_path, free_kb=8 * 1024 * 1024)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "fits"


def test_every_setup_script_checks_the_disk_before_creating_an_environment():
    for name in ("setup.sh", "setup_vllm.sh"):
        text = (ROOT / "scripts" / name).read_text()
        assert "source scripts/need_disk.sh" in text
        creates = [at for create in ('-m venv .venv\n', '-m venv .venv-tf4\n', '-m venv "$VENV"\n')
                   if (at := text.find(create)) >= 0]
        assert creates, name
        for at in creates:
            assert text.rfind("need_disk ", 0, at) > text.rfind("creating", 0, at), name
