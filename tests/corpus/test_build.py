"""``sparserl corpus build`` on archives made here (a wheel and a source tarball), no network:
filters, de-duplication, the manifest, the split by package, re-runs, the fetch cache and bad input."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import zipfile
from pathlib import Path

import pytest

from sparserl.corpus.build import BuildConfig, build
from sparserl.corpus.fetch import fetch, read_index
from sparserl.corpus.filters import FileRules, drop_reason, licence_of
from sparserl.corpus.manifest import file_path, read_manifest
from sparserl.corpus.sources import PackageSpec, parse_requirement
from sparserl.errors import SparseRLError
from tests.conftest import one_line_error

KERNEL = b"""// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) a kernel author
__global__ void scale(float* y, const float* x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i];
}
"""
SHARED = b"""#pragma once
__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffff, v, o);
  return v;
}
"""
HEADER = b"#pragma once\ntemplate <int N> struct Tile { __host__ __device__ static constexpr int size() { return N; } };\n"
PLAIN = b"#pragma once\n#include <vector>\nint parse_args(int argc, char** argv);\n"
GENERATED = b"// This file is auto-generated. Do not edit.\n__global__ void k0() {}\n"
MINIFIED = b"__global__ void m(){" + b"int a=1;" * 600 + b"}\n"
TABLE = b"__constant__ int lut[] = {\n" + b"".join(
    b", ".join(str(i * 7919 % 10007).encode() for i in range(r, r + 12)) + b",\n" for r in range(0, 1200, 12)) + b"};\n"
HIP = b"#include <hip/hip_runtime.h>\n__global__ void h() {}\n"
RULES = FileRules(max_bytes=20_000)
BIG = b"".join(b"__device__ int f%d(int x) { return x + %d; }\n" % (i, i) for i in range(800))  # ~30 KB > 20 KB


def make_wheel(folder: Path) -> Path:
    """A wheel of package 'demo-kernels' 1.0 (MIT): kept files, a copy, and one of each dropped kind."""
    path = folder / "demo_kernels-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("demo_kernels-1.0.dist-info/METADATA",
                   "Metadata-Version: 2.4\nName: demo-kernels\nVersion: 1.0\nLicense-Expression: MIT\n")
        z.writestr("demo_kernels/include/scale.cu", KERNEL)
        z.writestr("demo_kernels/include/warp.cuh", SHARED)
        z.writestr("demo_kernels/include/tile.hpp", HEADER)
        z.writestr("demo_kernels/include/cli.h", PLAIN)
        z.writestr("demo_kernels/include/gen.cu", GENERATED)
        z.writestr("demo_kernels/include/min.cu", MINIFIED)
        z.writestr("demo_kernels/include/lut.cuh", TABLE)
        z.writestr("demo_kernels/include/big.cuh", BIG)
        z.writestr("demo_kernels/include/third_party/lib/copy.cuh", b"__device__ int vendored() { return 1; }\n")
        z.writestr("demo_kernels/__init__.py", "")
    return path


def make_sdist(folder: Path, name: str = "other-ops", version: str = "2.0") -> Path:
    """A source tarball whose top folder is stripped; it brings a copy of the wheel's warp.cuh."""
    top = f"{name.replace('-', '_')}-{version}"
    path = folder / f"{top}.tar.gz"
    files = {f"{top}/PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nLicense: UNKNOWN\n".encode(),
             f"{top}/LICENSE": b"Apache License\nVersion 2.0, January 2004\n",
             f"{top}/csrc/spmv.cu": b"__global__ void spmv(const int* rp, const int* ci, const float* v, "
                                    b"const float* x, float* y, int m) {\n  int r = blockIdx.x;\n  if (r < m) {\n"
                                    b"    float s = 0;\n    for (int j = rp[r]; j < rp[r + 1]; ++j) s += v[j] * "
                                    b"x[ci[j]];\n    y[r] = s;\n  }\n}\n",
             f"{top}/csrc/warp.cuh": SHARED,
             f"{top}/csrc/hip.cu": HIP}
    with tarfile.open(path, "w:gz") as t:
        for member, data in files.items():
            info = tarfile.TarInfo(member)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return path


def cfg(out: Path, archives: Path, **kw) -> BuildConfig:
    base = dict(out=str(out), archives=str(archives), toolkit=False, library=False, templates=False, rules=RULES,
                heldout_packages=(), heldout_fraction=0.0)
    return BuildConfig(**(base | kw))


