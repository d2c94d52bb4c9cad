import os

import pytest

from vlmfast.files import atomic_write, publish_directory


def test_atomic_write_gives_ordinary_modes_and_whole_files(tmp_path):
    target = tmp_path / "f.json"
    target.write_text("old")
    atomic_write(target, b"new")
    assert target.read_bytes() == b"new" and oct(target.stat().st_mode & 0o777) == oct(0o666 & ~_umask())
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]  # no temp file left behind


def test_publish_without_replace_never_deletes_what_it_finds(tmp_path):
    build = tmp_path / "build"
    build.mkdir()
    (build / "a").write_text("x")
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("precious")
    with pytest.raises(OSError):
        publish_directory(build, out, replace=False)
    assert (out / "mine.txt").read_text() == "precious"
    (out / "mine.txt").unlink()
    publish_directory(build, out, replace=False)  # an empty directory is taken over
    assert (out / "a").read_text() == "x" and oct(out.stat().st_mode & 0o777) == oct(0o755)


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask
