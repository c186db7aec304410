"""The BPE tokenizer splits digits one by one, in kernels and in the matrix card, and keeps doing
so after a save and a load."""

from __future__ import annotations

import pytest

pytest.importorskip("tokenizers")

from sparserl.model.tokenizer import load_tokenizer, save_tokenizer, train_tokenizer  # noqa: E402

# numbers repeated often enough that a plain byte-level BPE learns them as single tokens
TEXTS = ["dim3 block(1024); int rows = 16384; int nnz = 1000000; y[1024] = x[16384] * 1000000;\n"] * 200


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(TEXTS, vocab_size=400)


@pytest.mark.parametrize("text,digits", [(" 1024", "1024"), (" 16384", "16384"), ("1000000", "1000000")])
def test_numbers_are_tokenised_digit_by_digit(tok, text: str, digits: str) -> None:
    """Kills: the Digits pre-tokenizer removed (the merges learnt ' 1024' from TEXTS, checked below)."""
    pieces = tok.convert_ids_to_tokens(tok(text, add_special_tokens=False)["input_ids"])
    assert [p for p in pieces if any(c.isdigit() for c in p)] == list(digits)
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text


def test_without_the_digit_split_the_same_texts_merge_numbers() -> None:
    """The control: a byte-level BPE trained on TEXTS without the split merges ' 1024' into fewer
    tokens, so the test above is not passing by accident of a small vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    plain = Tokenizer(models.BPE())
    plain.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    plain.train_from_iterator(TEXTS, trainers.BpeTrainer(vocab_size=400, show_progress=False,
                                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    assert len(plain.encode(" 1024").tokens) < 4 and len(plain.encode("1000000").tokens) < 7


def test_saved_tokenizer_round_trips(tok, tmp_path) -> None:
    save_tokenizer(tok, tmp_path / "t")
    back = load_tokenizer(tmp_path / "t")
    sample = "FORMAT: ELL width=32\nLAUNCH: grid=ceil_div(m, 256), block=256\nrows 16384, nnz 1000000\n"
    assert back(sample)["input_ids"] == tok(sample)["input_ids"]
    assert back.decode(back(sample, add_special_tokens=False)["input_ids"]) == sample
    assert back.convert_ids_to_tokens(back(" 16384", add_special_tokens=False)["input_ids"])[-5:] == list("16384")
    assert (back.eos_token, back.pad_token, back.bos_token) == (tok.eos_token, tok.pad_token, tok.bos_token)
