"""A small LLaMA-style GPT whose autograd functions save their activations through agoq.

Every tensor a block keeps for its backward pass is one of agoq's saved-tensor kinds
(docs/activations.md, section 1) and is stored the way a plan says, per layer and per kind:

- ``"fp32"``: the tensor itself (the exact baseline),
- ``"bf16"``: a bfloat16 copy (real rounding; "kept precise" in agoq's memory model),
- an agoq spec such as ``"int4_g128_sym_rne_f32"``: codes plus scales written by the extension,
  through the fused producer op where one exists (RMSNorm, SwiGLU), else by ``compress``.

The block is LLaMA's: RMSNorm -> fused QKV projection -> rotary position embedding (RoPE) of Q and
K -> causal attention -> output projection -> residual add -> RMSNorm -> fused gate/up projection ->
SwiGLU -> down projection -> residual add. The parameters are exactly those agoq's memory model
counts for a LLaMA shape (token embedding, per layer Q, K, V, O, gate, up, down and two norm
weights, the final norm and the untied head), so its gradient and optimizer figures apply as is.
What each function saves:

=====================  =================================  =====================================
function               saves (kind)                       backward recomputes
=====================  =================================  =====================================
RMSNorm                its input (attn_norm_input,        the normalised input from the saved
                       mlp_norm_input) + fp32 rstd        copy and rstd
Linear                 its input (qkv_input, mlp_input,   dW = dY^T X from the loaded input
                       swiglu_output); the output
                       projection reads attention_output
                       (the o_proj_input alias)
Attention              query, key, value,                 P = exp(QK^T/sqrt(d) - lse) from the
                       attention_output, fp32             loaded Q, K (flash attention style)
                       softmax_lse
SwiGLU                 gate_output, up_output             silu and its derivative
=====================  =================================  =====================================

The per-token RMSNorm statistics (4 bytes a token) are kept in fp32 and, like agoq's memory
model, not counted. RoPE saves nothing (torch's autograd keeps only its constant cos/sin tables).
The embedding, the final norm and the LM head are outside the plan (the memory model's head term)
and use plain torch autograd.

The ``agoq_torch`` extension is imported lazily: a model whose plan holds only ``"fp32"`` and
``"bf16"`` runs on plain torch, which is how the gradient check against autograd works.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

#: The saved-tensor kinds of a LLaMA block that own bytes, in block order (o_proj_input, the
#: alias of attention_output, owns none).
KINDS = (
    "attn_norm_input",
    "qkv_input",
    "query",
    "key",
    "value",
    "attention_output",
    "softmax_lse",
    "mlp_norm_input",
    "mlp_input",
    "gate_output",
    "up_output",
    "swiglu_output",
)

#: Storages handled in Python; every other storage name is an agoq spec.
PRECISE = ("fp32", "bf16")

#: Distance between the Philox stream offsets of two saved tensors (more than any tensor's
#: element count), so stochastic schemes never reuse a random number.
_STREAM_STRIDE = 1 << 32


def is_quantized(storage: str) -> bool:
    """True when ``storage`` names an agoq scheme rather than ``"fp32"`` / ``"bf16"``."""
    return storage not in PRECISE


def _agoq():
    """The agoq_torch extension (imported on first use; it JIT-builds on its first import)."""
    import agoq_torch

    return agoq_torch


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the model: a byte-level LLaMA-style decoder."""

    vocab: int = 256
    seq: int = 128
    layers: int = 4
    hidden: int = 128
    heads: int = 4
    ffn: int = 384
    eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def planner_model(self) -> dict:
        """The model as agoq's planner and memory model describe it."""
        return dict(
            style="llama",
            layers=self.layers,
            hidden=self.hidden,
            ffn=self.ffn,
            heads=self.heads,
            kv_heads=self.heads,
            head_dim=self.head_dim,
            vocab=self.vocab,
            tied_embeddings=False,
        )


