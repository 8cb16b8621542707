"""Quantized saved activations for any PyTorch model, through autograd's saved-tensor hooks.

``QuantizedSaves`` is a context manager: while it is active, every tensor autograd saves for the
backward pass is stored as agoq codes + scales (``compress``) and restored when backward needs it
(``decompress``), with a scheme chosen per module by name patterns. It needs no change to the
model's code, at the price of a separate quantizing read of each saved tensor (agoq's fused ops,
as gpt.py uses them, write the saved copy in the producing op's own pass). docs/pytorch.md,
"Any model: QuantizedSaves", documents it.
"""

from __future__ import annotations

import fnmatch
import inspect
import weakref

import torch

from . import compress, compress_measured, decompress, quantized_bytes

#: The floating dtypes agoq quantizes; a tensor of any other dtype is kept as saved.
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

#: Whether this torch's forward hooks run when the forward raises (``always_call``, torch 2.1).
_ALWAYS_CALL = "always_call" in inspect.signature(torch.nn.Module.register_forward_hook).parameters

#: The storages of a plan that keep a tensor as it is (docs/activations.md: "kept precise").
_PRECISE = ("bf16", "fp32")

#: Where each saved-tensor kind of a LLaMA block (``tensor_kinds("llama")``) is saved in Hugging
#: Face transformers' ``LlamaDecoderLayer``: module names relative to the layer. The attention
#: module's own saves (RoPE's and the attention kernel's: Q, K, V, its output and statistics) take
#: the attention kinds; SiLU's the gate output's; the MLP's own product ``act(gate) * up`` the up
#: output's.
HF_LLAMA_MODULES = {
    "attn_norm_input": ("input_layernorm",),
    "qkv_input": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "query": ("self_attn",),
    "key": ("self_attn",),
    "value": ("self_attn",),
    "attention_output": ("self_attn",),
    "softmax_lse": ("self_attn",),
    "o_proj_input": ("self_attn.o_proj",),
    "mlp_norm_input": ("post_attention_layernorm",),
    "mlp_input": ("mlp.gate_proj", "mlp.up_proj"),
    "gate_output": ("mlp.act_fn",),
    "up_output": ("mlp",),
    "swiglu_output": ("mlp.down_proj",),
}

#: The same for a Qwen3-style block (``tensor_kinds("qwen3")``) in transformers'
#: ``Qwen3DecoderLayer``: LLaMA's names, and the QK-norm's inputs saved by ``q_norm`` and
#: ``k_norm``.
HF_QWEN3_MODULES = {
    **HF_LLAMA_MODULES,
    "query_norm_input": ("self_attn.q_norm",),
    "key_norm_input": ("self_attn.k_norm",),
}

#: The same for a Gemma-2-style block (``tensor_kinds("gemma2")``) in transformers'
#: ``Gemma2DecoderLayer``: LLaMA's names but the MLP norm's, ``pre_feedforward_layernorm``, and the
#: post-norms' inputs saved by ``post_attention_layernorm`` and ``post_feedforward_layernorm``
#: (GeLU's save is the gate output's, as SiLU's is in LLaMA's).
HF_GEMMA2_MODULES = {
    **HF_LLAMA_MODULES,
    "post_attn_norm_input": ("post_attention_layernorm",),
    "mlp_norm_input": ("pre_feedforward_layernorm",),
    "post_mlp_norm_input": ("post_feedforward_layernorm",),
}

#: The same for a Gemma-3-style block (``tensor_kinds("gemma3")``) in transformers'
#: ``Gemma3DecoderLayer``: Gemma 2's names and the QK-norm's, ``q_norm`` and ``k_norm``.
HF_GEMMA3_MODULES = {
    **HF_GEMMA2_MODULES,
    "query_norm_input": ("self_attn.q_norm",),
    "key_norm_input": ("self_attn.k_norm",),
}

#: The same for a GPT-style block (``tensor_kinds("gpt")``) in transformers' ``GPT2Block``
#: (prefix ``"transformer.h.{layer}."``).
HF_GPT2_MODULES = {
    "ln1_input": ("ln_1",),
    "qkv_input": ("attn.c_attn",),
    "query": ("attn",),
    "key": ("attn",),
    "value": ("attn",),
    "attention_output": ("attn",),
    "softmax_lse": ("attn",),
    "o_proj_input": ("attn.c_proj",),
    "ln2_input": ("ln_2",),
    "fc1_input": ("mlp.c_fc",),
    "gelu_input": ("mlp.act",),
    "fc2_input": ("mlp.c_proj",),
}


