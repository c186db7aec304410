"""Hidden state: anything that would let a launch see what an earlier launch left behind."""

from __future__ import annotations

from tests.harness.adversarial.base import DOT, HONEST, csr

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
}
