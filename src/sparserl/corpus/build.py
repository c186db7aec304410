"""``sparserl corpus build``: a CUDA C++ pre-training corpus from packages on the public index.

Sources, in the order they are read (the first to bring a text owns it):

1. the packages (:mod:`sparserl.corpus.sources`), fetched with ``pip download`` into a cache
   (:mod:`sparserl.corpus.fetch`) or read from a folder of archives already downloaded;
2. the CUDA toolkit's include folder (its CCCL copy is skipped when a CCCL package is in the
   build: one version of a library, not two);
3. the project's own kernel library, rendered, and its search templates rendered at their seed points
   on small generated matrices of every trainable family (``sparserl-templates``: the specialised
   kernels the search's winners are made of, with their tables, which the library alone never shows);
4. the held-out packages, last, so a text they share with a training package stays in training.

Every file goes through :func:`sparserl.corpus.filters.drop_reason`, then de-duplication by the
SHA-256 of its text with line ends made LF and trailing white space taken off (:func:`content_key`).
The split is by package: the held-out packages whole, plus ``heldout_fraction`` of every other
fetched package's files (chosen by hash, so the same file lands in the same split on every build),
which gives each package a held-out perplexity of its own. The local sources (toolkit, library,
templates) give no share: they are what the model is trained to write, and the library and the
templates' files are near-copies of their siblings. Last, a held-out file whose lines are mostly
(``near_duplicate``, 0.8) found in one training file is dropped (:mod:`sparserl.corpus.near`), so
the held-out split holds no text the model saw in training, all but a few lines.

A build can be run again at any time: archives already in the cache are not fetched again, texts
already in ``files/`` are not written again, and the manifest is replaced only when the build
succeeded (a failed build leaves an earlier corpus as it was).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sparserl.corpus.archives import ArchiveInfo, members, read_info
from sparserl.corpus.fetch import fetch
from sparserl.corpus.filters import FileRules, drop_reason, has_extension, licence_of
from sparserl.corpus.lock import folder_lock
from sparserl.corpus.manifest import (
    CORPUS_VERSION,
    FILES,
    LIBRARY,
    SUMMARY,
    TEMPLATES,
    ManifestRow,
    file_path,
    read_text,
    write_manifest,
)
from sparserl.corpus.near import near_copies
from sparserl.corpus.sources import (
    ARCHIVE_SUFFIXES,
    DEFAULT_HELDOUT,
    DEFAULT_PACKAGES,
    PackageSpec,
    archive_name_version,
    normalise,
    spec_for,
)
from sparserl.errors import SparseRLError

log = logging.getLogger(__name__)

TOOLKIT = "cuda-toolkit"
TEMPLATE_ROWS = (3000, 8000)
"""Rows of the generated matrices the templates are rendered on (one matrix per trainable family and size)."""
TEMPLATE_SEED = 7919
"""Their generator seed: not one a data build, an evaluation or a benchmark uses."""


def default_cache() -> Path:
    """``<harness cache root>/pip-corpus`` (root: $SPARSERL_CACHE_DIR or ~/.cache/sparserl)."""
    root = os.environ.get("SPARSERL_CACHE_DIR") or os.path.join(Path.home(), ".cache", "sparserl")
    return Path(root) / "pip-corpus"


@dataclass(frozen=True)
class BuildConfig:
    """What goes into a built corpus."""

    out: str
    """Corpus folder (manifest.jsonl, summary.json, files/)."""
    cache: str | None = None
    """Folder the archives are downloaded into; default: :func:`default_cache`."""
    archives: str | None = None
    """Read this folder of archives (.whl, .tar.gz, .zip) instead of fetching: no index needed. One archive per
    package is read: where it holds several, the recipe's pinned version (else a SparseRLError)."""
    packages: tuple[PackageSpec, ...] = DEFAULT_PACKAGES
    """Packages to fetch (ignored with ``archives``)."""
    heldout_packages: tuple[str, ...] | None = None
    """Packages held out whole, each one of the build's packages (else a SparseRLError); None: those of
    :data:`DEFAULT_HELDOUT` that are in the build."""
    heldout_fraction: float = 0.01
    """Share of every other fetched package's files held out (chosen by hash); the local sources give none."""
    near_duplicate: float = 0.8
    """A held-out file with at least this share of its lines in one training file is dropped (a near-copy)."""
    toolkit: bool = True
    """Add the CUDA toolkit's headers."""
    cuda_include: str | None = None
    """The toolkit's include folder; default: found from nvcc or $CUDA_HOME."""
    library: bool = True
    """Add the project's kernel library, rendered."""
    templates: bool = True
    """Add the search templates rendered at their seed points on small generated matrices (:data:`TEMPLATES`)."""
    rules: FileRules = field(default_factory=FileRules)
    """File filter thresholds."""
    index_url: str | None = None
    """Package index for pip (default: pip's own setting)."""

    def __post_init__(self) -> None:
        if not 0 <= self.heldout_fraction < 0.5:
            raise SparseRLError(f"heldout_fraction must be in [0, 0.5), got {self.heldout_fraction}")
        if not 0 < self.near_duplicate <= 1:
            raise SparseRLError(f"near_duplicate must be in (0, 1], got {self.near_duplicate}")
        names = [normalise(p.name) for p in self.packages]
        if twice := sorted({n for n in names if names.count(n) > 1}):
            raise SparseRLError(f"packages: {', '.join(twice)} named more than once: one version of a package "
                                "(two would put one version's text in training and the next one's beside it)")


