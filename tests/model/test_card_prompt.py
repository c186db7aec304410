"""The matrix card in the prompt: on iff the policy's config says so, saved
with the checkpoint (an old checkpoint loads without it), the same text on every path that
builds a prompt (SFT data, RL rollouts, generate, search, best-known export), and a pure
function of the structure (values never reach a prompt)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

torch = pytest.importorskip("torch")

from sparserl.encoding import EncodingConfig  # noqa: E402
from sparserl.errors import SparseRLError  # noqa: E402
from sparserl.kernels.contract import Op  # noqa: E402
from sparserl.matrices import generate, save_matrix  # noqa: E402
from sparserl.matrices.card import PROMPT_OFFSET_ITEMS, matrix_card, prompt_card  # noqa: E402
from sparserl.model.policy import Policy, PolicyConfig, Sample, make_sample, prompt_text  # noqa: E402

ENC = EncodingConfig(max_nnz=16, d_pe=8, summary_tokens=2)


class RecordingPolicy:
    """Stands in for Policy.generate: records the samples it is given."""

    device = "cpu"

    def __init__(self, card: bool = True):
        self.config = PolicyConfig(encoding=ENC, card=card)
        self.calls: list[list[Sample]] = []

    def generate(self, samples, **kw):
        self.calls.append(list(samples))
        return ["x"] * len(samples)


def test_card_is_in_the_prompt_iff_enabled() -> None:
    A = generate("banded", 300, seed=0, bands=3)
    on = make_sample(A, PolicyConfig(encoding=ENC, card=True), Op.SPMV)
    off = make_sample(A, PolicyConfig(encoding=ENC, card=False), Op.SPMV)
    card = prompt_card(A)
    assert on.card == card and off.card is None
    for text_prompt in (True, False):
        with_card = prompt_text(on, text_prompt, card=True)
        assert f"Matrix card:\n{card}\n" in with_card and "diagonal offsets: -1..1" in with_card
        assert "Matrix card" not in prompt_text(on, text_prompt, card=False)
    # without the card the prompt is exactly the one models were trained on before it existed
    assert prompt_text(off, True, card=False).endswith("nonzeros). " + prompt_text(off, True).split(". ", 1)[1])
    assert prompt_text(off, True) == prompt_text(on, True, card=False)
    assert prompt_text(off, False) == "SpMV y = A x\n"
    with pytest.raises(SparseRLError, match="make_sample"):
        prompt_text(off, True, card=True)  # a card model is never prompted without its card


def test_the_policy_reads_the_card_from_its_config(tiny_tokenizer, tiny_hf_config) -> None:
    A = generate("banded", 300, seed=0, bands=3)
    lens = {}
    for card in (True, False):
        p = Policy.from_config(tiny_hf_config, tiny_tokenizer, PolicyConfig(encoding=ENC, card=card))
        s = make_sample(A, p.config, Op.SPMV)
        lens[card] = p._prefix([s])[0].shape[0]
        extra = len(tiny_tokenizer("Matrix card:\n" + prompt_card(A) + "\n", add_special_tokens=False)["input_ids"])
    assert lens[True] > lens[False] and lens[True] - lens[False] <= extra + 2
    p = Policy.from_config(tiny_hf_config, tiny_tokenizer, PolicyConfig(encoding=ENC))
    assert p.config.card, "new models carry the card"
    with pytest.raises(SparseRLError, match="matrix card"):
        p.generate([make_sample(A, PolicyConfig(encoding=ENC, card=False), Op.SPMV)], max_new_tokens=2)


def test_checkpoint_keeps_the_setting_and_an_old_one_loads_without_the_card(tmp_path: Path, tiny_tokenizer,
                                                                            tiny_hf_config) -> None:
    for card in (True, False):
        Policy.from_config(tiny_hf_config, tiny_tokenizer, PolicyConfig(encoding=ENC, card=card)).save(tmp_path / "c")
        assert json.loads((tmp_path / "c" / "policy.json").read_text())["config"]["card"] is card
        assert Policy.load(tmp_path / "c").config.card is card
    meta = json.loads((tmp_path / "c" / "policy.json").read_text())
    meta["config"]["card"] = True
    del meta["config"]["card"]  # saved before the card existed
    (tmp_path / "c" / "policy.json").write_text(json.dumps(meta))
    assert Policy.load(tmp_path / "c").config.card is False


def test_sft_sets_the_card_for_new_models_and_keeps_a_checkpoints(tmp_path: Path, tiny_model_dir: Path,
                                                                  caplog) -> None:
    from sparserl.model.build import build_policy
    from sparserl.train.sft import SFTConfig, policy_config

    def build(cfg: SFTConfig):  # as sft() builds its starting policy
        return build_policy(cfg.model, policy_config(cfg), dev, seed=cfg.seed, card=cfg.card)

    dev = torch.device("cpu")
    new = build(SFTConfig(model=str(tiny_model_dir), max_nnz=16))
    assert new.config.card is True
    old = build(SFTConfig(model=str(tiny_model_dir), max_nnz=16, card=False))
    assert old.config.card is False
    for a, b in zip(new.encoder.state_dict().values(), old.encoder.state_dict().values()):
        assert torch.equal(a, b), "both arms of the ablation start from the same weights"
    old.save(tmp_path / "old")
    assert build(SFTConfig(model=str(tmp_path / "old"))).config.card is False
    with caplog.at_level("WARNING", logger="sparserl.model.build"):
        assert build(SFTConfig(model=str(tmp_path / "old"), card=True)).config.card is True
    assert "trained without the matrix card" in caplog.text


def test_card_is_a_pure_function_of_the_structure() -> None:
    A = generate("powerlaw", 3000, seed=2)
    B = A.copy()
    B.data = np.full_like(B.data, 12345.678)  # same pattern, other values
    assert prompt_card(A) == prompt_card(B) and "12345" not in prompt_card(B)
    cfg = PolicyConfig(encoding=ENC)
    sa, sb = make_sample(A, cfg, Op.SPMM, 8), make_sample(B, cfg, Op.SPMM, 8)
    assert prompt_text(sa, True, True) == prompt_text(sb, True, True)
    C = A.tolil()
    C[0, (A.indices[A.indptr[0]] + 1) % A.shape[1]] = 1.0  # one more nonzero: another structure
    assert prompt_card(C.tocsr()) != prompt_card(A)


def test_prompt_card_is_bounded_and_exact_when_offsets_are_few() -> None:
    n = 100_000
    offs = np.sort(np.random.default_rng(0).choice(np.arange(-40_000, 40_000), 60, replace=False))
    A = sp.diags([np.ones(n - abs(o)) for o in offs], offs, shape=(n, n), format="csr")
    text = prompt_card(A)
    assert "diagonals: 60," in text and "diagonal offsets" not in text  # 60 items > PROMPT_OFFSET_ITEMS
    few = offs[:PROMPT_OFFSET_ITEMS]
    A = sp.diags([np.ones(n - abs(o)) for o in few], few, shape=(n, n), format="csr")
    text = prompt_card(A)
    assert "diagonal offsets: " + " ".join(str(o) for o in few) in text and len(text) < 1000
    for fam in ("rmat", "powerlaw", "stencil3d_27", "block", "skewed"):
        assert len(prompt_card(generate(fam, 20_000, seed=1))) < 900, fam
    band = generate("banded", 2000, seed=0, bands=5)
    assert "diagonal offsets: -2..2" in prompt_card(band) and matrix_card(band).dia_offsets == (-2, -1, 0, 1, 2)


def test_the_same_card_in_sft_rollout_generate_and_search(tmp_path: Path) -> None:
    """Every path that builds a prompt gives the one card text, prompt_card(A)."""
    from sparserl.request.context import MatrixContext
    from sparserl.rl.rollout import matrix_items
    from sparserl.search.policy import PolicyProposer
    from sparserl.data.rows import SFTRow
    from sparserl.train.dataset import SFTDataset

    A = generate("skewed", 2000, seed=3)
    path = tmp_path / "m.npz"
    save_matrix(A, path)
    card = prompt_card(A)
    pol = RecordingPolicy()

    # SFT data: a row of the data build (its matrix file), and a best-known export row whose file is gone
    row = SFTRow(matrix=str(path), shape=A.shape, rows=[0], cols=[int(A.indices[0])], op="spmv", nnz=int(A.nnz),
                 code="FORMAT: CSR")
    assert SFTDataset([row], pol.config).sample(row).card == card
    exported = dataclasses.replace(row, matrix=str(tmp_path / "gone.npz"), card=matrix_card(A).to_dict())
    assert SFTDataset([exported], pol.config).sample(exported).card == card
    bare = dataclasses.replace(exported, card=None, matrix=str(tmp_path / "gone2.npz"))
    with pytest.raises(SparseRLError, match="card"):
        SFTDataset([bare], pol.config).sample(bare)  # sampled coordinates only: their card would be wrong
    assert SFTDataset([bare], ENC).sample(bare).card is None  # an encoding alone asks for no card

    # RL rollouts
    class Ev:
        def register(self, A, name):
            return name

    items = matrix_items([str(path)], Ev(), pol, ("spmv", "spmm"), 8)
    assert [it.sample().card for it in items] == [card, card]

    # generate and search: the proposer of the request's matrix, its samples and refinements
    from sparserl.harness.result import ErrorKind, EvalResult

    pp = PolicyProposer(pol, MatrixContext.load(path, Op.SPMV), name="m")
    pp.sample(1)
    assert pol.calls[-1][0].card == card
    pp.refine("FORMAT: CSR", EvalResult.failure("spmv", None, "m", ErrorKind.COMPILE, "x"), 1)
    assert f"Matrix card:\n{card}\n" in pol.calls[-1][0].prompt
    assert make_sample(A, RecordingPolicy(card=False).config, Op.SPMV).card is None


def test_the_prompt_names_a_uniform_row_length_only_when_every_row_has_it() -> None:
    """Kills a line written from the maximum alone (the empty-rows matrix, min 0 and max 16, would read as
    uniform and invite ``csr_lanes_spec`` with ``L = 16``), and a line that never appears."""
    rng = np.random.default_rng(0)
    cols = np.concatenate([rng.choice(400, 7, replace=False) for _ in range(500)])
    uniform = sp.csr_matrix((np.ones(500 * 7), cols, np.arange(0, 500 * 7 + 1, 7)), shape=(500, 400))
    assert "every row has 7 entries" in prompt_card(uniform)
    holes = uniform.tolil()
    holes[3, :] = 0  # one empty row: min 0, max 7
    assert "every row has" not in prompt_card(holes.tocsr())
    longer = uniform.tolil()
    longer[5, [c for c in range(400) if c not in set(cols[35:42])][:1]] = 1.0  # one row of 8
    assert "every row has" not in prompt_card(longer.tocsr())
    assert "every row has" not in prompt_card(generate("empty_rows", 20_000, seed=1))
