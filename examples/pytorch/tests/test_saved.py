"""Tests of agoq_torch.QuantizedSaves (agoq_torch/saved.py): saved activations of any model
stored as agoq codes through autograd's saved-tensor hooks. Gradients are checked bit for bit
against the same math on fake-quantized copies (``fake_quantize``, itself tested against agoq's
codec in test_extension.py). Run: python3 -m unittest discover -s examples/pytorch/tests"""

import os
import sys
import unittest

import torch
import torch.nn.functional as F
import torch.utils.checkpoint

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import agoq_torch as agoq  # noqa: E402
import gpt  # noqa: E402

INT4 = "int4_g128_sym_rne_f32"
INT8 = "int8_g128_sym_rne_f32"
INT8_SR = "int8_g128_sym_sr_f32"


def activation(*shape, seed=0):
    """A non-leaf float32 tensor (what autograd saves) and the leaf it comes from."""
    g = torch.Generator().manual_seed(seed)
    leaf = torch.randn(*shape, generator=g).requires_grad_()
    return leaf * 1.0, leaf


class Mlp(torch.nn.Module):
    def __init__(self, width, hidden):
        super().__init__()
        self.up = torch.nn.Linear(width, hidden)
        self.act = torch.nn.GELU()
        self.down = torch.nn.Linear(hidden, width)

    def forward(self, x):
        return self.down(self.act(self.up(x)))