class SavedTensor:
    """One activation kept for backward: agoq codes + scales, a bf16 copy or the tensor itself."""

    __slots__ = ("storage", "data", "rows", "cols", "dtype")

    def __init__(self, storage: str, data: torch.Tensor, rows: int, cols: int, dtype: torch.dtype):
        self.storage = storage
        self.data = data
        self.rows = rows
        self.cols = cols
        self.dtype = dtype

    @property
    def nbytes(self) -> int:
        """Bytes held: the uint8 buffer's length, 2 per bf16 element or 4 per fp32 element."""
        return self.data.numel() * self.data.element_size()

    def load(self) -> torch.Tensor:
        """The tensor as backward sees it, [rows, cols] in the original dtype."""
        if self.storage == "fp32":
            return self.data
        if self.storage == "bf16":
            return self.data.to(self.dtype)
        return _agoq().decompress(self.data, self.storage, self.rows, self.cols, dtype=self.dtype)


class ActivationSaver:
    """Stores a model's saved tensors as a plan says and counts the bytes of each micro-batch.

    ``plan`` is a list with one ``{kind: storage}`` dict per layer (make_plan's ``layers``).
    Call :meth:`begin_micro_batch` before each forward pass: it resets the byte count and moves
    every stochastic stream to fresh random numbers (seed = ``seed``, offsets distinct per
    micro-batch, layer and kind).
    """

    def __init__(self, plan: list[dict], seed: int = 0):
        missing = [(i, k) for i, layer in enumerate(plan) for k in KINDS if k not in layer]
        if missing:
            raise ValueError(f"the activation plan has no storage for (layer, kind) {missing[:4]}")
        self.plan = plan
        self.seed = seed
        self.micro_batch = 0
        self.bytes_by_kind: dict[str, int] = {}
        self._published: dict[tuple[int, str], SavedTensor] = {}

    def storage(self, layer: int, kind: str) -> str:
        return self.plan[layer][kind]

    def begin_micro_batch(self, index: int) -> None:
        """Starts micro-batch ``index`` (a global count: step * micro_batches + micro-batch)."""
        self.micro_batch = index
        self.bytes_by_kind = {}
        self._published.clear()

    def stream(self, layer: int, kind: str) -> tuple[int, int]:
        """(seed, offset) of the Philox stream of one saved tensor of this micro-batch."""
        slot = (self.micro_batch * len(self.plan) + layer) * len(KINDS) + KINDS.index(kind)
        return self.seed, slot * _STREAM_STRIDE

    def record(self, kind: str, saved: SavedTensor) -> SavedTensor:
        """Counts a tensor saved by a fused op (or by :meth:`save`)."""
        self.bytes_by_kind[kind] = self.bytes_by_kind.get(kind, 0) + saved.nbytes
        return saved

    def save(self, x: torch.Tensor, layer: int, kind: str) -> SavedTensor:
        """Saves a 2-D tensor [rows, cols] with the plan's storage for (layer, kind)."""
        storage = self.storage(layer, kind)
        rows, cols = x.shape
        if storage == "fp32":
            data = x.detach()
        elif storage == "bf16":
            data = x.detach().to(torch.bfloat16)
        else:
            seed, offset = self.stream(layer, kind)
            data = _agoq().compress(x.detach().contiguous(), storage, seed=seed, offset=offset)
        return self.record(kind, SavedTensor(storage, data, rows, cols, x.dtype))

    def publish(self, layer: int, kind: str, saved: SavedTensor) -> None:
        """Offers a saved tensor to a later consumer of the same values (an alias)."""
        self._published[(layer, kind)] = saved

    def take(self, layer: int, kind: str) -> SavedTensor:
        """Takes the tensor :meth:`publish` offered (it is then no longer referenced here)."""
        return self._published.pop((layer, kind))

    def total_bytes(self) -> int:
        return sum(self.bytes_by_kind.values())


# ---------------------------------------------------------------------------------------------
# The block's math in plain torch: the forward of evaluation, the reference for the gradient
# check, and the precise-storage paths of the autograd functions below.


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, rstd): y = x * rstd * weight with rstd = 1 / sqrt(mean(x^2) + eps) per row."""
    rstd = torch.rsqrt(x.pow(2).mean(-1) + eps)
    return x * rstd[:, None] * weight, rstd


def rmsnorm_backward(dy, x, rstd, weight):
    """(dx, dweight) of :func:`rmsnorm` from the (loaded) input and the fp32 rstd."""
    xhat = x * rstd[:, None]
    dweight = (dy * xhat).sum(0)
    g = dy * weight
    dx = rstd[:, None] * (g - xhat * (g * xhat).mean(-1, keepdim=True))
    return dx, dweight


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up."""
    return F.silu(gate) * up


