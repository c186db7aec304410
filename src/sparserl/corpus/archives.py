"""Reading package archives (wheels and zips, source tarballs) without unpacking them to disk. A member is
read only up to a limit (a zip bomb's member is never decompressed whole)."""

from __future__ import annotations

import email.parser
import lzma
import re
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from sparserl.errors import SparseRLError

META_LIMIT = 1 << 20
"""Most bytes of a METADATA or PKG-INFO file read (its headers come first)."""
LICENCE_LIMIT = 100_000
"""Most bytes of a LICENSE file read (a larger one is not read)."""


@dataclass(frozen=True)
class ArchiveInfo:
    """What an archive's metadata says of its package."""

    name: str
    """Distribution name (from the metadata, else the file name)."""
    version: str
    """Version (from the metadata, else the file name)."""
    licence: str
    """Declared licence (License-Expression, License, or the licence classifiers); 'unknown' if none."""


def _is_zip(path: Path) -> bool:
    return path.name.endswith((".whl", ".zip"))


def _strip_top(names: list[str]) -> Callable[[str], str]:
    """A source archive keeps everything under one top folder (``pkg-1.0/``): strip it."""
    tops = {n.split("/", 1)[0] for n in names if n}
    if len(tops) == 1 and all("/" in n for n in names if not n.endswith("/")):
        return lambda n: n.split("/", 1)[1] if "/" in n else n
    return lambda n: n


@dataclass(frozen=True)
class Member:
    """One regular file of an archive; ``read(limit)`` decompresses at most ``limit + 1`` bytes of it (more
    than ``limit`` returned: the member is larger than the limit)."""

    name: str
    """Path inside the archive (an sdist's top folder removed)."""
    size: int
    """Uncompressed size in bytes (as the archive declares it)."""
    read: Callable[[int], bytes]


_DAMAGED = (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError, NotImplementedError)


def _reader(path: Path, name: str, open_member: Callable) -> Callable[[int], bytes]:
    """``read(limit)`` of one member: a damaged member (a flipped byte: a bad CRC, an invalid deflate
    stream) is a SparseRLError naming the archive and the member."""
    def read(limit: int) -> bytes:
        try:
            with open_member() as f:
                return f.read(limit + 1)
        except _DAMAGED as exc:
            cls = type(exc)
            kind = cls.__name__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__name__}"  # zlib.error
            raise SparseRLError(f"{path}: member {name} is damaged ({kind}: {exc}); remove the archive and fetch it "
                                "again") from None
    return read


def members(path: Path) -> Iterator[Member]:
    """The regular files of ``path`` in archive order; an sdist's top folder is removed from the
    paths. A damaged archive is a SparseRLError, and so is a damaged member when it is read."""
    try:
        if _is_zip(path):
            with zipfile.ZipFile(path) as z:
                infos = [i for i in z.infolist() if not i.is_dir()]
                strip = _strip_top([i.filename for i in infos]) if not path.name.endswith(".whl") else (lambda n: n)
                for info in infos:
                    yield Member(strip(info.filename), info.file_size,
                                 _reader(path, info.filename, lambda info=info: z.open(info)))
        else:
            with tarfile.open(path, "r:*") as t:
                infos = [m for m in t.getmembers() if m.isfile()]
                strip = _strip_top([m.name for m in infos])
                for info in infos:
                    yield Member(strip(info.name), info.size,
                                 _reader(path, info.name, lambda info=info: t.extractfile(info)))
    except _DAMAGED as exc:
        raise SparseRLError(f"{path}: not a readable archive ({type(exc).__name__}: {exc}); remove it "
                            "and fetch it again") from None


def read_info(path: Path, fallback_name: str, fallback_version: str) -> ArchiveInfo:
    """Name, version and licence from a wheel's METADATA or an sdist's PKG-INFO."""
    meta, licence_text = None, None
    for m in members(path):
        if meta is None and (m.name.endswith(".dist-info/METADATA") or m.name == "PKG-INFO"):
            meta = m.read(META_LIMIT)[:META_LIMIT]
        elif licence_text is None and _LICENCE_FILE.fullmatch(m.name) and m.size < LICENCE_LIMIT:
            licence_text = m.read(LICENCE_LIMIT)[:LICENCE_LIMIT].decode("utf-8", errors="replace")
    if meta is None:
        return ArchiveInfo(fallback_name, fallback_version, "unknown")
    msg = email.parser.BytesHeaderParser().parsebytes(meta)
    licence = (msg.get("License-Expression") or "").strip()
    if not licence:
        first = (msg.get("License") or "").strip().splitlines()
        licence = first[0].strip() if first and len(first[0]) <= 80 else ""
    if licence.upper() == "UNKNOWN":
        licence = ""
    if not licence:
        classes = [c.split("::")[-1].strip() for c in msg.get_all("Classifier") or [] if c.startswith("License ::")]
        licence = "; ".join(classes)
    from sparserl.corpus.sources import normalise

    return ArchiveInfo(normalise(msg.get("Name") or fallback_name), (msg.get("Version") or fallback_version).strip(),
                       licence or licence_from_text(licence_text or "") or "unknown")


_LICENCE_FILE = re.compile(r"(?:[^/]+\.dist-info/(?:licenses/)?)?(?:LICEN[CS]E|COPYING)(?:\.(?:txt|md|rst))?",
                           re.IGNORECASE)


def licence_from_text(text: str) -> str:
    """A licence name recognised from a LICENSE file's words ('' when not recognised)."""
    head = " ".join(text[:3000].split())
    if "Apache License" in head and "Version 2.0" in head:
        return "Apache-2.0"
    if "Permission is hereby granted, free of charge" in head:
        return "MIT"
    if "Redistribution and use in source and binary forms" in head:
        return "BSD-3-Clause" if "Neither the name" in head or "endorse or promote" in head else "BSD-2-Clause"
    return ""
