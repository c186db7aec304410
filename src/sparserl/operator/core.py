"""The operator: a sparse matrix on the GPU with its tuned kernel, for CuPy and PyTorch.

    op = sparserl.tune(A)                 # SpMV; sparserl.tune(A, "spmm", k=64) for SpMM
    y = op @ x                            # CuPy array or torch CUDA tensor, float32
    op.update_values(new_vals)            # same structure, new values (CSR order), on the GPU
    x, info = cupyx.scipy.sparse.linalg.cg(op.as_linear_operator(), b)

The hot path copies nothing: the kernel reads the operand's memory where it is (a CuPy array's or a
torch tensor's address goes straight into the kernel's packed arguments, :mod:`.launch`); the
output is a new array from the framework's pool (or ``out=``, reused). The launches are the ones
the harness planned and verified. Inputs are checked before anything runs (:mod:`.inputs`): a
wrong dtype, shape, device or layout is a one-line :class:`~sparserl.errors.SparseRLError`, never a
silent conversion.

Values: the kernel reads every value from its format's value arrays, so new values for the same
structure are written into those arrays on the GPU (one copy for CSR/COO, one gather per value
array otherwise, through the map its pattern conversion gives; see :mod:`.values`). A matrix
handed to ``update_values`` is checked against the tuned structure by fingerprint.

Transpose: ``op.transpose()`` (``op.T``) is A^T tuned the same way (the store first), made on first
use and kept; its values follow every ``update_values``. PyTorch's backward uses it.
"""

from __future__ import annotations

import logging
import math
import time
import weakref

import numpy as np
import scipy.sparse as sp

from sparserl.errors import SparseRLError
from sparserl.kernels.contract import Op
from sparserl.operator import registry
from sparserl.operator.inputs import (
    ALIGN,
    check_operand,
    check_structure,
    check_values,
    describe,
    overlaps,
)

log = logging.getLogger(__name__)

_TORCH_SIDE = None
""":mod:`sparserl.operator.torch_op`, imported (with torch) when the first tensor arrives: a product
from PyTorch then pays no import statement per call."""


def _torch_side():
    global _TORCH_SIDE
    if _TORCH_SIDE is None:
        from sparserl.operator import torch_op

        _TORCH_SIDE = torch_op
    return _TORCH_SIDE