@pytest.fixture
def archives(tmp_path) -> Path:
    folder = tmp_path / "archives"
    folder.mkdir()
    make_wheel(folder)
    make_sdist(folder)
    return folder


def test_filters_name_each_reason() -> None:
    """Each drop rule fires on its own kind of file and on no kept file (a rule that always or never
    fires fails here)."""
    cases = {"a/scale.cu": (KERNEL, None), "a/warp.cuh": (SHARED, None), "a/tile.hpp": (HEADER, None),
             "a/cli.h": (PLAIN, "not_cuda"), "a/gen.cu": (GENERATED, "generated"), "a/min.cu": (MINIFIED, "minified"),
             "a/lut.cuh": (TABLE, "table"), "a/big.cuh": (BIG, "too_large"), "a/x.py": (KERNEL, "extension"),
             "a/e.cu": (b"\n  \n", "empty"), "a/bin.cu": (b"\x00\x01__global__", "not_text"),
             "a/h.cu": (b"#include <hip/hip_runtime.h>\n__global__ void h() {}\n", "hip"),
             "a/generated/k.cu": (KERNEL, "generated")}
    got = {p: drop_reason(p, d, RULES)[0] for p, (d, _) in cases.items()}
    assert got == {p: want for p, (_, want) in cases.items()}
    # a file that supports both CUDA and HIP is CUDA source and stays
    both = b"#ifdef USE_ROCM\n#include <hip/hip_runtime.h>\n#else\n#include <cuda_runtime.h>\n#endif\n__global__ void k(){}\n"
    assert drop_reason("a/both.cu", both, RULES)[0] is None
    # extension-less headers only where a recipe allows them
    assert drop_reason("cuda/std/atomic", HEADER, RULES)[0] == "extension"
    assert drop_reason("cuda/std/atomic", HEADER, RULES, extensionless=True)[0] is None
    # the toolkit's own headers need no CUDA marker
    assert drop_reason("a/cli.h", PLAIN, RULES, cuda_only=False)[0] is None
    assert licence_of(KERNEL.decode()) == "BSD-3-Clause" and licence_of(SHARED.decode()) is None


def test_build_manifest_dedup_and_licences(tmp_path, archives) -> None:
    s = build(cfg(tmp_path / "c", archives))
    rows = read_manifest(tmp_path / "c")
    kept = {(r.package, r.path) for r in rows}
    assert kept == {("demo-kernels", "demo_kernels/include/scale.cu"), ("demo-kernels", "demo_kernels/include/warp.cuh"),
                    ("demo-kernels", "demo_kernels/include/tile.hpp"), ("other-ops", "csrc/spmv.cu")}
    # the copy in the sdist is counted as a duplicate, stored once
    assert s["packages"]["other-ops"]["duplicates"] == 1 and s["packages"]["demo-kernels"]["duplicates"] == 0
    assert len({r.sha256 for r in rows}) == len(rows)
    # every dropped kind is tallied with its reason; the vendored copy is excluded unread
    demo = s["packages"]["demo-kernels"]
    assert {k: v["files"] for k, v in demo["dropped"].items()} == {
        "not_cuda": 1, "generated": 1, "minified": 1, "table": 1, "too_large": 1}
    assert demo["excluded"] == 1 and s["packages"]["other-ops"]["dropped"] == {"hip": {"files": 1, "bytes": len(HIP)}}
    # hashes, sizes and stored texts agree with the archives' bytes
    by_path = {r.path: r for r in rows}
    assert by_path["demo_kernels/include/scale.cu"].sha256 == hashlib.sha256(KERNEL).hexdigest()
    assert file_path(tmp_path / "c", by_path["csrc/spmv.cu"].sha256).read_bytes().startswith(b"__global__ void spmv")
    assert all(r.bytes == file_path(tmp_path / "c", r.sha256).stat().st_size for r in rows)
    # licence: the file's SPDX line, else the package's metadata, else its LICENSE file
    assert by_path["demo_kernels/include/scale.cu"].licence == "BSD-3-Clause"
    assert by_path["demo_kernels/include/warp.cuh"].licence == "MIT"
    assert by_path["csrc/spmv.cu"].licence == "Apache-2.0" and by_path["csrc/spmv.cu"].version == "2.0"
    assert s["unique_bytes"] == sum(r.bytes for r in rows) and s["train_bytes"] == s["unique_bytes"]


