"""Batched sampling on a static KV cache, one CUDA graph per decode step.

``transformers``' ``generate()`` launches every small kernel of every layer from Python for
each new token. For the default 29M model that is the whole cost: on an H200 a decode step
of a batch of 32 took about 14 ms, while its arithmetic takes well under one. Here the
prompt is run once (eagerly), then one decode step -- the model's forward on a
:class:`transformers.StaticCache`, temperature/top-k/top-p sampling and the bookkeeping of
finished rows, all on the GPU with no host synchronisation -- is captured as a CUDA graph
and replayed for each token. The host looks at the "all finished" flag every
``check_every`` tokens only.

Engines (``engine=``, or the ``SPARSERL_DECODE`` environment variable):

* ``bucketed``: :mod:`sparserl.model.bucketed` -- the decoder's layers run step by step over
  only the cache positions in use (length buckets, one CUDA graph per bucket), grouped-query
  attention without key copies, and finished rows dropped from the batch (Qwen3/Qwen2/Llama
  decoders; graphs on CUDA, eager elsewhere);
* ``graph``: the above (CUDA only; falls back to ``static`` if capture fails);
* ``static``: the same loop run eagerly (CPU, or a model that cannot be captured);
* ``hf``: ``model.generate()`` (the reference the other two are tested against);
* ``auto`` (default): ``bucketed`` for the decoders it supports, else ``graph`` on CUDA,
  ``static`` elsewhere, and ``hf`` for a model this module cannot drive (attention other than
  SDPA, or sliding-window layers).

Sampling is the Gumbel-max trick on the filtered logits (equivalent to drawing from the
softmax), so it needs nothing but ``torch.rand`` and stays capturable. Output: the new
token ids, ``(B, T)``, each row padded with ``pad_id`` after its end-of-sequence token.
"""

from __future__ import annotations

import contextlib
import logging
import os

import torch

from sparserl.errors import SparseRLError
from sparserl.model import bucketed
from sparserl.model.hf_parts import base_model, text_config
from sparserl.model.sampling import sample_with_logp

log = logging.getLogger(__name__)

ENGINES = ("auto", "bucketed", "graph", "static", "hf")
_GRAPH_BROKEN: set[str] = set()  # model classes whose capture failed once: do not retry
_STATIC_BROKEN: set[str] = set()  # model classes whose forward refused the static-cache inputs
_BUCKETED_BROKEN: set[str] = set()  # model classes whose modules refused the bucketed engine's calls
LAST_ENGINE: dict[str, str] = {}  # the engine the last decode() ran ("engine"), for tests and logs


def _model_name(lm) -> str:
    """The underlying model's class, for the sets above."""
    return type(base_model(lm)).__name__


def static_supported(lm) -> bool:
    """Whether ``lm`` is a model this module can drive: SDPA attention, full attention in every layer."""
    cfg = text_config(lm)
    if getattr(cfg, "_attn_implementation", None) != "sdpa":
        return False
    types = getattr(cfg, "layer_types", None)
    return not types or all(t == "full_attention" for t in types)


