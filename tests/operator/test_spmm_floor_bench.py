"""benchmarks/spmm_floor.py on the CPU: its bad input and the machine without a GPU are one line and
write nothing (the measurement itself runs on the device). Mutations killed: a k that is no multiple
of 4 let through to the kernel's float4 loads, one whose lane group is no power of two (12, 96: the
lane mask and shuffle width need one) or has no library kernel (4), a run without a GPU that writes a file;
and its gather kernels compile with nvcc, the full one reading the row and value arrays the floor leaves out
(mutations killed: a syntax error in either mode, FULL that reads nothing more)."""

from __future__ import annotations

import pytest

from sparserl.harness.compile import find_nvcc
from tests.conftest import assert_no_gpu_is_one_line, load_benchmark

bench = load_benchmark("spmm_floor")


@pytest.mark.parametrize("ks", ["63", "0", "132", "64,x", "12", "4", "96"])
def test_a_bad_k_is_one_line(ks, tmp_path, capsys) -> None:
    assert bench.main(["--ks", ks, "--out", str(tmp_path / "f.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err
    assert not (tmp_path / "f.json").exists()


def test_without_a_gpu_it_says_so_in_one_line(tmp_path, capsys) -> None:
    assert_no_gpu_is_one_line(bench.main, [], tmp_path / "f.json", capsys)


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found")
@pytest.mark.parametrize("k", [64, 128])
def test_the_gather_kernels_compile_and_only_the_full_one_reads_rows_and_values(tmp_path, k) -> None:
    import re
    import subprocess

    loads = {}
    for full in (False, True):
        src = tmp_path / f"g{int(full)}.cu"
        src.write_text(bench.gather_source(k, full))
        ptx = tmp_path / f"g{int(full)}.ptx"
        out = subprocess.run([find_nvcc(), "-arch=sm_90", "--ptx", "-o", str(ptx), str(src)],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        text = ptx.read_text()
        assert ".entry gather(" in text
        loads[full] = len(re.findall(r"ld\.global\.nc\.(?:s32|u32|f32|b32)\b", text))
    assert loads[True] >= loads[False] + 2  # the row and value arrays: two more scalar loads


@pytest.mark.parametrize("k", bench.KS)
def test_the_timed_stored_kernels_are_the_library_body_under_the_asked_numbers(k) -> None:
    """Kills: a library point that is not the library's variant text (the default run times something else),
    a count asked for that the PARAMS line does not carry, a body changed on the way, a library point left
    out of the default."""
    from sparserl.kernels.contract import Op, split_completion
    from sparserl.kernels.library import get_variant

    got = bench.stored_kernels(k)
    assert got[-1][0].endswith("g=32,vec=4,nzpg=1024,block=128" if k > 64 else "g=16,vec=4,nzpg=256,block=256")
    assert len(got) == (4 if k > 64 else 3)
    assert all(text == get_variant(name).render() and get_variant(name).applicable(k) for name, text in got)
    (name, text), = bench.stored_kernels(k, [(2048, 128)])
    assert name.endswith("nzpg=2048,block=128") and "NZPG=2048, BLOCK=128" in text
    body = split_completion(get_variant(got[0][0]).render(), Op.SPMM)[1].split("\n", 5)[5]
    assert split_completion(text, Op.SPMM)[1].endswith(body)  # the same code, other numbers


@pytest.mark.parametrize("nzpg", ["0", "x", "100000", ""])
def test_a_bad_nzpg_is_one_line(nzpg, tmp_path, capsys) -> None:
    assert bench.main(["--ks", "128", "--nzpg", nzpg, "--out", str(tmp_path / "f.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and not (tmp_path / "f.json").exists()