class SparseOperator:
    """``y = A x`` (SpMV) or ``Y = A X`` (SpMM, k columns) with the kernel :func:`~.api.tune` chose."""

    def __init__(self, A: sp.csr_array, op: Op, k: int | None, backend, report, config, device: int):
        from sparserl.harness.device import cupy_module

        self._cp = cupy_module()
        self.A = A
        """The canonical host matrix the operator was made from (its structure; values as given then)."""
        self.op, self.k = op, k
        self.shape: tuple[int, int] = (int(A.shape[0]), int(A.shape[1]))
        self.nnz = int(A.nnz)
        self.dtype = np.dtype(np.float32)
        self.backend = backend
        self.report = report
        """What tune did (``report.line``: the one line it logged)."""
        self.config = config
        self.device = int(device)
        """The CUDA device the matrix lives on."""
        self.handle = registry.register(self)
        """The operator's number for ``torch.ops.sparserl.matmul``."""
        m, n = self.shape
        self._shapes = ((n,), (m,)) if op is Op.SPMV else ((n, k), (m, k))
        """(shape of x, shape of y)."""
        self._y_bytes = 4 * math.prod(self._shapes[1])  # float32
        self._transpose: SparseOperator | None = None
        self._transpose_order = None  # device gather: A^T's CSR order -> A's
        self._transpose_values = None
        self.values_version = 0
        """How many times the values were replaced (autograd's backward checks it did not change)."""
        self._transpose_of = None  # a weak reference to the operator whose transpose this is

    @classmethod
    def tuned(cls, A: sp.csr_array, op: Op, k: int | None, cfg, arch: str, t0: float | None = None) -> "SparseOperator":
        """The operator for a canonical matrix on the current GPU with the kernel :mod:`.tuning` chooses
        (store, search or library); the one line of what it did is logged."""
        from sparserl.operator.tuning import cache_dir_of, choose_kernel

        t0 = time.perf_counter() if t0 is None else t0
        choice = choose_kernel(A, op, k, cfg, arch, cache_dir=cache_dir_of(cfg.evaluator))
        operator = cls.build(A, op, k, choice, cfg, t0)
        log.info("%s", operator.report.line)
        return operator

    @classmethod
    def build(cls, A: sp.csr_array, op: Op, k: int | None, choice, config, t0: float) -> "SparseOperator":
        """Convert and upload ``A`` for the chosen kernel (or the library) on the current GPU."""
        from sparserl.harness.device import cupy_module
        from sparserl.operator import plans
        from sparserl.operator.backends import KernelBackend, LibraryBackend
        from sparserl.operator.tuning import LIBRARY

        cp = cupy_module()
        backend = None
        if choice.text is not None:
            bound, where = plans.bind(A, choice.fingerprint, choice.header, op, choice.cubin_path, k)
            if isinstance(bound, str):  # the harness bound it on this structure; only other limits refuse it
                log.warning("the chosen kernel does not bind here (%s): the library runs the operator", bound)
                from dataclasses import replace

                choice = replace(choice, action=LIBRARY, text=None, why=f"{choice.why}, but it does not bind here "
                                 f"({bound}), so the library (cuSPARSE) runs it")
            else:
                backend = KernelBackend(bound, A, where)
        if backend is None:
            backend = LibraryBackend(A, op, k)
        fmt = backend.format if choice.text is not None else None
        report = choice.report(op, k, time.perf_counter() - t0, fmt)
        return cls(A, op, k, backend, report, config, cp.cuda.runtime.getDevice())

    # -- products ---------------------------------------------------------------------------

    @property
    def T(self) -> "SparseOperator":
        return self.transpose()

    @property
    def format(self) -> str:
        """What runs the product: the kernel's format and parameters, or the library."""
        return self.backend.name

    def __repr__(self) -> str:
        k = f", k={self.k}" if self.k else ""
        return f"<SparseOperator {self.op.value}{k} {self.shape[0]}x{self.shape[1]}, nnz={self.nnz}, {self.format}>"

    def matvec(self, x, out=None):
        """``A x`` for x of shape (n,) (an SpMV operator); ``out``: a CuPy array of shape (m,) to reuse."""
        if self.op is not Op.SPMV:
            raise SparseRLError(f"this operator was tuned for SpMM with k={self.k}: use matmat(X), X of shape "
                                f"({self.shape[1]}, {self.k})")
        return self._apply(x, out, "x")

    def matmat(self, X, out=None):
        """``A X`` for X of shape (n, k), row-major (an SpMM operator); ``out``: (m, k) to reuse."""
        if self.op is not Op.SPMM:
            raise SparseRLError("this operator was tuned for SpMV: use matvec(x), or tune with op='spmm', k=K")
        return self._apply(X, out, "X")

    def __matmul__(self, x):
        return self.matvec(x) if self.op is Op.SPMV else self.matmat(x)

    def _apply(self, x, out, what: str):
        cp = self._cp
        want, give = self._shapes
        if (out is None and type(x) is cp.ndarray and x.dtype == self.dtype and x.shape == want
                and x.flags.c_contiguous and x.data.device_id == self.device and not x.data.ptr % ALIGN
                and cp.cuda.runtime.getDevice() == self.device):  # the common case, checked in a few attributes
            y = cp.empty(give, dtype=cp.float32)
            self.backend.run(x, y)
            return y
        if type(x).__module__.startswith("torch"):
            if out is not None:
                raise SparseRLError("out= takes CuPy arrays; with torch tensors the result is a new tensor")
            return self._torch(x, what)
        info = describe(x, what)
        check_operand(info, what, want, self.device)
        if out is None:
            with cp.cuda.Device(self.device):
                y = cp.empty(give, dtype=cp.float32)
        else:
            oinfo = describe(out, "out")
            check_operand(oinfo, "out", give, self.device)
            if overlaps(info, oinfo):
                raise SparseRLError(f"out shares memory with {what}; the kernel reads {what} while it writes out")
            y = out
        self._on_device(self.backend.run, x, y)
        return y

    def _on_device(self, fn, *args) -> None:
        """``fn(*args)`` with the operator's GPU current (switched only when another one is)."""
        cp = self._cp
        if cp.cuda.runtime.getDevice() == self.device:
            fn(*args)
        else:
            with cp.cuda.Device(self.device):
                fn(*args)

    # -- PyTorch ----------------------------------------------------------------------------

    def _torch(self, x, what: str):
        tp = _TORCH_SIDE or _torch_side()
        want = self._shapes[0]
        if not (x.dtype is tp.FLOAT32 and x.get_device() == self.device and x.shape == want and x.is_contiguous()
                and (tp.is_compiling() or not x.data_ptr() % ALIGN)):  # on a CPU tensor get_device() is -1
            check_operand(describe(x, what), what, want, self.device)  # traced: the op checks the address at run time
        if tp.needs_custom_op(x):
            return tp.apply(self, x)  # the custom op: autograd's formula, torch.compile's node, modes see it
        return self._torch_product(x)  # nothing to record: straight to the kernel, no dispatcher

    def torch_forward(self, x):
        """The custom op's implementation: ``A x`` for a torch CUDA tensor, into a new tensor."""
        check_operand(describe(x, "x"), "x", self._shapes[0], self.device)
        return self._torch_product(x)

    def _torch_product(self, x):
        """``A x`` for a checked torch tensor, in PyTorch's current stream, into a new tensor: the two
        tensors' addresses and the stream's go straight to the launch (no CuPy array or stream object
        is made on the way). A format that accumulates gets its zeros from the launch path's memset on
        that stream (cheaper on the host than ``torch.zeros``, which a small product is bound by)."""
        tp, device = _TORCH_SIDE or _torch_side(), self.device
        y = tp.torch.empty(self._shapes[1], dtype=tp.FLOAT32, device=device)  # an int: that CUDA device
        self._on_device(self.backend.run_pointers, x.data_ptr(), y.data_ptr(), self._y_bytes,
                        tp.current_stream_pointer(device))
        return y

    # -- values -----------------------------------------------------------------------------

    def update_values(self, values) -> None:
        """New values for the same structure: a vector of ``nnz`` float32 values in the tuned matrix's
        CSR order (rows in order, columns sorted; a CuPy array, a torch CUDA tensor, or a NumPy array
        uploaded once), or a SciPy (or CuPy) sparse matrix whose structure is checked against the
        tuned one by fingerprint, on the host. Written into the kernel's format on the GPU, in
        PyTorch's current stream for a tensor; the transpose follows. A bad input changes nothing.
        (Do not write to ``op.A`` in place: the operator keeps it as its structure.) A vector's order
        cannot be checked: a SciPy matrix's ``.data`` is in CSR order only when its indices are sorted
        and it has no duplicates (``M @ M.T`` leaves them unsorted); pass such a matrix itself.
        Autograd: a product whose backward has not run yet refuses it afterwards."""
        if self._transpose_of is not None and self._transpose_of() is not None:
            raise SparseRLError("this operator is the transpose of another, whose values it follows: update that "
                                "operator's values (op.update_values), and its transpose follows them")
        cp = self._cp
        if (type(values) is cp.ndarray and values.dtype == self.dtype and values.shape == (self.nnz,)
                and values.flags.c_contiguous and values.data.device_id == self.device
                and cp.cuda.runtime.getDevice() == self.device):  # the common case: on the current stream
            self._set_values(values)
            return
        if type(values).__module__.startswith("torch"):
            tp = _TORCH_SIDE or _torch_side()
            if (values.dtype is tp.FLOAT32 and values.get_device() == self.device and values.shape == (self.nnz,)
                    and values.is_contiguous()):  # checked in a few attributes; anything else: the checks below
                self._on_device(self._set_torch_values, values, tp)
                return
        if type(values).__module__.startswith("cupyx") and hasattr(values, "tocsr"):
            values = values.get()  # a CuPy sparse matrix: its structure is checked on the host
        if sp.issparse(values):
            from sparserl.matrices import canonicalize
            from sparserl.matrices.card import structure_fingerprint

            B = canonicalize(values)
            check_structure(self.report.fingerprint, structure_fingerprint(B))
            values = B.data
        info = describe(values, "values")
        check_values(info, self.nnz, self.device)
        stream = cp.cuda.get_current_stream()
        if info.kind == "torch":
            from sparserl.operator.torch_op import current_stream

            stream = current_stream(cp, values.device)
            values = values.detach()
        with cp.cuda.Device(self.device), stream:
            v = cp.asarray(values)  # a view of device memory; NumPy values are uploaded here
            self._set_values(v)

    def _set_torch_values(self, t, tp) -> None:
        """New values from a checked torch CUDA tensor, in PyTorch's current stream: a CuPy view made from
        its address (no ``__cuda_array_interface__`` round trip, no generic description of the input)."""
        cp = self._cp
        mem = cp.cuda.UnownedMemory(t.data_ptr(), self.nnz * 4, t, self.device)
        v = cp.ndarray((self.nnz,), cp.float32, cp.cuda.MemoryPointer(mem, 0))
        with tp.stream_on(cp, self.device):
            self._set_values(v)

    def _set_values(self, v) -> None:
        self.backend.set_values(v)
        self.values_version += 1
        T = self._transpose
        if T is not None:
            direct = T.backend.value_array() if T._transpose is None else None
            if direct is not None and direct.data.ptr != v.data.ptr:
                # the transpose keeps its values as one array in its CSR order: gather straight into it (not
                # when the new values are that very array: a gather in place would read what it overwrites)
                self._cp.take(v, self._transpose_order, out=direct)
                T.values_version += 1  # its values changed too (a product of it awaiting backward refuses)
            else:
                self._cp.take(v, self._transpose_order, out=self._transpose_values)
                T._set_values(self._transpose_values)

    def values(self):
        """The values the kernel reads now, in CSR order, on the device (a CuPy array; for CSR and COO
        kernels and the library the operator's own: do not write to it)."""
        with self._cp.cuda.Device(self.device):
            return self.backend.current_values()

    # -- transpose and solvers --------------------------------------------------------------

    def transpose(self) -> "SparseOperator":
        """A^T as an operator tuned the same way (store first), made once, values kept in step."""
        if self._transpose is None:
            from sparserl.operator.values import transpose_order
            from sparserl.harness.device import device_arch

            cp = self._cp
            t0 = time.perf_counter()
            AT, order = transpose_order(self.A)
            with cp.cuda.Device(self.device):
                T = SparseOperator.tuned(AT, self.op, self.k, self.config, device_arch(), t0)
                self._transpose_order = cp.asarray(order.astype(np.int32))
                self._transpose_values = cp.empty(self.nnz, dtype=cp.float32)
                cp.take(self.values(), self._transpose_order, out=self._transpose_values)  # values as they are now
                T._set_values(self._transpose_values)
                # made once, perhaps inside a backward whose products run on PyTorch's stream, not CuPy's
                # current one: the gathered values are in place before anything uses them
                cp.cuda.get_current_stream().synchronize()
            T._transpose_of = weakref.ref(self)
            self._transpose = T
            log.debug("transpose of %s made", self.config.name)
        return self._transpose

    def as_linear_operator(self):
        """A ``cupyx.scipy.sparse.linalg.LinearOperator`` (float32) for ``cg``, ``gmres``, ``minres``
        ...; its ``rmatvec`` uses the transpose (tuned on first use). SpMV operators only."""
        if self.op is not Op.SPMV:
            raise SparseRLError("as_linear_operator needs an SpMV operator: tune with op='spmv'")
        from cupyx.scipy.sparse.linalg import LinearOperator

        cp = self._cp

        def vector(x):
            if x.ndim != 1:
                x = x.reshape(-1)  # solvers pass (n,) or (n, 1)
            if x.flags.c_contiguous and not x.data.ptr % ALIGN:
                return x
            return cp.array(x, copy=True, order="C")  # a column of a solver's basis: strided, or off 16 bytes

        return LinearOperator(self.shape, matvec=lambda x: self.matvec(vector(x)),
                              rmatvec=lambda x: self.transpose().matvec(vector(x)), dtype=np.float32)

    def cg(self, b, x0=None, *, rtol: float = 1e-5, atol: float | None = None, maxiter: int | None = None,
           check_every: int = 16):
        """Solve ``A x = b`` (A symmetric positive definite) by conjugate gradient on the GPU, every
        iteration's scalars kept on the device and ``check_every`` iterations replayed as one CUDA graph:
        ``(x, info)`` as ``cupyx.scipy.sparse.linalg.cg`` returns them (:func:`~.solvers.solve_cg` for
        the iteration count and residual)."""
        from sparserl.operator.solvers import cg

        return cg(self, b, x0, rtol=rtol, atol=atol, maxiter=maxiter, check_every=check_every)

    def close(self) -> None:
        """Free the library backend's cuSPARSE descriptor now (device memory goes with the object), and
        the solvers' work vectors and graphs."""
        self.__dict__.pop("_cg_workspaces", None)
        self.backend.close()
        if self._transpose is not None:
            self._transpose.close()

    def __del__(self) -> None:
        try:
            self.backend.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown: CuPy may be gone already
            pass


