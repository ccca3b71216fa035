"""Atomic file writes for the command line (standard library only).

:func:`write_bytes_atomic` never leaves a partial file at the target path, and never a partial
file next to it: the bytes go into an anonymous file in the target directory (Linux
``O_TMPFILE``: it has no name, so a process killed while writing leaves nothing behind), which
gets a temporary name only once it is complete and is then renamed over the target with
``os.replace`` (atomic on POSIX: readers see the old file or the new one, never a mix). Where
``O_TMPFILE`` is not available, a named temporary file in the target directory is used and
removed on any error; only a hard kill (SIGKILL, power loss) can leave that one behind.
"""

from __future__ import annotations

import os
import tempfile

__all__ = ["write_bytes_atomic", "write_all_or_nothing", "same_file", "unwritable_reason"]


def same_file(a: str, b: str) -> bool:
    """Whether the paths name the same file (an existing one, or the same absolute path)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def _write_all(fd: int, data: bytes, chunk: int = 1 << 20):
    view = memoryview(data)
    while view:
        n = os.write(fd, view[:chunk])
        view = view[n:]


def _unlink_quietly(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def _temp_name(path: str) -> str:
    directory, base = os.path.split(path)
    return os.path.join(directory, f".{base}.{os.getpid()}.{os.urandom(4).hex()}.tmp")


def _anonymous(path: str, data: bytes) -> bool:
    """O_TMPFILE route; False if the platform or file system does not support it."""
    flag = getattr(os, "O_TMPFILE", None)
    if flag is None:
        return False
    try:
        fd = os.open(os.path.dirname(path), flag | os.O_WRONLY, 0o666)
    except OSError:
        return False
    tmp = None
    try:
        _write_all(fd, data)
        os.fsync(fd)
        candidate = _temp_name(path)
        try:
            os.link(f"/proc/self/fd/{fd}", candidate)
        except OSError:
            return False  # no /proc: the fallback writes the data again
        tmp = candidate
    finally:
        os.close(fd)
    try:
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    return True


def write_bytes_atomic(path: str, data: bytes) -> None:
    """Replace (or create) ``path`` with ``data`` atomically.

    Raises:
        OSError: the directory is not writable, the disk is full, ...; ``path`` is unchanged
            and no temporary file is left.
    """
    path = os.path.abspath(path)
    if _anonymous(path, data):
        return
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=f".{os.path.basename(path)}.",
                               suffix=".tmp")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # as a plain open() would create it
        _write_all(fd, data)
        os.fsync(fd)
        os.close(fd)
        fd = None
        os.replace(tmp, path)
    except BaseException:
        if fd is not None:
            os.close(fd)
        _unlink_quietly(tmp)
        raise


def unwritable_reason(path: str) -> str | None:
    """Why a file cannot be written at ``path`` (found by creating and removing a temporary
    file next to it), or None if it can."""
    path = os.path.abspath(path)
    if os.path.isdir(path):
        return f"{path} is a directory"
    directory = os.path.dirname(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.",
                                   suffix=".probe")
    except OSError as exc:
        return f"cannot create a file in {directory}: {exc.strerror or exc}"
    os.close(fd)
    _unlink_quietly(tmp)
    return None


def write_all_or_nothing(files) -> None:
    """Write every ``(path, bytes)`` of ``files`` atomically, or none of them: if one write
    fails (or the run is interrupted), the files already written are put back as they were
    (removed if they are new, their old bytes restored otherwise) and the error propagates.
    """
    done = []  # (path, old bytes or None)
    try:
        for path, data in files:
            old = None
            if os.path.isfile(path):
                with open(path, "rb") as f:
                    old = f.read()
            write_bytes_atomic(path, data)
            done.append((path, old))
    except BaseException:
        for path, old in reversed(done):
            try:
                if old is None:
                    os.unlink(path)
                else:
                    write_bytes_atomic(path, old)
            except OSError:
                pass
        raise
