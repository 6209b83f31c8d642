"""Writes that never leave a half-written file behind: write beside, then rename.

What they write gets the modes the user's umask gives any new file or folder (0644/0755 under
022), not the 0600/0700 of mkstemp, mkdtemp or safetensors: teammates read the outputs."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import shutil
import tempfile
import uuid
import warnings
from pathlib import Path
from typing import Iterator


def current_umask() -> int:
    """The process's umask. Linux tells it in /proc without changing it (os.umask can only read it
    by setting it, for a moment, for every thread)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def follow_umask(path: str | os.PathLike) -> None:
    """`path` and, for a folder, everything in it get the modes a new file or folder would: 0666 or,
    for a file anyone may execute, 0777, less the umask. Symbolic links are left alone."""
    mask = current_umask()

    def chmod(item: str, full: int) -> None:
        if not os.path.islink(item):
            executable = os.stat(item).st_mode & 0o111
            os.chmod(item, (0o777 if full or executable else 0o666) & ~mask)

    if not os.path.isdir(path):
        chmod(path, False)
        return
    for root, _, files in os.walk(path):
        chmod(root, True)
        for name in files:
            chmod(os.path.join(root, name), False)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        follow_umask(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_csv(path: str | os.PathLike, rows: list[dict]) -> None:
    """Rows as a CSV file (header: the first row's keys), written atomically."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, buffer.getvalue())


def atomic_write_json(path: str | os.PathLike, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def decode_utf8(path: str | os.PathLike, raw: bytes) -> str:
    """UTF-8 text of a file's bytes; a bad byte is a DataError naming file and line."""
    from transformer_lab.errors import DataError

    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise DataError(f"{path}:{line}: not valid UTF-8 (byte {raw[err.start]:#04x} at offset {err.start})") from None


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
    """Yields a temporary directory beside `path`; on success it replaces the folder `path` whole,
    on error it is removed and `path` is as it was. A file at `path` is refused, untouched.

    The replacement moves the old folder aside, the new one in, and only then removes the old one:
    a move that fails puts the old folder back."""
    from transformer_lab.errors import TransformerLabError

    path = Path(path)
    if path.exists() and not path.is_dir():
        raise TransformerLabError(f"{path}: a file, not a folder; name a folder to write")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    try:
        yield tmp
        follow_umask(tmp)
        if not os.path.lexists(path):
            os.rename(tmp, path)
            return
        aside = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.old")
        os.rename(path, aside)
        try:
            os.rename(tmp, path)
        except BaseException:
            os.rename(aside, path)
            raise
        try:
            if aside.is_symlink():
                aside.unlink()
            else:
                shutil.rmtree(aside)
        except OSError as err:  # the new folder is in place: say what is left, do not fail the write
            warnings.warn(f"{path}: the folder it replaced is left at {aside} ({err})", stacklevel=3)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
