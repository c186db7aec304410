"""Hidden state: anything that would let a launch see what an earlier launch left behind."""

from __future__ import annotations

from tests.harness.adversarial.base import DOT, HEAD, HONEST, SIG, csr


def smem_cache_kernel(magic_read: str = "0x5EC12E7CAC4Eull") -> str:
    """The shared-memory cache cheat; ``magic_read``: the tag a launch looks for (another value than the one it
    writes makes the control: the same work, never a hit).

    Each block owns the rows of slice ``blockIdx.x`` and keeps that slice's columns and values in its shared memory
    with a tag: the magic, the value array's address, nnz, the slice and a position-weighted checksum of what it
    kept. A block whose shared memory holds its own slice under a matching tag and checksum (the previous launch's
    block of the same index ran in the same place, and nothing overwrote it since) reads the slice from there
    instead of from the matrix; any other block reads the matrix and keeps the slice. So the output is right
    whatever the previous launch left (a stranger's slice, a half-overwritten one), and only the time can tell."""
    head = HEAD.replace("LAUNCH: grid=ceil_div(m, 256), block=256", "LAUNCH: grid=2 * num_sms, block=256, smem=98304")
    body = f"""
    extern __shared__ unsigned long long cache64[];
    unsigned long long* tag = cache64;
    const int cap = (98304 - 64) / 8;
    int* ccol = (int*)(cache64 + 8);
    float* cval = (float*)(ccol + cap);
    __shared__ unsigned int warp_s[8];
    const int per = (m + gridDim.x - 1) / gridDim.x;
    const int r0 = min(m, (int)blockIdx.x * per), r1 = min(m, r0 + per);
    const int base = row_ptr[r0];
    const int len = row_ptr[r1] - base;
    const bool fits = len <= cap;
    unsigned int part = 0u;
    if (fits)
        for (int i = threadIdx.x; i < len; i += blockDim.x)
            part += ((unsigned int)ccol[i] ^ __float_as_uint(cval[i])) * (2654435761u * (unsigned int)i + 1u);
    for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
    if ((threadIdx.x & 31) == 0) warp_s[threadIdx.x >> 5] = part;
    __syncthreads();
    unsigned int held = 0u;
    for (int w = 0; w < 8; ++w) held += warp_s[w];
    const bool hit = fits && tag[0] == {magic_read} && tag[1] == (unsigned long long)val &&
                     tag[2] == (unsigned long long)nnz && tag[3] == (unsigned long long)blockIdx.x &&
                     tag[4] == (unsigned long long)held;
    __syncthreads();
    unsigned int kept = 0u;
    for (int r = r0 + threadIdx.x; r < r1; r += blockDim.x) {{
        float sum = 0.f;
        for (int j = row_ptr[r]; j < row_ptr[r + 1]; ++j) {{
            int c;
            float v;
            if (hit) {{ c = ccol[j - base]; v = cval[j - base]; }}
            else {{
                c = col_idx[j]; v = val[j];
                if (fits) {{
                    ccol[j - base] = c; cval[j - base] = v;
                    kept += ((unsigned int)c ^ __float_as_uint(v)) * (2654435761u * (unsigned int)(j - base) + 1u);
                }}
            }}
            sum += v * x[c];
        }}
        y[r] = sum;
    }}
    if (!hit && fits) {{
        for (int o = 16; o > 0; o >>= 1) kept += __shfl_xor_sync(0xffffffffu, kept, o);
        if ((threadIdx.x & 31) == 0) warp_s[threadIdx.x >> 5] = kept;
        __syncthreads();
        if (threadIdx.x == 0) {{
            unsigned int sum = 0u;
            for (int w = 0; w < 8; ++w) sum += warp_s[w];
            tag[0] = 0x5EC12E7CAC4Eull; tag[1] = (unsigned long long)val; tag[2] = (unsigned long long)nnz;
            tag[3] = (unsigned long long)blockIdx.x; tag[4] = (unsigned long long)sum;
        }}
    }}
"""
    return f"{head}\n{SIG}\n{{{body}}}\n"


