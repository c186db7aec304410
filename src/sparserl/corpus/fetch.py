"""Fetching package archives with the ordinary client (``pip download``) into a cache folder.

The cache is a plain folder of archives, as ``pip download`` leaves them, plus ``fetched.json``
(requirement -> archive file name). A requirement recorded there whose archive is present is
never fetched again, so a build runs with no network once the cache is filled, and a build that
failed part-way keeps what it had fetched. The cache folder is itself a folder of archives:
``--archives CACHE`` reads it with no index at all.

Source archives are fetched with ``--no-build-isolation``: pip prepares an sdist's metadata
before it saves it, and some packages' ``setup.py`` import torch, which the isolated build
environment lacks. The environment variables in :data:`SKIP_BUILD_ENV` tell those setup
scripts not to look for a CUDA build (nothing is compiled: only metadata is read).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from sparserl.corpus.sources import ARCHIVE_SUFFIXES, PackageSpec, archive_name_version, normalise

log = logging.getLogger(__name__)

SKIP_BUILD_ENV = {"FLASH_ATTENTION_SKIP_CUDA_BUILD": "TRUE", "XFORMERS_DISABLE_FLASH_ATTN": "1",
                  "MAMBA_SKIP_CUDA_BUILD": "TRUE", "CAUSAL_CONV1D_SKIP_CUDA_BUILD": "TRUE", "DS_BUILD_OPS": "0",
                  "NATTEN_IS_BUILDING_DIST": "1", "FORCE_CUDA": "0", "BUILD_NO_CUDA": "1", "MAX_JOBS": "1"}
"""Set while pip prepares source archives' metadata: their setup scripts skip CUDA checks."""


@dataclass(frozen=True)
class FetchResult:
    """One requirement's fetch."""

    spec: PackageSpec
    """What was asked for."""
    archive: Path | None
    """The archive in the cache; None when it could not be fetched."""
    cached: bool
    """Taken from the cache without asking the index."""
    error: str = ""
    """pip's last words when the fetch failed."""


def _index_path(cache: Path) -> Path:
    return cache / "fetched.json"


def read_index(cache: Path) -> dict[str, str]:
    """requirement key -> archive file name, for the archives already fetched into ``cache``."""
    p = _index_path(cache)
    if not p.exists():
        return {}
    try:
        return dict(json.loads(p.read_text()))
    except (ValueError, TypeError):
        log.warning("%s is unreadable: fetching again", p)
        return {}


def _key(spec: PackageSpec) -> str:
    return f"{spec.requirement}:{spec.archive}"


def _record(cache: Path, spec: PackageSpec, archive: Path) -> None:
    index = read_index(cache) | {_key(spec): archive.name}
    tmp = _index_path(cache).with_suffix(".tmp")
    tmp.write_text(json.dumps(index, indent=1, sort_keys=True))
    tmp.replace(_index_path(cache))


def _archives(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir() if p.name.endswith(ARCHIVE_SUFFIXES)}


def _matches(spec: PackageSpec, filename: str) -> bool:
    nv = archive_name_version(filename)
    kind_ok = filename.endswith(".whl") == (spec.archive == "wheel")
    return nv is not None and nv[0] == normalise(spec.name) and (not spec.version or nv[1] == spec.version) and kind_ok


def fetch(spec: PackageSpec, cache: Path, index_url: str | None = None, timeout_s: float = 900.0) -> FetchResult:
    """``spec``'s archive in ``cache``: from the cache when recorded there, else by ``pip download``."""
    cache.mkdir(parents=True, exist_ok=True)
    known = read_index(cache).get(_key(spec))
    if known and (cache / known).exists():
        return FetchResult(spec, cache / known, cached=True)
    before = _archives(cache)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "--progress-bar",
           "off", "-d", str(cache), spec.requirement]
    if spec.archive == "wheel":
        cmd[5:5] = ["--only-binary", ":all:"]
    else:
        cmd[5:5] = ["--no-binary", ":all:", "--no-build-isolation"]
    if index_url:
        cmd[5:5] = ["--index-url", index_url, "--retries", "1", "--timeout", "15"]
    log.info("fetching %s (%s)", spec.requirement, spec.archive)
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=os.environ | SKIP_BUILD_ENV)
    except subprocess.TimeoutExpired:
        return FetchResult(spec, None, False, f"pip took over {timeout_s:.0f} s")
    new = sorted(_archives(cache) - before)
    # pip leaves an archive already in the folder alone ("File was already downloaded"): find it by name
    found = [n for n in new if _matches(spec, n)] or (
        [n for n in sorted(_archives(cache)) if _matches(spec, n)] if r.returncode == 0 else [])
    if r.returncode != 0 or not found:
        lines = [ln.strip() for ln in (r.stderr + r.stdout).splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("ERROR")] or lines[-1:]
        return FetchResult(spec, None, False, errors[-1] if errors else f"pip exited {r.returncode}")
    archive = cache / found[-1]
    _record(cache, spec, archive)
    return FetchResult(spec, archive, cached=False)
