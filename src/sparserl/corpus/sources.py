"""Where the corpus comes from: packages on the public index that ship CUDA C++ source.

Each :class:`PackageSpec` names one distribution (pinned, so a corpus can be built again
the same), the kind of archive to fetch (a wheel, or the source archive where only that holds
the code), and which of its files to take. What a package takes is its *own* code: copies of
other libraries that it bundles (CUTLASS inside flash-attn and xformers, the CUDA C++ core
libraries inside CuPy, RAFT and FlashInfer) are left out here because their own package brings
them once, at one version, instead of three near-identical versions of one file; the content hash
(:mod:`sparserl.corpus.build`) catches the exact copies any other package still brings.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, replace

from sparserl.errors import SparseRLError

VENDORED = ("*/third_party/*", "*/3rdparty/*", "*/thirdparty/*", "*/external/*", "*/vendor/*", "*/_vendor/*")
"""Folders that hold other projects' code in any package (left out everywhere)."""


@dataclass(frozen=True)
class PackageSpec:
    """One package of the corpus and what to take from it."""

    name: str
    """Distribution name on the index (normalised: lower case, ``-``)."""
    version: str = ""
    """Pinned version; empty: the newest the index has."""
    archive: str = "wheel"
    """'wheel' or 'sdist': which archive holds the code."""
    include: tuple[str, ...] = ()
    """Glob patterns (member paths, an sdist's top folder removed); empty: every member."""
    exclude: tuple[str, ...] = ()
    """Glob patterns left out (bundled copies, generated kernels, ports to other GPUs)."""
    extensionless: bool = False
    """Also take extension-less headers (libcu++'s ``cuda/std/atomic`` and kin)."""
    note: str = ""
    """Why the package is here and what was left out of it."""

    def __post_init__(self) -> None:
        if self.archive not in ("wheel", "sdist"):
            raise ValueError(f"archive must be 'wheel' or 'sdist', got {self.archive!r}")

    @property
    def requirement(self) -> str:
        """What ``pip download`` is asked for."""
        return f"{self.name}=={self.version}" if self.version else self.name

    def takes(self, path: str) -> bool:
        """Whether the member ``path`` (an sdist's top folder removed) is in this package's share."""
        p = "/" + path
        if self.include and not any(fnmatch.fnmatch(path, g) or fnmatch.fnmatch(p, g) for g in self.include):
            return False
        return not any(fnmatch.fnmatch(p, g) or fnmatch.fnmatch(path, g) for g in self.exclude + VENDORED)