@dataclass
class PackageTally:
    """What one source gave: the per-package lines of ``summary.json``."""

    version: str = ""
    licence: str = ""
    origin: str = ""
    """'fetched', 'cache', 'archives', 'local'."""
    archive: str = ""
    files_seen: int = 0
    """Files with a CUDA C++ extension inside the package's share."""
    bytes_seen: int = 0
    kept: int = 0
    kept_bytes: int = 0
    train_bytes: int = 0
    heldout_bytes: int = 0
    duplicates: int = 0
    """Files whose text an earlier file (this package's or another's) already brought (line ends and trailing
    white space aside)."""
    duplicate_bytes: int = 0
    near_duplicates: int = 0
    """Held-out files dropped as near-copies of a training file (:data:`BuildConfig.near_duplicate`)."""
    near_duplicate_bytes: int = 0
    dropped: dict = field(default_factory=dict)
    """reason -> {'files': n, 'bytes': b}."""
    excluded: int = 0
    """CUDA C++ files outside the package's share (bundled copies of other libraries, generated kernels)."""
    excluded_bytes: int = 0

    def drop(self, reason: str, size: int) -> None:
        d = self.dropped.setdefault(reason, {"files": 0, "bytes": 0})
        d["files"] += 1
        d["bytes"] += size


@dataclass(frozen=True)
class Source:
    """One package to read: its recipe, its archive (None for a local folder) and its metadata."""

    spec: PackageSpec
    archive: Path | None
    info: ArchiveInfo
    origin: str


def _heldout_by_hash(sha: str, fraction: float) -> bool:
    return int(sha[:8], 16) / 0x100000000 < fraction


_LINE_END = re.compile(rb"\r\n?")
_TRAILING = re.compile(rb"[ \t\f\v]+$", re.MULTILINE)


def content_key(data: bytes) -> str:
    """The de-duplication key of a file: the SHA-256 of its text with CRLF and CR line ends made LF, white space
    at the end of each line and blank lines at the end of the file taken off."""
    text = _TRAILING.sub(b"", _LINE_END.sub(b"\n", data)).rstrip(b"\n")
    return hashlib.sha256(text + b"\n").hexdigest()


def _archive_sources(folder: Path) -> list[Source]:
    if not folder.is_dir():
        raise SparseRLError(f"--archives {folder}: no such folder")
    found = sorted(p for p in folder.iterdir() if p.name.endswith(ARCHIVE_SUFFIXES))
    if not found:
        raise SparseRLError(f"--archives {folder} holds no package archives (.whl, .tar.gz, .zip): download "
                            "them there with 'pip download --no-deps -d FOLDER NAME'")
    by_name: dict[str, list[Source]] = {}
    for p in found:
        nv = archive_name_version(p.name) or (normalise(p.name.split(".")[0]), "")
        info = read_info(p, *nv)
        spec = spec_for(info.name, info.version)
        by_name.setdefault(spec.name, []).append(Source(spec, p, info, "archives"))
    return [_one_version(folder, name, group) for name, group in by_name.items()]


