"""A two-layer GCN whose aggregation A @ H runs a kernel tuned for the graph, trained a few steps.

    python examples/gcn_layer.py           # a 100k-node power-law graph, 64 features
"""

import sys

import numpy as np
import scipy.sparse as sp

import sparserl
from sparserl.matrices import generate


def normalized_adjacency(nodes: int) -> sp.csr_array:
    P = generate("powerlaw", nodes, mean_degree=8)
    S = ((P + P.T) != 0).astype(np.float32) + sp.identity(nodes, dtype=np.float32, format="csr")
    d = 1.0 / np.sqrt(np.asarray(S.sum(axis=1)).ravel())
    return sp.csr_array(sp.diags_array(d) @ S @ sp.diags_array(d), dtype=np.float32)


def main() -> int:
    A, k = normalized_adjacency(100_000), 64
    try:
        agg = sparserl.tune(A, "spmm", k, budget=16, backward=True)  # A and A^T (for the backward)
    except sparserl.SparseRLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import torch

    class GCN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.agg = agg  # keep the operator alive as long as the model
            self.w1, self.w2 = torch.nn.Linear(k, k), torch.nn.Linear(k, k)

        def forward(self, x):
            return self.agg.matmat(self.w2(torch.relu(self.agg.matmat(self.w1(x)))))

    model = GCN().cuda()
    x, target = torch.randn(A.shape[0], k, device="cuda"), torch.randn(A.shape[0], k, device="cuda")
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    step = torch.compile(lambda: torch.nn.functional.mse_loss(model(x), target))  # captures the custom op
    for i in range(5):
        opt.zero_grad()
        loss = step()
        loss.backward()
        opt.step()
        print(f"step {i}: loss {loss.item():.4f}")
    print(agg.report.line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
