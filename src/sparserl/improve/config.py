"""``ImproveConfig``: what one ``sparserl improve`` run does, and the knobs that bound a round."""

from __future__ import annotations

from dataclasses import dataclass

from sparserl.checks import check_device, check_op, require
from sparserl.errors import SparseRLError


@dataclass(frozen=True)
class ImproveConfig:
    """Expert iteration: rounds of search -> collect -> fine-tune -> validate (see :mod:`sparserl.improve`).

    The defaults make a small round: 8 training matrices searched with 32 candidates each, 100 SFT
    steps, 8 validation matrices sampled 8 times each. With the default model on demo-sized
    matrices (5k-100k rows) and ``search_seconds=30`` a round took 90-104 s on one H200. Round 0 validates the starting model (the bar to beat) and
    times the library oracle on the validation matrices once."""

    data: str = "runs/data"
    """SFT data folder (``sparserl data build``): its train.jsonl matrices are searched, its val.jsonl ones validate."""
    model: str = "runs/sft/checkpoint"
    """The starting policy: a policy checkpoint or a HF model folder."""
    out: str = "runs/improve"
    """Output folder: state.json, rounds.md, rounds.json, metrics.jsonl, tb/, round_N/, best/."""
    rounds: int = 2
    """Rounds to run (a resumed run may ask for more than it first did)."""
    store: str | None = None
    """Best-known store (default: best_known.sqlite under the harness cache root, the one ``sparserl search`` uses)."""
    op: str = "spmv"
    """spmv or spmm."""
    k: int | None = None
    """SpMM columns of X (required for spmm, refused for spmv)."""
    # -- 1. search ------------------------------------------------------------------------------
    matrices_per_round: int = 8
    """Training matrices searched per round (taken in a fixed shuffled order, round after round)."""
    search_budget: int = 32
    """Candidates evaluated per matrix (library seeds, mutations, policy samples and refinements)."""
    search_seconds: float | None = 120.0
    """Stop submitting a matrix's candidates after this many seconds (None: no limit)."""
    policy_share: float = 0.5
    """Share of each search's budget that goes to the policy's proposals (samples, then refinements)."""
    search_cost_model: str = "default"
    """The order each search tries its candidates in (:attr:`~sparserl.search.loop.SearchConfig.cost_model`):
    'default', 'none' or a model file ('none' where the packaged model saw held-out matrices)."""
    temperature: float = 1.0
    """Sampling temperature of the policy, in the search and in the validation."""
    max_new_tokens: int | None = None
    """Longest completion, in tokens (None: the longest library kernel in the policy's tokens plus a margin,
    :mod:`sparserl.model.budget`)."""
    regime: str = "cold"
    """L2 regime kernels are ranked and collected in: cold or warm."""
    # -- 2. collect -----------------------------------------------------------------------------
    within: float = 0.05
    """Collect the verified kernels at most this fraction slower than their matrix's best known (0.05: 5%)."""
    per_matrix: int = 4
    """At most this many distinct kernels per matrix in the teacher set."""
    max_target_chars: int | None = None
    """Only kernels of at most this many characters without comments in the teacher set (the next
    fastest within it takes a longer one's place); None: no limit (``best export --max-chars``)."""
    replay: float = 1.0
    """Rows of the data's own train split (the library-taught SFT pairs) mixed into each round's
    fine-tune data, as a multiple of the teacher rows (0: none): keeps what SFT taught while the
    policy learns the searched kernels."""
    # -- 3. fine-tune ---------------------------------------------------------------------------
    sft_steps: int = 100
    """SFT optimizer steps per round (on every training matrix searched so far)."""
    sft_batch_size: int = 8
    """(matrix, kernel) pairs per SFT step."""
    sft_lr: float = 1e-4
    """Peak SFT learning rate (warm-up, cosine decay)."""
    sft_warmup: int = 10
    """SFT warm-up steps."""
    # -- 4. validate ----------------------------------------------------------------------------
    val_matrices: int = 8
    """Validation matrices (the same ones every round)."""
    val_samples: int = 8
    """Completions per validation matrix: the figure is the best of them (best-of-k)."""
    min_gain: float = 0.0
    """Keep a round only when its validation figure beats the best so far by more than this fraction."""
    min_correct: float = 0.9
    """Keep a round only when it does not lower the share of correct validation samples below this:
    it must reach it, or the best's share where that is lower (0: no floor). The first GPU run's
    best-of-8 figure rose while the correct share fell from 89% to 81% (66% in a rejected round): the
    best-of-k figure alone does not see samples going wrong."""
    # -- held out -------------------------------------------------------------------------------
    test_samples: int = 16
    """After the last round: samples per matrix of the starting policy and the best one, side by side
    on the data's test split with cuSPARSE and the library oracle (0: no such evaluation). The
    validation figures chose the kept rounds, so they favour them; these do not."""
    # -- run ------------------------------------------------------------------------------------
    device: str = "auto"
    """The model's device: auto, cpu or cuda[:N]."""
    bf16: bool = True
    """bf16 autocast for the fine-tune on CUDA."""
    resume: bool = False
    """Continue the run in ``out`` at the phase it stopped in."""
    seed: int = 0
    """Seed of the matrix order, searches, sampling and batches."""

    def __post_init__(self) -> None:
        if self.rounds < 0:
            raise SparseRLError(f"--rounds must be >= 0, got {self.rounds}")
        check_op(self.op, self.k)
        check_device(self.device)
        if self.test_samples < 0:
            raise SparseRLError(f"--test-samples must be >= 0 (0: no held-out evaluation), got {self.test_samples}")
        for name in ("matrices_per_round", "search_budget", "per_matrix", "sft_steps", "sft_batch_size",
                     "val_matrices", "val_samples", "max_new_tokens"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise SparseRLError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.search_seconds is not None and not self.search_seconds > 0:
            raise SparseRLError(f"--search-seconds must be positive, got {self.search_seconds}")
        if not 0.0 <= self.policy_share < 1.0:
            raise SparseRLError(f"--policy-share must lie in [0, 1), got {self.policy_share}")
        if not self.temperature > 0:
            raise SparseRLError(f"--temperature must be > 0, got {self.temperature}")
        if self.regime not in ("cold", "warm"):
            raise SparseRLError(f"--regime must be cold or warm, got {self.regime!r}")
        if not self.replay >= 0:
            raise SparseRLError(f"--replay must be >= 0, got {self.replay}")
        if not 0.0 <= self.min_correct <= 1.0:
            raise SparseRLError(f"--min-correct must lie in [0, 1], got {self.min_correct}")
        require(self.within >= 0, "--within", ">= 0 (a fraction: 0.05 is 5%)", self.within)
        if self.max_target_chars is not None:
            require(self.max_target_chars >= 1, "--max-target-chars", ">= 1 (or left out for no limit)",
                    self.max_target_chars)
        require(self.min_gain >= 0, "--min-gain", ">= 0", self.min_gain)
        require(self.sft_lr > 0, "--sft-lr", "> 0", self.sft_lr)
        require(self.sft_warmup >= 0, "--sft-warmup", ">= 0", self.sft_warmup)
        require(self.seed >= 0, "--seed", ">= 0", self.seed)
