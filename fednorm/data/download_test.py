"""Tests for fednorm.data.download, run offline against ``file://`` urls in tmp_path."""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
import os
import tarfile
import zipfile
from pathlib import Path

import pytest

from fednorm.data.download import calculate_md5, check_integrity, download_url, extract_archive
from fednorm.errors import DatasetError

PAYLOAD = bytes(range(256)) * 4096  # 1 MiB: crosses the chunk size, so chunked hashing is exercised
PAYLOAD_MD5 = hashlib.md5(PAYLOAD).hexdigest()
PAYLOAD_SHA256 = hashlib.sha256(PAYLOAD).hexdigest()


@pytest.fixture()
def source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "blob.bin").write_bytes(PAYLOAD)
    return src


def _flip_one_byte(path: Path, offset: int = 1000) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x01
    path.write_bytes(bytes(raw))


class TestCheckIntegrity:
    def test_missing_file_is_false(self, tmp_path: Path) -> None:
        assert not check_integrity(tmp_path / "absent", md5=PAYLOAD_MD5)
        assert not check_integrity(tmp_path / "absent")

    def test_matching_checksums_pass(self, source: Path) -> None:
        path = source / "blob.bin"
        assert calculate_md5(path) == PAYLOAD_MD5
        assert check_integrity(path)
        assert check_integrity(path, md5=PAYLOAD_MD5)
        assert check_integrity(path, md5=PAYLOAD_MD5.upper())
        assert check_integrity(path, sha256=PAYLOAD_SHA256)
        assert check_integrity(path, md5=PAYLOAD_MD5, sha256=PAYLOAD_SHA256)

    def test_one_changed_byte_fails_both_checksums(self, source: Path) -> None:
        path = source / "blob.bin"
        _flip_one_byte(path, offset=len(PAYLOAD) - 1)  # the last chunk must be hashed too
        assert not check_integrity(path, md5=PAYLOAD_MD5)
        assert not check_integrity(path, sha256=PAYLOAD_SHA256)
        assert not check_integrity(path, md5=PAYLOAD_MD5, sha256="0" * 64)

    def test_directory_is_not_a_file(self, tmp_path: Path) -> None:
        assert not check_integrity(tmp_path)


class TestDownloadUrlSuccess:
    def test_file_url_downloads_and_verifies(self, source: Path, tmp_path: Path) -> None:
        dest = tmp_path / "dest" / "nested"  # created on demand
        out = download_url((source / "blob.bin").as_uri(), dest, md5=PAYLOAD_MD5)
        assert out == dest / "blob.bin"
        assert out.read_bytes() == PAYLOAD
        assert not (dest / "blob.bin.part").exists()

    def test_custom_filename(self, source: Path, tmp_path: Path) -> None:
        out = download_url((source / "blob.bin").as_uri(), tmp_path, "renamed.dat", PAYLOAD_MD5)
        assert out == tmp_path / "renamed.dat" and out.read_bytes() == PAYLOAD

    def test_idempotent_when_verified_copy_exists(self, source: Path, tmp_path: Path) -> None:
        url = (source / "blob.bin").as_uri()
        first = download_url(url, tmp_path / "d", md5=PAYLOAD_MD5)
        mtime = first.stat().st_mtime_ns
        (source / "blob.bin").unlink()  # a second fetch would now fail
        second = download_url(url, tmp_path / "d", md5=PAYLOAD_MD5)
        assert second == first and second.stat().st_mtime_ns == mtime

    def test_corrupt_existing_copy_is_replaced(self, source: Path, tmp_path: Path) -> None:
        dest = tmp_path / "d"
        dest.mkdir()
        (dest / "blob.bin").write_bytes(b"stale")
        out = download_url((source / "blob.bin").as_uri(), dest, md5=PAYLOAD_MD5)
        assert out.read_bytes() == PAYLOAD

    def test_falls_back_to_mirror_when_url_missing(self, source: Path, tmp_path: Path) -> None:
        primary = (tmp_path / "nowhere" / "blob.bin").as_uri()
        mirror = source.as_uri()  # base without trailing slash: one is added
        out = download_url(primary, tmp_path / "d", md5=PAYLOAD_MD5, mirrors=[mirror])
        assert out.read_bytes() == PAYLOAD

    def test_falls_back_to_mirror_when_url_serves_corrupt_file(self, source: Path, tmp_path: Path) -> None:
        bad = tmp_path / "bad"
        bad.mkdir()
        (bad / "blob.bin").write_bytes(PAYLOAD[:-1] + b"\x00")
        out = download_url(
            (bad / "blob.bin").as_uri(), tmp_path / "d", md5=PAYLOAD_MD5, mirrors=[source.as_uri() + "/"]
        )
        assert out.read_bytes() == PAYLOAD