class Attention(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.qk = torch.nn.Linear(width, 2 * width, bias=False)

    def forward(self, x):
        q, k = self.qk(x).chunk(2, -1)
        return torch.softmax(q @ k.t() / x.shape[-1] ** 0.5, -1) @ x


class Block(torch.nn.Module):
    def __init__(self, width=64, hidden=256):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.attn = Attention(width)
        self.mlp = Mlp(width, hidden)

    def forward(self, x):
        x = x + self.attn(self.norm(x))
        return x + self.mlp(x)


class Failing(torch.nn.Module):
    def forward(self, x):
        raise ArithmeticError("failed on purpose")


class HfRMSNorm(torch.nn.Module):
    """transformers' LlamaRMSNorm, op for op."""

    def __init__(self, width, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class HfAttention(torch.nn.Module):
    """A causal attention with LlamaAttention's module names."""

    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
            torch.nn.Linear(width, width, bias=False) for _ in range(4))

    def forward(self, x):
        b, s, w = x.shape
        q, k, v = (p(x).view(b, s, self.heads, -1).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
        scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
        o = torch.softmax(scores, -1) @ v
        return self.o_proj(o.transpose(1, 2).reshape(b, s, w))


class HfMlp(torch.nn.Module):
    def __init__(self, width, ffn):
        super().__init__()
        self.gate_proj = torch.nn.Linear(width, ffn, bias=False)
        self.up_proj = torch.nn.Linear(width, ffn, bias=False)
        self.down_proj = torch.nn.Linear(ffn, width, bias=False)
        self.act_fn = torch.nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class HfLayer(torch.nn.Module):
    def __init__(self, width, heads, ffn):
        super().__init__()
        self.input_layernorm = HfRMSNorm(width)
        self.self_attn = HfAttention(width, heads)
        self.post_attention_layernorm = HfRMSNorm(width)
        self.mlp = HfMlp(width, ffn)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class HfLlama(torch.nn.Module):
    """LlamaForCausalLM's module tree: model.embed_tokens, model.layers.<i>, model.norm,
    lm_head."""

    def __init__(self, layers=2, width=128, heads=4, ffn=384, vocab=256):
        super().__init__()
        self.model = torch.nn.Module()
        self.model.embed_tokens = torch.nn.Embedding(vocab, width)
        self.model.layers = torch.nn.ModuleList(HfLayer(width, heads, ffn) for _ in range(layers))
        self.model.norm = HfRMSNorm(width)
        self.lm_head = torch.nn.Linear(width, vocab, bias=False)

    def forward(self, idx):
        x = self.model.embed_tokens(idx)
        for layer in self.model.layers:
            x = layer(x)
        return self.lm_head(self.model.norm(x))


class QuantizedSavesTest(unittest.TestCase):
    def test_backward_reads_the_quantized_copies(self):
        """x * y saves both: each gradient is the other factor's fake-quantized copy, bit for bit;
        the second tensor's stochastic rounding starts where the first one's positions end."""
        for spec in (INT8, INT4, INT8_SR):
            x, lx = activation(64, 256, seed=1)
            y, ly = activation(64, 256, seed=2)
            with agoq.QuantizedSaves(spec, seed=7) as saves:
                z = (x * y).sum()
            gx, gy = torch.autograd.grad(z, (lx, ly), retain_graph=True)
            qx = agoq.fake_quantize(x.detach(), spec, seed=7, offset=0)
            qy = agoq.fake_quantize(y.detach(), spec, seed=7, offset=x.numel())
            self.assertTrue(torch.equal(gx, qy), spec)
            self.assertTrue(torch.equal(gy, qx), spec)
            self.assertFalse(torch.equal(gx, y.detach()), spec)
            self.assertEqual(saves.stats["quantized"], 2)
            self.assertEqual(saves.stats["original_bytes"], 2 * x.numel() * 4)
            self.assertEqual(saves.stats["stored_bytes"], 2 * agoq.quantized_bytes(spec, 64, 256))
            # The next use of the context goes on from where this one ended.
            with saves:
                z = (x * y).sum()
            gx, gy = torch.autograd.grad(z, (lx, ly), retain_graph=True)
            self.assertTrue(torch.equal(gx, agoq.fake_quantize(y.detach(), spec, seed=7,
                                                               offset=3 * x.numel())), spec)
            with agoq.QuantizedSaves(spec, seed=7, offset=2 * x.numel()):
                z = (x * y).sum()
            self.assertTrue(torch.equal(torch.autograd.grad(z, lx)[0], gx), spec)

    def test_every_dtype_and_shape(self):
        """bf16 and fp16 tensors, and N-d tensors quantized along their last dimension."""
        for dtype in (torch.bfloat16, torch.float16):
            x, lx = activation(4, 16, 200)
            x = x.to(dtype)
            with agoq.QuantizedSaves(INT8) as saves:
                z = (x * x).float().sum()
            (g,) = torch.autograd.grad(z, lx)
            # x * x saves x twice, quantized once; backward adds the copy to itself.
            self.assertEqual((saves.stats["quantized"], saves.stats["shared"]), (1, 1))
            q = agoq.fake_quantize(x.detach().reshape(64, 200), INT8)
            self.assertEqual(q.dtype, dtype)
            self.assertTrue(torch.equal(g, (q + q).reshape(4, 16, 200).float()), dtype)

    def test_kept_tensors(self):
        """What is kept as saved: parameters and views of them, inputs, integer tensors, vectors,
        small tensors, broadcast views, float64, and a tensor whose codes would be larger."""
        w = torch.nn.Parameter(torch.randn(32, 128))
        data = torch.randn(64, 128)
        index = torch.arange(64) % 7
        cases = {
            "a parameter's transpose": lambda: F.linear(x.detach(), w).sum(),
            "an input": lambda: (data * x).sum(),
            "a vector": lambda: (x.reshape(-1) * x.reshape(-1)).sum(),
            "a small tensor": lambda: (x[:4] * x[:4]).sum(),
            "a broadcast view": lambda: (data.requires_grad_() * x[:1].expand(64, 128)).sum(),
            "float64": lambda: (x.double() * x.double()).sum(),
            "codes larger than the tensor": lambda: (x.reshape(-1, 1) * x.reshape(-1, 1)).sum(),
            "an index": lambda: x[index].sum(),
        }
        for what, f in cases.items():
            x, lx = activation(64, 128)
            with agoq.QuantizedSaves(INT4, record=True) as saves:
                z = f()
            quantized = [r for r in saves.records if r["storage"] is not None]
            self.assertEqual(quantized, [], what)
            stats = saves.stats
            self.assertEqual(stats["saved"], len(saves.records), what)
            self.assertEqual(stats["kept"] + stats["leaves"], stats["saved"], what)
            self.assertEqual(stats["kept_bytes"], sum(r["bytes"] for r in saves.records), what)
            leaves = ("a parameter's transpose", "an input", "a broadcast view", "an index")
            self.assertEqual(stats["leaves"] > 0, what in leaves, what)
            torch.autograd.grad(z, lx if what != "a parameter's transpose" else w)
        # The parameter case: dW = dY^T X from the unquantized input, as without the context.
        x, lx = activation(64, 128)
        with agoq.QuantizedSaves(INT4):
            z = F.linear(x, w).sum()
        got = torch.autograd.grad(z, (lx, w), retain_graph=True)
        want = torch.autograd.grad(F.linear(x, w).sum(), (lx, w))
        # F.linear saves x (quantized) and w (kept): dx = dY W exactly, dW from the codes.
        self.assertTrue(torch.equal(got[0], want[0]))
        self.assertFalse(torch.equal(got[1], want[1]))

    def test_min_elements(self):
        x, lx = activation(8, 128)
        for min_elements, quantized in ((0, 2), (1024, 2), (1025, 0)):
            with agoq.QuantizedSaves(INT8, min_elements=min_elements) as saves:
                (x * x.exp()).sum()
            self.assertEqual(saves.stats["quantized"], quantized, min_elements)

    def test_a_tensor_saved_twice_is_quantized_once(self):
        x, lx = activation(64, 128)
        w1 = torch.nn.Parameter(torch.randn(32, 128))
        w2 = torch.nn.Parameter(torch.randn(48, 128))
        with agoq.QuantizedSaves(INT4) as saves:
            z = (x @ w1.t()).sum() + (x @ w2.t()).sum()
        self.assertEqual((saves.stats["quantized"], saves.stats["shared"]), (1, 1))
        g1, g2 = torch.autograd.grad(z, (w1, w2))
        q = agoq.fake_quantize(x.detach(), INT4)
        self.assertTrue(torch.equal(g1, torch.ones(64, 32).t() @ q))
        self.assertTrue(torch.equal(g2, torch.ones(64, 48).t() @ q))
        # Modified in place between the saves: quantized again, and each backward reads the
        # values of its own save (plain autograd would refuse this backward).
        with torch.no_grad():
            y = x.detach().clone()
        y = y.requires_grad_() * 1.0
        with agoq.QuantizedSaves(INT4) as saves:
            z1 = (y @ w1.t()).sum()
            with torch.no_grad():
                y.mul_(2)
            z2 = (y @ w2.t()).sum()
        self.assertEqual((saves.stats["quantized"], saves.stats["shared"]), (2, 0))
        g1, g2 = torch.autograd.grad(z1 + z2, (w1, w2))
        self.assertTrue(torch.equal(g1, torch.ones(64, 32).t() @ q))
        self.assertTrue(torch.equal(g2, torch.ones(64, 48).t() @ agoq.fake_quantize(
            2 * x.detach(), INT4, offset=x.numel())))
        # A tensor that died is never matched by a new one at the same address.
        with agoq.QuantizedSaves(INT4) as saves:
            for i in range(4):
                a = x * float(i + 1)
                (a @ w1.t()).sum()
                del a
        self.assertEqual((saves.stats["quantized"], saves.stats["shared"]), (4, 0))

    def test_rules_pick_the_innermost_module(self):
        torch.manual_seed(0)
        model = Block()
        rules = {"attn": None, "mlp": INT4, "mlp.act": INT8_SR}
        x, _ = activation(64, 64)
        with agoq.QuantizedSaves(INT8, model, rules, record=True) as saves:
            model(x).sum().backward()
        by_module = {}
        for r in saves.records:
            by_module.setdefault(r["module"], set()).add(r["storage"])
        self.assertEqual(by_module["attn"], {None})
        self.assertEqual(by_module["mlp"], {INT4, None})  # the linears' inputs; weights kept
        self.assertEqual(by_module["mlp.act"], {INT8_SR})  # GELU's input
        self.assertEqual(by_module[""] - {None}, {INT8})  # the norm, outside any rule
        self.assertEqual(saves.stats["stored_bytes"], sum(r["bytes"] for r in saves.records
                                                          if r["storage"] is not None))
        # The hooks are gone after the context.
        for m in model.modules():
            self.assertFalse(m._forward_pre_hooks or m._forward_hooks)
        # The first matching pattern wins for a module several patterns name.
        with agoq.QuantizedSaves(INT8, model, {"mlp*": INT4, "mlp.act": None},
                                 record=True) as saves:
            model(x)
        self.assertNotIn(None, {r["storage"] for r in saves.records if r["module"] == "mlp.act"})

    def test_model_gradients(self):
        """The plain-torch GPT of gpt.py: every gradient within a few percent at int8, more error
        at int4, none with every saved tensor kept; the stored bytes are the codes' sizes."""
        torch.manual_seed(0)
        cfg = gpt.ModelConfig(layers=2, seq=64)
        model = gpt.GPT(cfg)
        idx = torch.randint(0, cfg.vocab, (4, cfg.seq))
        params = list(model.parameters())

        def grads(*saves):
            if saves:
                with agoq.QuantizedSaves(*saves, record=True) as ctx:
                    loss = model(idx[:, :-1].contiguous(), idx[:, 1:].contiguous())
            else:
                ctx, loss = None, model(idx[:, :-1].contiguous(), idx[:, 1:].contiguous())
            return torch.autograd.grad(loss, params), ctx

        exact, _ = grads()
        kept, ctx = grads(None)
        self.assertEqual(ctx.stats["quantized"], 0)
        self.assertTrue(all(torch.equal(a, b) for a, b in zip(kept, exact)))

        def error(gs):
            return max(((a - b).norm() / b.norm()).item() for a, b in zip(gs, exact))

        g8, ctx8 = grads(INT8)
        g4, ctx4 = grads(INT4)
        e8, e4 = error(g8), error(g4)
        self.assertGreater(e8, 0)
        self.assertLess(e8, 0.02)
        self.assertLess(4 * e8, e4)
        for ctx, spec in ((ctx8, INT8), (ctx4, INT4)):
            coded = [r for r in ctx.records if r["storage"] is not None]
            sizes = sum(agoq.quantized_bytes(spec, int(torch.Size(r["shape"]).numel()
                                                       // r["shape"][-1]), r["shape"][-1])
                        for r in coded if r["bytes"])
            self.assertEqual(ctx.stats["stored_bytes"], sizes)
            self.assertLess(ctx.stats["stored_bytes"], ctx.stats["original_bytes"] / 3)
        # Layer-aware as train.py's hooks-layer-aware runs: int8 in the blocks but for their
        # attention cores (gpt.CausalAttention), the embedding and the head kept.
        gl, ctxl = grads(None, model, {"blocks.*.core": None, "blocks.*": INT8})
        for r in ctxl.records:
            inside = r["module"] in ("blocks.0", "blocks.1")
            self.assertTrue(r["storage"] in ((INT8, None) if inside else (None,)), r)
        self.assertTrue(any(r["module"] == "blocks.1.core" for r in ctxl.records))
        self.assertLess(ctxl.stats["original_bytes"], ctx8.stats["original_bytes"])
        self.assertLess(0, error(gl))

    def test_checkpointed_regions_are_recomputed_precisely(self):
        """Under torch.utils.checkpoint(use_reentrant=False) the checkpoint's hooks are innermost:
        nothing of its region reaches the context, and its backward recomputes outside it."""
        torch.manual_seed(0)
        model = Block()
        x, lx = activation(64, 64)

        def loss():
            return torch.utils.checkpoint.checkpoint(model, x, use_reentrant=False).sum()

        want = torch.autograd.grad(loss(), [lx] + list(model.parameters()), retain_graph=True)
        with agoq.QuantizedSaves(INT4) as saves:
            z = loss()
        got = torch.autograd.grad(z, [lx] + list(model.parameters()))
        self.assertEqual(saves.stats["quantized"], 0)
        self.assertTrue(all(torch.equal(a, b) for a, b in zip(got, want)))

    def test_rules_from_a_plan(self):
        """A plan's storages reach the saves of the modules of a transformers-style LLaMA: each
        layer's norms, projections, SiLU and MLP product quantized as its plan says, attention
        and the layers' outside kept."""
        torch.manual_seed(0)
        model = HfLlama()
        defaults = {k: v[0] for k, v in agoq.default_policy().items()}
        defaults["o_proj_input"] = "bf16"  # an alias of attention_output (not in the policy)
        plan = [{k: defaults[k] for k in agoq.tensor_kinds("llama")},
                {k: (INT8 if defaults[k] == INT4 else defaults[k])
                 for k in agoq.tensor_kinds("llama")}]
        plan[1]["up_output"] = INT8_SR
        rules = agoq.rules_from_plan(plan)
        # Which kind's storage each module's saves take (transformers' layer, by hand).
        kind_of = {"input_layernorm": "attn_norm_input", "self_attn.q_proj": "qkv_input",
                   "self_attn.k_proj": "qkv_input", "self_attn.v_proj": "qkv_input",
                   "self_attn": "attention_output", "self_attn.o_proj": "o_proj_input",
                   "post_attention_layernorm": "mlp_norm_input", "mlp.gate_proj": "mlp_input",
                   "mlp.up_proj": "mlp_input", "mlp.act_fn": "gate_output", "mlp": "up_output",
                   "mlp.down_proj": "swiglu_output"}
        self.assertEqual(set(rules), {f"model.layers.{i}.{m}" for i in range(2) for m in kind_of})
        idx = torch.randint(0, 256, (2, 64))
        with agoq.QuantizedSaves(None, model, rules, record=True) as saves:
            loss = F.cross_entropy(model(idx).flatten(0, 1), idx.flatten())
        loss.backward()
        quantizing = set()
        for r in saves.records:
            if r["module"] == "":
                self.assertIsNone(r["storage"])  # embedding, final norm, head
                continue
            layer, module = r["module"].split(".", 3)[2:]
            want = plan[int(layer)][kind_of[module]]
            if r["storage"] is not None:
                self.assertEqual(r["storage"], want, r)
                quantizing.add(r["module"])
        self.assertEqual(quantizing, {f"model.layers.{i}.{m}" for i in range(2) for m in kind_of
                                      if m not in ("self_attn", "self_attn.o_proj")})
        # The Q, K and V projections read one tensor: quantized by the first, shared after.
        shared = [r["bytes"] for r in saves.records if r["storage"] is not None
                  and r["module"].endswith(("q_proj", "k_proj", "v_proj"))]
        self.assertEqual([b > 0 for b in shared], [True, False, False] * 2)
        self.assertTrue(all(p.grad is not None and p.grad.isfinite().all()
                            for p in model.parameters()))

    def test_measured_statistics_reach_the_planner(self):
        """measure=True gathers each quantized save's statistics (the same as measure() of the
        tensor); statistics_for_plan keeps the modules that quantized one tensor, and make_plan
        takes them in place of the prior."""
        torch.manual_seed(0)
        model = HfLlama()
        idx = torch.randint(0, 256, (2, 64))
        inputs = {}
        handle = model.model.layers[1].mlp.down_proj.register_forward_pre_hook(
            lambda _m, args: inputs.__setitem__("down", args[0].detach().clone()))
        rules = agoq.rules_from_plan([{k: INT4 for k in agoq.tensor_kinds("llama")}] * 2)
        with agoq.QuantizedSaves(None, model, rules, measure=True) as saves:
            model(idx).sum().backward()
        handle.remove()
        down = saves.statistics["model.layers.1.mlp.down_proj"]
        self.assertEqual(len(down), 1)  # one forward call, one quantized tensor: its input
        self.assertEqual(down[0][0], agoq.measure(inputs["down"].flatten(0, 1), INT4))
        # The norm quantized its input, its square (pow saves both) and its normalized output;
        # K and V shared Q's input.
        self.assertEqual(len(saves.statistics["model.layers.0.input_layernorm"][0]), 3)
        self.assertEqual(saves.statistics["model.layers.0.self_attn.k_proj"], [[]])
        chosen = agoq.statistics_for_plan(saves.statistics, 2)
        self.assertEqual(set(chosen), {(i, k) for i in range(2) for k in (
            "qkv_input", "o_proj_input", "mlp_input", "gate_output", "swiglu_output")})
        self.assertEqual(chosen[(1, "swiglu_output")], down[0][0])
        # A second forward is a second call; the last one is used.
        with agoq.QuantizedSaves(None, model, rules, measure=True) as again:
            model(idx)
            model(idx[:, :32])
        self.assertEqual([len(c) for c in again.statistics["model.layers.1.mlp.down_proj"]],
                         [1, 1])
        later = agoq.statistics_for_plan(again.statistics, 2)
        self.assertNotEqual(later[(1, "swiglu_output")], chosen[(1, "swiglu_output")])
        self.assertEqual(later[(1, "swiglu_output")]["elements"], 32 * 2 * 384)
        # Without measure, no statistics and the same saved bytes.
        with agoq.QuantizedSaves(None, model, rules) as plain:
            model(idx)
        self.assertEqual(plain.statistics, {})
        self.assertEqual(plain.stats, saves.stats)
        # The planner: measured statistics replace the prior for the model of these shapes.
        shape = dict(style="llama", layers=2, hidden=128, ffn=384, heads=4, kv_heads=4,
                     head_dim=0, vocab=256, tied_embeddings=False)
        fixed = {k: (d, [d]) for k, (d, _) in agoq.default_policy().items()}  # int4 inputs
        prior = agoq.make_plan(shape, 2, 64, 1 << 40, policy=fixed)["error"]
        measured = agoq.make_plan(shape, 2, 64, 1 << 40, policy=fixed, statistics=chosen)
        self.assertGreater(prior, 0)
        self.assertGreater(measured["error"], 0)
        self.assertNotEqual(prior, measured["error"])
        with self.assertRaisesRegex(ValueError, "layers"):
            agoq.statistics_for_plan(saves.statistics, -1)
        with self.assertRaises(ValueError):  # per-row statistics cannot predict g128 candidates
            row = {k: stats | {"tile": (1, 384)} for k, stats in chosen.items()}
            agoq.make_plan(shape, 2, 64, 1 << 40, policy=fixed, statistics=row)

    def test_rules_from_plan_choices_and_errors(self):
        kinds = agoq.tensor_kinds("llama")
        plan = [dict.fromkeys(kinds, INT4)]
        self.assertEqual(set(agoq.rules_from_plan(plan).values()), {INT4})
        # Kinds that share a module: the storage that keeps the most.
        plan[0].update(query=INT8, key="int8_g32_sym_rne_f32")
        self.assertEqual(agoq.rules_from_plan(plan)["model.layers.0.self_attn"],
                         "int8_g32_sym_rne_f32")
        plan[0]["value"] = "bf16"
        self.assertIsNone(agoq.rules_from_plan(plan)["model.layers.0.self_attn"])
        gpt_plan = [dict.fromkeys(agoq.tensor_kinds("gpt"), INT8)]
        rules = agoq.rules_from_plan(gpt_plan, agoq.HF_GPT2_MODULES, "transformer.h.{layer}.")
        self.assertEqual(rules["transformer.h.0.mlp.act"], INT8)
        self.assertEqual(len(rules), 8)
        with self.assertRaisesRegex(ValueError, r"\['fc1_input'.*layer 0"):
            agoq.rules_from_plan(gpt_plan)
        # Qwen3: LLaMA's modules and the QK-norm's; LLaMA's mapping does not place its kinds.
        qwen3_plan = [dict.fromkeys(agoq.tensor_kinds("qwen3"), INT8)]
        qwen3_plan[0].update(query_norm_input="bf16", key_norm_input=INT4)
        rules = agoq.rules_from_plan(qwen3_plan, agoq.HF_QWEN3_MODULES)
        self.assertIsNone(rules["model.layers.0.self_attn.q_norm"])
        self.assertEqual(rules["model.layers.0.self_attn.k_norm"], INT4)
        self.assertEqual(len(rules), len(agoq.rules_from_plan([plan[0]])) + 2)
        with self.assertRaisesRegex(ValueError, r"\['key_norm_input', 'query_norm_input'\]"):
            agoq.rules_from_plan(qwen3_plan)
        with self.assertRaisesRegex(ValueError, "'mlp_input' in layer 0"):
            agoq.rules_from_plan([dict(plan[0], mlp_input="int4")])
        # Gemma: every kind of its blocks placed; the post-norms' inputs on their norms, the MLP
        # norm's input on pre_feedforward_layernorm; Gemma 3 also the QK-norm's.
        for style, modules in (("gemma2", agoq.HF_GEMMA2_MODULES),
                               ("gemma3", agoq.HF_GEMMA3_MODULES)):
            self.assertEqual(set(modules), set(agoq.tensor_kinds(style)))
        gemma_plan = [dict.fromkeys(agoq.tensor_kinds("gemma3"), INT8)]
        gemma_plan[0].update(post_mlp_norm_input=INT4, mlp_norm_input="bf16")
        rules = agoq.rules_from_plan(gemma_plan, agoq.HF_GEMMA3_MODULES)
        self.assertEqual(rules["model.layers.0.post_feedforward_layernorm"], INT4)
        self.assertEqual(rules["model.layers.0.post_attention_layernorm"], INT8)
        self.assertIsNone(rules["model.layers.0.pre_feedforward_layernorm"])
        self.assertEqual(rules["model.layers.0.self_attn.k_norm"], INT8)
        with self.assertRaisesRegex(ValueError, "post_attn_norm_input"):
            agoq.rules_from_plan(gemma_plan, agoq.HF_QWEN3_MODULES)

    def test_bad_arguments(self):
        model = Block()
        with self.assertRaisesRegex(ValueError, "int3|spec|scheme|bits"):
            agoq.QuantizedSaves("int3_g128_sym_rne_f32")
        with self.assertRaises(TypeError):
            agoq.QuantizedSaves(8)
        with self.assertRaisesRegex(ValueError, "need a model"):
            agoq.QuantizedSaves(INT8, rules={"mlp": INT4})
        with self.assertRaisesRegex(ValueError, r"matches \['mpl'\]"):
            agoq.QuantizedSaves(INT8, model, {"mlp": INT4, "mpl": INT4})
        with self.assertRaisesRegex(ValueError, "rule of 'mlp'"):
            agoq.QuantizedSaves(INT8, model, {"mlp": "int4_g128"})
        with self.assertRaisesRegex(ValueError, "min_elements"):
            agoq.QuantizedSaves(INT8, min_elements=-1)
        saves = agoq.QuantizedSaves(INT8)
        with saves:
            with self.assertRaisesRegex(RuntimeError, "already active"):
                saves.__enter__()

    def test_an_exception_leaves_no_hooks_behind(self):
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), Failing())
        x, _ = activation(64, 64)
        with self.assertRaises(ArithmeticError):
            with agoq.QuantizedSaves(INT8, model, {"1": None}):
                model(x)
        for m in model.modules():
            self.assertFalse(m._forward_pre_hooks or m._forward_hooks)
        # Autograd's hook stack is balanced again: a tensor saved now is kept as it is.
        y, _ = activation(64, 64)
        saved = (y * y).grad_fn._saved_self
        self.assertTrue(torch.equal(saved, y))
        self.assertFalse(torch.equal(agoq.fake_quantize(y.detach(), INT8), y))

    def test_a_caught_exception_leaves_no_rule_in_force(self):
        # The ruled module fails, the caller catches it and runs the model again in the same
        # context: the first layer's input is then saved outside every rule (INT8), not under
        # the failed module's (kept), which torch 1.13 never ended.
        class Flaky(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fail = True
                self.linear = torch.nn.Linear(64, 64)

            def forward(self, x):
                if self.fail:
                    raise ArithmeticError("failed on purpose")
                return self.linear(x)

        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), Flaky())
        x, _ = activation(64, 64)
        with agoq.QuantizedSaves(INT8, model, {"2": None}, record=True) as saves:
            with self.assertRaises(ArithmeticError):
                model(x)
            model[2].fail = False
            first = len(saves.records)
            model(x).sum().backward()
        records = saves.records[first:]
        # GELU's input, quantized outside every rule; Flaky's linear's input, kept by its rule.
        self.assertIn(("", INT8), {(r["module"], r["storage"]) for r in records})
        self.assertEqual({r["storage"] for r in records if r["module"] == "2"}, {None})
        for m in model.modules():
            self.assertFalse(m._forward_pre_hooks or m._forward_hooks)

if __name__ == "__main__":
    unittest.main()