def _one_version(folder: Path, name: str, group: list[Source]) -> Source:
    """The one archive of package ``name`` to read: the only one, else the recipe's pinned version (in the
    recipe's kind of archive where both are there); two versions of a package would put one version's text in
    training and its near-copy in the next version beside it, and tally both under one name."""
    if len(group) == 1:
        return group[0]
    recipe = spec_for(name)
    picks = [s for s in group if recipe.version and s.info.version == recipe.version]
    if len(picks) > 1:
        picks = [s for s in picks if s.archive.name.endswith(".whl") == (recipe.archive == "wheel")] or picks
    files = ", ".join(s.archive.name for s in group)
    if len(picks) != 1:
        pinned = f"its recipe pins {recipe.version}" if recipe.version else "no recipe pins its version"
        raise SparseRLError(f"--archives {folder} holds {len(group)} archives of {name} ({files}) and {pinned}: "
                            "leave one there")
    log.info("--archives: %d archives of %s (%s): reading %s, the recipe's version", len(group), name, files,
             picks[0].archive.name)
    return picks[0]


def _fetched_sources(cfg: BuildConfig, cache: Path) -> list[Source]:
    results = []
    failed = []
    for spec in cfg.packages:
        r = fetch(spec, cache, cfg.index_url)
        if r.archive is None:
            failed.append(r)
            log.warning("could not fetch %s: %s", spec.requirement, r.error)
        else:
            results.append(r)
    if failed:
        names = ", ".join(r.spec.requirement for r in failed)
        why = failed[0].error.removeprefix("ERROR: ")
        raise SparseRLError(
            f"could not fetch {len(failed)} of {len(cfg.packages)} packages ({names}; pip: {why}); "
            f"{len(results)} fetched are kept in {cache}. With no reachable index, download the archives where "
            "there is one (pip download --no-deps NAME==VERSION) and pass their folder with --archives DIR")
    return [Source(r.spec, r.archive, read_info(r.archive, r.spec.name, r.spec.version),
                   "cache" if r.cached else "fetched") for r in results]


def _toolkit_files(root: Path, skip_cccl: bool) -> Iterator[tuple[str, bytes]]:
    for dirpath, dirnames, names in os.walk(root, followlinks=True):
        rel_dir = os.path.relpath(dirpath, root)
        if skip_cccl and rel_dir == ".":
            dirnames[:] = [d for d in dirnames if d != "cccl"]
        dirnames.sort()
        for name in sorted(names):
            p = Path(dirpath) / name
            rel = os.path.normpath(os.path.join(rel_dir, name))
            if has_extension(rel, extensionless=True):
                try:
                    yield rel, p.read_bytes()
                except OSError:
                    continue


def _toolkit_version(root: Path) -> str:
    try:
        m = re.search(r"#define\s+CUDA_VERSION\s+(\d+)", (root / "cuda.h").read_text(errors="replace"))
    except OSError:
        return ""
    return f"{int(m.group(1)) // 1000}.{int(m.group(1)) % 1000 // 10}" if m else ""


def _library_files() -> Iterator[tuple[str, bytes]]:
    from sparserl.kernels.library import all_variants

    for v in all_variants():
        yield f"library/{v.id}.cu", v.render().encode()


def _template_files() -> Iterator[tuple[str, bytes]]:
    """Every template's seed points (SpMV, and SpMM at k = 32) rendered on one matrix per trainable family
    (the held-out ones left out) and size of :data:`TEMPLATE_ROWS`. A generic template renders a point the
    same on every matrix, so each of its points is rendered once; the specialised ones on every matrix."""
    from sparserl.kernels.contract import Op
    from sparserl.kernels.templates import templates
    from sparserl.matrices import generate
    from sparserl.matrices.card import matrix_card
    from sparserl.matrices.generators import HELD_OUT_FAMILIES, family_names

    generic_done: set[tuple] = set()
    for fam in (f for f in family_names(include_application=True) if f not in HELD_OUT_FAMILIES):
        for rows in TEMPLATE_ROWS:
            card = matrix_card(generate(fam, rows, seed=TEMPLATE_SEED))
            for op, k in ((Op.SPMV, None), (Op.SPMM, 32)):
                for t in templates(op.value):
                    for p in t.seed_points(card, k):
                        key = (op, t.name, tuple(sorted(p.items())))
                        if key in generic_done or t.check(p, card, k) is not None:
                            continue
                        if not t.specialised:
                            generic_done.add(key)
                        text = t.render(p, card).encode()
                        yield f"templates/{t.name}/{hashlib.sha256(text).hexdigest()[:16]}.cu", text


