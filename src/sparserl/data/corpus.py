"""The CUDA pre-training corpus, gathered from what is on the machine.

No data can be downloaded, so the corpus is the CUDA toolkit's own headers (CCCL: CUB,
Thrust, libcu++; plus cooperative groups and the intrinsics headers), found from nvcc or
``CUDA_HOME``, and the project's rendered kernel library (repeated, since it is the
domain the policy must write). Files are deduplicated by content, shuffled with a seed,
and split into train and held-out *by file*, so held-out perplexity measures text the
model never saw.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
from dataclasses import dataclass, field
from pathlib import Path

from sparserl.errors import SparseRLError

log = logging.getLogger(__name__)

_EXTS = {".h", ".hpp", ".cuh", ".inl", ".cu", ""}


@dataclass(frozen=True)
class CorpusConfig:
    """What goes into the pre-training corpus."""

    cuda_include: str | None = None
    """CUDA include folder; default: found from nvcc / $CUDA_HOME."""
    max_bytes: int = 64 << 20
    """Cap on the header text gathered (bytes)."""
    max_file_bytes: int = 512 << 10
    """Files larger than this are skipped (generated tables)."""
    library_repeats: int = 20
    """How many times the rendered kernel library is included (it is small and on-domain)."""
    heldout_fraction: float = 0.02
    """Share of files held out for perplexity."""
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.heldout_fraction < 0.5:
            raise SparseRLError("heldout_fraction must be in (0, 0.5)")
        if self.library_repeats < 0:
            raise SparseRLError("library_repeats must be >= 0")


@dataclass
class Corpus:
    train: list[str]
    heldout: list[str]
    stats: dict = field(default_factory=dict)


def find_cuda_include(explicit: str | None = None) -> Path:
    """The CUDA toolkit's include folder (with the CCCL headers)."""
    from sparserl.harness.compile import find_cuda_include as find

    if explicit:
        if (Path(explicit) / "cuda_runtime.h").exists():
            return Path(explicit)
        raise SparseRLError(f"{explicit}: no cuda_runtime.h there")
    if (found := find()) is not None:
        return found
    raise SparseRLError("CUDA headers not found: install the CUDA toolkit or set CUDA_HOME (needed for the corpus)")


def _header_files(root: Path) -> list[Path]:
    files = []
    for dirpath, _, names in os.walk(root):
        for name in names:
            p = Path(dirpath) / name
            if p.suffix in _EXTS and not p.is_symlink():
                files.append(p)
    return sorted(files)


def _looks_like_text(data: bytes) -> bool:
    return b"\0" not in data[:4096]


def library_texts() -> list[str]:
    """Every library variant rendered as a completion."""
    from sparserl.kernels.library import all_variants

    return [v.render() for v in all_variants()]


def build_corpus(config: CorpusConfig | None = None) -> Corpus:
    """Gather, deduplicate, shuffle and split the corpus (texts are whole files)."""
    cfg = config or CorpusConfig()
    root = find_cuda_include(cfg.cuda_include)
    seen: set[str] = set()
    headers: list[str] = []
    total = 0
    for p in _header_files(root):
        try:
            data = p.read_bytes()
        except OSError:
            continue
        if len(data) > cfg.max_file_bytes or not data.strip() or not _looks_like_text(data):
            continue
        h = hashlib.sha1(data).hexdigest()
        if h in seen:
            continue
        seen.add(h)
        headers.append(data.decode("utf-8", errors="replace"))
        total += len(data)
        if total >= cfg.max_bytes:
            break
    if not headers:
        raise SparseRLError(f"no CUDA headers found under {root}")
    rng = random.Random(cfg.seed)
    rng.shuffle(headers)
    n_held = max(1, int(len(headers) * cfg.heldout_fraction))
    lib = library_texts()
    rng.shuffle(lib)
    lib_held = lib[: max(1, len(lib) // 20)]
    train = headers[n_held:] + lib[len(lib_held):] * cfg.library_repeats
    rng.shuffle(train)
    heldout = headers[:n_held] + lib_held
    stats = {"include_dir": str(root), "header_files": len(headers), "header_bytes": total,
             "library_variants": len(lib), "train_texts": len(train), "heldout_texts": len(heldout),
             "train_chars": sum(map(len, train)), "heldout_chars": sum(map(len, heldout))}
    log.info("corpus: %s", stats)
    return Corpus(train, heldout, stats)
