"""araopt.files: a local file is whole or absent (kills mid-write must not leave a partial file)."""
import os

import pytest

from araopt.io.files import atomic_write, atomic_write_bytes, read_bytes


def test_new_content_replaces_the_old_and_no_temporary_file_remains(tmp_path):
    path = tmp_path / "a.json"
    path.write_text("old")
    assert atomic_write_bytes(path, b"new") == str(path)
    assert path.read_bytes() == b"new" and os.listdir(tmp_path) == ["a.json"]
    atomic_write(path, lambda fh: fh.write("caf\u00e9"), mode="w")
    assert path.read_text(encoding="utf-8") == "caf\u00e9"


def test_a_failing_writer_leaves_the_old_file_untouched_and_no_temporary_file(tmp_path):
    path = tmp_path / "a.json"
    path.write_bytes(b"old")

    def half_then_crash(fh):
        fh.write(b"partial")
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError, match="killed"):
        atomic_write(path, half_then_crash)
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["a.json"]


def test_mode_must_be_write_binary_or_text(tmp_path):
    with pytest.raises(ValueError, match="mode"):
        atomic_write(tmp_path / "a", lambda fh: None, mode="a")


def test_read_bytes_names_what_and_the_path(tmp_path):
    (tmp_path / "p.json").write_bytes(b"{}")
    assert read_bytes(tmp_path / "p.json", "parameter file") == b"{}"
    with pytest.raises(ValueError, match=r"cannot read parameter file .*missing\.json: No such file"):
        read_bytes(tmp_path / "missing.json", "parameter file")