class _Writer:
    """De-duplicates, splits, stores texts and tallies."""

    def __init__(self, cfg: BuildConfig, out: Path):
        self.cfg, self.out = cfg, out
        self.seen: dict[str, str] = {}
        """:func:`content_key` -> the package that brought the text."""
        self.rows: list[ManifestRow] = []
        self.near: list[dict] = []
        """The held-out files dropped as near-copies, with their closest training file."""
        self.held_texts: dict[str, bytes] = {}
        """The held-out files' bytes by SHA-256 (stored after :meth:`drop_near_copies`)."""
        self.tally: dict[str, PackageTally] = {}
        self.written = 0

    def store(self, sha: str, data: bytes) -> None:
        """Write a text into ``files/`` unless it is there already."""
        dest = file_path(self.out, sha)
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_suffix(".tmp")
            tmp.write_bytes(data)
            tmp.replace(dest)
            self.written += 1

    def share(self, spec: PackageSpec, archive: Path) -> Iterator[tuple[str, bytes]]:
        """The members of ``archive`` in ``spec``'s share; those outside it (bundled copies, other
        folders) are tallied as ``excluded`` without being read, those over the size limit as
        ``too_large`` without being read (or, where the archive understated a size, past the limit)."""
        t = self.tally.setdefault(spec.name, PackageTally())
        limit = self.cfg.rules.max_bytes
        for m in members(archive):
            if not has_extension(m.name, spec.extensionless):
                continue
            if spec.takes(m.name):
                data = m.read(limit) if m.size <= limit else None
                if data is None or len(data) > limit:
                    t.files_seen += 1
                    t.bytes_seen += max(m.size, len(data or b""))
                    t.drop("too_large", max(m.size, len(data or b"")))
                    continue
                yield m.name, data
            else:
                t.excluded += 1
                t.excluded_bytes += m.size

    def add(self, package: str, version: str, licence: str, items: Iterator[tuple[str, bytes]],
            extensionless: bool, cuda_only: bool, heldout: bool, origin: str, archive: str,
            share: bool = True) -> PackageTally:
        """Read one source's files; ``heldout``: all of them held out, else ``share``: the hash-chosen
        ``heldout_fraction`` of them."""
        t = self.tally.setdefault(package, PackageTally())
        t.version, t.licence, t.origin, t.archive = version, licence, origin, archive
        for path, data in items:
            t.files_seen += 1
            t.bytes_seen += len(data)
            reason, text = drop_reason(path, data, self.cfg.rules, extensionless=extensionless, cuda_only=cuda_only)
            if reason is not None:
                t.drop(reason, len(data))
                continue
            key = content_key(data)
            if key in self.seen:
                t.duplicates += 1
                t.duplicate_bytes += len(data)
                continue
            self.seen[key] = package
            sha = hashlib.sha256(data).hexdigest()
            split = "heldout" if heldout or (share and _heldout_by_hash(sha, self.cfg.heldout_fraction)) else "train"
            if split == "train":
                self.store(sha, data)
            else:  # stored once the near-copy check has kept it
                self.held_texts[sha] = data
            self.rows.append(ManifestRow(package, version, licence_of(text, self.cfg.rules.head_chars) or licence,
                                         path, sha, len(data), split))
            t.kept += 1
            t.kept_bytes += len(data)
            if split == "train":
                t.train_bytes += len(data)
            else:
                t.heldout_bytes += len(data)
        return t

    def drop_near_copies(self, bar) -> None:
        """Drop each held-out file with at least ``near_duplicate`` of its lines in one training file (its text
        was seen in training, all but a few lines), tallied as ``near_duplicates``; store the others."""
        held = [r for r in self.rows if r.split == "heldout"]
        train = [r for r in self.rows if r.split == "train"]
        if not held or not train:
            for r in held:
                self.store(r.sha256, self.held_texts[r.sha256])
            return
        t0 = time.perf_counter()
        task = bar.add_task("near-duplicates", total=len(train))

        def texts() -> Iterator[str]:
            for r in train:
                yield read_text(self.out, r)
                bar.advance(task)

        matches = near_copies([self.held_texts[r.sha256].decode() for r in held], texts())
        dropped = set()
        for r, m in zip(held, matches):
            if m.similarity < self.cfg.near_duplicate:
                self.store(r.sha256, self.held_texts[r.sha256])
                continue
            dropped.add(id(r))
            t = self.tally[r.package]
            t.near_duplicates += 1
            t.near_duplicate_bytes += r.bytes
            t.kept -= 1
            t.kept_bytes -= r.bytes
            t.heldout_bytes -= r.bytes
            near = train[m.train]
            self.near.append({"package": r.package, "path": r.path, "similarity": round(m.similarity, 3),
                              "train_package": near.package, "train_path": near.path})
        self.rows = [r for r in self.rows if id(r) not in dropped]
        log.info("near-duplicates: %d of %d held-out files have %.0f%% or more of their lines in one training file: "
                 "dropped (%.1f s over %d training files)", len(dropped), len(held), 100 * self.cfg.near_duplicate,
                 time.perf_counter() - t0, len(train))