DEFAULT_PACKAGES: tuple[PackageSpec, ...] = (
    PackageSpec("nvidia-cutlass", "4.2.0.0", "wheel", include=("cutlass_library/source/*",),
                note="CUTLASS and CuTe: headers, tools and examples"),
    PackageSpec("nvidia-cuda-cccl-cu12", "12.9.27", "wheel", include=("nvidia/cuda_cccl/include/*",),
                extensionless=True, note="the CUDA C++ core libraries: CUB, Thrust, libcu++"),
    PackageSpec("libraft-cu12", "26.10.0", "wheel", include=("libraft/include/raft/*",),
                note="RAFT's headers; its bundled CCCL (include/rapids) left out"),
    PackageSpec("cupy-cuda12x", "14.2.0", "wheel", include=("cupy/*", "cupyx/*"), exclude=("*/_cccl/*",),
                note="CuPy's device headers; its bundled CCCL left out"),
    PackageSpec("flash-attn", "2.8.3.post2", "sdist", include=("csrc/*",),
                exclude=("csrc/cutlass/*", "csrc/composable_kernel/*", "csrc/flash_attn_ck/*"),
                note="flash-attention's kernels; bundled CUTLASS and the AMD port left out"),
    PackageSpec("xformers", "0.0.35", "sdist", include=("xformers/csrc/*",), exclude=("*/hip_fmha/*",),
                note="xformers' kernels; bundled CUTLASS and the AMD port left out"),
    PackageSpec("flashinfer-python", "0.7.4", "wheel", include=("flashinfer/data/include/flashinfer/*",),
                note="FlashInfer's hand-written headers; generated and JIT kernels, bundled CUTLASS/CCCL left out"),
    PackageSpec("torch-sparse", "0.6.18", "sdist", include=("csrc/*",),
                note="sparse matrix products (spmm_cuda.cu): small, on topic"),
    PackageSpec("torch-scatter", "2.1.2", "sdist", include=("csrc/*",),
                note="scatter and segment (CSR) reductions: small, on topic"),
    PackageSpec("torch-cluster", "1.6.3", "sdist", include=("csrc/*",), note="graph clustering kernels: small"),
    PackageSpec("warp-lang", "1.19.0", "wheel", include=("warp/native/*",), exclude=("*/nanovdb/*",),
                note="NVIDIA Warp's native device code; bundled NanoVDB left out"),
    PackageSpec("nvidia-nvshmem-cu12", "3.8.0", "wheel", include=("nvidia/nvshmem/include/*",),
                note="NVSHMEM's device API headers"),
    PackageSpec("deepspeed", "0.19.8", "sdist", include=("csrc/*", "deepspeed/ops/csrc/*", "deepspeed/inference/*"),
                exclude=("*/xpu/*", "*/cpu/*", "*/npu/*"), note="DeepSpeed's CUDA ops (its two copies de-duplicated)"),
    PackageSpec("natten", "0.21.7", "sdist", include=("csrc/*",),
                note="neighbourhood attention kernels; bundled CUTLASS left out"),
    PackageSpec("gsplat", "1.5.3", "sdist", include=("gsplat/cuda/*",), note="Gaussian splatting kernels"),
    PackageSpec("mamba-ssm", "2.3.2.post1", "sdist", include=("csrc/*",), note="selective-scan kernels: small"),
    PackageSpec("causal-conv1d", "1.7.0", "sdist", include=("csrc/*",), note="causal convolution kernels: small"),
)
"""The packages ``sparserl corpus build`` fetches when none are named."""

DEFAULT_HELDOUT = ("torch-sparse", "mamba-ssm", "gsplat")
"""Packages held out whole: perplexity on code of a library the model never saw."""


def normalise(name: str) -> str:
    """A distribution name as the index compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def spec_for(name: str, version: str = "") -> PackageSpec:
    """The default recipe of ``name``, or a generic one (every CUDA file outside bundled folders)."""
    key = normalise(name)
    for spec in DEFAULT_PACKAGES:
        if spec.name == key:
            return spec if not version or version == spec.version else _with_version(spec, version)
    return PackageSpec(key, version, "wheel", note="no recipe: every CUDA file outside bundled folders")


def _with_version(spec: PackageSpec, version: str) -> PackageSpec:
    return replace(spec, version=version)


def parse_requirement(text: str) -> PackageSpec:
    """``name``, ``name==version``, either with ``:wheel`` or ``:sdist`` after it, as a spec. A
    package with a recipe keeps its file rules (and, with no version given, its pinned version)."""
    text = text.strip()
    kind = ""
    if ":" in text:
        text, kind = text.rsplit(":", 1)
    m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:==\s*([A-Za-z0-9.+!_-]+))?", text)
    if not m:
        raise SparseRLError(f"package {text!r}: give NAME or NAME==VERSION (optionally :wheel or :sdist)")
    spec = spec_for(m.group(1), m.group(2) or "")
    if kind:
        if kind not in ("wheel", "sdist"):
            raise SparseRLError(f"package {text!r}: the archive kind after ':' is wheel or sdist, not {kind!r}")
        spec = replace(spec, archive=kind)
    return spec


ARCHIVE_SUFFIXES = (".whl", ".tar.gz", ".tgz", ".zip")


def archive_name_version(filename: str) -> tuple[str, str] | None:
    """(name, version) read from a wheel's or a source archive's file name, or None."""
    if filename.endswith(".whl"):
        parts = filename[:-4].split("-")
        return (normalise(parts[0]), parts[1]) if len(parts) >= 5 else None
    for suffix in (".tar.gz", ".tgz", ".zip"):
        if filename.endswith(suffix):
            stem = filename[: -len(suffix)]
            m = re.fullmatch(r"(.+?)-(\d[A-Za-z0-9.+!_]*)", stem)
            return (normalise(m.group(1)), m.group(2)) if m else None
    return None
