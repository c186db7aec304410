"""The header grammar: the automaton against every header the project writes and the malformed ones
policies wrote, the code's two rules after it (ASCII, digit runs), its lift to tokens, and sampling under it in
every CPU engine."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from sparserl.kernels.contract import Op  # noqa: E402
from sparserl.kernels.library import variants  # noqa: E402
from sparserl.model.header_grammar import DONE, MAX_DIGIT_RUN, START, HeaderGrammar, in_code, run  # noqa: E402
from sparserl.model.sampling import sample_with_logp  # noqa: E402

from tests.model.test_policy import ENC, samples  # noqa: E402

# Headers that policies wrote and the contract refused (held-out evaluations of the small preset)
MALFORMED = [
    "FORMAT: EC\nPARAMS: BLOCK=128, RPT=4\nLAUNCH: grid=ceil_div(m, BLOCK * RPT), block=BLOCK\n\n",
    "FORMAT: BSR R=2 N)\nPARAMS: BLOCK=128, RPT=1\nLAUNCH: grid=ceil_div(mb, BLOCK / G), block=BLOCK\n\n",
    "FORMAT: cooperative_ROW=8128\nLAUNCH: grid=1, block=1\n\n",
    "FORMAT: HYB=8\nPARAMS: grid=ceil_div(m, BLOCK), block=BLOCK\n",
    "FORMAT: CSR\nPARAMS: grid=ceil_div(m, 256), block=256, kernel=spmv_zero_y\nLAUNCH: grid=1, block=1\n\n",
    "FORMAT: CSR\nLAUNCH: grid=device__ void __launch_bounds__(BLOCK) spmv_kernel(\n",
    "FORMAT: CSR\nLAUNCH: grid=ceil_div(m, 256)\n\n",  # no block
    "FORMAT: CSR\n\nextern",  # no LAUNCH line
    "FORMAT: SELL C=32 sigma=\nLAUNCH: grid=1, block=1\n\n",  # a key without its value
    "FORMAT: CSR\nLAUNCH: grid=(m + 1, block=256\n\n",  # unbalanced
    "FORMAT: CSR\nLAUNCH: grid=m<<1, block=256\n\n",  # an operator the contract has not
    "FORMAT: CSR\nLAUNCH: grid=m**2, block=256\n\n",
    "FORMAT: CSR\nLAUNCH: grid=m & 3, block=256\n\n",
    "FORMAT: CSR\nLAUNCH: grid=m > 2 ? m : 2, block=256\n\n",
    "FORMAT: CSR\nLAUNCH: grid=foo(m), block=256\n\n",  # a function the contract has not
    "FORMAT: CSR\nLAUNCH: grid=ceil_div(m, 010), block=256\n\n",  # a leading zero
    "FORMAT: CSR\nPARAMS: A=007\nLAUNCH: grid=m, block=A\n\n",
    "FORMAT: CSR\nPARAMS: A=--1\nLAUNCH: grid=m, block=A\n\n",
    "FORMAT: CSR\nPARAMS: _A=1\nLAUNCH: grid=m, block=_A\n\n",  # reserved in C++
    # FORMAT values the contract refused: SELL's sigma neither 1 nor a multiple of C, a BSR block side of 4 digits
    "FORMAT: SELL C=128 sigma=1028\nLAUNCH: grid=ceil_div(num_slices * C, BLOCK), block=BLOCK\n\n",
    "FORMAT: SELL C=8 sigma=2\nLAUNCH: grid=1, block=1\n\n",
    "FORMAT: SELL C=32 sigma=1094\nLAUNCH: grid=1, block=1\n\n",
    "FORMAT: SELL C=32 sigma=710\nLAUNCH: grid=1, block=1\n\n",
    "FORMAT: SELL C=128 sigma=10201\nLAUNCH: grid=1, block=1\n\n",
    "FORMAT: SELL sigma=48\nLAUNCH: grid=1, block=1\n\n",  # C left out: 32, and 48 is not a multiple
    "FORMAT: SELL sigma=8\nLAUNCH: grid=1, block=1\n\n",  # a multiple of other C values, not of the default 32
    "FORMAT: SELL C=32 C=32\nLAUNCH: grid=1, block=1\n\n",  # a key twice
    "FORMAT: BSR R=8 C=1024\nLAUNCH: grid=1, block=1\n\n",
    "FORMAT: HYB width=-1\nLAUNCH: grid=1, block=1\n\n",
]

# Headers the contract's parser accepts, beyond the library's own spelling
ACCEPTED = [
    "FORMAT: SELL C=32, sigma=64\nLAUNCH: grid=ceil_div(m, 128), block=128\n\n",
    "FORMAT: COO zero_y=0\nPARAMS: B=-3, BLOCK=0\nLAUNCH: grid=1, block=256\n\n",
    "FORMAT: CSR\nLAUNCH: grid=min(max(nnz / 1024, 1), 4 * num_sms), block=-(-256), smem=0\n\n",
    "FORMAT: CSR\nLAUNCH: grid=(ceil_div(m, 4), 1), block=(32, 4), kernel=spmv_kernel\n\n",
    "FORMAT: CSR\nLAUNCH: grid=m // 2 + m % 3, block=256\nLAUNCH: grid=1, block=32, kernel=k2\n\n",
    "FORMAT: SELL sigma=64\nLAUNCH: grid=1, block=1\n\n",  # C left out: 32
    "FORMAT: SELL C=4\nLAUNCH: grid=1, block=1\n\n",  # sigma left out: 1
    "FORMAT: SELL C=2 sigma=1\nPARAMS: BLOCK=256\nLAUNCH: grid=ceil_div(num_slices * C, BLOCK), block=BLOCK\n\n",
    # (a policy's correct kernel on a 1M-row matrix: a C the library never uses)
    "FORMAT: BSR R=3 C=5\nLAUNCH: grid=1, block=1\n\n",
    "FORMAT: HYB width=65536\nLAUNCH: grid=1, block=1\n\n",
]


def _whole(text: str) -> bool:
    """The header reaches its end and the code keeps the code's rules to the text's end."""
    return run(START, text) == DONE and in_code(run(START, text, code=True))


def test_every_header_the_project_writes_is_in_the_grammar() -> None:
    """Every library variant (both ops) and every template point the search would render, on three
    structures, reaches the end of its header, and its code keeps the code's rules. Kills a grammar stricter
    than the contract's writers (a format parameter, a PARAMS list, a second LAUNCH line or an expression it
    refuses; a digit run or a character the project's own kernels write)."""
    for op, k in ((Op.SPMV, None), (Op.SPMM, 32)):
        for v in variants(op, None, k):
            assert _whole(v.render()), v.id
    from sparserl.kernels.templates import templates
    from sparserl.matrices import generate
    from sparserl.matrices.card import matrix_card

    rng = np.random.default_rng(0)
    seen = 0
    for family in ("banded", "powerlaw", "block"):
        card = matrix_card(generate(family, 5000, seed=1))
        for op, k in ((Op.SPMV, None), (Op.SPMM, 32)):
            for t in templates(op):
                points = [p for p in t.seeds(card, k) if p is not None]
                points += [t.random_point(rng, card, k) for _ in range(3)]
                for p in points:
                    if p is None or t.check(p, card, k):
                        continue
                    assert _whole(t.render(p, card)), (t.name, p)
                    seen += 1
    assert seen > 200


