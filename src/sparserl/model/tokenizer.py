"""A byte-level BPE tokenizer trained on the CUDA corpus (the ``tokenizers`` library).

Saved as a Hugging Face fast tokenizer, so ``AutoTokenizer.from_pretrained(folder)`` loads
it like any other. ``<|endofkernel|>`` ends a completion (generation stops there).

Digits are split one by one before the byte-level split, so no token holds two digits: ``1024``
is ``1 0 2 4`` and ``1000000`` is seven tokens, in a kernel's literals and in the matrix card
alike. A number is then read and written digit by digit, the way the model has to choose it,
instead of as whichever chunks the merges happened to learn (`` 1|0000|00``).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

BOS, EOS, PAD = "<|bos|>", "<|endofkernel|>", "<|pad|>"
SPECIAL_TOKENS = [PAD, BOS, EOS]


def train_tokenizer(texts: Iterable[str], vocab_size: int = 8192, min_frequency: int = 2):
    """Train byte-level BPE on ``texts``; returns a ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                   clean_up_tokenization_spaces=False)


def encode_plain(tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of ``texts`` read as plain text, no BOS or EOS added: a special token's string inside a text (a
    corpus file that spells ``<|endofkernel|>``) is encoded as its characters, never as the special token."""
    return tokenizer(texts, add_special_tokens=False, split_special_tokens=True)["input_ids"]


def save_tokenizer(tokenizer, folder: str | Path) -> None:
    tokenizer.save_pretrained(str(folder))


def load_tokenizer(folder: str | Path):
    """Any HF tokenizer from a local folder; adds a pad token (= eos) when the model has none."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok
