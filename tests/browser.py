"""A real headless browser for tests: Chromium from the distribution's packages. Found on PATH; where it is
missing, installed with apt-get when running as root in CI (CI set); otherwise the test is skipped with
the reason."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--hide-scrollbars")


def _found() -> str | None:
    return next((path for path in map(shutil.which, NAMES) if path), None)


def chromium() -> str:
    """The browser's path, installing it where that is allowed; pytest.skip with the reason otherwise."""
    found = _found()
    if found:
        return found
    if not os.environ.get("CI") or not hasattr(os, "geteuid") or os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("no Chromium here (apt-get install chromium; CI installs it itself when it runs as root)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", "chromium"]
    if subprocess.run(install, capture_output=True, env=env).returncode != 0:
        subprocess.run(["apt-get", "update"], capture_output=True, env=env)
        subprocess.run(install, capture_output=True, env=env)
    return _found() or pytest.skip("apt-get could not install chromium")


def dump_dom(url: str, profile: Path) -> str:
    """The page's DOM after its scripts ran (virtual time: no waiting on the wall clock)."""
    r = subprocess.run([chromium(), *FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=10000", "--dump-dom", url],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def screenshot(url: str, path: Path, profile: Path, size: str = "1280,1900") -> Path:
    r = subprocess.run([chromium(), *FLAGS, f"--user-data-dir={profile}", f"--window-size={size}",
                        "--virtual-time-budget=10000", f"--screenshot={path}", url], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and path.is_file(), r.stderr[-2000:]
    return path