def test_a_second_build_into_a_folder_being_written_stops_in_one_line(tmp_path, archives) -> None:
    """Kills: the folder lock dropped (two builds rename each other's temporary files away) or never released."""
    from sparserl.corpus.lock import folder_lock

    out = tmp_path / "c"
    with folder_lock(out, "corpus build"):  # another build, as far as the lock can tell (its own open file)
        with pytest.raises(SparseRLError, match=r"another corpus build is writing here \(pid \d+\)"):
            build(cfg(out, archives))
        assert not (out / "manifest.jsonl").exists()
    build(cfg(out, archives))  # released when the holder ends
    assert read_manifest(out)


def test_heldout_split_by_package(tmp_path, archives) -> None:
    """A held-out package is read last: the text it shares with a training package stays in
    training (so held-out perplexity is on unseen text), the rest of it is held out whole."""
    build(cfg(tmp_path / "c", archives, heldout_packages=("demo-kernels",)))
    rows = read_manifest(tmp_path / "c")
    split = {r.path: (r.package, r.split) for r in rows}
    assert split["csrc/warp.cuh"] == ("other-ops", "train")
    assert split["csrc/spmv.cu"] == ("other-ops", "train")
    assert {v for k, v in split.items() if k.startswith("demo_kernels/")} == {("demo-kernels", "heldout")}
    # a fraction of each other package's files by hash: the same files on every build
    a = build(cfg(tmp_path / "d", archives, heldout_fraction=0.49))
    b = build(cfg(tmp_path / "e", archives, heldout_fraction=0.49))
    ra, rb = read_manifest(tmp_path / "d"), read_manifest(tmp_path / "e")
    assert [(r.sha256, r.split) for r in ra] == [(r.sha256, r.split) for r in rb]
    assert {r.split for r in ra} == {"train", "heldout"} and a["heldout_bytes"] == b["heldout_bytes"] > 0


def test_rebuild_writes_nothing_again_restores_and_prunes(tmp_path, archives) -> None:
    out = tmp_path / "c"
    first = build(cfg(out, archives))
    manifest = (out / "manifest.jsonl").read_text()
    assert first["files_written"] == 4
    again = build(cfg(out, archives))
    assert again["files_written"] == 0 and (out / "manifest.jsonl").read_text() == manifest
    # a stored text lost (an interrupted build) is written again
    lost = read_manifest(out)[0]
    file_path(out, lost.sha256).unlink()
    assert build(cfg(out, archives))["files_written"] == 1 and file_path(out, lost.sha256).exists()
    # a package no longer in the build: its texts are pruned
    (archives / "other_ops-2.0.tar.gz").unlink()
    s = build(cfg(out, archives))
    assert s["files_pruned"] == 1 and {r.package for r in read_manifest(out)} == {"demo-kernels"}
    assert len(list((out / "files").glob("*/*.txt"))) == 3


def test_library_and_toolkit_sources(tmp_path, archives) -> None:
    """The kernel library comes in rendered, one file per variant (the toolkit is read the same way)."""
    from sparserl.kernels.library import all_variants

    s = build(cfg(tmp_path / "c", archives, library=True))
    lib = [r for r in read_manifest(tmp_path / "c") if r.package == "sparserl-library"]
    assert len(lib) == s["packages"]["sparserl-library"]["kept"] > 0
    assert len(lib) + s["packages"]["sparserl-library"]["duplicates"] == len(all_variants())
    assert file_path(tmp_path / "c", lib[0].sha256).read_text().startswith("FORMAT:")