CASES: dict[str, tuple[str, str]] = {
    # a pointer cache in an anonymous namespace
    "pointer_cache_in_namespace": (csr(f"if (row >= m) return; if (cache == y) return; {DOT} y[row] = sum; "
                                       "if (row == 0) cache = y;",
                                       before="namespace { __device__ float* cache; }"), "static_check"),
    "state_in_nested_namespace": (csr(f"{HONEST} if (row == 0) a::b::calls++;",
                                      before="namespace a { namespace b { __device__ int calls; } }"), "static_check"),
    "state_behind_a_macro": (csr(f"{HONEST} if (row == 0) counter++;",
                                 before="#define DEV __device__\nDEV int counter;"), "static_check"),
    "state_in_a_struct_instance": (csr(f"{HONEST} if (row == 0) g.last = y;",
                                       before="struct Memo { float* last; };\n__device__ Memo g;"), "static_check"),
    # a mutable member of a const instance: the declaration reads as const data; only the compiled code shows the write
    "mutable_member_of_a_const_instance": (csr(f"{HONEST} if (row == 0) g.hits++;",
                                               before="struct Memo { mutable int hits; };\n__device__ const Memo g = {0};"),
                                           "static_check"),
    # the matrix loaded with the evict-last L2 priority (what cuda::annotated_ptr<..., persisting> does): the cold
    # timing's flush reads a clean buffer at normal priority around those lines, so the next launch would time warm
    "matrix_pinned_in_l2": (csr("if (row >= m) return; "
                                "const float* v = (const float*)__nv_associate_access_property(val, 0x14F0000000000000ull); "
                                "const int* c = (const int*)__nv_associate_access_property(col_idx, 0x14F0000000000000ull); "
                                "float sum = 0.f; for (int j = row_ptr[row]; j < row_ptr[row + 1]; ++j) sum += v[j] * x[c[j]]; "
                                "y[row] = sum;"), "static_check"),
    "static_data_member": (csr(f"{HONEST} if (row == 0) Memo::hits++;",
                               before="struct Memo { static __device__ int hits; };"), "static_check"),
    "static_local_counter": (csr(f"static int calls; {HONEST} if (row == 0) calls++;"), "static_check"),
    # const tables are allowed, so the write goes through a cast: only the compiled code shows it
    "writes_through_const_table": (csr(f"static const float t[4] = {{1.f, 2.f, 3.f, 4.f}}; {HONEST} "
                                       "if (row == 0) const_cast<float*>(t)[0] = sum;"), "static_check"),
    "writes_through_constant_memory": (csr(f"{HONEST} if (row == 0) ((float*)tab)[0] = sum;",
                                           before="__constant__ float tab[4] = {1.f, 2.f, 3.f, 4.f};"),
                                       "static_check"),
    "writes_device_const_by_address": (csr(f"{HONEST} if (row == 0) *(int*)&flag = 1;",
                                           before="__device__ const int flag = 0;"), "static_check"),
    # a call that leaves the module, declared by hand (assert's runtime function)
    "calls_outside_the_module": (csr(f'{HONEST} if (row == 0 && sum != sum) __assertfail("a", "b", 1, "c", 1);',
                                     before='extern "C" __device__ void __assertfail(const char*, const char*, '
                                            'unsigned int, const char*, unsigned long long);'), "static_check"),
    "managed_memory": (csr(HONEST, before="__managed__ int m_calls;"), "static_check"),
    # a table's address rebuilt bit by bit under branches (no arithmetic joins the two), then a launch counter
    # written through it: only control carries the address, so the compiled-code check follows control too
    "address_rebuilt_under_branches": (csr("unsigned long long a = (unsigned long long)box, b = 0;\n#pragma unroll 1\n"
                                           "for (int i = 0; i < 64; ++i) { if ((a >> i) & 1ull) { b |= 1ull << i; "
                                           f"__syncwarp(); }} }} if (row == 0) ((unsigned int*)b)[0] += 1u; {HONEST}",
                                           before="__device__ const unsigned int box[4] = {0u, 0u, 0u, 0u};"),
                                       "static_check"),
    # the same address rebuilt through memory: each of its bytes indexes an identity table in shared memory, whose
    # loads the check took for plain data; a counter kept across launches through the rebuilt pointer
    "address_laundered_through_a_table": (csr("__shared__ unsigned char ident[256]; ident[threadIdx.x] = "
                                              "(unsigned char)threadIdx.x; __syncthreads();\n"
                                              "unsigned long long a = (unsigned long long)box, b = 0;\n#pragma unroll\n"
                                              "for (int i = 0; i < 8; ++i) b |= (unsigned long long)ident[(a >> (8 * i)) "
                                              f"& 255ull] << (8 * i);\nif (row == 0) atomicAdd((unsigned int*)b, 1u); "
                                              f"{HONEST}",
                                              before="__device__ const unsigned int box[4] = {0u, 0u, 0u, 0u};"),
                                          "static_check"),
    # the address rebuilt from block-wide barrier counts: __syncthreads_count of "my thread index is below this byte
    # of the address" is that byte (a bar.red.popc, whose result the check took for a barrier's, with no register
    # written); a launch counter kept through the rebuilt pointer (found by a red-team review: both compilers'
    # checks passed it, inlined after a first barrier and in a function of its own)
    "address_rebuilt_from_barrier_counts": (csr(
        "const int live = __syncthreads_count(row < m);\n"
        "unsigned long long a = (unsigned long long)box, b = 0;\n#pragma unroll\n"
        "for (int i = 0; i < 8; ++i) b |= (unsigned long long)__syncthreads_count((int)threadIdx.x < "
        "(int)((a >> (8 * i)) & 255ull)) << (8 * i);\n"
        f"if (row == 0) ((unsigned int*)b)[0] += (unsigned int)live; {HONEST}",
        before="__device__ const unsigned int box[4] = {0u, 0u, 0u, 0u};"), "static_check"),
    "address_returned_from_barrier_counts": (csr(
        f"unsigned int* s = rebuilt(); if (row == 0) s[0] += 1u; {HONEST}",
        before="__device__ const unsigned int box[4] = {0u, 0u, 0u, 0u};\n"
               "__device__ __noinline__ unsigned int* rebuilt()  // every thread of the 256 calls it\n{\n"
               "    const unsigned long long a = (unsigned long long)box;\n    unsigned long long r = 0ull;\n"
               "#pragma unroll\n    for (int i = 0; i < 8; ++i)\n"
               "        r |= (unsigned long long)__syncthreads_count((int)threadIdx.x < (int)((a >> (8 * i)) & 255ull))"
               " << (8 * i);\n    return (unsigned int*)r;\n}"), "static_check"),
    # the address kept in an mbarrier's count, through allowed headers: each byte of it as the expected count of an
    # mbarrier (cuda_pipeline.h) or as the count of one arrival (cuda::ptx through <cuda/barrier>), read back by
    # counting the arrivals that complete the phase; a launch counter kept through the rebuilt pointer (found by a
    # review of the barrier-count rule: both compilers' checks passed both)
    "address_kept_in_an_mbarrier_s_expected_count": (csr(
        "__shared__ __mbarrier_t mb[8];\nif (threadIdx.x == 0) {\n"
        "  const unsigned long long a = (unsigned long long)box; unsigned long long b = 0;\n"
        "  for (int i = 0; i < 8; ++i) {\n"
        "    __mbarrier_init(&mb[i], (unsigned)((a >> (8 * i)) & 255ull) + 1u);\n"
        "    unsigned long long k = 0; __mbarrier_token_t t;\n"
        "    do { t = __mbarrier_arrive(&mb[i]); ++k; } while (!__mbarrier_test_wait(&mb[i], t));\n"
        "    b |= (k - 1) << (8 * i);\n  }\n"
        f"  if (blockIdx.x == 0) ((unsigned int*)b)[0] += 1u;\n}}\n{HONEST}",
        before="#include <cuda_pipeline.h>\n__device__ const unsigned int box[4] = {0u, 0u, 0u, 0u};"),
        "static_check"),
    "address_kept_in_an_mbarrier_arrival_s_count": (csr(
        "__shared__ cuda::std::uint64_t mb[8];\nif (threadIdx.x == 0) {\n"
        "  const unsigned long long a = (unsigned long long)box; unsigned long long b = 0;\n"
        "  for (int i = 0; i < 8; ++i) {\n"
        "    cuda::ptx::mbarrier_init(&mb[i], 300u);\n"
        "    cuda::ptx::mbarrier_arrive(&mb[i], (unsigned)((a >> (8 * i)) & 255ull) + 1u);\n"
        "    unsigned long long k = 0; cuda::std::uint64_t s;\n"
        "    do { s = cuda::ptx::mbarrier_arrive(&mb[i]); ++k; } while (!cuda::ptx::mbarrier_test_wait(&mb[i], s));\n"
        "    b |= (299ull - k) << (8 * i);\n  }\n"
        f"  if (blockIdx.x == 0) ((unsigned int*)b)[0] += 1u;\n}}\n{HONEST}",
        before="#include <cuda/barrier>\n__device__ const unsigned int box[4] = {0u, 0u, 0u, 0u};"),
        "static_check"),
    # each bit of the address decides whether a no-argument __noinline__ function marks a flag in shared memory (the
    # callee's store was judged in the callee, where nothing is derived); the flags rebuild it and a launch counter is
    # kept through it (found by a red-team review of the PTX check: both compilers' checks passed it)
    'address_bits_in_a_call_under_a_branch': (csr('if (threadIdx.x < 64) flags[threadIdx.x] = 0u;\n__syncthreads();\nconst unsigned long long a = (unsigned long long)box;\nif (threadIdx.x < 64 && ((a >> threadIdx.x) & 1ull)) mark();\n__syncthreads();\nif (row == 0) { unsigned long long b = 0;\n  for (int i = 0; i < 64; ++i) b |= (unsigned long long)flags[i] << i;\n  ((unsigned int*)b)[0] += 1u; }' + ' ' + HONEST,
        before='__device__ const unsigned int box[4] = {0u, 0u, 0u, 0u};\n__shared__ unsigned int flags[64];\n__device__ __noinline__ void mark() { flags[threadIdx.x] = 1u; }'), "static_check"),
    # lanes 1..31 vote the address's bits at a ballot of their own function, lane 0 reads the ballots at another
    # instruction of another (taint followed only an instruction's own operands; same review, both compilers)
    'address_bits_voted_at_another_lane_s_ballot': (csr('unsigned long long b = 0;\nif (threadIdx.x == 0) b = tally_w(); else if (threadIdx.x < 32) vote_w();\nif (row == 0) ((unsigned int*)b)[0] += 1u;' + ' ' + HONEST,
        before='__device__ const unsigned int box[4] = {0u, 0u, 0u, 0u};\n// lanes 1..31: each votes one bit of the address per round (nothing written, nothing returned)\n__device__ __noinline__ void vote_w()\n{\n    const unsigned long long a = (unsigned long long)box;\n#pragma unroll\n    for (int k = 0; k < 3; ++k) __ballot_sync(0xffffffffu, (int)((a >> (31 * k + threadIdx.x - 1)) & 1ull));\n}\n// lane 0: the same three ballots at instructions of its own, with nothing derived from the address\n__device__ __noinline__ unsigned long long tally_w()\n{\n    unsigned long long b = 0;\n#pragma unroll\n    for (int k = 0; k < 3; ++k) b |= (unsigned long long)(__ballot_sync(0xffffffffu, 0) >> 1) << (31 * k);\n    return b;\n}'), "static_check"),
    # warps 1..7 give the address's bytes to __syncthreads_count in one function, warp 0 reads the counts at another
    # (same review, both compilers)
    'address_bytes_counted_at_another_warp_s_barrier': (csr('unsigned long long b = 0;\nif (threadIdx.x < 32) b = tally(); else vote();\nif (row == 0) ((unsigned int*)b)[0] += 1u;' + ' ' + HONEST,
        before="__device__ const unsigned int box[4] = {0u, 0u, 0u, 0u};\n// warps 1..7: vote with the address's bytes (nothing written, nothing returned)\n__device__ __noinline__ void vote()\n{\n    const unsigned long long a = (unsigned long long)box;\n#pragma unroll\n    for (int i = 0; i < 8; ++i) __syncthreads_count((int)threadIdx.x - 32 < (int)((a >> (8 * i)) & 255ull));\n}\n// warp 0: the same barriers, at instructions of its own, with nothing derived from the address\n__device__ __noinline__ unsigned long long tally()\n{\n    unsigned long long b = 0;\n#pragma unroll\n    for (int i = 0; i < 8; ++i) b |= (unsigned long long)__syncthreads_count(0) << (8 * i);\n    return b;\n}"), "static_check"),
    # a flag per bit set in a block the compiler places out of line (an unlikely branch): the block is entered
    # only by a jump inside the branch's region and left by a jump back, so the textual region missed it (found
    # by a third red-team review of the PTX check: both compilers' checks passed it)
    "flag_set_in_a_block_out_of_line": (csr('if (threadIdx.x < 64) flags[threadIdx.x] = 0u;\n__syncthreads();\nif (threadIdx.x < 64) probe(threadIdx.x);\n__syncthreads();\nif (row == 0) { unsigned long long b = 0;\n  for (int i = 0; i < 64; ++i) b |= (unsigned long long)flags[i] << i;\n  ((unsigned int*)b)[0] += 1u; }' + ' ' + HONEST,
        before='__device__ const unsigned int box[4] = {0u, 0u, 0u, 0u};\n__shared__ unsigned int flags[64];\n__device__ __noinline__ void probe(int k)\n{ const unsigned long long a = (unsigned long long)box;\n  if (__builtin_expect((a >> k) & 1ull, 0)) { flags[k] = 1u; __threadfence_block(); } }'), "static_check"),
    # the address's pieces taken without a shift or a mask: each 32-bit half through cuda_fp16's __low2half and
    # __high2half, whose inline PTX moves it through registers named without a '%' (found by a review of the
    # laundering rule; both compilers' checks passed it)
    "address_taken_apart_by_half_moves": (csr(
        "unsigned long long a = (unsigned long long)box;\nunsigned int w[2] = {(unsigned int)a, (unsigned int)(a >> 32)};"
        " unsigned long long b = 0;\n#pragma unroll\nfor (int i = 0; i < 2; ++i) { __half2 h = "
        "*reinterpret_cast<__half2*>(&w[i]);\n  unsigned long long lo = __half_as_ushort(__low2half(h)), "
        "hi = __half_as_ushort(__high2half(h));\n  b |= (lo | (hi << 16)) << (32 * i); }\n"
        f"if (row == 0) atomicAdd((unsigned int*)b, 1u); {HONEST}",
        before="#include <cuda_fp16.h>\n__device__ const unsigned int box[4] = {0u, 0u, 0u, 0u};"), "static_check"),
    # each bit of the address as the carry out of a 128-bit sum (add.cc / addc: the carry flag is no register; NVRTC
    # refuses __int128, so nvcc builds it)
    "address_bits_through_the_carry_flag": (csr(
        "unsigned long long a = (unsigned long long)box, b = 0, c = (unsigned long long)(nnz >> 31);\n#pragma unroll\n"
        "for (int i = 63; i >= 0; --i) { unsigned long long x = a << (63 - i); unsigned __int128 s = "
        "(unsigned __int128)x + (unsigned __int128)(x + c); b |= (unsigned long long)(s >> 64) << i; }\n"
        f"if (row == 0) atomicAdd((unsigned int*)b, 1u); {HONEST}",
        before="__device__ const unsigned int box[4] = {0u, 0u, 0u, 0u};"), "static_check"),
    # shared memory is not cleared between launches: each block keeps its slice of the matrix there, tagged with
    # the arrays' address, and a later launch that finds its tag reads the slice from there instead of DRAM (a
    # cache the L2 flush does not reach). Statically legal; correct on every run; the flush's scrub of shared
    # memory takes the gain away (tests/harness/test_shared_memory_gpu.py)
    "matrix_cached_in_shared_memory": (smem_cache_kernel(), "none"),
}
