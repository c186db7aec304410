"""``sparserl corpus pack``: a built corpus tokenised once into compressed token streams that
decompress to exactly the tokenizer's output, cut to a size limit, and refused when damaged."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tokenizers")

from sparserl.corpus.manifest import CORPUS_VERSION, SUMMARY, ManifestRow, file_path, write_manifest  # noqa: E402
from sparserl.corpus.pack import PackConfig, open_pack, pack  # noqa: E402
from sparserl.errors import SparseRLError  # noqa: E402


def kernel_text(rng: random.Random, i: int) -> str:
    """A small CUDA kernel with random names and numbers (so it does not compress to nothing)."""
    name = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(8))
    n = rng.randint(1, 99999)
    return (f"// kernel {i}\n__global__ void {name}_{i}(const float* x, float* y, int n) {{\n"
            f"  int i = blockIdx.x * {rng.choice([64, 128, 256])} + threadIdx.x;\n"
            f"  if (i < n) y[i] = x[i] * {rng.random():.6f}f + {n};\n}}\n")


def make_corpus(folder: Path, files: int = 120, seed: int = 0) -> list[ManifestRow]:
    """A corpus folder written directly: package 'alpha' (train, a few held out by share), 'beta'
    held out whole, two library files and one template render; a summary of the current rules."""
    rng = random.Random(seed)
    rows = []
    for i in range(files):
        pkg = "alpha" if i % 6 else "beta"
        split = "heldout" if pkg == "beta" or i % 25 == 1 else "train"
        text = kernel_text(rng, i)
        rows.append(_row(folder, pkg, f"k{i}.cu", text, split))
    for j in range(2):
        rows.append(_row(folder, "sparserl-library", f"library/v{j}.cu",
                         f"FORMAT: CSR\nLAUNCH: grid=ceil_div(m, 8), block=256\n// variant {j}\n", "train"))
    rows.append(_row(folder, "sparserl-templates", "templates/csr_split_spec/0.cu",
                     "FORMAT: DIA\nLAUNCH: grid=ceil_div(m, 8), block=256\n// a specialised render\n", "train"))
    write_manifest(folder, rows)
    (folder / SUMMARY).write_text(json.dumps({"corpus_version": CORPUS_VERSION, "heldout_packages": ["beta"]}))
    return rows


def _row(folder: Path, pkg: str, path: str, text: str, split: str) -> ManifestRow:
    data = text.encode()
    sha = hashlib.sha256(data).hexdigest()
    p = file_path(folder, sha)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return ManifestRow(pkg, "1.0", "MIT", path, sha, len(data), split)


def pcfg(corpus: Path, out: Path, **kw) -> PackConfig:
    return PackConfig(**(dict(corpus=str(corpus), out=str(out), vocab_size=400, max_mib=0, library_repeats=3,
                              tokenizer_mb=1.0) | kw))


def test_pack_streams_are_the_tokenizers_output(tmp_path) -> None:
    rows = make_corpus(tmp_path / "c")
    info = pack(pcfg(tmp_path / "c", tmp_path / "p"))
    pk = open_pack(tmp_path / "p", scratch=tmp_path / "scratch")
    from sparserl.model.tokenizer import load_tokenizer

    tok = load_tokenizer(pk.tokenizer_dir)
    eos = tok.eos_token_id
    texts = {r.sha256: file_path(tmp_path / "c", r.sha256).read_text() for r in rows}
    # held out: 'beta' whole, 'alpha''s held-out share; each stream is its files' tokens, EOS after each
    assert set(pk.heldout) == {"alpha", "beta"} and info["heldout_whole"] == ["beta"]
    beta = [r for r in sorted(rows, key=lambda r: r.sha256) if r.package == "beta"]
    want = [t for r in beta for t in tok(texts[r.sha256], add_special_tokens=False)["input_ids"] + [eos]]
    assert pk.heldout["beta"].tolist() == want
    # train: every train file once (the library's and the templates' three times), in some order, nothing held out
    train = pk.train.tolist()
    docs, cur = [], []
    for t in train:
        if t == eos:
            docs.append(tok.decode(cur))
            cur = []
        else:
            cur.append(t)
    assert cur == [] and len(docs) == info["train_files"] + 2 * (2 + 1)
    train_texts = [texts[r.sha256] for r in rows if r.split == "train"]
    assert sorted(set(docs)) == sorted(train_texts)
    assert sum(d.startswith("FORMAT: CSR") for d in docs) == 2 * 3  # kills library files not repeated
    assert sum(d.startswith("FORMAT: DIA") for d in docs) == 3  # kills template renders not repeated
    assert not set(docs) & {texts[r.sha256] for r in rows if r.split == "heldout"}
    assert pk.train.dtype == np.uint16 and isinstance(pk.train, np.memmap)
    # the raw streams went to the scratch folder, the pack holds only the compressed ones
    assert (tmp_path / "scratch" / "p" / "train.tokens").exists() and not (tmp_path / "p" / "train.tokens").exists()
    # the tokenizer splits digits (it is the project's tokenizer, trained on the train split)
    assert tok.convert_ids_to_tokens(tok(" 16384", add_special_tokens=False)["input_ids"])[-5:] == list("16384")


def test_pack_waits_for_no_one_and_reads_no_corpus_being_built(tmp_path) -> None:
    """Kills: a pack that reads a corpus while a build writes it, or writes a folder another pack writes."""
    from sparserl.corpus.lock import folder_lock

    corpus = tmp_path / "corpus"
    make_corpus(corpus, files=40)
    with folder_lock(corpus, "corpus build"):
        with pytest.raises(SparseRLError, match="a corpus build is still writing it"):
            pack(pcfg(corpus, tmp_path / "p1"))
    with folder_lock(tmp_path / "p2", "corpus pack"):
        with pytest.raises(SparseRLError, match="another corpus pack is writing here"):
            pack(pcfg(corpus, tmp_path / "p2"))
    assert not (tmp_path / "p1" / "pack.json").exists() and not (tmp_path / "p2" / "pack.json").exists()
    pack(pcfg(corpus, tmp_path / "p2"))
    assert (tmp_path / "p2" / "pack.json").exists()


def test_pack_is_cut_to_its_size_limit(tmp_path) -> None:
    make_corpus(tmp_path / "c", files=1000)
    whole = pack(pcfg(tmp_path / "c", tmp_path / "whole"))
    limit = whole["pack_mib"] * 0.6
    cut = pack(pcfg(tmp_path / "c", tmp_path / "cut", max_mib=limit))
    assert cut["pack_mib"] <= limit and cut["train_tokens"] < cut["train_tokens_total"] == whole["train_tokens"]
    pk = open_pack(tmp_path / "cut")
    assert pk.train.size == cut["train_tokens"]
    assert pk.train.tolist() == open_pack(tmp_path / "whole").train[: cut["train_tokens"]].tolist()
    with pytest.raises(SparseRLError, match="alone take"):
        pack(pcfg(tmp_path / "c", tmp_path / "none", max_mib=0.001))


def test_damaged_or_empty_packs_are_refused(tmp_path) -> None:
    make_corpus(tmp_path / "c")
    pack(pcfg(tmp_path / "c", tmp_path / "p"))
    info = json.loads((tmp_path / "p" / "pack.json").read_text())
    info["train_sha256"] = "0" * 64
    (tmp_path / "p" / "pack.json").write_text(json.dumps(info))
    with pytest.raises(SparseRLError, match="does not match pack.json"):
        open_pack(tmp_path / "p")
    (tmp_path / "p" / "train.tokens.xz").unlink()
    with pytest.raises(SparseRLError, match="train.tokens.xz missing"):
        open_pack(tmp_path / "p")
    # a corpus with no train files holds nothing to pre-train on
    rows = make_corpus(tmp_path / "h")
    write_manifest(tmp_path / "h", [r for r in rows if r.split == "heldout"])
    with pytest.raises(SparseRLError, match="nothing usable"):
        pack(pcfg(tmp_path / "h", tmp_path / "q"))
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "manifest.jsonl").write_text("")
    with pytest.raises(SparseRLError, match="lists no files"):
        pack(pcfg(tmp_path / "e", tmp_path / "r"))


def test_a_corpus_built_under_other_rules_is_not_packed(tmp_path) -> None:
    """A corpus whose summary records no rules version (built before near-copies were kept out of the held-out
    split) or none at all is refused in one line; the packages held out whole are the summary's. Kills: the
    version not checked, the whole packages guessed from the splits (a package whose every file a share held
    out counted as held out whole)."""
    make_corpus(tmp_path / "c", files=40)
    summary = tmp_path / "c" / "summary.json"
    summary.write_text(json.dumps({"heldout_packages": ["beta"]}))
    with pytest.raises(SparseRLError, match="built under corpus rules 1, not 2") as e:
        pack(pcfg(tmp_path / "c", tmp_path / "p"))
    assert "\n" not in str(e.value) and not (tmp_path / "p" / "pack.json").exists()
    summary.unlink()
    with pytest.raises(SparseRLError, match="no readable summary.json"):
        pack(pcfg(tmp_path / "c", tmp_path / "p"))
    summary.write_text(json.dumps({"corpus_version": 2, "heldout_packages": []}))
    info = pack(pcfg(tmp_path / "c", tmp_path / "p"))
    assert info["heldout_whole"] == [] and set(info["heldout"]) == {"alpha", "beta"} and info["corpus_version"] == 2


def test_a_repack_never_serves_the_earlier_packs_streams_or_pack_json(tmp_path, monkeypatch) -> None:
    """Packed again with another vocabulary into the same folder and opened with the same scratch folder, the
    held-out streams (cut to one length, so of one size under both tokenizers) are the new pack's; a re-pack cut
    short leaves no pack.json (so no earlier pack.json beside the new tokenizer). Kills: a raw stream reused on
    its size alone, pack.json kept while the tokenizer and streams are replaced, or written before them."""
    import sparserl.corpus.pack as pack_module
    from sparserl.corpus.pack import is_pack

    make_corpus(tmp_path / "c", files=60)
    out, scratch = tmp_path / "p", tmp_path / "scratch"
    shas = []
    for vocab in (300, 400):  # 300 and 382 tokens (all this corpus has)
        info = pack(pcfg(tmp_path / "c", out, vocab_size=vocab, heldout_tokens=60))
        pk = open_pack(out, scratch=scratch)
        assert info["heldout_tokens"] == {"alpha": 60, "beta": 60}
        shas.append(info["heldout"]["beta"]["sha256"])
        for name, stream in pk.heldout.items():
            assert hashlib.sha256(stream.tobytes()).hexdigest() == info["heldout"][name]["sha256"], (vocab, name)
        assert hashlib.sha256(pk.train.tobytes()).hexdigest() == info["train_sha256"]
    assert shas[0] != shas[1] and not (out / "pack.json.tmp").exists()
    write = pack_module._write

    def interrupted(path, data):
        if path.name == "train.tokens.xz":
            raise KeyboardInterrupt  # Ctrl-C while the train stream is written
        write(path, data)

    monkeypatch.setattr(pack_module, "_write", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pack(pcfg(tmp_path / "c", out, vocab_size=300))
    assert not is_pack(out)
    with pytest.raises(SparseRLError, match=r"not a complete pack \(pack.json missing\)"):
        open_pack(out, scratch=scratch)


def test_special_token_strings_in_corpus_files_are_plain_text(tmp_path) -> None:
    """A train file and a held-out file that spell '<|endofkernel|>' and '<|pad|>' in a comment: their streams
    hold EOS only where a document ends, and the text decodes back with the strings in it. Kills: corpus text
    encoded with its special-token strings read as the special tokens (a document cut in two mid-file, a pad
    token trained on)."""
    from sparserl.model.tokenizer import load_tokenizer

    rows = make_corpus(tmp_path / "c", files=40)
    literal = "// a kernel ends at <|endofkernel|>; pads are <|pad|>\n__global__ void k() {}\n"
    rows += [_row(tmp_path / "c", "alpha", "special.cu", literal, "train"),
             _row(tmp_path / "c", "beta", "special.cu", literal.replace("k()", "h()"), "heldout")]
    write_manifest(tmp_path / "c", rows)
    info = pack(pcfg(tmp_path / "c", tmp_path / "p"))
    pk = open_pack(tmp_path / "p")
    tok = load_tokenizer(pk.tokenizer_dir)
    eos, pad = tok.eos_token_id, tok.pad_token_id
    train = pk.train.tolist()
    assert train.count(eos) == info["train_files"] + 2 * (2 + 1) and pad not in train
    beta = pk.heldout["beta"].tolist()
    assert beta.count(eos) == sum(r.package == "beta" for r in rows) and pad not in beta
    ends = [i for i, t in enumerate(train) if t == eos]
    docs = [tok.decode(train[a + 1: b]) for a, b in zip([-1, *ends], ends)]
    assert literal in docs