def test_the_templates_come_in_rendered_with_their_specialised_kernels(tmp_path, archives, monkeypatch) -> None:
    """The search templates at their seed points on small generated matrices: the specialised kernels (tables of
    a matrix's facts) among them, each rendering once. Kills: the source left out of a build, only the generic
    templates (whose renderings do not depend on the matrix), a rendering kept twice, a held-out family's
    matrix rendered."""
    import sparserl.matrices as matrices
    from sparserl.matrices.generators import HELD_OUT_FAMILIES

    seen: list[str] = []
    original = matrices.generate
    monkeypatch.setattr(matrices, "generate", lambda family, rows, **kw: seen.append(family) or original(family, rows, **kw))
    s = build(cfg(tmp_path / "c", archives, templates=True))
    rows = [r for r in read_manifest(tmp_path / "c") if r.package == "sparserl-templates"]
    assert len(rows) == s["packages"]["sparserl-templates"]["kept"] > 20
    names = {r.path.split("/")[1] for r in rows}
    assert {"csr_adaptive_spec", "dia_window_spec"} <= names and any(not n.endswith("_spec") for n in names)
    assert len({r.sha256 for r in rows}) == len(rows)
    text = file_path(tmp_path / "c", next(r for r in rows if "/csr_adaptive_spec/" in r.path).sha256).read_text()
    assert text.startswith("FORMAT: CSR") and "Specialised to this matrix" in text
    assert seen and not set(seen) & set(HELD_OUT_FAMILIES) and "lp" in seen


UNREACHABLE = "http://127.0.0.1:9/simple"  # the discard port: refused at once, no traffic leaves the machine


def test_fetch_cache_needs_no_index(tmp_path) -> None:
    """An archive recorded in the cache is used as it is: a build with an unreachable index works."""
    cache = tmp_path / "cache"
    cache.mkdir()
    wheel = make_wheel(cache)
    spec = PackageSpec("demo-kernels", "1.0", "wheel")
    (cache / "fetched.json").write_text(json.dumps({"demo-kernels==1.0:wheel": wheel.name}))
    r = fetch(spec, cache, index_url=UNREACHABLE)
    assert r.cached and r.archive == wheel
    s = build(BuildConfig(out=str(tmp_path / "c"), cache=str(cache), packages=(spec,), toolkit=False, library=False,
                          templates=False, rules=RULES, heldout_packages=(), index_url=UNREACHABLE))
    assert s["packages"]["demo-kernels"]["kept"] == 3 and s["packages"]["demo-kernels"]["origin"] == "cache"