@pytest.mark.parametrize("text", MALFORMED)
def test_malformed_headers_leave_the_grammar(text: str) -> None:
    """Each header shape the contract refused is refused by the automaton at some character.
    Kills an automaton that accepts any format name, a FORMAT key the format does not have, a
    PARAMS value that is not an integer, unbalanced parentheses, a missing block or LAUNCH line."""
    assert run(START, text) is None, text


@pytest.mark.parametrize("text", ACCEPTED)
def test_headers_the_parser_accepts_are_in_the_grammar(text: str) -> None:
    """Spellings beyond the library's (commas between FORMAT parameters, negative PARAMS, calls,
    tuples, ``//``, two LAUNCH lines) end inside the grammar, and the contract's parser accepts each
    (so the list itself is right). Kills integer, operator and separator rules stricter than the parser's."""
    from sparserl.kernels.contract import split_completion

    split_completion(text + "extern \"C\" __global__ void spmv_kernel() {}\n", Op.SPMV)
    assert run(START, text) == DONE, text


def test_every_sell_pair_of_the_grammar_is_one_the_contract_accepts() -> None:
    """The grammar's SELL table lies inside the contract (each pair resolves), keeps sigma=1 for every C, and
    refuses every other pair of its C values and sigmas up to its bound that the contract refuses. Kills a table
    that lets an invalid sigma through (a rule of "any digits", or sigma a power of two whatever C)."""
    from sparserl.kernels.contract import FORMATS
    from sparserl.model.header_grammar import SELL_C, SELL_SIGMA_MAX, _sell_table

    table = {(dict(a)["C"], dict(a)["sigma"]) for a in _sell_table()}
    spec = FORMATS["SELL"]
    for c, sigma in table:
        spec.resolve_params({"C": c, "sigma": sigma})
        assert run(START, f"FORMAT: SELL C={c} sigma={sigma}\nLAUNCH: grid=1, block=1\n\n") == DONE
    assert {(c, 1) for c in SELL_C} <= table
    for c in SELL_C:
        for sigma in range(2, SELL_SIGMA_MAX + 1):
            if sigma % c:
                assert (c, sigma) not in table
                assert run(START, f"FORMAT: SELL C={c} sigma={sigma}\n") is None, (c, sigma)