def _bytes_per_element(storage):
    """How much a storage keeps: inf for a precise one, else its codes' and scales' bytes."""
    return float("inf") if storage in _PRECISE else quantized_bytes(storage, 1, 1 << 16)


def rules_from_plan(layers, modules=HF_LLAMA_MODULES, prefix="model.layers.{layer}."):
    """``QuantizedSaves`` rules that store each layer's saved tensors as a plan says.

    ``layers`` is a plan's per-layer list of ``{kind: storage}`` (``make_plan(...)["layers"]``,
    ``gpt.uniform_plan``); ``modules`` maps each kind to the modules, relative to a layer, whose
    saves it is (``HF_LLAMA_MODULES``, ``HF_QWEN3_MODULES``, ``HF_GEMMA2_MODULES``,
    ``HF_GEMMA3_MODULES``, ``HF_GPT2_MODULES``, or your model's); ``prefix`` names layer ``i``'s
    module (``str.format`` with ``layer=i``). Returns ``{module name: spec or None}`` with
    ``"bf16"`` and ``"fp32"`` mapped to None (kept as saved). Where several kinds share a module
    (the attention core's), it takes the storage that keeps the most (precise, else the most bytes
    per element). A kind of the plan that ``modules`` does not place raises ValueError, as does an
    invalid spec.
    """
    rules, keeps = {}, {}
    for i, layer in enumerate(layers):
        unplaced = sorted(set(layer) - set(modules))
        if unplaced:
            raise ValueError(f"rules_from_plan: the plan's kinds {unplaced} (layer {i}) have no "
                             f"modules; pass modules= mapping them")
        for kind, storage in layer.items():
            if storage not in _PRECISE:
                _check_spec(storage, f"the storage of {kind!r} in layer {i}")
            for module in modules[kind]:
                name = prefix.format(layer=i) + module
                if name not in rules or _bytes_per_element(storage) > keeps[name]:
                    rules[name] = None if storage in _PRECISE else storage
                    keeps[name] = _bytes_per_element(storage)
    return rules


def statistics_for_plan(statistics, layers, modules=HF_LLAMA_MODULES,
                        prefix="model.layers.{layer}."):
    """``make_plan(statistics=...)`` from what ``QuantizedSaves(measure=True)`` gathered.

    ``statistics`` is ``QuantizedSaves.statistics``; ``layers`` the model's layer count;
    ``modules`` and ``prefix`` as in ``rules_from_plan``. Returns ``{(layer, kind): stats}`` for
    every kind whose first module quantized exactly one tensor in its last forward call (a linear
    layer's input, an activation module's input: LLaMA's ``qkv_input``, ``o_proj_input``,
    ``mlp_input``, ``gate_output``, ``swiglu_output``); a module that quantized several (a norm
    saves its input and its normalized output, the attention core its Q, K, V, ...) or none
    leaves its kinds to the error model's prior. The statistics hold under the group tile they
    were measured with (the rule's spec), so plan with candidates of that tile (the default
    policy's are all g128), else ``make_plan`` raises ValueError.
    """
    if not isinstance(layers, int) or layers < 0:
        raise ValueError(f"statistics_for_plan: layers must be an int >= 0, not {layers!r}")
    chosen = {}
    for i in range(layers):
        for kind, names in modules.items():
            calls = statistics.get(prefix.format(layer=i) + names[0])
            if calls and len(calls[-1]) == 1:
                chosen[(i, kind)] = calls[-1][0]
    return chosen


class _Packed:
    """One saved tensor as codes + scales (what the pack hook returns to autograd)."""

    __slots__ = ("buffer", "spec", "shape", "dtype", "rows", "cols", "__weakref__")

    def __init__(self, buffer, spec, shape, dtype, rows, cols):
        self.buffer, self.spec, self.shape, self.dtype = buffer, spec, shape, dtype
        self.rows, self.cols = rows, cols

    def unpack(self) -> torch.Tensor:
        return decompress(self.buffer, self.spec, self.rows, self.cols,
                          dtype=self.dtype).view(self.shape)


def _unpack(packed):
    return packed.unpack() if isinstance(packed, _Packed) else packed


def _check_spec(spec, what):
    """None (keep) or a valid agoq spec; ValueError with agoq's message otherwise."""
    if spec is None:
        return
    if not isinstance(spec, str):
        raise TypeError(f"QuantizedSaves: {what} must be an agoq spec string or None, "
                        f"not {type(spec).__name__}")
    try:
        quantized_bytes(spec, 1, 1)
    except ValueError as e:
        raise ValueError(f"QuantizedSaves: {what}: {e}") from None