def build(cfg: BuildConfig) -> dict:
    """Build the corpus folder; returns the summary (also written to ``summary.json``). One build at a
    time writes a folder, and one fetches into a cache (:func:`~sparserl.corpus.lock.folder_lock`)."""
    with folder_lock(Path(cfg.out), "corpus build"):
        return _build(cfg)


def _build(cfg: BuildConfig) -> dict:
    from sparserl.progress import progress

    t0 = time.perf_counter()
    out = Path(cfg.out)
    local_names = {n for n, on in ((TOOLKIT, cfg.toolkit), (LIBRARY, cfg.library), (TEMPLATES, cfg.templates)) if on}
    if cfg.archives:
        sources = _archive_sources(Path(cfg.archives))
        held = _heldout_names(cfg, {s.spec.name for s in sources} | local_names)
    else:
        held = _heldout_names(cfg, {normalise(p.name) for p in cfg.packages} | local_names)  # before fetching
        cache = Path(cfg.cache) if cfg.cache else default_cache()
        with folder_lock(cache, "corpus fetch"):
            sources = _fetched_sources(cfg, cache)
    sources.sort(key=lambda s: s.spec.name in held)  # stable: training packages first, held-out ones last
    (out / FILES).mkdir(parents=True, exist_ok=True)
    w = _Writer(cfg, out)
    local: list[tuple[str, str, str, Iterator, str]] = []
    if cfg.toolkit:
        from sparserl.data.corpus import find_cuda_include

        try:
            root = find_cuda_include(cfg.cuda_include)
        except SparseRLError as exc:
            raise SparseRLError(f"{exc}; or build without them: --no-toolkit") from None
        has_cccl = any(s.spec.name.startswith("nvidia-cuda-cccl") for s in sources)
        local.append((TOOLKIT, _toolkit_version(root), "NVIDIA CUDA Toolkit EULA",
                      _toolkit_files(root, skip_cccl=has_cccl), str(root)))
    from sparserl import __version__

    if cfg.library:
        local.append((LIBRARY, __version__, "Apache-2.0", _library_files(), "rendered"))
    if cfg.templates:
        local.append((TEMPLATES, __version__, "Apache-2.0", _template_files(), "rendered"))
    train_sources = [s for s in sources if s.spec.name not in held]
    held_sources = [s for s in sources if s.spec.name in held]
    with progress() as bar:
        task = bar.add_task("corpus", total=len(sources) + len(local))

        def read(s: Source) -> None:
            bar.update(task, description=f"corpus {s.spec.name}")
            spec = s.spec
            items = w.share(spec, s.archive)
            w.add(spec.name, s.info.version, s.info.licence, items, spec.extensionless, True,
                  spec.name in held, s.origin, s.archive.name)
            bar.advance(task)

        for s in train_sources:
            read(s)
        for name, version, licence, items, where in local:
            bar.update(task, description=f"corpus {name}")
            w.add(name, version, licence, items, extensionless=True, cuda_only=name != TOOLKIT,
                  heldout=name in held, origin="local", archive=where, share=False)
            bar.advance(task)
        for s in held_sources:
            read(s)
        w.drop_near_copies(bar)
    from_packages = sum(w.tally[s.spec.name].kept for s in sources if s.spec.name in w.tally)
    if sources and from_packages == 0:
        where = cfg.archives or "the fetched archives"
        raise SparseRLError(f"{where}: {len(sources)} archive(s), none holds CUDA source that passes the filters "
                            f"({_reasons(w.tally)}): nothing usable, the corpus in {out} was left as it was")
    if not w.rows:
        raise SparseRLError("nothing usable: no package, toolkit or library file passed the filters")
    if not any(r.split == "train" for r in w.rows):
        raise SparseRLError("every file landed in the held-out split: hold out fewer packages")
    write_manifest(out, w.rows)
    pruned = _prune(out, {r.sha256 for r in w.rows})
    summary = _summary(cfg, w, time.perf_counter() - t0, pruned, held)
    tmp = out / (SUMMARY + ".tmp")
    tmp.write_text(json.dumps(summary, indent=1))
    tmp.replace(out / SUMMARY)
    return summary