def test_no_state_of_the_automaton_is_a_dead_end() -> None:
    """Every state reachable from the start, character by character, can go on with some character: the sampler
    is never led into a prefix that no header completes (the lift prunes such states, but then a value it drew
    forces the rest, as ``sigma=8`` would force 8192). Kills candidates that ignore a key's default (sigma
    written alone, C taken as any of the table's) and a repeated key refused only at its '='."""
    from sparserl.model.header_grammar import MAX_STATES, step

    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    seen, todo, dead = {START}, [START], []
    while todo:
        state = todo.pop()
        if state == DONE:
            continue
        nxt = [n for n in (step(state, ch) for ch in chars) if n is not None]
        if not nxt:
            dead.append(state)
        for n in nxt:
            if n not in seen:
                seen.add(n)
                todo.append(n)
        assert len(seen) < MAX_STATES, "the automaton is unbounded (a key repeated without end?)"
    assert not dead, dead[:5]
    assert len(seen) > 400  # the walk reached the LAUNCH expressions and the SELL table


def test_a_header_prefix_is_in_the_grammar_until_its_end() -> None:
    """Every prefix of a valid header is a live state (the sampler can always go on), and the first
    character after the header (not a LAUNCH line) ends it: the code is free from there."""
    text = variants(Op.SPMV, "CSR")[0].render()
    header_end = text.index("\n\n") + 1
    for i in range(header_end + 1):
        s = run(START, text[:i])
        assert s is not None and (s != DONE) == (i <= header_end), (i, text[:i])
    assert run(START, text[:header_end] + "@@ anything goes") == DONE


def _toy():
    """A toy vocabulary: whole header pieces, single characters, a dead end and an end token."""
    pieces = ["FORMAT: ", "CSR", "\n", "LAUNCH: ", "grid=", "m", ",", " ", "block=", "2", "5", "6", "x", "\n\nint",
              "FORMAT: X", "FORMAT: C", "S", "C"]
    return pieces, len(pieces) - 1  # the end token has text ("C") that a header could take


def test_tokens_are_allowed_only_where_the_header_continues() -> None:
    """The lift: at the start only tokens that begin a header (and never the end token) are allowed;
    following allowed tokens spells a header and reaches the end state, where every token of this ASCII
    vocabulary is allowed.
    Kills an allowed table that ignores the automaton, an end token allowed inside the header, and
    transitions that do not follow the drawn token."""
    pieces, eos = _toy()
    g = HeaderGrammar.build(pieces, eos_id=eos)
    allowed0 = {pieces[i] for i in range(len(pieces)) if g.allowed[g.start, i]}
    # "FORMAT: X" is no format; "FORMAT: C" is a dead end two tokens deep ("S" goes on, then nothing gives "R"):
    # pruned; the end
    # token's text would spell the format name after "FORMAT: ", yet it is allowed only after the header
    assert allowed0 == {"FORMAT: "}
    after_format = int(g.trans[g.start, pieces.index("FORMAT: ")])
    assert g.allowed[after_format, pieces.index("CSR")] and not g.allowed[after_format, eos]
    s = g.start
    for piece in ["FORMAT: ", "CSR", "\n", "LAUNCH: ", "grid=", "m", ",", " ", "block=", "2", "5", "6", "\n\nint"]:
        tid = pieces.index(piece)
        assert g.allowed[s, tid], (piece, s)
        assert not g.allowed[s, eos]
        s = int(g.trans[s, tid])
    assert s == g.done and bool(g.allowed[s].all())  # the end token too
    # "x" after "grid=" is an identifier: allowed; "," right after "grid=" (an empty expression) is not
    s = g.start
    for piece in ["FORMAT: ", "CSR", "\n", "LAUNCH: ", "grid="]:
        s = int(g.trans[s, pieces.index(piece)])
    assert g.allowed[s, pieces.index("x")] and not g.allowed[s, pieces.index(",")]


