"""What every command shares: defaults read from the stage's config, the no-GPU fallback, lists
given as comma-separated text.

Rules every command follows:

* An option's default is its stage's config dataclass's (:func:`defaults`), so the command line
  and the library agree on every default.
* On a machine without a GPU a command that would verify kernels falls back to compile-only and
  prints a ``note:`` line saying so (:func:`fallback`).
* A command that writes a run folder refuses one that holds an earlier run unless ``--force``
  (or ``--resume``, where the stage can continue) is given (:mod:`sparserl.runs`).
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import typer

from sparserl.devices import compile_only_or_fallback
from sparserl.errors import SparseRLError


HEADER_GRAMMAR_HELP = ("sample each kernel's header (FORMAT, PARAMS, LAUNCH lines) within the contract's grammar; "
                       "the code as before but in printable ASCII and whitespace, with no run of more than 20 digits")
"""``--header-grammar``'s help, in every command that samples a policy."""
FILL_FACTS_HELP = ("write the matrix card's facts (the row lengths and long rows csr_adaptive_spec spells) into a sample that "
                   "is a specialised template's kernel wrong only in that block; the harness judges it like any other, and the "
                   "report marks it (--no-fill-facts: the samples as the policy wrote them)")
"""``--fill-facts``'s help, in ``generate`` and ``search``."""
RETIME_HELP = ("a second look before the kernel is handed back: the fastest distinct correct candidates (up to 3, "
               "within 5% of the fastest) evaluated again on fresh inputs this many times each; the lowest median is "
               "handed back and reported; one that fails is dropped and, when all do, the next fastest are tried "
               "(generate: then the library's kernels) (0: the fastest first timing, as measured)")
"""``--retime``'s help, in ``generate`` and ``search``."""


def defaults(config: type) -> SimpleNamespace:
    """The field defaults of a config dataclass, by name (``defaults(SFTConfig).steps``); a field
    without a default is left out."""
    out = {}
    for f in dataclasses.fields(config):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return SimpleNamespace(**out)


def fallback(compile_only: bool) -> bool:
    """compile-only as asked, or forced by a machine without a GPU (with a note)."""
    compile_only, note = compile_only_or_fallback(compile_only)
    if note:
        typer.echo(f"note: {note}", err=True)
    return compile_only


def names(text: str) -> tuple[str, ...]:
    """A comma-separated list of names (empty entries dropped)."""
    return tuple(filter(None, (s.strip() for s in text.split(","))))


def integers(text: str, flag: str) -> tuple[int, ...]:
    """A comma-separated list of integers; a one-line error naming ``flag`` otherwise."""
    try:
        return tuple(int(s) for s in names(text))
    except ValueError:
        raise SparseRLError(f"{flag} must be comma-separated integers, got {text!r}") from None