def test_unreachable_index_names_what_failed_and_keeps_the_cache(tmp_path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    wheel = make_wheel(cache)
    (cache / "fetched.json").write_text(json.dumps({"demo-kernels==1.0:wheel": wheel.name}))
    specs = (PackageSpec("demo-kernels", "1.0"), parse_requirement("nvidia-cutlass"))
    with pytest.raises(SparseRLError) as e:
        build(BuildConfig(out=str(tmp_path / "c"), cache=str(cache), packages=specs, toolkit=False, library=False,
                          templates=False, index_url=UNREACHABLE))
    msg = str(e.value)
    assert "\n" not in msg and "nvidia-cutlass==4.2.0.0" in msg and "--archives" in msg and "1 of 2" in msg
    assert "demo-kernels" not in msg.split(";")[0]
    assert read_index(cache) == {"demo-kernels==1.0:wheel": wheel.name} and wheel.exists()
    assert not (tmp_path / "c" / "manifest.jsonl").exists()


def test_bad_archive_folders_are_one_line_errors_that_keep_the_corpus(tmp_path, archives) -> None:
    out = tmp_path / "c"
    build(cfg(out, archives))
    manifest = (out / "manifest.jsonl").read_text()
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("no archives here")
    useless = tmp_path / "useless"
    useless.mkdir()
    with zipfile.ZipFile(useless / "pyonly-1.0-py3-none-any.whl", "w") as z:
        z.writestr("pyonly/__init__.py", "")
        z.writestr("pyonly/cli.h", PLAIN)
    for folder, words in ((tmp_path / "missing", "no such folder"), (empty, "holds no package archives"),
                          (useless, "nothing usable")):
        with pytest.raises(SparseRLError) as e:
            build(cfg(out, folder))
        assert words in str(e.value) and "\n" not in str(e.value)
        assert (out / "manifest.jsonl").read_text() == manifest
    with pytest.raises(SparseRLError, match="no manifest.jsonl here"):
        read_manifest(tmp_path / "empty")


def test_cli_build_and_its_error_line(tmp_path, archives, cli) -> None:
    """The command prints the per-package table; bad input is one 'error:' line, exit status 2."""
    base = ["corpus", "build", "--no-toolkit", "--no-library", "--no-templates", "--heldout", ""]
    ok = cli(*base, "--out", tmp_path / "c", "--archives", archives)
    assert ok.rc == 0, ok.err
    assert "demo-kernels" in ok.out and "other-ops" in ok.out and "wrote" in ok.out
    one_line_error(cli(*base, "--out", tmp_path / "d", "--archives", tmp_path), "holds no package archives")


def _sdist(folder: Path, name: str, files: dict[str, bytes], version: str = "1.0") -> Path:
    """A source tarball of package ``name`` holding ``files`` (paths under its top folder)."""
    top = f"{name.replace('-', '_')}-{version}"
    path = folder / f"{top}.tar.gz"
    files = {"PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nLicense: MIT\n".encode(), **files}
    with tarfile.open(path, "w:gz") as t:
        for member, data in files.items():
            info = tarfile.TarInfo(f"{top}/{member}")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return path


SEGMENT = b"""// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2023 a kernel author
#include "atomics.cuh"
__global__ void segment_sum(const float* src, const long* ptr, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) { float s = 0; for (long j = ptr[i]; j < ptr[i + 1]; ++j) s += src[j]; out[i] = s; }
}
"""


def test_heldout_near_copies_of_training_files_are_not_held_out(tmp_path) -> None:
    """A held-out package's copies of a training file with CRLF line ends or an extra trailing newline are
    duplicates (one text), and one with another copyright year is dropped as a near-copy (6 of its 7 lines are
    in the training file); a new kernel stays held out, and a second build writes nothing again. Kills: the
    de-duplication key a hash of the bytes (the CRLF and trailing-newline copies held out), no near-copy check
    or a threshold not applied (the year copy held out), a near-copy moved into training or its text stored."""
    folder = tmp_path / "archives"
    folder.mkdir()
    _sdist(folder, "scatter-ops", {"csrc/segment.cu": SEGMENT})
    new = KERNEL.replace(b"scale", b"axpy_new").replace(b"a * x[i]", b"a * x[i] + y[i]")
    _sdist(folder, "torch-sparse", {"csrc/segment_crlf.cu": SEGMENT.replace(b"\n", b"\r\n"),
                                    "csrc/segment_ws.cu": SEGMENT.replace(b"{\n", b"{  \n") + b"\n\n",
                                    "csrc/segment_year.cu": SEGMENT.replace(b"2023", b"2024"),
                                    "csrc/axpy.cu": new})
    out = tmp_path / "c"
    s = build(cfg(out, folder, heldout_packages=("torch-sparse",)))
    rows = read_manifest(out)
    assert {(r.package, r.path, r.split) for r in rows} == {("scatter-ops", "csrc/segment.cu", "train"),
                                                            ("torch-sparse", "csrc/axpy.cu", "heldout")}
    ts = s["packages"]["torch-sparse"]
    assert (ts["duplicates"], ts["near_duplicates"], ts["kept"]) == (2, 1, 1)
    assert ts["heldout_bytes"] == len(new) and ts["near_duplicate_bytes"] == len(SEGMENT.replace(b"2023", b"2024"))
    assert s["near_duplicates"] == 1 and s["near_copies"] == [
        {"package": "torch-sparse", "path": "csrc/segment_year.cu", "similarity": round(6 / 7, 3),
         "train_package": "scatter-ops", "train_path": "csrc/segment.cu"}]
    assert s["corpus_version"] == 2 and s["heldout_bytes"] == len(new)
    assert sorted(p.name for p in (out / "files").glob("*/*.txt")) == sorted(f"{r.sha256}.txt" for r in rows)
    again = build(cfg(out, folder, heldout_packages=("torch-sparse",)))
    assert again["files_written"] == again["files_pruned"] == 0
    # a stricter threshold keeps the year copy held out
    loose = build(cfg(tmp_path / "d", folder, heldout_packages=("torch-sparse",), near_duplicate=0.9))
    assert loose["near_duplicates"] == 0 and loose["packages"]["torch-sparse"]["kept"] == 2


def test_near_copies_similarity_is_the_share_of_lines_seen_in_one_training_file() -> None:
    """Kills: a similarity summed over several training files, a Jaccard index instead of the held-out
    file's share, indentation or blank lines counted, no match reported as a match."""
    from sparserl.corpus.near import near_copies

    held = ["a\nb\nc\nd\n", "  a\n\n\tb\r\n", "x\ny\n", ""]
    train = ["a\nb\nq\n", "c\nd\n", "a\nb\nc\nd\ne\nf\ng\nh\n"]
    got = [(m.similarity, m.train) for m in near_copies(held, train)]
    assert got == [(1.0, 2), (1.0, 0), (0.0, -1), (0.0, -1)]
    assert [(m.similarity, m.train) for m in near_copies(held[:1], train[:2])] == [(0.5, 0)]


def test_the_local_sources_give_no_heldout_share(tmp_path, archives) -> None:
    """The toolkit's headers and the library's renders are what the model is trained on (the library and the
    templates' files are near-copies of their siblings): none of their files is held out by share, while the packages'
    shares stay. Kills: the held-out fraction applied to every source."""
    include = tmp_path / "include"
    include.mkdir()
    (include / "cuda_runtime.h").write_text("#pragma once\n#define CUDART_VERSION 13000\n")
    for i in range(30):
        (include / f"h{i}.h").write_text(f"#pragma once\n__device__ inline int f{i}(int x) {{ return x * {i}; }}\n")
    s = build(cfg(tmp_path / "c", archives, toolkit=True, cuda_include=str(include), library=True,
                  heldout_fraction=0.49))
    rows = read_manifest(tmp_path / "c")
    local = [r for r in rows if r.package in ("cuda-toolkit", "sparserl-library")]
    assert len(local) > 60 and {r.split for r in local} == {"train"}
    assert s["packages"]["cuda-toolkit"]["heldout_bytes"] == s["packages"]["sparserl-library"]["heldout_bytes"] == 0
    assert {r.split for r in rows if r.package in ("demo-kernels", "other-ops")} == {"train", "heldout"}


def test_a_member_over_the_size_limit_is_never_decompressed(tmp_path, monkeypatch) -> None:
    """A zip bomb's member (5 MB of spaces in a few KB) over the size limit is counted too_large without
    being read, and every read of a member (its METADATA and LICENSE included) is capped. Kills: the member
    read whole before its size is checked, an unbounded read of METADATA or LICENSE."""
    folder = tmp_path / "bomb"
    folder.mkdir()
    with zipfile.ZipFile(folder / "bomb_ops-1.0-py3-none-any.whl", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("bomb_ops-1.0.dist-info/METADATA", "Metadata-Version: 2.4\nName: bomb-ops\nVersion: 1.0\n"
                   "License-Expression: MIT\n\n" + "a long description\n" * 200_000)
        z.writestr("bomb_ops-1.0.dist-info/licenses/LICENSE", "Permission is hereby granted, free of charge\n")
        z.writestr("bomb_ops/ok.cu", KERNEL)
        z.writestr("bomb_ops/huge.cu", b" " * (5 << 20))
    reads: list[tuple[str, int | None]] = []
    real = zipfile.ZipExtFile.read

    def read(self, n=-1):
        reads.append((self.name, n))
        return real(self, n)

    monkeypatch.setattr(zipfile.ZipExtFile, "read", read)
    s = build(cfg(tmp_path / "c", folder))
    bomb = s["packages"]["bomb-ops"]
    assert bomb["dropped"] == {"too_large": {"files": 1, "bytes": 5 << 20}} and bomb["kept"] == 1
    assert bomb["licence"] == "MIT" and bomb["version"] == "1.0"
    assert "bomb_ops/huge.cu" not in {name for name, _ in reads}
    assert reads and all(n is not None and 0 < n <= (1 << 20) + 1 for _, n in reads), reads
    from sparserl.corpus.archives import members

    for m in members(folder / "bomb_ops-1.0-py3-none-any.whl"):
        if m.name == "bomb_ops/huge.cu":
            assert m.size == 5 << 20 and len(m.read(1000)) == 1001


def test_a_damaged_member_of_a_valid_archive_is_one_error_line(tmp_path, cli) -> None:
    """One compressed byte flipped inside a wheel whose directory is intact: one 'error:' line naming the
    archive and the member, and the corpus left as it was. Kills: the zlib error (or a bad CRC) escaping as a
    traceback, a message naming neither the archive nor the member."""
    folder = tmp_path / "crc"
    folder.mkdir()
    path = folder / "crc_ops-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("crc_ops-1.0.dist-info/METADATA", "Metadata-Version: 2.4\nName: crc-ops\nVersion: 1.0\n")
        z.writestr("crc_ops/k.cu", KERNEL * 3)
    data = bytearray(path.read_bytes())
    at = data.find(b"crc_ops/k.cu") + len("crc_ops/k.cu") + 40  # inside the member's deflate stream
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(SparseRLError, match=r"crc_ops-1.0-py3-none-any.whl: member crc_ops/k.cu is damaged") as e:
        build(cfg(tmp_path / "c", folder))
    assert "\n" not in str(e.value) and not (tmp_path / "c" / "manifest.jsonl").exists()
    res = cli("corpus", "build", "--no-toolkit", "--no-library", "--no-templates", "--heldout", "",
              "--out", tmp_path / "d", "--archives", folder)
    one_line_error(res, "member crc_ops/k.cu is damaged")


def test_one_archive_per_package(tmp_path) -> None:
    """Two versions of a package in --archives: the recipe's pinned version is read alone (the other is not
    tallied under its name); with no recipe, one error line names both files; a package named twice in
    --packages is refused too. Kills: both versions read (one version's text trained on, the next one's near-copy
    beside it, both tallied under one name), the first file found taken silently."""
    two = tmp_path / "two"
    two.mkdir()
    for v in ("1.0", "1.1"):
        _sdist(two, "scatter-ops", {"csrc/k.cu": SEGMENT.replace(b"2023", v.encode())}, version=v)
    with pytest.raises(SparseRLError, match=r"holds 2 archives of scatter-ops \(scatter_ops-1.0.tar.gz, "
                                            r"scatter_ops-1.1.tar.gz\) and no recipe pins its version") as e:
        build(cfg(tmp_path / "c", two))
    assert "\n" not in str(e.value)
    pinned = tmp_path / "pinned"
    pinned.mkdir()
    for v in ("0.6.17", "0.6.18"):
        _sdist(pinned, "torch-sparse", {"csrc/spmm.cu": KERNEL.replace(b"scale", f"spmm_{v[-2:]}".encode()),
                                        f"csrc/only_{v[-2:]}.cu": KERNEL.replace(b"scale", b"x" + v[-2:].encode())},
               version=v)
    s = build(cfg(tmp_path / "d", pinned))
    rows = read_manifest(tmp_path / "d")
    assert {(r.path, r.version) for r in rows} == {("csrc/spmm.cu", "0.6.18"), ("csrc/only_18.cu", "0.6.18")}
    assert s["packages"]["torch-sparse"]["files_seen"] == 2 and s["packages"]["torch-sparse"]["version"] == "0.6.18"
    with pytest.raises(SparseRLError, match="torch-sparse named more than once"):
        cfg(tmp_path / "e", pinned, packages=(parse_requirement("torch-sparse"), parse_requirement("torch_sparse==1")))


def test_a_heldout_name_matching_no_package_is_one_error_line(tmp_path, archives, cli) -> None:
    """--heldout with a typo (or a package not in the build) is refused in one line naming it, before any fetch;
    with no --heldout, the default held-out packages the build lacks are not asked for. Kills: the name ignored
    (the package meant to be held out trained on, unnoticed)."""
    with pytest.raises(SparseRLError, match=r"--heldout other-opps: no such package in this build \(its packages: "
                                            r"demo-kernels, other-ops\)"):
        build(cfg(tmp_path / "c", archives, heldout_packages=("other-ops", "other_opps")))
    with pytest.raises(SparseRLError, match="--heldout torch-sprase: no such package"):  # before the fetch fails
        build(BuildConfig(out=str(tmp_path / "c"), cache=str(tmp_path / "cache"),
                          packages=(parse_requirement("torch-sparse"),), heldout_packages=("torch-sprase",),
                          toolkit=False, library=False, templates=False, index_url=UNREACHABLE))
    assert not (tmp_path / "c" / "manifest.jsonl").exists()
    s = build(cfg(tmp_path / "c", archives, heldout_packages=None))  # the defaults: none in this build
    assert s["heldout_packages"] == [] and s["heldout_bytes"] == 0
    s = build(cfg(tmp_path / "c", archives, heldout_packages=("Other_Ops",)))
    assert s["heldout_packages"] == ["other-ops"]
    one_line_error(cli("corpus", "build", "--no-toolkit", "--no-library", "--no-templates", "--heldout", "demo-kernel",
                       "--out", tmp_path / "d", "--archives", archives), "--heldout demo-kernel: no such package")
