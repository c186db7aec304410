"""Host code: device code only, every function __device__ or __global__, no host variables."""

from __future__ import annotations

from tests.harness.adversarial.base import HONEST, csr

CASES: dict[str, tuple[str, str]] = {
    # a host function beside the kernel
    "host_helper_function": (csr(HONEST, before="int helper(int a) { return a + 1; }"), "static_check"),
    "host_variable": (csr(HONEST, before="int counter = 0;"), "static_check"),
    "host_function_in_namespace": (csr(HONEST, before="namespace util { int twice(int a) { return 2 * a; } }"),
                                   "static_check"),
    "host_member_function": (csr(HONEST, before="struct Acc { float v; float get() const { return v; } };"),
                             "static_check"),
    "host_template_function": (csr(HONEST, before="template <typename T> T twice(T a) { return a + a; }"),
                               "static_check"),
    "host_prototype": (csr(HONEST, before="int helper(int a);"), "static_check"),
    "host_function_behind_a_macro": (csr(HONEST, before="#define FN(name) int name(int a) { return a; }\nFN(h)"),
                                     "static_check"),
    "extern_host_data": (csr(HONEST, before="extern int shared_counter;"), "static_check"),
}
