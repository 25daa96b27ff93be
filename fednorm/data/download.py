"""Downloading, verifying and unpacking dataset files.

Follows torchvision's ``datasets/utils.py`` contract, hardened for unattended runs: a
download goes to ``<file>.part`` and is renamed only once its checksum passes, so an
interrupted or corrupt transfer never leaves a file that looks complete; the url and then
each mirror are tried in order; and archives are unpacked only when no member would land
outside the destination. Everything works offline with ``file://`` urls, which is how the
tests exercise it.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import os
import shutil
import sys
import tarfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path
from typing import IO, Sequence

from fednorm.errors import DatasetError

__all__ = ["calculate_md5", "check_integrity", "download_url", "extract_archive"]

_CHUNK = 1 << 20  # 1 MiB: large enough for throughput, small enough for a steady progress bar
_PROGRESS_MIN_BYTES = 1 << 20  # smaller files finish before a bar is worth drawing
_USER_AGENT = "fednorm"  # some hosts (e.g. S3 behind a CDN) reject urllib's default agent


def _hash_file(path: Path, algorithm: str) -> str:
    digest = hashlib.new(algorithm, usedforsecurity=False)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def calculate_md5(path: str | os.PathLike) -> str:
    """MD5 hex digest of a file, read in chunks so large archives need little memory."""
    return _hash_file(Path(path), "md5")


def check_integrity(
    path: str | os.PathLike, md5: str | None = None, sha256: str | None = None
) -> bool:
    """Whether ``path`` is a file matching every checksum given.

    With no checksum this only checks that the file exists. MD5 is used for upstream
    datasets (it is what their publishers list), not for security, hence
    ``usedforsecurity=False``.

    Args:
        path: file to check.
        md5: expected MD5 hex digest (case-insensitive), or ``None`` to skip.
        sha256: expected SHA-256 hex digest (case-insensitive), or ``None`` to skip.

    Returns:
        ``False`` when the file is missing or any given checksum differs.
    """
    p = Path(path)
    if not p.is_file():
        return False
    if md5 is not None and _hash_file(p, "md5") != md5.lower():
        return False
    if sha256 is not None and _hash_file(p, "sha256") != sha256.lower():
        return False
    return True


def _candidate_urls(url: str, mirrors: Sequence[str]) -> list[str]:
    """The url itself, then ``mirror + <remote file name>`` for each mirror base."""
    remote_name = Path(urllib.parse.urlparse(url).path).name
    urls = [url]
    for base in mirrors:
        candidate = base if base.endswith("/") else base + "/"
        candidate += remote_name
        if candidate not in urls:
            urls.append(candidate)
    return urls


def _progress_bar(total: int | None, desc: str):
    """A tqdm bar for large transfers on a terminal; ``None`` otherwise (logs stay clean)."""
    if total is not None and total < _PROGRESS_MIN_BYTES:
        return None
    if not sys.stderr.isatty():
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm is a declared dependency, but a missing bar must not block a download
        return None
    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc, leave=False)


def _fetch(url: str, part: Path, md5: str | None, timeout: float) -> None:
    """Stream ``url`` into ``part``, hashing on the fly; raise on a checksum mismatch."""
    request = urllib.request.Request(url, headers={"User-Agent": _USER_AGENT})
    digest = hashlib.md5(usedforsecurity=False)
    with urllib.request.urlopen(request, timeout=timeout) as response:
        length = response.headers.get("Content-Length")
        total = int(length) if length and length.isdigit() else None
        bar = _progress_bar(total, part.name[: -len(".part")])
        try:
            with open(part, "wb") as out:
                for chunk in iter(lambda: response.read(_CHUNK), b""):
                    out.write(chunk)
                    digest.update(chunk)
                    if bar is not None:
                        bar.update(len(chunk))
        finally:
            if bar is not None:
                bar.close()
    if md5 is not None and digest.hexdigest() != md5.lower():
        raise ValueError(f"md5 mismatch (expected {md5.lower()}, got {digest.hexdigest()})")


def download_url(
    url: str,
    root: str | os.PathLike,
    filename: str | None = None,
    md5: str | None = None,
    *,
    mirrors: Sequence[str] = (),
    timeout: float = 60.0,
) -> Path:
    """Download ``url`` into ``root/filename`` unless a verified copy is already there.

    The transfer goes to ``<file>.part`` and is renamed to ``<file>`` only after its MD5
    matches, so a partial or corrupt download never masquerades as the real file. On a
    failed attempt the ``.part`` file is deleted and the next url is tried: first ``url``,
    then each base in ``mirrors`` joined with the url's file name (torchvision's MNIST
    mirror scheme). ``file://`` urls work, which allows offline copies and tests.

    Args:
        url: primary location.
        root: destination folder, created if needed.
        filename: local name (default: the last component of ``url``).
        md5: expected MD5; ``None`` skips verification (and accepts any existing file).
        mirrors: alternative base urls, tried in order after ``url``.
        timeout: socket timeout in seconds for each attempt.

    Returns:
        Path of the verified file.

    Raises:
        DatasetError: when every url failed or delivered a file with the wrong checksum;
            the message names the file and lists each url with its error.
    """
    root = Path(root).expanduser()
    if filename is None:
        filename = Path(urllib.parse.urlparse(url).path).name
    if not filename:
        raise ValueError(f"cannot infer a file name from url {url!r}; pass filename=")
    fpath = root / filename
    if check_integrity(fpath, md5):  # idempotent: a verified file is never fetched twice
        return fpath
    root.mkdir(parents=True, exist_ok=True)
    part = fpath.with_name(fpath.name + ".part")
    errors: list[str] = []
    for candidate in _candidate_urls(url, mirrors):
        try:
            _fetch(candidate, part, md5, timeout)
        except (OSError, ValueError, urllib.error.URLError) as exc:  # HTTPError is an OSError
            part.unlink(missing_ok=True)
            errors.append(f"  {candidate}: {exc}")
            continue
        os.replace(part, fpath)  # atomic on one filesystem: readers see all or nothing
        return fpath
    raise DatasetError(
        f"Failed to download {filename} to {fpath}. Tried:\n" + "\n".join(errors) + "\n"
        f"Check the network, or place a copy of {filename} at {fpath} by hand."
    )


def _is_within(base: Path, target: Path) -> bool:
    try:
        target.relative_to(base)
    except ValueError:
        return False
    return True


def _check_tar_members(tar: tarfile.TarFile, dest: Path, archive: Path) -> None:
    """Reject members that would escape ``dest`` (absolute paths, ``..``, outside links)."""
    for member in tar.getmembers():
        target = (dest / member.name).resolve()
        if not _is_within(dest, target):
            raise DatasetError(f"Refusing to extract {archive}: member {member.name!r} escapes {dest}")
        if member.issym() or member.islnk():
            link_base = target.parent if member.issym() else dest
            link_target = (link_base / member.linkname).resolve()
            if not _is_within(dest, link_target):
                raise DatasetError(
                    f"Refusing to extract {archive}: link {member.name!r} -> {member.linkname!r} "
                    f"points outside {dest}"
                )
        elif not (member.isfile() or member.isdir()):
            raise DatasetError(
                f"Refusing to extract {archive}: member {member.name!r} is a device or fifo"
            )


def _decompress_stream(src: IO[bytes], dest_file: Path) -> None:
    part = dest_file.with_name(dest_file.name + ".part")
    try:
        with open(part, "wb") as out:
            shutil.copyfileobj(src, out, _CHUNK)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    os.replace(part, dest_file)


def extract_archive(path: str | os.PathLike, to: str | os.PathLike | None = None) -> Path:
    """Unpack a ``.tar``/``.tar.gz``/``.tgz``/``.tar.bz2``/``.zip`` archive or a ``.gz``/``.bz2`` file.

    Tar and zip members are checked before anything is written: an absolute path, a
    ``..`` component or a link pointing outside ``to`` aborts the extraction (the classic
    tar-slip attack; a downloaded archive is untrusted input even after its checksum).

    Args:
        path: the archive.
        to: destination folder (default: the archive's folder), created if needed.

    Returns:
        ``to`` for multi-file archives, the decompressed file for ``.gz``/``.bz2``.

    Raises:
        DatasetError: for an unsafe member or a corrupt archive.
        ValueError: for an unsupported suffix.
    """
    path = Path(path)
    dest = Path(to) if to is not None else path.parent
    dest.mkdir(parents=True, exist_ok=True)
    dest = dest.resolve()
    name = path.name.lower()
    try:
        if name.endswith((".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz")):
            with tarfile.open(path, "r:*") as tar:
                _check_tar_members(tar, dest, path)
                if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4 / 3.12: defence in depth
                    tar.extractall(dest, filter="data")
                else:  # pragma: no cover - older interpreters rely on the check above
                    tar.extractall(dest)
            return dest
        if name.endswith(".zip"):
            with zipfile.ZipFile(path) as zf:
                for info in zf.infolist():
                    if not _is_within(dest, (dest / info.filename).resolve()):
                        raise DatasetError(
                            f"Refusing to extract {path}: member {info.filename!r} escapes {dest}"
                        )
                zf.extractall(dest)
            return dest
        if name.endswith(".gz"):
            out = dest / path.name[: -len(".gz")]
            with gzip.open(path, "rb") as src:
                _decompress_stream(src, out)
            return out
        if name.endswith(".bz2"):
            out = dest / path.name[: -len(".bz2")]
            with bz2.open(path, "rb") as src:
                _decompress_stream(src, out)
            return out
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError) as exc:
        if isinstance(exc, FileNotFoundError) and not path.exists():
            raise DatasetError(f"Archive not found: {path}") from exc
        raise DatasetError(f"Could not extract {path}: {exc}") from exc
    raise ValueError(
        f"Unsupported archive type for {path}: expected .tar, .tar.gz, .tgz, .tar.bz2, .zip, .gz or .bz2"
    )