def from_library(A, op: str = "spmv", k: int | None = None) -> SparseOperator:
    """An operator that runs cuSPARSE's generic SpMV/SpMM on ``A`` in CSR, with no store lookup or
    search: the baseline a tuned operator is measured against, with the same solvers and checks."""
    from sparserl.harness.device import cupy_module
    from sparserl.matrices import canonicalize
    from sparserl.matrices.card import structure_fingerprint
    from sparserl.operator.tuning import GIVEN, KernelChoice, TuneConfig, check_request

    t0 = time.perf_counter()
    opv, k = check_request(op, k)
    cupy_module()
    A = canonicalize(A)
    choice = KernelChoice(GIVEN, structure_fingerprint(A), why="the library (cuSPARSE), as asked")
    return SparseOperator.build(A, opv, k, choice, TuneConfig(), t0)


def from_kernel(A, text: str, op: str = "spmv", k: int | None = None) -> SparseOperator:
    """An operator running a given kernel text (a contract completion: FORMAT/LAUNCH header + code),
    without the store or a search; for kernels from ``sparserl generate`` or your own. Unverified
    here: verify a kernel with the harness (``sparserl check-kernel``) before trusting it."""
    from sparserl.harness.compile import CompileOptions
    from sparserl.harness.device import cupy_module, device_arch
    from sparserl.matrices import canonicalize
    from sparserl.matrices.card import structure_fingerprint
    from sparserl.operator.tuning import GIVEN, KernelChoice, TuneConfig, build_kernel, check_request

    t0 = time.perf_counter()
    opv, k = check_request(op, k)
    cupy_module()
    A = canonicalize(A)
    built = build_kernel(text, opv, CompileOptions(arch=device_arch()), A=A)
    if isinstance(built, str):
        raise SparseRLError(f"this kernel cannot be used: {built}")
    choice = KernelChoice(GIVEN, structure_fingerprint(A), text=text, header=built[0], cubin_path=built[1],
                          kernel=built[0].format, why="a given kernel (not from the store or a search)")
    return SparseOperator.build(A, opv, k, choice, TuneConfig(), t0)

