"""utils/io.py: a folder or file is replaced whole or not at all, and what it writes has the
modes any other program of the user's would give it (the umask), not mkdtemp's/mkstemp's 0700/0600."""

import os
import stat

import pytest
import torch
from safetensors.torch import save_file

from transformer_lab.errors import TransformerLabError
from transformer_lab.utils import io
from transformer_lab.utils.io import atomic_directory, atomic_write_json


def snapshot(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def umask():
    """Sets the process's umask for one test; the old one comes back after."""
    old = os.umask(0o022)
    yield os.umask
    os.umask(old)


@pytest.fixture
def prepared(tmp_path):
    """A folder that an earlier run wrote."""
    out = tmp_path / "prepared"
    out.mkdir()
    (out / "old.txt").write_text("old")
    return out


def test_a_folder_is_replaced_whole_and_nothing_is_left_beside_it(tmp_path, prepared):
    out = prepared
    with atomic_directory(out) as folder:
        (folder / "new.txt").write_text("new")
    assert snapshot(out) == {"new.txt": b"new"}
    assert [p.name for p in tmp_path.iterdir()] == ["prepared"]


def test_a_failure_inside_leaves_the_old_folder_as_it_was(tmp_path, prepared):
    out = prepared
    with pytest.raises(RuntimeError, match="half way"):
        with atomic_directory(out) as folder:
            (folder / "new.txt").write_text("new")
            raise RuntimeError("half way")
    assert snapshot(out) == {"old.txt": b"old"}
    assert [p.name for p in tmp_path.iterdir()] == ["prepared"]


def test_a_failed_move_into_place_leaves_the_old_folder(tmp_path, prepared, monkeypatch):
    """The old folder goes only once the new one is in place: a move that fails leaves the old one."""
    out = prepared
    real_rename = os.rename

    def rename_fails_for_the_new_folder(src, dst):
        if str(src).endswith(".tmp"):
            raise OSError("disk gone")
        return real_rename(src, dst)

    monkeypatch.setattr(io.os, "rename", rename_fails_for_the_new_folder)
    monkeypatch.setattr(io.os, "replace", rename_fails_for_the_new_folder)
    with pytest.raises(OSError, match="disk gone"):
        with atomic_directory(out) as folder:
            (folder / "new.txt").write_text("new")
    assert snapshot(out) == {"old.txt": b"old"}
    assert [p.name for p in tmp_path.iterdir()] == ["prepared"]


def test_a_file_where_the_folder_goes_is_one_error_and_stays(tmp_path):
    out = tmp_path / "prepared"
    out.write_text("a user's notes")
    with pytest.raises(TransformerLabError) as refused:
        with atomic_directory(out) as folder:
            (folder / "new.txt").write_text("new")
    assert str(out) in str(refused.value) and "\n" not in str(refused.value)
    assert out.read_text() == "a user's notes"
    assert [p.name for p in tmp_path.iterdir()] == ["prepared"]


@pytest.mark.parametrize("mask, folder_mode, file_mode", [(0o022, 0o755, 0o644), (0o077, 0o700, 0o600)])
def test_what_is_written_follows_the_umask(tmp_path, umask, mask, folder_mode, file_mode):
    umask(mask)
    out = tmp_path / "prepared"
    with atomic_directory(out) as folder:
        save_file({"w": torch.zeros(2)}, str(folder / "weights.safetensors"))  # safetensors writes 0600
        (folder / "sub").mkdir(mode=0o700)
        (folder / "sub" / "labels.txt").write_text("a\n")
        atomic_write_json(folder / "meta.json", {"n": 1})  # mkstemp: 0600
    assert mode(out) == mode(out / "sub") == folder_mode
    assert {name: mode(out / name) for name in snapshot(out)} == dict.fromkeys(snapshot(out), file_mode)
    atomic_write_json(tmp_path / "metrics.json", {"loss": 1.0})
    assert mode(tmp_path / "metrics.json") == file_mode