def swiglu_backward(dout, gate, up):
    """(dgate, dup) of :func:`swiglu` from the (loaded) gate and up."""
    s = torch.sigmoid(gate)
    silu = gate * s
    return dout * up * s * (1 + gate * (1 - s)), dout * silu


def rope_tables(seq: int, head_dim: int, base: float = 10000.0, dtype=torch.float32):
    """(cos, sin) [seq, head_dim / 2] of the rotary position embedding."""
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.arange(seq, dtype=torch.float64)[:, None] * inv_freq
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rope(x: torch.Tensor, batch: int, heads: int, cos: torch.Tensor, sin: torch.Tensor):
    """Rotates each head's halves of [tokens, heads * d] by its token's position angles
    (LLaMA's rotate-half convention); returns a contiguous [tokens, heads * d]."""
    tokens, width = x.shape
    xh = x.view(batch, tokens // batch, heads, width // heads)
    x1, x2 = xh.chunk(2, -1)
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), -1).reshape(tokens, width)


def _heads(x: torch.Tensor, batch: int, heads: int) -> torch.Tensor:
    """[tokens, heads * d] -> [batch, heads, seq, d]."""
    tokens, width = x.shape
    return x.view(batch, tokens // batch, heads, width // heads).transpose(1, 2)


def _tokens(x: torch.Tensor) -> torch.Tensor:
    """[batch, heads, seq, d] -> [tokens, heads * d] (contiguous)."""
    batch, heads, seq, d = x.shape
    return x.transpose(1, 2).reshape(batch * seq, heads * d)


def _causal_scores(q, k):
    """Scaled, causally masked QK^T of [batch, heads, seq, d] tensors."""
    seq, d = q.shape[-2], q.shape[-1]
    scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(d))
    mask = torch.ones(seq, seq, dtype=torch.bool, device=q.device).triu(1)
    return scores.masked_fill(mask, float("-inf"))