def pick_engine(lm, device: torch.device, engine: str | None = None) -> str:
    """The engine that will run: ``engine`` (or ``$SPARSERL_DECODE``, default ``auto``), downgraded
    where it cannot work (no CUDA for ``graph``; a model this module cannot drive: ``hf``)."""
    engine = engine or os.environ.get("SPARSERL_DECODE", "auto")
    if engine not in ENGINES:
        raise SparseRLError(f"decode engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if engine == "hf":
        return engine
    name = _model_name(lm)
    if engine in ("auto", "bucketed") and bucketed.supports(lm) and name not in _BUCKETED_BROKEN:
        return "bucketed"
    if engine == "bucketed":
        log.warning("the bucketed decode engine cannot drive %s; using the next engine that can", name)
        engine = "auto"
    return _cache_engine(lm, device, engine)


def _cache_engine(lm, device: torch.device, engine: str) -> str:
    """Among the static-cache engines (``graph``, ``static``) and ``hf``: the one ``engine`` asks for,
    downgraded where it cannot work; ``auto`` is ``graph`` on CUDA, ``static`` elsewhere."""
    name = _model_name(lm)
    if not static_supported(lm) or name in _STATIC_BROKEN:
        if engine != "auto":  # a boolean mask would be added, not applied, by eager attention
            log.warning("decode engine %r cannot drive %s (attention %r or sliding-window layers); using generate()",
                        engine, name, getattr(text_config(lm), "_attn_implementation", None))
        return "hf"
    if engine == "auto":
        return "graph" if device.type == "cuda" and name not in _GRAPH_BROKEN else "static"
    if engine == "graph" and device.type != "cuda":
        return "static"
    return engine


@torch.no_grad()
def decode(lm, embeds: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int, eos_id: int, pad_id: int,
           temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, engine: str | None = None,
           check_every: int = 32, return_logp: bool = False, constraint=None):
    """Sample up to ``max_new_tokens`` tokens after left-padded prompts.

    embeds: (B, P, d) prompt embeddings; attention_mask: (B, P), 1 on real prompt positions
    (left padding). Returns (B, T) new token ids, T <= max_new_tokens, ``pad_id`` after each
    row's first ``eos_id``; with ``return_logp`` also (B, T) float32 log-probabilities of those
    tokens under the distribution each was drawn from (see :func:`sample_with_logp`), 0 after
    each row's end. ``constraint``: a :class:`sparserl.model.header_grammar.HeaderConstraint` (one
    state per row) that every engine applies to every drawn token.
    """
    if max_new_tokens < 1:
        raise SparseRLError("max_new_tokens must be >= 1")
    if constraint is not None:
        constraint.reset()  # every row at the header's start, also after an engine that failed having drawn
    engine = pick_engine(lm, embeds.device, engine)
    if engine == "hf":
        LAST_ENGINE["engine"] = "hf"
        return _hf_generate(lm, embeds, attention_mask, max_new_tokens, eos_id, pad_id, temperature, top_k, top_p,
                            return_logp, constraint)
    # No autocast: under it the rotary embedding leaves keys in float32 and values in bf16, and a
    # static cache holds one dtype. The weights' own dtype rules (bf16 for large models), so a
    # float32 policy samples in float32 here while generate() would follow the autocast.
    on_device = torch.cuda.device(embeds.device) if embeds.device.type == "cuda" else contextlib.nullcontext()
    with on_device, torch.autocast(embeds.device.type, enabled=False):
        if engine == "bucketed":
            try:
                run = bucketed.BucketedDecode(lm, embeds, attention_mask, max_new_tokens, eos_id, pad_id,
                                              (temperature, top_k, top_p), constraint=constraint)
            except torch.OutOfMemoryError:
                raise
            except (TypeError, ValueError, AttributeError, RuntimeError) as exc:  # modules that take other inputs
                if not isinstance(exc, RuntimeError):  # a shape or CUDA error may pass; a wrong signature will not
                    _BUCKETED_BROKEN.add(_model_name(lm))
                log.warning("the bucketed decode engine does not fit %s (%s: %s); using the next engine",
                            _model_name(lm), type(exc).__name__, exc)
                return decode(lm, embeds, attention_mask, max_new_tokens, eos_id, pad_id, temperature, top_k, top_p,
                              _cache_engine(lm, embeds.device, "auto"), check_every, return_logp, constraint)
            LAST_ENGINE["engine"] = "bucketed"
            ids, logp = run.run(graph=embeds.device.type == "cuda", check_every=check_every)
            return (ids, logp) if return_logp else ids
        try:
            state = _StaticDecode(lm, embeds, attention_mask, max_new_tokens, eos_id, pad_id, temperature, top_k,
                                  top_p, constraint)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:  # a forward that takes other inputs
            _STATIC_BROKEN.add(_model_name(lm))
            log.warning("static-cache decoding does not fit %s (%s: %s); using generate() from now on",
                        _model_name(lm), type(exc).__name__, exc)
            state = None
        if state is not None:
            LAST_ENGINE["engine"] = engine
            ids, logp = state.run(graph=engine == "graph", check_every=check_every)
            return (ids, logp) if return_logp else ids
    return decode(lm, embeds, attention_mask, max_new_tokens, eos_id, pad_id, temperature, top_k, top_p, "hf",
                  return_logp=return_logp, constraint=constraint)


def _hf_generate(lm, embeds, attention_mask, max_new_tokens, eos_id, pad_id, temperature, top_k, top_p,
                 return_logp: bool, constraint=None):
    """``model.generate()``; with ``return_logp`` the log-probabilities come from its processed
    scores (the logits after the constraint, temperature, top-k and top-p), the distribution it drew from."""
    do_sample = temperature > 0
    extra = {}
    if constraint is not None:
        from transformers import LogitsProcessorList

        extra["logits_processor"] = LogitsProcessorList([constraint.logits_processor()])
    out = lm.generate(
        inputs_embeds=embeds, attention_mask=attention_mask, max_new_tokens=max_new_tokens, do_sample=do_sample,
        temperature=temperature if do_sample else None, top_k=top_k if do_sample and top_k else None,
        top_p=top_p if do_sample and top_p < 1.0 else None, eos_token_id=eos_id, pad_token_id=pad_id,
        use_cache=True, output_scores=return_logp, return_dict_in_generate=return_logp, **extra)
    if not return_logp:
        return out
    ids = out.sequences
    scores = torch.stack(out.scores, dim=1).float()[:, :ids.shape[1]]  # (B, T, V)
    logp = torch.log_softmax(scores, dim=-1).gather(-1, ids[..., None]).squeeze(-1)
    is_eos = ids == eos_id
    after = (is_eos.long().cumsum(1) - is_eos.long()) > 0  # strictly after the first EOS
    return ids, logp.masked_fill(after, 0.0)


def _cache_kwarg(lm) -> str:
    """The forward's name for the cache argument: ``cache`` in newer transformers 5.x, else ``past_key_values``."""
    import inspect

    return "cache" if "cache" in inspect.signature(base_model(lm).forward).parameters else "past_key_values"


class _StaticDecode:
    """State of one batched decode: static buffers that a captured step reads and updates in place."""

    def __init__(self, lm, embeds, attention_mask, max_new_tokens, eos_id, pad_id, temperature, top_k, top_p,
                 constraint=None):
        from transformers import StaticCache

        self.lm, self.eos, self.pad = lm, eos_id, pad_id
        self.cache_kw = _cache_kwarg(lm)
        self.sampling = (temperature, top_k, top_p, constraint)
        self.n = max_new_tokens
        dev = embeds.device
        B, P, _ = embeds.shape
        L = P + max_new_tokens
        self.cache = StaticCache(config=text_config(lm), max_cache_len=L)
        key_ok = torch.zeros(B, L, dtype=torch.bool, device=dev)
        key_ok[:, :P] = attention_mask.bool()
        # Prompt mask (B, 1, P, L): causal and not padding; every position sees itself, so a
        # padding row attends to something and stays finite (its keys are masked for others).
        i = torch.arange(P, device=dev)
        m = (torch.arange(L, device=dev)[None, :] <= i[:, None])[None] & key_ok[:, None, :]
        m[:, i, i] = True
        pos = (attention_mask.long().cumsum(1) - 1).clamp(min=0)
        out = self._forward(inputs_embeds=embeds, mask=m[:, None], position_ids=pos, logits_to_keep=1)
        first, first_logp = sample_with_logp(out.logits[:, -1], *self.sampling)
        # static buffers of the decode step
        self.ids = torch.full((B, max_new_tokens), pad_id, dtype=torch.long, device=dev)
        self.ids[:, 0] = first
        self.logp = torch.zeros((B, max_new_tokens), dtype=torch.float32, device=dev)
        self.logp[:, 0] = first_logp
        self.finished = first == eos_id
        self.cur = first[:, None].clone()
        self.pos = pos[:, -1:] + 1
        self.mask = key_ok[:, None, None, :].clone()
        self.col = torch.tensor([P], dtype=torch.long, device=dev)
        self.t = torch.tensor([1], dtype=torch.long, device=dev)

    def _forward(self, mask, **kw):
        # a dict of prepared masks is taken as is by transformers 5's decoder models
        return self.lm(attention_mask={"full_attention": mask}, use_cache=True, **{self.cache_kw: self.cache}, **kw)

    def step(self) -> None:
        """Feed the last token, sample the next; reads and writes only the static buffers."""
        self.mask.index_fill_(3, self.col, True)
        logits = self._forward(input_ids=self.cur, mask=self.mask, position_ids=self.pos).logits[:, -1]
        nxt, lp = sample_with_logp(logits, *self.sampling)
        nxt = torch.where(self.finished, torch.full_like(nxt, self.pad), nxt)
        lp = torch.where(self.finished, torch.zeros_like(lp), lp)
        self.ids.index_copy_(1, self.t, nxt[:, None])
        self.logp.index_copy_(1, self.t, lp[:, None])
        self.finished.logical_or_(nxt == self.eos)
        self.cur.copy_(nxt[:, None])
        self.pos.add_(1)
        self.col.add_(1)
        self.t.add_(1)

    def run(self, graph: bool, check_every: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids, log-probs), both (B, T), T the longest row's length."""
        done, todo = 1, self.n - 1
        replay = None
        if graph and todo > 4:
            replay, done = self._capture(done)
        while done < self.n:
            if done % check_every == 0 and bool(self.finished.all()):
                break
            if replay is not None:
                replay()
            else:
                self.step()
            done += 1
        return bucketed.trim_to_longest(self.ids, self.logp, self.eos, done)

    def _capture(self, done: int):
        """Warm up (real steps) on a side stream, then capture one step; None if capture fails."""
        name = _model_name(self.lm)
        side = torch.cuda.Stream(device=self.ids.device)
        side.wait_stream(torch.cuda.current_stream(self.ids.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self.step()
                done += 1
        torch.cuda.current_stream(self.ids.device).wait_stream(side)
        try:
            g = bucketed.capture(self.step, side)  # captured on this GPU's stream, not a default one
        except Exception as exc:  # noqa: BLE001 - any capture failure means "run eagerly"
            _GRAPH_BROKEN.add(name)
            log.warning("CUDA graph capture of %s failed (%s: %s); decoding eagerly", name, type(exc).__name__, exc)
            torch.cuda.synchronize(self.ids.device)
            return None, done
        return g.replay, done