def test_sampling_under_the_constraint_draws_allowed_tokens_and_their_masked_logp() -> None:
    """``sample_with_logp`` with a constraint: uniform logits draw only allowed tokens, the states move
    by them, and the log-probability is the masked distribution's (log 1/allowed). Kills a mask not
    applied, a state not advanced, and a log-probability from the unmasked softmax."""
    pieces, eos = _toy()
    g = HeaderGrammar.build(pieces, eos_id=eos)
    c = g.constraint(64, "cpu")
    torch.manual_seed(0)
    for _ in range(12):
        before = c.state.clone()
        n_allowed = g.allowed[before].sum(-1).float()
        tok, lp = sample_with_logp(torch.zeros(64, len(pieces)), 1.0, constraint=c)
        assert bool(g.allowed[before, tok].all())
        assert torch.allclose(lp, -torch.log(n_allowed))
        assert torch.equal(c.state, g.trans[before, tok])
    assert bool((c.state != g.start).all())


def test_the_bucketed_rows_move_only_their_own_states() -> None:
    """With ``rows`` (the bucketed engine's running rows after a compaction) only those rows' states
    are read and moved. Kills an update that writes the running batch's states over rows 0..n-1."""
    pieces, eos = _toy()
    g = HeaderGrammar.build(pieces, eos_id=eos)
    c = g.constraint(4, "cpu")
    rows = torch.tensor([1, 3])
    sample_with_logp(torch.zeros(2, len(pieces)), 1.0, constraint=c, rows=rows)  # "FORMAT: " for both
    moved = int(g.trans[g.start, pieces.index("FORMAT: ")])
    assert c.state.tolist() == [g.start, moved, g.start, moved]


@pytest.mark.parametrize("engine", ["static", "bucketed", "hf"])
def test_a_random_model_writes_only_grammatical_headers_under_it(engine, tiny_tokenizer, tiny_hf_config) -> None:
    """A tiny random-weight policy sampled at temperature 1: without the grammar its completions leave
    the header grammar at once; with it every completion is a header prefix, or a whole header and
    code, in each CPU engine (static cache, bucketed, ``generate()``). Kills an engine that drops the
    constraint, or a constraint whose state does not follow the tokens drawn."""
    from sparserl.model.policy import Policy, PolicyConfig

    p = Policy.from_config(tiny_hf_config, tiny_tokenizer, PolicyConfig(encoding=ENC))
    batch = samples() * 4
    free = p.generate(batch, max_new_tokens=40, temperature=1.0, seed=3, engine=engine)
    assert sum(run(START, t) is None for t in free) >= len(free) - 1
    bound = p.generate(batch, max_new_tokens=120, temperature=1.0, seed=3, engine=engine, header_grammar=True)
    for text in bound:
        assert text.startswith("FORMAT: ") and run(START, text, code=True) is not None, text[:200]


def test_the_constraint_follows_rows_through_the_bucketed_compaction(tiny_tokenizer, tiny_hf_config,
                                                                     monkeypatch) -> None:
    """64 rows on the bucketed engine, the end token played by a token the header often draws (a
    space), so rows end inside their headers and the engine compacts the running batch: every
    row's text is still a header prefix. Kills a constraint indexed by the running batch's order
    instead of the global rows after a compaction."""
    from sparserl.model import bucketed
    from sparserl.model.decode import decode

    from tests.model.test_decode import _model, _prompts

    lm = _model(tiny_hf_config)
    embeds, mask = _prompts(tiny_hf_config.hidden_size, lengths=tuple(4 + i % 9 for i in range(64)))
    space = tiny_tokenizer.convert_tokens_to_ids("Ġ")
    c = HeaderGrammar.for_tokenizer(tiny_tokenizer).constraint(64, "cpu")
    torch.manual_seed(2)
    seen = []
    real = bucketed.BucketedDecode._compact

    def compact(self):
        real(self)
        seen.append(int(self.rows.numel()))

    monkeypatch.setattr(bucketed.BucketedDecode, "_compact", compact)
    ids = decode(lm, embeds, mask, 96, eos_id=space, pad_id=tiny_tokenizer.pad_token_id, temperature=1.0,
                 engine="bucketed", check_every=4, constraint=c)
    assert seen, "no compaction happened: the test did not exercise it"
    for row in ids.tolist():
        toks = row[:row.index(space)] if space in row else row
        text = tiny_tokenizer.decode([t for t in toks if t != tiny_tokenizer.pad_token_id])
        assert run(START, text) is not None, text[:200]