def attention(q, k, v, batch: int, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention of [tokens, hidden] Q, K, V.

    Returns (O [tokens, hidden], logsumexp [batch * heads, seq])."""
    qh, kh, vh = (_heads(t, batch, heads) for t in (q, k, v))
    scores = _causal_scores(qh, kh)
    lse = torch.logsumexp(scores, -1)
    p = torch.exp(scores - lse[..., None])
    return _tokens(p @ vh), lse.reshape(-1, lse.shape[-1])


def attention_backward(do, q, k, v, o, lse, batch: int, heads: int):
    """(dQ, dK, dV) as flash attention computes them: the probabilities are recomputed from Q, K
    and the logsumexp; D = rowsum(dO * O) replaces the softmax's own backward."""
    qh, kh, vh, oh, doh = (_heads(t, batch, heads) for t in (q, k, v, o, do))
    scale = 1.0 / math.sqrt(qh.shape[-1])
    p = torch.exp(_causal_scores(qh, kh) - lse.view(qh.shape[:3])[..., None])
    dv = p.transpose(-1, -2) @ doh
    dp = doh @ vh.transpose(-1, -2)
    ds = p * (dp - (doh * oh).sum(-1, keepdim=True))
    dq = (ds @ kh) * scale
    dk = (ds.transpose(-1, -2) @ qh) * scale
    return _tokens(dq), _tokens(dk), _tokens(dv)


# ---------------------------------------------------------------------------------------------
# Autograd functions that save through the ActivationSaver. Arguments after the tensors are
# constants; their gradient slots return None.


class RMSNormFn(torch.autograd.Function):
    """RMSNorm saving its input (a residual-stream kind); the fused agoq op when quantized."""

    @staticmethod
    def forward(ctx, x, weight, eps, saver, layer, kind):
        storage = saver.storage(layer, kind)
        if is_quantized(storage):
            seed, offset = saver.stream(layer, kind)
            y, data, rstd = _agoq().rmsnorm_forward(x, weight, eps, storage, seed=seed,
                                                    offset=offset)
            ctx.saved = saver.record(kind, SavedTensor(storage, data, *x.shape, x.dtype))
        else:
            y, rstd = rmsnorm(x, weight, eps)
            ctx.saved = saver.save(x, layer, kind)
        ctx.save_for_backward(weight, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        weight, rstd = ctx.saved_tensors
        saved = ctx.saved
        if is_quantized(saved.storage):
            dx, dweight = _agoq().rmsnorm_backward(
                dy.contiguous(), saved.data, saved.storage, rstd, weight)
        else:
            dx, dweight = rmsnorm_backward(dy, saved.load(), rstd, weight)
        return dx, dweight, None, None, None, None


class LinearFn(torch.autograd.Function):
    """y = x W^T saving x, or reading a tensor another function saved (``alias``)."""

    @staticmethod
    def forward(ctx, x, weight, saver, layer, kind, alias):
        ctx.saved = saver.take(layer, alias) if alias else saver.save(x, layer, kind)
        ctx.save_for_backward(weight)
        return x @ weight.t()

    @staticmethod
    def backward(ctx, dy):
        (weight,) = ctx.saved_tensors
        x = ctx.saved.load()
        return dy @ weight, dy.t() @ x, None, None, None, None


class AttentionFn(torch.autograd.Function):
    """Causal attention saving Q, K, V, O and the fp32 logsumexp; O is published for the output
    projection (o_proj_input is stored once, as attention_output)."""

    @staticmethod
    def forward(ctx, q, k, v, batch, heads, saver, layer):
        o, lse = attention(q, k, v, batch, heads)
        ctx.saved = [saver.save(t, layer, kind) for t, kind in
                     ((q, "query"), (k, "key"), (v, "value"), (o, "attention_output"),
                      (lse, "softmax_lse"))]
        saver.publish(layer, "attention_output", ctx.saved[3])
        ctx.shape = (batch, heads)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = (s.load() for s in ctx.saved)
        dq, dk, dv = attention_backward(do, q, k, v, o, lse, *ctx.shape)
        return dq, dk, dv, None, None, None, None


class SwiGLUFn(torch.autograd.Function):
    """silu(gate) * up saving gate and up; the fused agoq op when both are quantized."""

    @staticmethod
    def forward(ctx, gate, up, saver, layer):
        sg, su = saver.storage(layer, "gate_output"), saver.storage(layer, "up_output")
        if is_quantized(sg) and is_quantized(su):
            seed, offset = saver.stream(layer, "gate_output")
            out, dg, du = _agoq().swiglu_forward(gate, up, sg, su, seed=seed, offset=offset)
            ctx.saved = (saver.record("gate_output", SavedTensor(sg, dg, *gate.shape, gate.dtype)),
                         saver.record("up_output", SavedTensor(su, du, *up.shape, up.dtype)))
        else:
            out = swiglu(gate, up)
            ctx.saved = (saver.save(gate, layer, "gate_output"), saver.save(up, layer, "up_output"))
        return out

    @staticmethod
    def backward(ctx, dout):
        g, u = ctx.saved
        if is_quantized(g.storage) and is_quantized(u.storage):
            dgate, dup = _agoq().swiglu_backward(dout.contiguous(), g.data, g.storage, u.data,
                                                 u.storage)
        else:
            dgate, dup = swiglu_backward(dout, g.load(), u.load())
        return dgate, dup, None, None


# ---------------------------------------------------------------------------------------------
# The model.


class CausalAttention(torch.nn.Module):
    """The plain-torch path's attention core (:func:`attention`) as a module without parameters,
    so that ``agoq_torch.QuantizedSaves`` rules can name it (``blocks.*.core``)."""

    def __init__(self, heads: int):
        super().__init__()
        self.heads = heads

    def forward(self, q, k, v, batch: int) -> torch.Tensor:
        return attention(q, k, v, batch, self.heads)[0]


class Block(torch.nn.Module):
    """One LLaMA block (no biases; RoPE on Q and K)."""

    def __init__(self, cfg: ModelConfig, index: int):
        super().__init__()
        h, f = cfg.hidden, cfg.ffn
        self.cfg, self.index = cfg, index
        self.core = CausalAttention(cfg.heads)
        self.attn_norm = torch.nn.Parameter(torch.ones(h))
        self.wqkv = torch.nn.Parameter(torch.empty(3 * h, h))
        self.wo = torch.nn.Parameter(torch.empty(h, h))
        self.mlp_norm = torch.nn.Parameter(torch.ones(h))
        self.w_gate_up = torch.nn.Parameter(torch.empty(2 * f, h))
        self.w_down = torch.nn.Parameter(torch.empty(h, f))

    def forward(self, x: torch.Tensor, batch: int, rot, saver: ActivationSaver | None):
        """x: the residual stream [tokens, hidden]; rot: the RoPE (cos, sin) tables. Without a
        saver: plain torch autograd."""
        cfg, i, h, f = self.cfg, self.index, self.cfg.hidden, self.cfg.ffn
        if saver is None:
            q, k, v = (rmsnorm(x, self.attn_norm, cfg.eps)[0] @ self.wqkv.t()).split(h, -1)
            q, k = (rope(t, batch, cfg.heads, *rot) for t in (q, k))
            x = x + self.core(q, k, v, batch) @ self.wo.t()
            gate, up = (rmsnorm(x, self.mlp_norm, cfg.eps)[0] @ self.w_gate_up.t()).split(f, -1)
            return x + swiglu(gate, up) @ self.w_down.t()
        y = RMSNormFn.apply(x, self.attn_norm, cfg.eps, saver, i, "attn_norm_input")
        q, k, v = LinearFn.apply(y, self.wqkv, saver, i, "qkv_input", None).split(h, -1)
        q, k, v = rope(q, batch, cfg.heads, *rot), rope(k, batch, cfg.heads, *rot), v.contiguous()
        o = AttentionFn.apply(q, k, v, batch, cfg.heads, saver, i)
        x = x + LinearFn.apply(o, self.wo, saver, i, "o_proj_input", "attention_output")
        y = RMSNormFn.apply(x, self.mlp_norm, cfg.eps, saver, i, "mlp_norm_input")
        gate, up = (t.contiguous() for t in
                    LinearFn.apply(y, self.w_gate_up, saver, i, "mlp_input", None).split(f, -1))
        s = SwiGLUFn.apply(gate, up, saver, i)
        return x + LinearFn.apply(s, self.w_down, saver, i, "swiglu_output", None)


class GPT(torch.nn.Module):
    """Byte-level LLaMA-style decoder: token embedding, blocks with RoPE, final RMSNorm, untied
    LM head. Initialised from the current torch seed (GPT-2's scheme: N(0, 0.02),
    residual output projections scaled by 1/sqrt(2 layers))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = torch.nn.Parameter(torch.empty(cfg.vocab, cfg.hidden))
        self.blocks = torch.nn.ModuleList(Block(cfg, i) for i in range(cfg.layers))
        self.final_norm = torch.nn.Parameter(torch.ones(cfg.hidden))
        self.head = torch.nn.Parameter(torch.empty(cfg.vocab, cfg.hidden))
        residual_std = 0.02 / math.sqrt(2 * cfg.layers)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = residual_std if name.endswith(("wo", "w_down")) else 0.02
                torch.nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor,
                saver: ActivationSaver | None = None) -> torch.Tensor:
        """Mean cross-entropy of next-byte prediction. idx, targets: int64 [batch, seq].

        With a saver the blocks run through agoq's saving functions; without one (evaluation,
        the reference of the gradient check) through plain torch autograd.
        """
        batch, seq = idx.shape
        x = self.tok_emb[idx].reshape(batch * seq, -1)
        rot = rope_tables(seq, self.cfg.head_dim, dtype=x.dtype)
        for block in self.blocks:
            x = block(x, batch, rot, saver)
        logits = rmsnorm(x, self.final_norm, self.cfg.eps)[0] @ self.head.t()
        return F.cross_entropy(logits, targets.reshape(-1))


def uniform_plan(cfg: ModelConfig, storage: str, lse: str = "fp32") -> list[dict]:
    """Every saved tensor of every layer in ``storage`` (the logsumexp in ``lse``)."""
    layer = {k: (lse if k == "softmax_lse" else storage) for k in KINDS}
    return [dict(layer) for _ in range(cfg.layers)]
