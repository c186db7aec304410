"""A built corpus tokenised once, in a folder small enough to carry to a GPU machine.

``sparserl corpus pack`` trains the BPE tokenizer (digits split one by one) on a seeded sample of
the train split, tokenises the train split (documents shuffled, each ended by EOS; the project's own
kernels, the library's files and the templates' renders, repeated ``library_repeats`` times) and each
held-out package's files, and writes:

* ``tokenizer/``: the Hugging Face fast tokenizer;
* ``train.tokens.xz``: the train token stream, raw little-endian uint16 (uint32 past 65,536
  tokens), xz-compressed;
* ``heldout/<package>.tokens.xz``: one stream per held-out package, at most ``heldout_tokens``;
* ``pack.json``: counts, dtype, the SHA-256 of every raw stream, where the train stream was
  cut when the whole of it did not fit in ``max_mib``, and what it was made from: the SHA-256 of the
  corpus's manifest and the settings (:func:`pack_differs` tells whether a pack is the one asked for).

``pack.json`` is removed before anything else of an earlier pack is touched and written last, so a
folder whose packing was cut short is no pack (never one ``pack.json`` beside another pack's tokenizer).

:func:`open_pack` decompresses the streams once into raw files in a scratch folder (``pretrain``
uses its output folder; without one, beside them) and maps them with ``numpy.memmap``; a second
open maps the raw files directly when their SHA-256 is the one ``pack.json`` records.
"""

from __future__ import annotations

import hashlib
import json
import logging
import lzma
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from sparserl.corpus.lock import check_free, folder_lock
from sparserl.corpus.manifest import (
    CORPUS_VERSION,
    MANIFEST,
    OWN,
    ManifestRow,
    read_manifest,
    read_summary,
    read_text,
)
from sparserl.errors import SparseRLError

log = logging.getLogger(__name__)

PACK_JSON = "pack.json"


@dataclass(frozen=True)
class PackConfig:
    """How a built corpus is tokenised and packed."""

    corpus: str
    """A built corpus folder (``sparserl corpus build``)."""
    out: str
    """The pack folder."""
    vocab_size: int = 8192
    """BPE vocabulary of the tokenizer."""
    max_mib: float = 40.0
    """Most MiB the pack may take; the train stream is cut to fit (0: no limit)."""
    library_repeats: int = 10
    """Times the project's own kernels (:data:`OWN`: the library's and the templates' train files) appear in
    the train stream: they are small and on-domain, and the policy must copy their bodies exactly."""
    tokenizer_mb: float = 32.0
    """MB of train text (a seeded sample of whole files) the tokenizer is trained on."""
    heldout_tokens: int = 262_144
    """Most tokens kept per held-out package."""
    seed: int = 0
    """Seed of the document order and of the tokenizer's sample."""
    tokenizer: str | None = None
    """Tokenise with this saved tokenizer (a model's folder) instead of training one."""

    def __post_init__(self) -> None:
        if self.vocab_size < 300:
            raise SparseRLError(f"vocab_size {self.vocab_size} is below the 256 byte tokens and specials")
        if self.max_mib < 0 or self.library_repeats < 0 or self.tokenizer_mb <= 0 or self.heldout_tokens < 1:
            raise SparseRLError("max_mib and library_repeats must be >= 0, tokenizer_mb and heldout_tokens > 0")


@dataclass(frozen=True)
class Pack:
    """An opened pack: the tokenizer's folder and the token streams (memory-mapped)."""

    folder: Path
    tokenizer_dir: Path
    train: np.ndarray
    """The train stream (documents joined, each ended by EOS)."""
    heldout: dict[str, np.ndarray]
    """Held-out stream per package."""
    info: dict
    """pack.json."""


def _dtype(vocab: int) -> np.dtype:
    return np.dtype("<u2") if vocab <= 65536 else np.dtype("<u4")


def _encode(tok, texts: list[str], eos: int, dtype: np.dtype, desc: str, chunk: int = 256) -> np.ndarray:
    """Texts tokenised as plain text (a special token's string in a file is its characters) and joined, each
    followed by EOS."""
    from sparserl.model.tokenizer import encode_plain
    from sparserl.progress import progress

    parts: list[np.ndarray] = []
    with progress() as bar:
        task = bar.add_task(desc, total=len(texts))
        for i in range(0, len(texts), chunk):
            batch = encode_plain(tok, texts[i: i + chunk])
            for ids in batch:
                parts.append(np.asarray(ids + [eos], dtype=dtype))
            bar.advance(task, len(batch))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def _xz(data: bytes) -> bytes:
    return lzma.compress(data, preset=6)