class QuantizedSaves:
    """Stores what autograd saves for backward as agoq codes + scales while the context is active.

    ``spec`` is the scheme of every saved tensor outside the modules ``rules`` names (None keeps
    them as autograd would). ``rules`` maps ``fnmatch`` patterns of ``model``'s module names
    (``model.named_modules()``, e.g. ``"blocks.*.attn"``) to a spec or None; a tensor saved while
    such a module's forward runs takes the rule of the innermost one (for modules matched by
    several patterns, the first pattern in ``rules``' order). A pattern that matches no module
    raises ValueError, as does an invalid spec.

    A saved tensor is quantized when all of these hold; else it is kept as autograd saved it:
    it is a dense (strided) tensor of float32, bfloat16 or float16; it has at least two
    dimensions and ``min_elements`` elements (per-token statistics such as RMSNorm's rstd are
    vectors); it is produced by autograd (neither a leaf tensor nor a view of one: parameters,
    frozen weights and inputs stay alive anyway, so quantizing them would only add memory and
    error); no two of its elements share memory (a broadcast view); and its quantized buffer is
    smaller than the tensor. It is quantized as a ``[numel / n, n]`` matrix,
    n its last dimension (groups run along it). A tensor saved several times (the input of
    several projections) is quantized once and shared, while the tensor it came from (or the one
    it is a view of) is alive and unmodified (same memory, shape, strides and version).

    Stochastic rounding draws stream positions from ``seed`` and an offset that starts at
    ``offset`` and advances by each quantized tensor's element count, across every use of this
    context: each forward pass run under it draws new random numbers, and a new context with the
    same seed and offset repeats the same bits for the same saves in the same order.

    With ``measure=True`` each quantized tensor goes through ``compress_measured`` (the same
    buffer, and the error model's statistics gathered in the same sweep), and ``statistics``
    maps each ruled module's name ("" outside them) to one list per forward call of the module,
    of the statistics of the tensors it quantized, in order (a shared save adds none);
    ``statistics_for_plan`` turns them into ``make_plan``'s ``statistics``.

    ``stats`` counts, since the context was entered: ``saved`` (pack calls), ``quantized``,
    ``shared``, ``kept`` (activations kept as saved), ``leaves`` (leaf tensors and their views);
    ``original_bytes`` and ``stored_bytes`` of the quantized tensors (each once), ``kept_bytes``
    of the kept activations (each time it is saved). ``stored_bytes + kept_bytes`` is what the
    saved activations hold. With ``record=True``, ``records`` lists one dict per pack call:
    ``module`` (the innermost ruled module, "" outside them), ``shape``, ``dtype``, ``storage``
    (the spec, or None when kept), ``bytes`` (what it adds: the buffer's size, the kept
    activation's, 0 when shared or a leaf).

    Composes with ``torch.utils.checkpoint(use_reentrant=False)``: the checkpoint's own hooks
    are innermost, so its region saves nothing here and recomputes in its backward outside this
    context. The reentrant checkpoint saves its inputs through autograd, and so they are
    quantized like any other saved tensor (a rule of None for the checkpointed module keeps
    them).
    """

    def __init__(self, spec, model: torch.nn.Module | None = None, rules=None, *,
                 min_elements: int = 1024, seed: int = 0, offset: int = 0,
                 record: bool = False, measure: bool = False):
        _check_spec(spec, "spec")
        rules = dict(rules or {})
        if rules and model is None:
            raise ValueError("QuantizedSaves: rules name modules, so they need a model")
        for pattern, rule in rules.items():
            _check_spec(rule, f"the rule of {pattern!r}")
        if not isinstance(min_elements, int) or min_elements < 0:
            raise ValueError(f"QuantizedSaves: min_elements must be an int >= 0, "
                             f"not {min_elements!r}")
        self.spec, self.model, self.rules = spec, model, rules
        self.min_elements, self.seed, self.record = min_elements, seed, record
        self.measure = measure
        self._ruled = self._match_rules()
        self._hooks = None
        self._handles = []
        self._active = []  # (module, spec, name) of the ruled modules whose forward runs
        self._shared = {}
        self._offset = offset
        self.stats: dict[str, int] = {}
        self.records: list[dict] = []
        self.statistics: dict[str, list[list[dict]]] = {}

    def _match_rules(self):
        """(module, spec, name) of every module a rule names."""
        if not self.rules:
            return []
        names = [(name, module) for name, module in self.model.named_modules() if name]
        ruled, matched = [], set()
        for name, module in names:
            patterns = [p for p in self.rules if fnmatch.fnmatchcase(name, p)]
            if patterns:
                ruled.append((module, self.rules[patterns[0]], name))
                matched.update(patterns)
        unmatched = [p for p in self.rules if p not in matched]
        if unmatched:
            raise ValueError(f"QuantizedSaves: no module of the model matches {unmatched} "
                             f"(module names: {[n for n, _ in names][:8]}...)")
        return ruled

    def __enter__(self):
        if self._hooks is not None:
            raise RuntimeError("QuantizedSaves: this context is already active")
        self.stats = dict(saved=0, quantized=0, shared=0, kept=0, leaves=0, original_bytes=0,
                          stored_bytes=0, kept_bytes=0)
        self.records = []
        self.statistics = {}
        always = {"always_call": True} if _ALWAYS_CALL else {}
        for module, rule, name in self._ruled:
            entry = (module, rule, name)
            self._handles.append(module.register_forward_pre_hook(
                lambda _m, _args, entry=entry: self._enter_module(entry)))
            self._handles.append(module.register_forward_hook(
                lambda m, _args, _out: self._leave(m), **always))
        if self._ruled:
            # A forward of the whole model starts outside every ruled module, whatever an
            # exception caught outside it left behind (where forward hooks cannot run on
            # exceptions).
            self._handles.append(self.model.register_forward_pre_hook(
                lambda _m, _args: self._active.clear()))
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)
        self._hooks = None
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._active.clear()
        self._shared.clear()
        return False

    def _enter_module(self, entry):
        """Starts a forward of a ruled module: its saves take its rule, and with ``measure`` its
        statistics start a new call."""
        self._active.append(entry)
        if self.measure:
            self.statistics.setdefault(entry[2], []).append([])

    def _leave(self, module):
        """Ends the innermost forward of ``module`` (and whatever an exception left above it):
        after its forward, or where torch runs the hook on exceptions (2.1 on), after it raised."""
        for i in range(len(self._active) - 1, -1, -1):
            if self._active[i][0] is module:
                del self._active[i:]
                return

    def _remember(self, key, t, packed):
        """Lets later saves of ``t``'s values share ``packed`` while the tensor that owns them
        (``t``, or the tensor ``t`` is a view of: ops often save a fresh view, as a linear layer
        its 3-d input flattened) is alive; the entry goes when ``packed`` does."""
        def forget(ref, key=key):
            entry = self._shared.get(key)
            if entry is not None and entry[2] is ref:
                del self._shared[key]
        owner = t._base if t._base is not None else t
        self._shared[key] = (weakref.ref(owner), t._version, weakref.ref(packed, forget))

    def _quantizable(self, t: torch.Tensor, spec) -> bool:
        if (spec is None or t.dtype not in _DTYPES or t.layout != torch.strided or t.dim() < 2
                or t.numel() < self.min_elements):
            return False
        if any(stride == 0 and size > 1 for stride, size in zip(t.stride(), t.shape)):
            return False  # a broadcast view: its elements share memory, which a copy would not
        cols = t.shape[-1]
        return quantized_bytes(spec, t.numel() // cols, cols) < t.numel() * t.element_size()

    def _pack(self, t: torch.Tensor):
        spec, module = (self._active[-1][1:] if self._active else (self.spec, ""))
        stats = self.stats
        stats["saved"] += 1
        held = 0
        base = t._base if t._base is not None else t
        if base.grad_fn is None:
            stats["leaves"] += 1  # alive anyway: it costs the backward pass no memory
            packed, spec = t, None
        elif not self._quantizable(t, spec):
            stats["kept"] += 1
            held = t.numel() * t.element_size()
            stats["kept_bytes"] += held
            packed, spec = t, None
        else:
            key = (t.data_ptr(), t.device, t.dtype, tuple(t.shape), t.stride())
            known = self._shared.get(key)
            packed = None
            if known is not None:
                source, version, ref = known
                if source() is not None and version == t._version:
                    packed = ref()
            if packed is not None and packed.spec == spec:
                stats["shared"] += 1
            else:
                cols = t.shape[-1]
                rows = t.numel() // cols
                x = t.detach().contiguous().view(rows, cols)
                if self.measure:
                    buffer, measured = compress_measured(x, spec, seed=self.seed,
                                                         offset=self._offset)
                    self.statistics.setdefault(module, [[]])[-1].append(measured)
                else:
                    buffer = compress(x, spec, seed=self.seed, offset=self._offset)
                self._offset += t.numel()
                packed = _Packed(buffer, spec, t.shape, t.dtype, rows, cols)
                self._remember(key, t, packed)
                held = buffer.numel()
                stats["quantized"] += 1
                stats["original_bytes"] += t.numel() * t.element_size()
                stats["stored_bytes"] += held
        if self.record:
            self.records.append(dict(module=module, shape=tuple(t.shape), dtype=t.dtype,
                                     storage=spec, bytes=held))
        return packed
