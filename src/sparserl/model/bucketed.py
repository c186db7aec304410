"""Batched decoding that reads only the part of the KV cache in use and drops finished rows.

The ``graph`` engine of :mod:`sparserl.model.decode` runs the model's own forward on a
``transformers.StaticCache``: every decode step attends over the cache's whole allocated length
(prompt + ``max_new_tokens``), and ``transformers``' SDPA path copies the keys and values of
every layer once per query-head group (``repeat_kv``) because a mask is given. At batch 256
that traffic, not the arithmetic, was the step (10 ms a step for the 29M default model on an
H200). This engine runs the same decoder layers through their own modules (norms, projections
with any LoRA adapters on them, rotary embedding, MLP), with three changes to the attention:

* **Length buckets.** The step that writes new token ``t`` (prompt length ``P``) attends over the
  first ``ceil((P + t) / bucket) * bucket`` cache positions only; one CUDA graph is captured per (batch, bucket) and replayed.
* **No key copies for grouped-query attention.** The ``g`` query heads that share a key head are
  laid out as ``g`` query rows of that key head, so scaled-dot-product attention reads each key
  and value once.
* **Finished rows leave the batch.** At each host check (every ``check_every`` tokens) the rows
  still running are counted; once at most half of the batch is left, the running rows' cache and
  state are gathered into a smaller batch (graphs are re-captured for it), so the tail of long
  completions is not paid for by the rows that ended early.
* **Triton on a GPU** (``SPARSERL_DECODE_ATTENTION=auto``, the default there): split-key attention
  (:mod:`sparserl.model.decode_attention`) and a fused step (:mod:`sparserl.model.decode_fused`:
  residual sum and RMS norm, q/k norms with the rotary embedding and the cache writes, the SiLU
  gate), about 130 kernels a step instead of 335 for the default model.

Models: decoder-only models of the Llama family whose layers are ``input_layernorm ->
self_attn (q/k/v/o_proj, optional q_norm/k_norm) -> post_attention_layernorm -> mlp`` with full
attention in every layer (Qwen3, Qwen2, Llama). :func:`supports` says whether a model qualifies;
others keep the ``graph``/``static``/``hf`` engines. Sampling is :func:`sampling.sample_with_logp`,
the rule every engine shares.
"""

from __future__ import annotations

import logging
import os

import torch
import torch.nn.functional as F

from sparserl.errors import SparseRLError
from sparserl.model import decode_attention as da
from sparserl.model import decode_fused as fu
from sparserl.model.hf_parts import RMS_NORMS, base_model, text_config
from sparserl.model.sampling import sample_with_logp

log = logging.getLogger(__name__)

