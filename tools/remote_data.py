"""Carry image datasets to a machine that cannot download them, in calls of bounded size.

A lent GPU machine sees only what a call carries (64 MiB per call here), and CIFAR-10's npz files
are 185 MB. Images compress losslessly about 1.8× as WebP mosaics, so this script packs each
``.npz`` of ``x`` (uint8 N×H×W×C images) and ``y`` (labels) into chunks of at most ``--chunk``
images, one WebP mosaic each, and deals the chunks into ``part0/``, ``part1/``, ... of at most
``--part-mb`` megabytes. On the other side ``unpack`` decodes whatever parts a call carried into a
chunk cache and writes every ``.npz`` whose chunks are all there, after checking the SHA-256 of its
``x`` and ``y`` bytes against the packed originals, so a file is either exact or absent::

    python tools/remote_data.py pack ../shared/data /tmp/pack --part-mb 40 cifar10_train_part0 cifar10_train_part1 cifar10_test_jpeg
    # call k carries /tmp/pack/part<k> (e.g. copied into an ignored folder of the repository) and runs
    python tools/remote_data.py unpack /tmp/data .pack/part<k>       # on the remote machine; /tmp persists while it is warm

Needs numpy and Pillow with WebP (``python -c "import PIL.features as f; print(f.check('webp'))"``).
The commit messages of the GPU runs under reproduction/ tell how the lent GPUs were used with it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

COLUMNS = 128  # images per mosaic row


def _map(fn, items: list, workers: int) -> list:  # type: ignore[no-untyped-def]
    """``map`` over processes (the codecs are CPU-bound), or in this process for one worker."""
    if workers <= 1:
        return [fn(i) for i in items]
    with ProcessPoolExecutor(workers) as ex:
        return list(ex.map(fn, items))


def _sha(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def _encode(job: tuple[str, np.ndarray, np.ndarray, Path]) -> tuple[str, Path, int]:
    from PIL import Image

    stem, x, y, dest = job
    n, h, w, c = x.shape
    rows = -(-n // COLUMNS)
    padded = np.zeros((rows * COLUMNS, h, w, c), np.uint8)
    padded[:n] = x
    mosaic = padded.reshape(rows, COLUMNS, h, w, c).transpose(0, 2, 1, 3, 4).reshape(rows * h, COLUMNS * w, c)
    image = Image.fromarray(mosaic[..., 0] if c == 1 else mosaic)
    path = dest / f"{stem}.webp"
    image.save(path, lossless=True, quality=100, method=4)
    np.save(dest / f"{stem}.y.npy", y)
    (dest / f"{stem}.json").write_text(json.dumps({"shape": list(x.shape), "dtype_y": str(y.dtype)}))
    return stem, path, path.stat().st_size + (dest / f"{stem}.y.npy").stat().st_size


def pack(src: Path, dest: Path, names: list[str], *, chunk: int = 5000, part_mb: float = 40.0, workers: int = 2) -> list[Path]:
    """Pack ``src/<name>.npz`` into ``dest/part<k>/`` (module docstring); returns the part folders."""
    staging = dest / "_chunks"
    staging.mkdir(parents=True, exist_ok=True)
    jobs, manifests = [], {}
    for name in names:
        with np.load(src / f"{name}.npz") as d:
            x, y = d["x"], d["y"]
        if x.dtype != np.uint8 or x.ndim != 4 or x.shape[-1] not in (1, 3):
            raise SystemExit(f"{name}: x must be uint8 N×H×W×C with C in (1, 3), got {x.dtype} {x.shape}")
        stems = []
        for i, start in enumerate(range(0, len(x), chunk)):
            stem = f"{name}__{i:03d}"
            stems.append(stem)
            jobs.append((stem, x[start:start + chunk], y[start:start + chunk], staging))
        manifests[name] = {"chunks": stems, "sha_x": _sha(x), "sha_y": _sha(y), "shape": list(x.shape)}
    encoded = sorted(_map(_encode, jobs, workers), key=lambda t: -t[2])
    budget = part_mb * 1e6
    parts: list[list[str]] = []
    sizes: list[float] = []
    for stem, _, size in encoded:  # first fit, largest first
        k = next((k for k, s in enumerate(sizes) if s + size <= budget), None)
        if k is None:
            if size > budget:
                raise SystemExit(f"{stem} is {size / 1e6:.1f} MB, over --part-mb {part_mb}: use a smaller --chunk")
            parts.append([]), sizes.append(0.0)
            k = len(parts) - 1
        parts[k].append(stem)
        sizes[k] += size
    folders = []
    for k, stems in enumerate(parts):
        folder = dest / f"part{k}"
        folder.mkdir(exist_ok=True)
        for stem in stems:
            for suffix in (".webp", ".y.npy", ".json"):
                (staging / f"{stem}{suffix}").rename(folder / f"{stem}{suffix}")
        (folder / "manifest.json").write_text(json.dumps(manifests, indent=1))
        folders.append(folder)
        print(f"{folder}: {len(stems)} chunks, {sizes[k] / 1e6:.1f} MB")
    staging.rmdir()
    return folders


def _decode(args: tuple[Path, Path]) -> str:
    from PIL import Image

    Image.MAX_IMAGE_PIXELS = None
    meta_path, cache = args
    stem = meta_path.stem
    meta = json.loads(meta_path.read_text())
    n, h, w, c = meta["shape"]
    mosaic = np.asarray(Image.open(meta_path.with_suffix(".webp")).convert("L" if c == 1 else "RGB"))
    mosaic = mosaic.reshape(mosaic.shape[0], mosaic.shape[1], c)
    rows = mosaic.shape[0] // h
    x = mosaic.reshape(rows, h, COLUMNS, w, c).transpose(0, 2, 1, 3, 4).reshape(rows * COLUMNS, h, w, c)[:n]
    np.save(cache / f"{stem}.x.npy", x)
    np.save(cache / f"{stem}.y.npy", np.load(meta_path.parent / f"{stem}.y.npy"))
    return stem


def unpack(out: Path, folders: list[Path], *, workers: int = 8) -> dict[str, str]:
    """Decode the chunks in ``folders`` into ``out/_chunks`` and write each complete, verified
    ``out/<name>.npz``; returns name -> "written" | "present" | "waiting (k of n chunks)" | "CHECKSUM MISMATCH"."""
    cache = out / "_chunks"
    cache.mkdir(parents=True, exist_ok=True)
    manifests: dict[str, dict] = {}
    metas = []
    for folder in folders:
        manifests.update(json.loads((folder / "manifest.json").read_text()))
        metas += [p for p in sorted(folder.glob("*.json")) if p.name != "manifest.json"]
    _map(_decode, [(m, cache) for m in metas], workers)
    status = {}
    for name, man in manifests.items():
        if (out / f"{name}.npz").exists():
            status[name] = "present"
            continue
        have = [s for s in man["chunks"] if (cache / f"{s}.x.npy").exists()]
        if len(have) < len(man["chunks"]):
            status[name] = f"waiting ({len(have)} of {len(man['chunks'])} chunks)"
            continue
        x = np.concatenate([np.load(cache / f"{s}.x.npy") for s in man["chunks"]])
        y = np.concatenate([np.load(cache / f"{s}.y.npy") for s in man["chunks"]])
        if _sha(x) != man["sha_x"] or _sha(y) != man["sha_y"]:
            status[name] = "CHECKSUM MISMATCH"
            continue
        np.savez(out / f"{name}.npz", x=x, y=y)
        status[name] = "written"
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="npz files -> WebP chunks in parts of bounded size")
    p.add_argument("src", type=Path)
    p.add_argument("dest", type=Path)
    p.add_argument("names", nargs="+", help="npz file names without .npz")
    p.add_argument("--chunk", type=int, default=5000, help="images per chunk (default: 5000)")
    p.add_argument("--part-mb", type=float, default=40.0, help="most megabytes per part (default: 40)")
    p.add_argument("--workers", type=int, default=2)
    u = sub.add_parser("unpack", help="parts -> verified npz files")
    u.add_argument("out", type=Path)
    u.add_argument("folders", type=Path, nargs="+")
    u.add_argument("--workers", type=int, default=8)
    args = parser.parse_args(argv)
    if args.command == "pack":
        pack(args.src, args.dest, args.names, chunk=args.chunk, part_mb=args.part_mb, workers=args.workers)
        return 0
    status = unpack(args.out, args.folders, workers=args.workers)
    for name, s in status.items():
        print(f"{name}: {s}")
    return 1 if any(s == "CHECKSUM MISMATCH" for s in status.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