def _write(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _sample_for_tokenizer(texts: list[str], mb: float, rng: np.random.Generator) -> list[str]:
    order = rng.permutation(len(texts))
    out, total = [], 0
    for i in order:
        out.append(texts[i])
        total += len(texts[i])
        if total >= mb * 1e6:
            break
    return out


def manifest_sha256(corpus: str | Path) -> str:
    """SHA-256 of a built corpus's manifest (every file's hash and split: what a pack is made from)."""
    try:
        return _file_sha256(Path(corpus) / MANIFEST)
    except OSError:
        return ""


def _settings(cfg: PackConfig) -> dict:
    """What a pack is made with, its folders aside."""
    return {k: v for k, v in asdict(cfg).items() if k not in ("corpus", "out")}


def pack_differs(folder: str | Path, cfg: PackConfig) -> str | None:
    """None when ``folder`` holds ``cfg``'s pack of its corpus as the corpus is now; else why not, in words
    (no pack there, another corpus, other settings)."""
    info = pack_info(folder)
    if info is None:
        return "not packed yet"
    made = info.get("settings", {})
    if "manifest_sha256" not in info:
        return "by an earlier SparseRL (its pack.json names no corpus)"
    if not isinstance(made, dict) or info.get("manifest_sha256") != manifest_sha256(cfg.corpus):
        return "from another corpus (or another build of it)"
    changed = [f"{k} {made.get(k)!r}, not {v!r}" for k, v in _settings(cfg).items() if made.get(k) != v]
    return f"with other settings ({'; '.join(changed)})" if changed else None


def pack(cfg: PackConfig) -> dict:
    """Tokenise the corpus and write the pack; returns pack.json's content. One pack at a time writes a
    folder, and none reads a corpus that a build is writing."""
    check_free(Path(cfg.corpus), "corpus build")
    with folder_lock(Path(cfg.out), "corpus pack"):
        return _pack(cfg)


def _pack(cfg: PackConfig) -> dict:
    from sparserl.model.tokenizer import load_tokenizer, save_tokenizer, train_tokenizer

    t0 = time.perf_counter()
    corpus, out = Path(cfg.corpus), Path(cfg.out)
    manifest = manifest_sha256(corpus)
    rows = read_manifest(corpus)
    summary = read_summary(corpus)  # refuses a corpus built under other rules
    train_rows = sorted((r for r in rows if r.split == "train"), key=lambda r: r.sha256)
    held_rows: dict[str, list[ManifestRow]] = {}
    for r in sorted((r for r in rows if r.split == "heldout"), key=lambda r: r.sha256):
        held_rows.setdefault(r.package, []).append(r)
    if not train_rows:
        raise SparseRLError(f"{corpus}: the manifest has no train files: nothing usable to pre-train on")
    rng = np.random.default_rng(cfg.seed)
    texts = [read_text(corpus, r) for r in train_rows]
    t1 = time.perf_counter()
    if cfg.tokenizer:
        tok = load_tokenizer(cfg.tokenizer)
    else:
        tok = train_tokenizer(_sample_for_tokenizer(texts, cfg.tokenizer_mb, rng), cfg.vocab_size)
        log.info("trained a %d-token BPE tokenizer in %.0f s", len(tok), time.perf_counter() - t1)
    dtype = _dtype(len(tok))
    docs = texts + [t for r, t in zip(train_rows, texts) if r.package in OWN] * max(cfg.library_repeats - 1, 0)
    docs = [docs[i] for i in rng.permutation(len(docs))]
    eos = tok.eos_token_id
    train = _encode(tok, docs, eos, dtype, "tokenise train")
    held = {}
    for pkg, prs in sorted(held_rows.items()):
        stream = _encode(tok, [read_text(corpus, r) for r in prs], eos, dtype, f"tokenise {pkg}")
        held[pkg] = stream[: cfg.heldout_tokens]
    chars = sum(map(len, docs))

    out.mkdir(parents=True, exist_ok=True)
    (out / PACK_JSON).unlink(missing_ok=True)  # no pack until this one is whole: pack.json is written last
    (out / "heldout").mkdir(exist_ok=True)
    for old in (out / "heldout").glob("*"):
        old.unlink()
    save_tokenizer(tok, out / "tokenizer")
    held_info = {}
    for pkg, stream in held.items():
        _write(out / "heldout" / f"{pkg}.tokens.xz", _xz(stream.tobytes()))
        held_info[pkg] = {"tokens": int(stream.size), "sha256": hashlib.sha256(stream.tobytes()).hexdigest()}
    budget = cfg.max_mib * (1 << 20)
    fixed = _folder_bytes(out / "tokenizer") + _folder_bytes(out / "heldout") + 4096
    keep = train.size
    while True:
        blob = _xz(train[:keep].tobytes())
        if not budget or fixed + len(blob) <= budget:
            break
        if budget - fixed <= 0:
            raise SparseRLError(f"the tokenizer and held-out streams alone take {fixed / (1 << 20):.1f} MiB, over "
                                f"--max-mib {cfg.max_mib}")
        keep = int(keep * (budget - fixed) / len(blob) * 0.98)
        log.info("the train stream takes %.1f MiB compressed: cutting it to %d tokens", len(blob) / (1 << 20), keep)
    kept = train[:keep]
    _write(out / "train.tokens.xz", blob)
    for raw in [out / "train.tokens", *(out / "heldout").glob("*.tokens")]:
        raw.unlink(missing_ok=True)  # raw streams of an earlier pack are stale
    info = {
        "vocab_size": len(tok), "dtype": dtype.str, "eos_token_id": eos,
        "train_tokens": int(kept.size), "train_tokens_total": int(train.size),
        "train_sha256": hashlib.sha256(kept.tobytes()).hexdigest(),
        "train_files": len(train_rows), "train_chars": chars, "chars_per_token": round(chars / max(train.size, 1), 3),
        "heldout_tokens": {k: v["tokens"] for k, v in held_info.items()}, "heldout": held_info,
        "heldout_whole": sorted(set(summary.get("heldout_packages", ())) & set(held_rows)),
        "corpus_version": CORPUS_VERSION, "manifest_sha256": manifest, "settings": _settings(cfg),
        "library_repeats": cfg.library_repeats, "config": asdict(cfg),
        "corpus_files": len(rows), "seconds": round(time.perf_counter() - t0, 1),
    }
    (out / (PACK_JSON + ".tmp")).write_text(json.dumps(info, indent=1))
    info["pack_mib"] = round(_folder_bytes(out) / (1 << 20), 2)  # pack.json included (its size barely changes)
    _write(out / PACK_JSON, json.dumps(info, indent=1).encode())
    log.info("packed %d train tokens (of %d) and %d held-out streams into %s: %.1f MiB", kept.size, train.size,
             len(held), out, info["pack_mib"])
    return info


def _file_sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _raw(xz_path: Path, scratch: Path | None, dtype: np.dtype, tokens: int, sha: str) -> np.ndarray:
    """The raw stream of ``xz_path`` memory-mapped, decompressed once (into ``scratch`` when given, which
    keeps the pack itself small enough to carry, else beside it)."""
    name = xz_path.name.removesuffix(".xz")
    places = ([Path(scratch) / xz_path.parent.name / name] if scratch else []) + [xz_path.with_name(name)]
    for p in places:  # a raw file of another pack may have the same size (held-out streams are cut to one length)
        if p.exists() and p.stat().st_size == tokens * dtype.itemsize and _file_sha256(p) == sha:
            return np.memmap(p, dtype=dtype, mode="r", shape=(tokens,)) if tokens else np.zeros(0, dtype)
    try:
        data = lzma.decompress(xz_path.read_bytes())
    except FileNotFoundError:
        raise
    except (OSError, lzma.LZMAError) as exc:
        raise SparseRLError(f"{xz_path}: unreadable ({exc}); pack the corpus again") from None
    if len(data) != tokens * dtype.itemsize or hashlib.sha256(data).hexdigest() != sha:
        raise SparseRLError(f"{xz_path} does not match pack.json (size or hash): pack the corpus again")
    for p in places:
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            _write(p, data)
            return np.memmap(p, dtype=dtype, mode="r", shape=(tokens,)) if tokens else np.zeros(0, dtype)
        except OSError:
            continue
    return np.frombuffer(data, dtype=dtype)


def pack_info(folder: str | Path) -> dict | None:
    """A pack's pack.json, read without opening its streams; None when there is none or it cannot be read."""
    try:
        info = json.loads((Path(folder) / PACK_JSON).read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def is_pack(folder: str | Path) -> bool:
    return (Path(folder) / PACK_JSON).exists()


def open_pack(folder: str | Path, scratch: str | Path | None = None) -> Pack:
    """Open a pack written by :func:`pack`."""
    folder = Path(folder)
    try:
        info = json.loads((folder / PACK_JSON).read_text())
        dtype = np.dtype(info["dtype"])
        train = _raw(folder / "train.tokens.xz", scratch, dtype, info["train_tokens"], info["train_sha256"])
        held = {pkg: _raw(folder / "heldout" / f"{pkg}.tokens.xz", scratch, dtype, h["tokens"], h["sha256"])
                for pkg, h in info["heldout"].items()}
    except FileNotFoundError as exc:
        raise SparseRLError(f"{folder}: not a complete pack ({Path(exc.filename).name} missing): pack the corpus "
                            "again with 'sparserl corpus pack'") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise SparseRLError(f"{folder}/{PACK_JSON} is unreadable ({exc}): pack the corpus again") from None
    if train.size == 0:
        raise SparseRLError(f"{folder}: the pack's train stream is empty: nothing usable to pre-train on")
    if not (folder / "tokenizer").is_dir():
        raise SparseRLError(f"{folder}: no tokenizer/ folder: pack the corpus again")
    return Pack(folder, folder / "tokenizer", train, held, info)