@pytest.mark.parametrize("temperature, top_k", [(0.0, 0), (1.0, 1), (0.7, 2)])
def test_the_mask_comes_before_argmax_and_top_k(temperature, top_k) -> None:
    """Logits that favour forbidden tokens: greedy decoding and top-k still draw allowed ones, with
    finite log-probabilities. Kills a mask skipped at temperature 0 and a mask applied after top-k
    (which would leave nothing to draw)."""
    pieces, eos = _toy()
    g = HeaderGrammar.build(pieces, eos_id=eos)
    c = g.constraint(8, "cpu")
    logits = torch.zeros(8, len(pieces))
    logits[:, [pieces.index("x"), pieces.index("FORMAT: X"), eos]] = 10.0  # none allowed at the start
    tok, lp = sample_with_logp(logits, temperature, top_k, constraint=c)
    assert bool(g.allowed[g.start, tok].all()) and bool(torch.isfinite(lp).all())


def test_constraints_on_two_devices_keep_their_own_tables() -> None:
    """A constraint made for one device keeps working after another is made for a second device.
    Kills a constraint that reads the grammar's shared tables once a later one moved them."""
    pieces, eos = _toy()
    g = HeaderGrammar.build(pieces, eos_id=eos)
    on_cpu = g.constraint(2, "cpu")
    on_meta = g.constraint(2, "meta")
    assert on_meta.allowed.device.type == "meta" and on_cpu.allowed.device.type == "cpu"
    tok, _ = sample_with_logp(torch.zeros(2, len(pieces)), 1.0, constraint=on_cpu)
    assert tok.tolist() == [pieces.index("FORMAT: ")] * 2


def test_a_padded_vocabulary_is_covered(tiny_tokenizer, tiny_hf_config) -> None:
    """A model whose logits are wider than its tokenizer (Qwen pads its vocabulary): the grammar is
    built for the logits' width, the extra ids are never drawn inside a header. Kills tables sized to
    the tokenizer (a shape error in every engine)."""
    import copy

    from sparserl.model.policy import Policy, PolicyConfig

    cfg = copy.deepcopy(tiny_hf_config)
    cfg.vocab_size = len(tiny_tokenizer) + 64
    p = Policy.from_config(cfg, tiny_tokenizer, PolicyConfig(encoding=ENC))
    for engine in ("static", "bucketed", "hf"):
        texts = p.generate(samples(), max_new_tokens=40, temperature=1.0, seed=4, engine=engine, header_grammar=True)
        assert all(t.startswith("FORMAT: ") and run(START, t) is not None for t in texts), (engine, texts)
    g = HeaderGrammar.for_tokenizer(tiny_tokenizer, cfg.vocab_size)
    header_rows = [k for k in range(g.states) if k not in g.code_rows]
    assert g.allowed.shape[1] == cfg.vocab_size and not g.allowed[header_rows, len(tiny_tokenizer):].any()
    assert g.allowed[list(g.code_rows), len(tiny_tokenizer):].all()  # free in the code, as before its rules


def test_an_engine_that_fails_after_drawing_leaves_the_next_one_a_fresh_start(tiny_tokenizer, tiny_hf_config,
                                                                              monkeypatch) -> None:
    """The bucketed engine drawing a token and then failing: the static engine it falls back to starts
    every row at the header's start. Kills the reset before a fallback (rows would begin mid-header)."""
    from sparserl.model import bucketed, decode as dec

    from tests.model.test_decode import _model, _prompts

    class Failing:
        def __init__(self, *args, constraint=None, **kw):
            constraint.advance(torch.full_like(constraint.state, tiny_tokenizer.convert_tokens_to_ids("F")))
            raise RuntimeError("a shape this engine cannot take")

    monkeypatch.setattr(bucketed, "BucketedDecode", Failing)
    lm = _model(tiny_hf_config)
    embeds, mask = _prompts(tiny_hf_config.hidden_size)
    c = HeaderGrammar.for_tokenizer(tiny_tokenizer).constraint(3, "cpu")
    ids = dec.decode(lm, embeds, mask, 30, eos_id=tiny_tokenizer.eos_token_id, pad_id=tiny_tokenizer.pad_token_id,
                     temperature=1.0, engine="bucketed", constraint=c)
    for text in tiny_tokenizer.batch_decode(ids, skip_special_tokens=True):
        assert text.startswith("FORMAT: ") and run(START, text) is not None, text[:80]


