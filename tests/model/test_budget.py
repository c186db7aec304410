"""The completion budget: every stage's default lets a sample finish every library kernel."""

from __future__ import annotations

import dataclasses
import logging

import pytest

pytest.importorskip("torch")


def test_the_automatic_budget_fits_every_library_kernel_in_the_policys_own_tokens(tiny_tokenizer) -> None:
    """Kills: a fixed default shorter than the longest library kernel (the 1536 that cut csr_adaptive
    short), a budget worked out in characters or another tokenizer's tokens, a budget without room
    for the end token."""
    from sparserl.kernels.library import variants
    from sparserl.model.budget import completion_budget, library_token_lengths

    lengths = library_token_lengths(tiny_tokenizer)
    assert len(lengths) == len(variants("spmv")) + len(variants("spmm", None, 32))
    longest_id = max(lengths, key=lengths.get)
    v = next(v for op in ("spmv", "spmm") for v in variants(op, None, 32 if op == "spmm" else None)
             if v.id == longest_id)
    independent = len(tiny_tokenizer(v.render(), add_special_tokens=False)["input_ids"])
    assert lengths[longest_id] == independent
    budget = completion_budget(tiny_tokenizer, None, lengths)
    assert budget > independent and budget % 128 == 0


def test_a_smaller_budget_given_on_purpose_is_kept_and_named(tiny_tokenizer, caplog) -> None:
    from sparserl.model.budget import completion_budget

    with caplog.at_level(logging.WARNING, logger="sparserl.model.budget"):
        assert completion_budget(tiny_tokenizer, 16) == 16
    assert "cuts" in caplog.text and "library kernel" in caplog.text


@pytest.mark.parametrize("config", ["sparserl.generate:GenerateConfig", "sparserl.search.run:SearchJob",
                                    "sparserl.train.config:SFTConfig", "sparserl.eval.compare:EvalConfig",
                                    "sparserl.rl.config:RLConfig", "sparserl.improve.config:ImproveConfig"])
def test_every_stage_defaults_to_the_automatic_budget(config: str) -> None:
    """Kills a stage that keeps a fixed number as its default (each stage passes its setting to
    Policy.generate, which resolves None to the automatic budget)."""
    import importlib

    module, name = config.split(":")
    cls = getattr(importlib.import_module(module), name)
    [field] = [f for f in dataclasses.fields(cls) if f.name == "max_new_tokens"]
    assert field.default is None


def test_policy_generate_resolves_none_to_the_budget(tiny_tokenizer, tiny_hf_config) -> None:
    from tests.rl.tiny import tiny_policy

    policy = tiny_policy(tiny_tokenizer, tiny_hf_config)
    from sparserl.model.budget import completion_budget, library_token_lengths

    assert policy.completion_budget(None) == completion_budget(tiny_tokenizer, None,
                                                               library_token_lengths(tiny_tokenizer))
    assert policy.completion_budget(7) == 7


def test_a_taught_completion_longer_than_the_library_sets_the_budget(tiny_tokenizer, caplog) -> None:
    """A policy fine-tuned on kernels longer than the library's longest (specialised kernels with tables)
    gets a budget that lets a sample finish them; one asked for below it is kept and the cut is named.
    Kills: ``taught`` ignored, the library's figure taken when it is the smaller, a warning that names only
    library kernels."""
    from sparserl.model.budget import completion_budget, library_token_lengths, longest_completion

    lengths = library_token_lengths(tiny_tokenizer)
    library = max(lengths.values())
    assert completion_budget(tiny_tokenizer, None, lengths, taught=library - 10) == completion_budget(
        tiny_tokenizer, None, lengths)
    budget = completion_budget(tiny_tokenizer, None, lengths, taught=library + 1000)
    assert budget > library + 1000 and budget % 128 == 0
    with caplog.at_level(logging.WARNING, logger="sparserl.model.budget"):
        assert completion_budget(tiny_tokenizer, library + 500, lengths, taught=library + 1000) == library + 500
    assert "fine-tuned on" in caplog.text and "library kernel" not in caplog.text
    n = len(tiny_tokenizer("a b c d e f", add_special_tokens=False)["input_ids"])
    short = len(tiny_tokenizer("a b", add_special_tokens=False)["input_ids"])
    assert longest_completion(tiny_tokenizer, ["a b", "a b c d e f", "a b"]) == (n, 0)
    assert longest_completion(tiny_tokenizer, ["a b", "a b c d e f", "a b"], limit=n - 1) == (short, 1)  # past the model
    assert longest_completion(tiny_tokenizer, []) == (0, 0)


def test_a_policy_names_a_cut_once_not_at_every_batch(tiny_tokenizer, tiny_hf_config, caplog) -> None:
    """A training loop asks for the same small budget at every step: the cut is named the first time only,
    and again for another number. Kills a warning repeated per call, and one never given."""
    from tests.rl.tiny import tiny_policy

    policy = tiny_policy(tiny_tokenizer, tiny_hf_config)
    with caplog.at_level(logging.WARNING, logger="sparserl.model.budget"):
        for _ in range(3):
            assert policy.completion_budget(7) == 7
        assert caplog.text.count("max_new_tokens 7 cuts") == 1
        assert policy.completion_budget(9) == 9
    assert caplog.text.count("max_new_tokens 9 cuts") == 1