def _heldout_names(cfg: BuildConfig, names: set[str]) -> set[str]:
    """The packages held out whole: ``cfg.heldout_packages``, each one of the build's ``names`` (a name matching
    none, a typo, would leave that package in training unnoticed), or the default ones the build has."""
    if cfg.heldout_packages is None:
        return {n for n in DEFAULT_HELDOUT if n in names}
    held = {normalise(n) for n in cfg.heldout_packages}
    if missing := sorted(held - names):
        raise SparseRLError(f"--heldout {', '.join(missing)}: no such package in this build (its packages: "
                            f"{', '.join(sorted(names))})")
    return held


def _reasons(tally: dict[str, PackageTally]) -> str:
    total: dict[str, int] = {}
    for t in tally.values():
        for reason, d in t.dropped.items():
            total[reason] = total.get(reason, 0) + d["files"]
    seen = sum(t.files_seen for t in tally.values())
    if not seen:
        return "no .cu/.cuh/.h/.hpp/.inl file in their share"
    return f"{seen} CUDA C++ files seen, dropped: " + ", ".join(f"{k} {v}" for k, v in sorted(total.items()))


def _prune(out: Path, keep: set[str]) -> int:
    """Remove texts an earlier build stored that this one no longer lists."""
    n = 0
    for p in (out / FILES).glob("*/*.txt"):
        if p.stem not in keep:
            p.unlink()
            n += 1
    return n


def _summary(cfg: BuildConfig, w: _Writer, seconds: float, pruned: int, held_names: set[str]) -> dict:
    packages = {name: asdict(t) for name, t in w.tally.items()}
    train = sum(r.bytes for r in w.rows if r.split == "train")
    held = sum(r.bytes for r in w.rows if r.split == "heldout")
    return {
        "corpus_version": CORPUS_VERSION,
        "files": len(w.rows), "unique_bytes": train + held, "train_bytes": train, "heldout_bytes": held,
        "heldout_packages": sorted({r.package for r in w.rows if r.split == "heldout" and r.package in held_names}),
        "heldout_fraction": cfg.heldout_fraction, "bytes_seen": sum(t.bytes_seen for t in w.tally.values()),
        "duplicate_bytes": sum(t.duplicate_bytes for t in w.tally.values()),
        "near_duplicate": cfg.near_duplicate, "near_duplicates": len(w.near),
        "near_duplicate_bytes": sum(t.near_duplicate_bytes for t in w.tally.values()), "near_copies": w.near,
        "excluded_bytes": sum(t.excluded_bytes for t in w.tally.values()),
        "files_written": w.written, "files_pruned": pruned, "seconds": round(seconds, 1),
        "rules": asdict(cfg.rules), "packages": packages,
    }