FAMILIES = ("qwen3", "qwen2", "llama")
BUCKET = 128  # cache positions per length bucket
MIN_COMPACT_BATCH = 8  # below this a smaller batch saves nothing worth a re-capture
# attention of a decode step ($SPARSERL_DECODE_ATTENTION): "auto" (the default: "triton" on a GPU
# where Triton is installed and the model's shape suits its kernels, else "sdpa"), "triton" (split-key
# kernels with float32 scores, model/decode_attention.py, and the fused step of model/decode_fused.py:
# 127-140k tokens/s for the default model at batch 256 on an H200, against 73-75k with sdpa,
# docs/results.md, 'How fast is decoding?'), "sdpa" (torch's fused kernel) or "matmul" (two batched
# products; in bf16 it rounds the raw scores to bf16, and the sampler's log-probabilities then drift
# from the learner's)
ATTENTION = os.environ.get("SPARSERL_DECODE_ATTENTION", "auto")
GATE_UP_MAX_BYTES = 1 << 30  # the fused step's copies of the gate and up weights, at most (Qwen3-8B's: 6.75 GiB)
CAPTURE_BROKEN: set[str] = set()  # model classes whose step failed to capture once: eager from then on


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x`` (B, H, T, D) with cos/sin (B, T, D)."""
    return x * cos[:, None] + _rotate_half(x) * sin[:, None]


_TABLE_ROPE = ("default", "linear", "llama3")  # rotary types whose angles depend on the position alone


def _norm(module, x: torch.Tensor) -> torch.Tensor:
    """``module(x)``; the RMS norms of the supported families in three kernels instead of six (the same
    arithmetic: float32 normalisation, cast back, times the weight)."""
    if type(module).__name__ in RMS_NORMS:
        return module.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=module.variance_epsilon).to(x.dtype)
    return module(x)


class DecoderView:
    """The pieces of a supported decoder that a step calls, found once per decode.

    Two per-decode preparations cut kernels from every step: the three input projections of a layer
    become one matrix product where they are plain linear layers (LoRA-wrapped ones stay separate,
    so their adapters apply), and the rotary angles are a table indexed by position where the
    rotary type allows it."""

    def __init__(self, base):
        body = base.model
        self.embed = body.embed_tokens
        self.layers = list(body.layers)
        self.norm = body.norm
        self.rotary = body.rotary_emb
        self.head = base.lm_head
        a = self.layers[0].self_attn
        cfg = text_config(base)
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads or cfg.num_attention_heads
        self.group = self.n_heads // self.n_kv  # query heads per key head
        self.head_dim = a.head_dim
        self.scaling = a.scaling
        self.fused: list[tuple[torch.Tensor, torch.Tensor | None] | None] = [self._fuse(la.self_attn)
                                                                               for la in self.layers]
        self.table: tuple[torch.Tensor, torch.Tensor] | None = None
        self.gate_up: list[torch.Tensor | None] | None = None  # built by fuse_mlp (the fused Triton step)

    def fuse_mlp(self) -> None:
        """One weight for each layer's gate and up projections where both are plain, bias-free
        ``nn.Linear`` layers and the copies stay under GATE_UP_MAX_BYTES in all (else None: the
        two projections run apart)."""
        if self.gate_up is not None:
            return
        plain = [all(type(m) is torch.nn.Linear and m.bias is None for m in (la.mlp.gate_proj, la.mlp.up_proj))
                 for la in self.layers]
        size = sum(la.mlp.gate_proj.weight.nbytes * 2 for la, p in zip(self.layers, plain) if p)
        self.gate_up = [torch.cat([la.mlp.gate_proj.weight, la.mlp.up_proj.weight]) if p and size <= GATE_UP_MAX_BYTES
                        else None for la, p in zip(self.layers, plain)]

    def project(self, li: int, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values of layer ``li`` for h (..., d), unrotated: (..., heads * D) each."""
        a = self.layers[li].self_attn
        if self.fused[li] is not None:
            D = self.head_dim
            return F.linear(h, *self.fused[li]).split([self.n_heads * D, self.n_kv * D, self.n_kv * D], dim=-1)
        return a.q_proj(h), a.k_proj(h), a.v_proj(h)

    def mlp_fused(self, li: int, h: torch.Tensor) -> torch.Tensor:
        """Layer ``li``'s gated MLP on rows h (B, d) with the Triton activation."""
        mlp = self.layers[li].mlp
        if self.gate_up is not None and self.gate_up[li] is not None:
            g, u = F.linear(h, self.gate_up[li]).chunk(2, dim=-1)
        else:
            g, u = mlp.gate_proj(h), mlp.up_proj(h)
        return mlp.down_proj(fu.silu_mul(g, u))

    @staticmethod
    def _fuse(attn):
        """One weight (and bias) for q, k and v when all three are plain ``nn.Linear``; else None."""
        mods = (attn.q_proj, attn.k_proj, attn.v_proj)
        if not all(type(m) is torch.nn.Linear for m in mods):
            return None
        w = torch.cat([m.weight for m in mods])
        biases = [m.bias for m in mods]
        if all(b is None for b in biases):
            return w, None
        return w, torch.cat([b if b is not None else torch.zeros(m.out_features, dtype=w.dtype, device=w.device)
                             for b, m in zip(biases, mods)])

    @property
    def dtype(self) -> torch.dtype:
        return self.head.weight.dtype

    def rope_table(self, length: int, like: torch.Tensor) -> None:
        """Precompute cos/sin for positions 0 .. length-1 (when the rotary type depends on position alone)."""
        if getattr(self.rotary, "rope_type", None) in _TABLE_ROPE:
            cos, sin = self.rotary(like, torch.arange(length, device=like.device)[None])
            self.table = (cos[0], sin[0])

    def angles(self, x: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (B, T, D) for positions ``pos`` (B, T)."""
        if self.table is None:
            return self.rotary(x, pos)
        return F.embedding(pos, self.table[0]), F.embedding(pos, self.table[1])

    def qkv(self, li: int, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Rotated queries (B, Hq, T, D), keys and values (B, Hkv, T, D) of layer ``li`` for h (B, T, d)."""
        a = self.layers[li].self_attn
        B, T, _ = h.shape
        D, nq, nk = self.head_dim, self.n_heads, self.n_kv
        q, k, v = self.project(li, h)
        q, k, v = q.view(B, T, nq, D), k.view(B, T, nk, D), v.view(B, T, nk, D)
        if getattr(a, "q_norm", None) is not None:
            q, k = _norm(a.q_norm, q), _norm(a.k_norm, k)
        qk = _rope(torch.cat([q, k], dim=2).transpose(1, 2), cos, sin)  # one rotation for queries and keys
        return qk[:, :nq], qk[:, nq:], v.transpose(1, 2)

    def finish(self, layer, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Output projection, residual, MLP and residual: the layer's output for input h."""
        h = h + layer.self_attn.o_proj(attn)
        return h + layer.mlp(_norm(layer.post_attention_layernorm, h))


def supports(lm) -> bool:
    """Whether ``lm`` (a model or a PEFT wrapper) is a decoder this engine can run."""
    base = base_model(lm)
    cfg = text_config(base)
    if getattr(cfg, "model_type", None) not in FAMILIES:
        return False
    if getattr(cfg, "use_sliding_window", False):
        return False
    types = getattr(cfg, "layer_types", None)
    if types and any(t != "full_attention" for t in types):
        return False
    body = getattr(base, "model", None)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if body is None or not all(hasattr(body, n) for n in needed) or not hasattr(base, "lm_head"):
        return False
    layer = body.layers[0]
    attn = getattr(layer, "self_attn", None)
    return attn is not None and all(hasattr(attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim")) \
        and all(hasattr(layer, n) for n in ("input_layernorm", "post_attention_layernorm", "mlp"))


def attention_kind(group: int, head_dim: int, device: torch.device) -> str:
    """``$SPARSERL_DECODE_ATTENTION`` (read at import, :data:`ATTENTION`), resolved for this model
    and device. ``auto``: ``triton`` on a CUDA device with Triton installed where the kernels apply,
    else ``sdpa`` (CPU tensors take ``sdpa``: Triton's interpreter is far slower). An unknown value,
    or ``triton`` without Triton, is an error; ``triton`` where its kernels do not apply (a group or
    head size that is not a power of two, CPU tensors outside Triton's interpreter) decodes with
    ``sdpa``, with a warning."""
    kind = ATTENTION
    if kind not in ("auto", "sdpa", "matmul", "triton"):
        raise SparseRLError(f"SPARSERL_DECODE_ATTENTION={kind!r}: choose auto (the default), sdpa, matmul or triton")
    if kind not in ("auto", "triton"):
        return kind
    if kind == "auto":
        fits = torch.device(device).type == "cuda" and da.available() and da.unsupported(group, head_dim, device) is None
        return "triton" if fits else "sdpa"
    if not da.available():
        raise SparseRLError("SPARSERL_DECODE_ATTENTION=triton needs Triton (python -m pip install triton; "
                            "the GPU image has it)")
    why = da.unsupported(group, head_dim, device)
    if why:
        log.warning("split-key decode attention does not apply (%s): decoding with sdpa", why)
        return "sdpa"
    return kind


def _record(graph: "torch.cuda.CUDAGraph", fn, stream: "torch.cuda.Stream", pool) -> None:
    with torch.cuda.stream(stream):
        if pool is None:
            graph.capture_begin()
        else:
            graph.capture_begin(pool)
        try:
            fn()
        except BaseException:
            try:
                graph.capture_end()
            except Exception:  # noqa: BLE001 - the capture is already invalid; report fn's error
                pass
            raise
        graph.capture_end()


def capture(fn, stream: "torch.cuda.Stream", pool=None) -> "torch.cuda.CUDAGraph":
    """A CUDA graph of ``fn()``, recorded on ``stream`` (into memory ``pool``). ``torch.cuda.graph``
    does the same after a device synchronisation and an ``empty_cache``, which hands the caching
    allocator's free blocks back to the driver: the steps after it allocate them again, and on an
    H200 each capture of the default model's step then took about 32 ms (ten per decode at batch
    256, 17% of the decode's time; docs/results.md, 'How fast is decoding?'). During a capture the
    allocator cannot free cached blocks to make room, so a capture that fails (out of memory near
    the limit, say) is tried once more after that synchronisation and ``empty_cache``; a second
    failure raises."""
    graph = torch.cuda.CUDAGraph()
    try:
        _record(graph, fn, stream, pool)
        return graph
    except Exception as exc:  # noqa: BLE001 - retried once with the cache emptied
        log.debug("graph capture failed (%s: %s); retrying after empty_cache", type(exc).__name__, exc)
    torch.cuda.synchronize(stream.device)
    torch.cuda.empty_cache()
    graph = torch.cuda.CUDAGraph()
    _record(graph, fn, stream, pool)
    return graph


def trim_to_longest(ids: torch.Tensor, logp: torch.Tensor, eos: int, done: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``done`` columns of (ids, logp), cut after the longest row's end token."""
    ids = ids[:, :done]
    is_eos = ids == eos
    ends = torch.where(is_eos.any(dim=1), is_eos.float().argmax(dim=1) + 1, torch.full_like(ids[:, 0], done))
    T = int(ends.max())
    return ids[:, :T], logp[:, :T]


class BucketedDecode:
    """One batched decode: prompt pass, then captured steps over length buckets, with compaction."""

    @torch.no_grad()
    def __init__(self, lm, embeds: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int, eos_id: int,
                 pad_id: int, sampling: tuple[float, int, float], bucket: int | None = None, constraint=None):
        self._sample = sample_with_logp
        self.constraint = constraint  # a HeaderConstraint over the global rows, or None
        base = base_model(lm)
        self.model_name = type(base).__name__
        self.m = DecoderView(base)
        self.eos, self.pad, self.sampling, self.bucket = eos_id, pad_id, sampling, bucket or BUCKET
        self.n = max_new_tokens
        dev, dt = embeds.device, self.m.dtype
        self.attention = attention_kind(self.m.group, self.m.head_dim, dev)  # a bad setting fails before any work
        B, P, _ = embeds.shape
        self.P = P
        self.L = -(-(P + max_new_tokens) // self.bucket) * self.bucket  # whole buckets: every span is a multiple of one
        shape = (B, self.m.n_kv, self.L, self.m.head_dim)
        self.k = [torch.zeros(shape, dtype=dt, device=dev) for _ in self.m.layers]
        self.v = [torch.zeros(shape, dtype=dt, device=dev) for _ in self.m.layers]
        self.key_ok = torch.zeros(B, self.L, dtype=torch.bool, device=dev)
        self.key_ok[:, :P] = attention_mask.bool()
        pos = (attention_mask.long().cumsum(1) - 1).clamp(min=0)
        x = embeds.to(dt)
        logits = self._prefill(x, pos)
        self.m.rope_table(self.L, x)
        self.fused = self._fusable()
        first, first_logp = self._sample(logits, *sampling, constraint=constraint)
        self.ids = torch.full((B, max_new_tokens), pad_id, dtype=torch.long, device=dev)
        self.ids[:, 0] = first
        self.logp = torch.zeros((B, max_new_tokens), dtype=torch.float32, device=dev)
        self.logp[:, 0] = first_logp
        self.rows = torch.arange(B, device=dev)  # global row of each row of the running batch
        self.finished = first == eos_id
        self.cur = first[:, None].clone()
        self.pos = pos[:, -1:] + 1
        self.col = torch.tensor([P], dtype=torch.long, device=dev)
        self.t = torch.tensor([1], dtype=torch.long, device=dev)
        self.graphs: dict[int, object] = {}  # span -> replay of the captured step, for the current batch
        self.pool = None  # one memory pool for every captured step (they never run at the same time)
        self.side: torch.cuda.Stream | None = None
        self.warm = 0
        self.broken = self.model_name in CAPTURE_BROKEN
        self.compactions: list[int] = []  # the batch size after each compaction

    def _fusable(self) -> bool:
        """Whether the step runs the fused Triton kernels (model/decode_fused.py): with the Triton
        attention, an angle table and layers the kernels know."""
        if self.attention != "triton":
            return False
        why = "the rotary type needs more than the position" if self.m.table is None else \
            fu.unfusable(self.m.layers, self.m.norm)
        if why:
            log.info("decode step not fused (%s): Triton attention, PyTorch for the rest", why)
            return False
        self.m.fuse_mlp()
        return True

    # -- the model -------------------------------------------------------------------------

    def _prefill(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Run the prompt, fill the cache's first P positions; logits (B, V) of the last position."""
        B, P, _ = x.shape
        i = torch.arange(P, device=x.device)
        m = (i[None, :] <= i[:, None])[None] & self.key_ok[:, None, :P]
        m[:, i, i] = True  # a padding position sees itself, so its row stays finite
        m = m[:, None]
        cos, sin = self.m.rotary(x, pos)
        g = self.m.group
        for li, layer in enumerate(self.m.layers):
            q, k, v = self.m.qkv(li, _norm(layer.input_layernorm, x), cos, sin)
            self.k[li][:, :, :P] = k
            self.v[li][:, :, :P] = v
            if g > 1:
                k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
            att = F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=self.m.scaling)
            x = self.m.finish(layer, x, att.transpose(1, 2).reshape(B, P, -1))
        return self.m.head(_norm(self.m.norm, x[:, -1]))

    def _attend(self, li: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, span: int,
                bias: torch.Tensor) -> torch.Tensor:
        """Write this step's k, v (B, Hkv, 1, D) at ``col``; attend q (B, Hq, 1, D) over ``span``
        positions, ``bias`` (B, 1, 1, span) 0 on valid keys and -inf elsewhere."""
        K, V = self.k[li], self.v[li]
        K.index_copy_(2, self.col, k)
        V.index_copy_(2, self.col, v)
        B = q.shape[0]
        qg = q.reshape(B, self.m.n_kv, self.m.group, self.m.head_dim)  # heads sharing a key head: query rows of it
        if self.attention == "triton":  # split-key kernels (model/decode_attention.py)
            out = da.decode_attention(qg, K, V, bias, span, self.m.scaling)
        elif self.attention == "matmul":  # two batched products and a float32 softmax: no 64-row query tiles
            scores = torch.matmul(qg, K[:, :, :span].transpose(-1, -2)).float() * self.m.scaling + bias
            out = torch.matmul(scores.softmax(-1).to(qg.dtype), V[:, :, :span])
        else:
            out = F.scaled_dot_product_attention(qg, K[:, :, :span], V[:, :, :span], attn_mask=bias,
                                                 scale=self.m.scaling)
        return out.reshape(B, 1, -1)

    def step(self, span: int) -> None:
        """Feed the last token, sample the next; reads and writes only the state's buffers."""
        self.key_ok.index_fill_(1, self.col, True)
        x = self.m.embed(self.cur)
        ok = self.key_ok[:, None, None, :span]  # one additive mask per step, for every layer
        bias = torch.zeros(ok.shape, dtype=x.dtype, device=x.device).masked_fill_(~ok, float("-inf"))
        if self.fused:
            return self._emit(self._layers_fused(x[:, 0], span, bias))
        cos, sin = self.m.angles(x, self.pos)
        for li, layer in enumerate(self.m.layers):
            q, k, v = self.m.qkv(li, _norm(layer.input_layernorm, x), cos, sin)
            x = self.m.finish(layer, x, self._attend(li, q, k, v, span, bias))
        self._emit(self.m.head(_norm(self.m.norm, x[:, -1])))

    def _layers_fused(self, x: torch.Tensor, span: int, bias: torch.Tensor) -> torch.Tensor:
        """The decoder on rows x (B, d) with the fused Triton kernels (model/decode_fused.py): each
        residual sum fused into the next norm, q/k norms, rotary embedding and cache writes in one
        kernel, and the MLP's activation in one; the logits (B, vocab)."""
        B, m = x.shape[0], self.m
        res = None
        for li, layer in enumerate(m.layers):
            h, x = fu.add_rms_norm(x, res, layer.input_layernorm)
            q, k, v = m.project(li, h)
            qo = fu.qk_rope_store(q, k, v, layer.self_attn, m.table, self.pos, self.col, self.k[li], self.v[li],
                                  m.head_dim)
            att = da.decode_attention(qo.view(B, m.n_kv, m.group, m.head_dim), self.k[li], self.v[li], bias, span,
                                      m.scaling)
            h, x = fu.add_rms_norm(x, layer.self_attn.o_proj(att.reshape(B, -1)), layer.post_attention_layernorm)
            res = m.mlp_fused(li, h)
        return m.head(fu.add_rms_norm(x, res, m.norm)[0])

    def _emit(self, logits: torch.Tensor) -> None:
        """Sample the next token from ``logits`` (B, vocab) and record it (the step's tail)."""
        nxt, lp = self._sample(logits, *self.sampling, constraint=self.constraint, rows=self.rows)
        nxt = torch.where(self.finished, torch.full_like(nxt, self.pad), nxt)
        lp = torch.where(self.finished, torch.zeros_like(lp), lp)
        t = self.t.expand_as(self.rows)
        self.ids.index_put_((self.rows, t), nxt)
        self.logp.index_put_((self.rows, t), lp)
        self.finished.logical_or_(nxt == self.eos)
        self.cur.copy_(nxt[:, None])
        self.pos.add_(1)
        self.col.add_(1)
        self.t.add_(1)

    # -- the loop --------------------------------------------------------------------------

    def _span(self, done: int) -> int:
        """Cache positions the step that writes token ``done`` must see (positions 0 .. P + done - 1),
        rounded up to the bucket's end."""
        return -(-(self.P + done) // self.bucket) * self.bucket

    def _compact(self) -> None:
        """Keep only the running rows (their cache, positions and state)."""
        keep = (~self.finished).nonzero().squeeze(1)
        self.k = [K.index_select(0, keep) for K in self.k]
        self.v = [V.index_select(0, keep) for V in self.v]
        self.key_ok = self.key_ok.index_select(0, keep)
        self.rows = self.rows.index_select(0, keep)
        self.finished = self.finished.index_select(0, keep)
        self.cur = self.cur.index_select(0, keep)
        self.pos = self.pos.index_select(0, keep)
        self.graphs.clear()  # after the host sync of the check that called this: no replay in flight
        self.pool = None  # a fresh pool for the new batch's graphs, not one whose graphs are all gone
        self.compactions.append(int(keep.numel()))

    @torch.no_grad()
    def run(self, graph: bool, check_every: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids, log-probs), both (B, T), T the longest row's length."""
        done = 1
        while done < self.n:
            if done % check_every == 0:
                running = int((~self.finished).sum())
                if running == 0:
                    break
                if running <= self.finished.numel() // 2 and self.finished.numel() >= MIN_COMPACT_BATCH:
                    self._compact()
            span = self._span(done)
            replay = self._graph(span) if graph else None
            if replay is not None:
                replay()
            elif graph and self.warm < 2:  # the first steps warm up on the capture stream
                self._on_side(lambda: self.step(span))
                self.warm += 1
            else:
                self.step(span)
            done += 1
        return trim_to_longest(self.ids, self.logp, self.eos, done)

    def _on_side(self, fn) -> None:
        """Run ``fn`` on the capture stream (cuBLAS workspaces are per stream: warm up where we capture)."""
        dev = self.ids.device
        if self.side is None:
            self.side = torch.cuda.Stream(device=dev)
        self.side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(self.side):
            fn()
        torch.cuda.current_stream(dev).wait_stream(self.side)

    def _graph(self, span: int):
        """The captured step for this batch and span (captured on first use); None while warming up
        or if capture failed."""
        if span in self.graphs:
            return self.graphs[span]
        if self.warm < 2 or self.broken:
            return None
        dev = self.ids.device
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        try:
            self.side.wait_stream(torch.cuda.current_stream(dev))
            g = capture(lambda: self.step(span), self.side, self.pool)
        except Exception as exc:  # noqa: BLE001 - any capture failure means "run eagerly"
            log.warning("CUDA graph capture of the bucketed decode step failed (%s: %s); decoding %s eagerly "
                        "from now on", type(exc).__name__, exc, self.model_name)
            torch.cuda.synchronize(dev)
            self.broken = True
            CAPTURE_BROKEN.add(self.model_name)
            return None
        torch.cuda.current_stream(dev).wait_stream(self.side)
        self.graphs[span] = g.replay
        return g.replay