class TestDownloadUrlFailure:
    def test_corrupt_source_raises_and_leaves_no_file(self, source: Path, tmp_path: Path) -> None:
        _flip_one_byte(source / "blob.bin")
        dest = tmp_path / "d"
        url = (source / "blob.bin").as_uri()
        with pytest.raises(DatasetError) as info:
            download_url(url, dest, md5=PAYLOAD_MD5)
        message = str(info.value)
        assert "blob.bin" in message and url in message and "md5 mismatch" in message
        assert not (dest / "blob.bin").exists()
        assert not (dest / "blob.bin.part").exists()  # documented: .part is removed on failure

    def test_every_url_tried_is_named(self, tmp_path: Path) -> None:
        url = (tmp_path / "a" / "f.bin").as_uri()
        mirrors = [(tmp_path / "b").as_uri() + "/", (tmp_path / "c").as_uri() + "/"]
        with pytest.raises(DatasetError) as info:
            download_url(url, tmp_path / "d", md5="0" * 32, mirrors=mirrors)
        message = str(info.value)
        assert "f.bin" in message
        for tried in [url, mirrors[0] + "f.bin", mirrors[1] + "f.bin"]:
            assert tried in message
        assert list((tmp_path / "d").iterdir()) == []


def _tar_with(path: Path, members: dict[str, bytes], mode: str = "w:gz") -> None:
    with tarfile.open(path, mode) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


class TestExtractArchive:
    @pytest.mark.parametrize(
        "suffix, mode", [(".tar.gz", "w:gz"), (".tgz", "w:gz"), (".tar", "w"), (".tar.bz2", "w:bz2")]
    )
    def test_tar_roundtrip(self, tmp_path: Path, suffix: str, mode: str) -> None:
        archive = tmp_path / f"a{suffix}"
        _tar_with(archive, {"top/x.bin": b"xx", "top/sub/y.bin": b"yyy"}, mode)
        out = extract_archive(archive, tmp_path / "out")
        assert out == (tmp_path / "out").resolve()
        assert (out / "top" / "x.bin").read_bytes() == b"xx"
        assert (out / "top" / "sub" / "y.bin").read_bytes() == b"yyy"

    def test_zip_roundtrip(self, tmp_path: Path) -> None:
        archive = tmp_path / "a.zip"
        with zipfile.ZipFile(archive, "w") as zf:
            zf.writestr("d/z.txt", "zip")
        out = extract_archive(archive, tmp_path / "out")
        assert (out / "d" / "z.txt").read_text() == "zip"

    def test_single_file_gz_and_bz2(self, tmp_path: Path) -> None:
        (tmp_path / "f.idx.gz").write_bytes(gzip.compress(PAYLOAD))
        (tmp_path / "g.txt.bz2").write_bytes(bz2.compress(b"libsvm"))
        assert extract_archive(tmp_path / "f.idx.gz").read_bytes() == PAYLOAD
        out = extract_archive(tmp_path / "g.txt.bz2", tmp_path / "o")
        assert out == (tmp_path / "o").resolve() / "g.txt" and out.read_bytes() == b"libsvm"

    def test_default_destination_is_archive_folder(self, tmp_path: Path) -> None:
        _tar_with(tmp_path / "a.tar.gz", {"m.bin": b"m"})
        extract_archive(tmp_path / "a.tar.gz")
        assert (tmp_path / "m.bin").read_bytes() == b"m"

    @pytest.mark.parametrize("name", ["../escape.bin", "/abs/escape.bin", "ok/../../escape.bin"])
    def test_tar_member_escaping_destination_is_rejected(self, tmp_path: Path, name: str) -> None:
        archive = tmp_path / "evil.tar.gz"
        _tar_with(archive, {"fine.bin": b"f", name: b"evil"})
        dest = tmp_path / "inner" / "out"
        with pytest.raises(DatasetError, match="escape"):
            extract_archive(archive, dest)
        assert not (tmp_path / "inner" / "escape.bin").exists()
        assert not (dest / "fine.bin").exists()  # checked before anything is written

    def test_tar_symlink_pointing_outside_is_rejected(self, tmp_path: Path) -> None:
        archive = tmp_path / "link.tar"
        with tarfile.open(archive, "w") as tar:
            link = tarfile.TarInfo("link")
            link.type = tarfile.SYMTYPE
            link.linkname = "../../etc/passwd"
            tar.addfile(link)
        with pytest.raises(DatasetError, match="outside"):
            extract_archive(archive, tmp_path / "out")
        assert not os.path.lexists(tmp_path / "out" / "link")

    def test_zip_member_escaping_destination_is_rejected(self, tmp_path: Path) -> None:
        archive = tmp_path / "evil.zip"
        with zipfile.ZipFile(archive, "w") as zf:
            zf.writestr("../escape.txt", "evil")
        with pytest.raises(DatasetError, match="escape"):
            extract_archive(archive, tmp_path / "out")
        assert not (tmp_path / "escape.txt").exists()

    def test_corrupt_gz_raises_dataset_error_and_cleans_up(self, tmp_path: Path) -> None:
        path = tmp_path / "f.bin.gz"
        path.write_bytes(gzip.compress(PAYLOAD)[:-100])
        with pytest.raises(DatasetError, match="f.bin.gz"):
            extract_archive(path)
        assert not (tmp_path / "f.bin").exists() and not (tmp_path / "f.bin.part").exists()

    def test_unsupported_suffix(self, tmp_path: Path) -> None:
        (tmp_path / "a.rar").write_bytes(b"x")
        with pytest.raises(ValueError, match="Unsupported archive"):
            extract_archive(tmp_path / "a.rar")