def test_the_code_after_the_header_is_ascii_with_bounded_digit_runs() -> None:
    """After the header: a run of :data:`MAX_DIGIT_RUN` digits is allowed and one more is not (a DIA offsets block
    a policy wrote held a number of 180 digits), anywhere in the code, the first character included; a character
    that is not ASCII (U+FFFD, a byte fragment's decoding, as policies wrote one) or a control character other than
    whitespace ends the completion; the header-only walk is unchanged. Kills the rules unapplied, a run counted across a non-digit, and the first
    character of the code left unchecked."""
    header = "FORMAT: CSR\nLAUNCH: grid=1, block=1\n"
    ok = "9" * MAX_DIGIT_RUN
    assert run(START, header + f"int a = {ok};", code=True) == DONE
    assert run(START, header + f"int a = {ok}", code=True) == ("code", MAX_DIGIT_RUN)
    assert run(START, header + f"int a = {ok}9;", code=True) is None
    assert run(START, header + f"int a[] = {{{ok}, {ok}}};", code=True) == DONE  # two runs, not one of 40
    assert run(START, header + ok + "9", code=True) is None  # the code's first character is counted
    assert run(START, header + "const bool aligned = (m >= m)\ufffd C;", code=True) is None
    assert run(START, header + "// a comment \u2014 not ASCII", code=True) is None
    assert run(START, header + "int a;\x7f", code=True) is None and run(START, header + "\x01", code=True) is None
    assert run(START, header + "int a;\t\f\v\r\n", code=True) == DONE  # whitespace, as the static check allows
    assert run(START, header + f"int a = {ok}9;") == DONE  # the header's own walk stops at its end,
    assert run(START, header + "\u00e9") == DONE  # whatever the code's first character


def test_the_lift_of_the_code_agrees_with_the_automaton(tiny_tokenizer) -> None:
    """In every code state, each token's allowed bit and next state are those of the character automaton walked
    over its text (the lift computes them from each token's digit runs instead of walking it). Kills a run that
    does not carry across tokens, a token's inner run ignored, and a non-ASCII token allowed."""
    from sparserl.model.header_grammar import step

    texts = [tiny_tokenizer.decode([t]) for t in range(len(tiny_tokenizer))]
    texts += ["9" * 12, "1a" + "2" * 21 + "b", "x\ufffd", "12", "\u00e9", "7;", "", "\x7f", "a\t"]  # runs, others
    texts += [None]  # a special token (no text): free in the code, as before the rules; here the end token
    eos = len(texts) - 1
    g = HeaderGrammar.build(texts, eos_id=eos)
    assert len(g.code_rows) == MAX_DIGIT_RUN + 1 and g.code_rows[0] == g.done
    header_rows = [k for k in range(g.states) if k not in g.code_rows]
    assert g.allowed[list(g.code_rows), eos].all() and not g.allowed[header_rows, eos].any()
    refused = 0
    for run_, row in enumerate(g.code_rows):
        state = DONE if run_ == 0 else ("code", run_)
        for tid, text in enumerate(texts[:eos]):
            want: object = state
            for ch in text:
                want = step(want, ch)
                if want is None:
                    break
            assert bool(g.allowed[row, tid]) == (want is not None), (state, text)
            if want is not None:
                assert int(g.trans[row, tid]) == g.code_rows[0 if want == DONE else want[1]], (state, text)
            refused += want is None
    assert refused > 3 * (MAX_DIGIT_RUN + 1)  # the fragment, the letter and the 21-digit run, in every state


def test_a_token_that_ends_the_header_is_held_to_the_codes_rules() -> None:
    """A token that closes the header and begins the code (``"\\n\\n1"``) leads to the code's state after its
    digit, and one whose code part is not ASCII is refused. Kills the lift's walk stopping at the header's end
    (the rest of such a token unchecked)."""
    pieces = ["FORMAT: CSR\nLAUNCH: grid=1, block=1\n", "\n1", "\n\u00e9", "9" * MAX_DIGIT_RUN, "\n", "x"]
    g = HeaderGrammar.build(pieces)
    s = int(g.trans[g.start, 0])
    assert g.allowed[g.start, 0] and g.allowed[s, 1] and not g.allowed[s, 2]
    assert int(g.trans[s, 1]) == g.code_rows[1]
    assert not g.allowed[g.code_rows[1], 3] and g.allowed[g.code_rows[0], 3]  # 1 + 20 digits, then 20 alone
