"""Tests of the agoq PyTorch extension (CPU): every binding against agoq's own definitions or a
float64 reference, its argument checks, and the 8-bit all-reduce over a real gloo process group
of several processes. Run: python3 -m unittest discover -s examples/pytorch/tests"""

import json
import math
import os
import pathlib
import pickle
import re
import socket
import sys
import tempfile
import unittest

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import agoq_torch as agoq  # noqa: E402

INT4 = "int4_g128_sym_rne_f32"
INT8 = "int8_g128_sym_rne_f32"
INT8_SR = "int8_g128_sym_sr_f32"

LLAMA = dict(style="llama", layers=4, hidden=128, ffn=384, heads=4, kv_heads=4, head_dim=0,
             vocab=256, tied_embeddings=False)


def rmsnorm_ref(x, w, eps):
    return x * torch.rsqrt((x * x).mean(1, keepdim=True) + eps) * w


class TensorTest(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)

    def test_round_trip_matches_fake_quantize_for_every_dtype(self):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            for spec in (INT4, INT8, "int2_g64_asym_rne_f32", "fp8e4m3_g32_rne_e8m0",
                         "int8_row_sym_sr_bf16", "int4_tensor_sym_rne_f32"):
                x = (torch.randn(37, 256) * 3).to(dtype)
                buf = agoq.compress(x, spec, seed=5, offset=11)
                self.assertEqual(buf.dtype, torch.uint8)
                self.assertEqual(buf.numel(), agoq.quantized_bytes(spec, 37, 256))
                y = agoq.decompress(buf, spec, 37, 256, dtype)
                self.assertEqual(y.dtype, dtype)
                self.assertTrue(torch.equal(y, agoq.fake_quantize(x, spec, seed=5, offset=11)),
                                f"{spec} {dtype}")

    def test_compress_measured_is_compress_and_measure(self):
        agoq.reset_nonfinite()
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            x = (torch.randn(37, 1100) * 3).to(dtype)
            x[3, 7] = float("nan")
            for spec in (INT4, INT8_SR, "int4_g64_asym_rne_bf16", "int8_row_sym_rne_f32",
                         "int4_tensor_sym_rne_f32"):
                buf, st = agoq.compress_measured(x, spec, seed=5, offset=11)
                self.assertTrue(torch.equal(buf, agoq.compress(x, spec, seed=5, offset=11)),
                                f"{spec} {dtype}")
                self.assertEqual(st, agoq.measure(x, spec), f"{spec} {dtype}")
        self.assertEqual(agoq.nonfinite_seen(), 30)  # both calls count each NaN
        with self.assertRaises(ValueError):
            agoq.compress_measured(x, "int3_g128_sym_rne_f32")
        with self.assertRaises((RuntimeError, ValueError)):
            agoq.compress_measured(x[0], INT4)

    def test_nearest_error_within_half_a_step(self):
        x = torch.randn(64, 512, dtype=torch.float64).float()
        y = agoq.decompress(agoq.compress(x, INT4), INT4, 64, 512)
        amax = x.view(64, 4, 128).abs().amax(-1, keepdim=True)
        step = amax / 7  # int4 symmetric: 7 positive steps; scales rounded up only enlarge it
        err = (y - x).view(64, 4, 128).abs()
        self.assertTrue(bool((err <= step / 2 * (1 + 1e-5) + 1e-7).all()))

    def test_stochastic_rounding_depends_on_seed_and_offset(self):
        x = torch.randn(8, 128)
        a = agoq.fake_quantize(x, INT8_SR, seed=1, offset=0)
        self.assertTrue(torch.equal(a, agoq.fake_quantize(x, INT8_SR, seed=1, offset=0)))
        self.assertFalse(torch.equal(a, agoq.fake_quantize(x, INT8_SR, seed=2, offset=0)))
        self.assertFalse(torch.equal(a, agoq.fake_quantize(x, INT8_SR, seed=1, offset=1)))

    def test_nonfinite_values_are_counted(self):
        agoq.reset_nonfinite()
        x = torch.randn(4, 128)
        x[1, 3] = float("nan")
        x[2, 5] = float("inf")
        agoq.compress(x, INT8)
        self.assertEqual(agoq.nonfinite_seen(), 2)
        agoq.reset_nonfinite()
        self.assertEqual(agoq.nonfinite_seen(), 0)

    def test_empty_tensors(self):
        for rows, cols in ((0, 128), (5, 0)):
            x = torch.empty(rows, cols)
            buf = agoq.compress(x, INT4)
            self.assertEqual(agoq.decompress(buf, INT4, rows, cols).shape, (rows, cols))

    def test_bad_arguments_raise(self):
        x = torch.randn(4, 128)
        buf = agoq.compress(x, INT4)
        cases = {
            "unknown spec": lambda: agoq.compress(x, "int5_g128_sym_rne_f32"),
            "non-contiguous": lambda: agoq.compress(torch.randn(128, 4).t(), INT4),
            "integer dtype": lambda: agoq.compress(torch.ones(4, 128, dtype=torch.int32), INT4),
            "1-D input": lambda: agoq.compress(torch.randn(128), INT4),
            "short buffer": lambda: agoq.decompress(buf[:-1], INT4, 4, 128),
            "wrong extents": lambda: agoq.decompress(buf, INT4, 8, 128),
            "float buffer": lambda: agoq.decompress(buf.float(), INT4, 4, 128),
            "negative extent": lambda: agoq.decompress(buf, INT4, -1, 128),
            "weight size": lambda: agoq.rmsnorm_forward(x, torch.ones(64), 1e-6, INT8),
            "weight dtype": lambda: agoq.rmsnorm_forward(x, torch.ones(128).double(), 1e-6, INT8),
            "shape mismatch": lambda: agoq.swiglu_forward(x, torch.randn(4, 256), INT4, INT4),
            "negative eps": lambda: agoq.rmsnorm_forward(x, torch.ones(128), -1.0, INT8),
        }
        for name, call in cases.items():
            with self.subTest(name), self.assertRaises((RuntimeError, ValueError)):
                call()
        with self.assertRaisesRegex(TypeError, "torch.dtype"):
            agoq.decompress(buf, INT4, 4, 128, "float32")

    @unittest.skipIf(torch.version.cuda is not None or os.environ.get("AGOQ_TORCH_DEVICE"),
                     "this torch has CUDA, or the device module is built for the emulator")
    def test_no_device_module_without_cuda(self):
        # A CUDA-less torch cannot hold GPU tensors, and the device module says why it is absent.
        with self.assertRaisesRegex(RuntimeError, "this torch has no CUDA"):
            agoq.device_module()


class FusedTest(unittest.TestCase):
    """The fused ops: forward outputs equal the plain ops bit for bit and their float64
    references to rounding; saved copies equal compress(); backward ops equal autograd of the
    reference evaluated on the dequantized saved input."""

    def setUp(self):
        torch.manual_seed(1)

    def test_rmsnorm(self):
        x = torch.randn(33, 256)
        w = torch.rand(256) + 0.5
        y, saved, rstd = agoq.rmsnorm_forward(x, w, 1e-6, INT8, seed=3)
        yp, rstdp = agoq.rmsnorm_forward_plain(x, w, 1e-6)
        self.assertTrue(torch.equal(y, yp) and torch.equal(rstd, rstdp))
        self.assertTrue(torch.equal(saved, agoq.compress(x, INT8, seed=3)))
        ref = rmsnorm_ref(x.double(), w.double(), 1e-6)
        self.assertLess((y.double() - ref).abs().max().item(), 1e-5)
        xh = agoq.decompress(saved, INT8, 33, 256).double().requires_grad_()
        wd = w.double().requires_grad_()
        dy = torch.randn(33, 256)
        # The backward's rstd comes from the forward (the unquantized x); the reference uses it.
        yh = xh * rstd.double()[:, None] * wd
        yh.backward(dy.double())
        # d rstd / d x term, evaluated at x̂ with the saved rstd (the op's documented formula).
        r = rstd.double()[:, None]
        c = (wd.detach() * dy.double() * xh.detach()).mean(1, keepdim=True)
        dx_ref = r * (wd.detach() * dy.double() - xh.detach() * r * r * c)
        dx, dw = agoq.rmsnorm_backward(dy, saved, INT8, rstd, w)
        self.assertLess((dx.double() - dx_ref).abs().max().item(), 1e-4)
        self.assertLess((dw.double() - wd.grad).abs().max().item(), 1e-3)

    def test_swiglu(self):
        g, u = torch.randn(17, 384), torch.randn(17, 384)
        out, sg, su = agoq.swiglu_forward(g, u, INT4, INT8, seed=2, offset=7)
        self.assertTrue(torch.equal(out, agoq.swiglu_forward_plain(g, u)))
        self.assertTrue(torch.equal(sg, agoq.compress(g, INT4, seed=2, offset=7)))
        self.assertTrue(torch.equal(su, agoq.compress(u, INT8, seed=2, offset=7 + g.numel())))
        ref = torch.nn.functional.silu(g.double()) * u.double()
        self.assertLess((out.double() - ref).abs().max().item(), 1e-5)
        gh = agoq.decompress(sg, INT4, 17, 384).double().requires_grad_()
        uh = agoq.decompress(su, INT8, 17, 384).double().requires_grad_()
        d = torch.randn(17, 384)
        (torch.nn.functional.silu(gh) * uh).backward(d.double())
        dg, du = agoq.swiglu_backward(d, sg, INT4, su, INT8)
        self.assertLess((dg.double() - gh.grad).abs().max().item(), 1e-4)
        self.assertLess((du.double() - uh.grad).abs().max().item(), 1e-4)

    def test_gelu_and_residual(self):
        x = torch.randn(9, 256)
        y, saved = agoq.gelu_forward(x, INT8)
        self.assertTrue(torch.equal(y, agoq.gelu_forward_plain(x)))
        ref = torch.nn.functional.gelu(x.double(), approximate="tanh")
        self.assertLess((y.double() - ref).abs().max().item(), 1e-5)
        xh = agoq.decompress(saved, INT8, 9, 256).double().requires_grad_()
        dy = torch.randn(9, 256)
        torch.nn.functional.gelu(xh, approximate="tanh").backward(dy.double())
        dx = agoq.gelu_backward(dy, saved, INT8)
        self.assertLess((dx.double() - xh.grad).abs().max().item(), 1e-4)
        a, b = torch.randn(9, 256), torch.randn(9, 256)
        s, ss = agoq.residual_add(a, b, INT8, seed=4)
        self.assertTrue(torch.equal(s, a + b))
        self.assertTrue(torch.equal(ss, agoq.compress(a + b, INT8, seed=4)))

    def test_measured_forms_are_the_ops_and_measure(self):
        def same(got, want, what):  # bit for bit: the NaN's row has NaN outputs
            self.assertEqual(len(got), len(want), what)
            for g, w in zip(got, want):
                self.assertTrue(torch.equal(g.view(-1).view(torch.uint8),
                                            w.view(-1).view(torch.uint8)), what)

        agoq.reset_nonfinite()
        for dtype in (torch.float32, torch.bfloat16):
            x, g = torch.randn(21, 1100).to(dtype), torch.randn(21, 1100).to(dtype)
            x[2, 5] = float("nan")
            w = (torch.rand(1100) + 0.5).to(dtype)
            for spec in (INT4, INT8_SR, "int8_row_sym_rne_f32", "int4_tensor_sym_rne_f32"):
                what = f"{spec} {dtype}"
                *fwd, st = agoq.rmsnorm_forward_measured(x, w, 1e-6, spec, seed=3, offset=9)
                same(fwd, agoq.rmsnorm_forward(x, w, 1e-6, spec, seed=3, offset=9), what)
                self.assertEqual(st, agoq.measure(x, spec), what)
                *fwd, st_g, st_u = agoq.swiglu_forward_measured(x, g, spec, INT4, seed=3)
                same(fwd, agoq.swiglu_forward(x, g, spec, INT4, seed=3), what)
                self.assertEqual(st_g, agoq.measure(x, spec), what)
                self.assertEqual(st_u, agoq.measure(g, INT4), what)
                *fwd, st = agoq.gelu_forward_measured(x, spec, seed=3)
                same(fwd, agoq.gelu_forward(x, spec, seed=3), what)
                self.assertEqual(st, agoq.measure(x, spec), what)
                *fwd, st = agoq.residual_add_measured(x, g, spec, seed=3)
                same(fwd, agoq.residual_add(x, g, spec, seed=3), what)
                self.assertEqual(st, agoq.measure(fwd[0], spec), what)
        self.assertEqual(agoq.nonfinite_seen(), 64)  # x's NaN, in both calls of each of the ops
        with self.assertRaises(ValueError):
            agoq.gelu_forward_measured(x, "int3_g128_sym_rne_f32")
        with self.assertRaises((RuntimeError, ValueError)):
            agoq.residual_add_measured(x, g[:3], INT4)


class ThreadsTest(unittest.TestCase):
    """The calls run on torch.get_num_threads() threads of agoq's host executor: the same bits
    for any count (tensors large enough to be split: at least 65536 elements per thread)."""

    def run_all(self, threads):
        saved = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            gen = torch.Generator().manual_seed(5)
            x, u = torch.randn(512, 1024, generator=gen), torch.randn(512, 1024, generator=gen)
            w = torch.rand(1024, generator=gen) + 0.5
            out = [agoq.compress(x, INT8_SR, seed=1), agoq.fake_quantize(x, INT4, seed=1)]
            out.append(agoq.decompress(out[0], INT8_SR, 512, 1024))
            # One row of groups (a flat buffer), which the row path splits by groups.
            flat = agoq.compress(x.reshape(1, -1), INT8, seed=1)
            out += [flat, agoq.decompress(flat, INT8, 1, x.numel())]
            y, sx, rstd = agoq.rmsnorm_forward(x, w, 1e-6, INT8, seed=3)
            out += [y, sx, rstd, *agoq.rmsnorm_backward(u, sx, INT8, rstd, w)]
            o, sg, su = agoq.swiglu_forward(x, u, INT4, INT8, seed=2)
            out += [o, sg, su, *agoq.swiglu_backward(u, sg, INT4, su, INT8)]
            gy, gs = agoq.gelu_forward(x, INT4)
            out += [gy, gs, agoq.gelu_backward(u, gs, INT4), *agoq.residual_add(x, u, INT8)]
            buf = agoq.GradientBuffer(x.numel(), seed=4)
            buf.accumulate(x.flatten())
            buf.accumulate(u.flatten())
            out.append(buf.to_tensor())
            p = x.flatten().clone()
            opt = agoq.AdamW8bit(p.numel(), seed=9)
            opt.step(p, u.flatten(), lr=1e-2)
            out.append(p)
            # measure() in one pass (groups of 128) and in two (per row: the dead zones' pass).
            stats = [agoq.measure(x, INT4), agoq.measure(x, "int8_row_sym_rne_f32")]
            return out, stats
        finally:
            torch.set_num_threads(saved)

    def test_same_bits_on_any_number_of_threads(self):
        one, one_stats = self.run_all(1)
        for threads in (2, 3):
            many, many_stats = self.run_all(threads)
            self.assertEqual(len(one), len(many))
            for i, (a, b) in enumerate(zip(one, many)):
                self.assertTrue(torch.equal(a, b), f"output {i} differs on {threads} threads")
            self.assertEqual(one_stats, many_stats, f"measure() differs on {threads} threads")


class GradientAndOptimizerTest(unittest.TestCase):
    def test_gradient_buffer_is_unbiased_and_small(self):
        n, k = 4096, 16
        torch.manual_seed(2)
        grads = [torch.randn(n) for _ in range(k)]
        exact = torch.stack(grads).double().sum(0)
        errs = []
        for seed in range(8):
            b = agoq.GradientBuffer(n, seed=seed)
            for g in grads:
                self.assertEqual(b.accumulate(g), 0)
            errs.append(b.to_tensor().double() - exact)
        self.assertLessEqual(b.bytes, math.ceil(1.04 * n))
        self.assertEqual(b.spec, INT8_SR)
        mean = torch.stack(errs).mean().item()
        rms = torch.stack(errs).pow(2).mean().sqrt().item()
        # docs/gradients.md: RMS <= sqrt(K) * Delta_max / 2, Delta_max = max |sum| / 127.
        self.assertLess(rms, math.sqrt(k) * exact.abs().max().item() / 127 / 2)
        self.assertLess(abs(mean), 5 * rms / math.sqrt(len(errs) * n))
        b.zero()
        self.assertTrue(torch.equal(b.to_tensor(), torch.zeros(n)))
        with self.assertRaises((RuntimeError, ValueError)):
            b.accumulate(torch.randn(n + 1))
        with self.assertRaises(ValueError):
            agoq.GradientBuffer(10, group_size=16)

    def test_adamw8bit_tracks_torch_adamw(self):
        """Least squares min |A p - b|^2 with 1024 parameters and 2048 equations: the 8-bit
        step's loss curve stays within 5% of torch.optim.AdamW's (plus 1% of the initial loss)
        for 300 steps, and with fp32 moments the two agree to rounding."""
        torch.manual_seed(3)
        n = 1024
        a_mat = torch.randn(2 * n, n) / math.sqrt(n)
        b_vec = torch.randn(2 * n)

        def loss_and_grad(p):
            q = p.clone().requires_grad_()
            loss = (a_mat @ q - b_vec).pow(2).mean()
            loss.backward()
            return loss.item(), q.grad

        p_ref = torch.zeros(n, requires_grad=True)
        ref = torch.optim.AdamW([p_ref], lr=1e-2, weight_decay=0.01)
        p8, p32 = torch.zeros(n), torch.zeros(n)
        opt8 = agoq.AdamW8bit(n, seed=9)
        opt32 = agoq.AdamW8bit(n, m_format="f32", v_format="f32")
        loss0 = loss_and_grad(p8)[0]
        for _ in range(300):
            ref.zero_grad()
            loss_ref = (a_mat @ p_ref - b_vec).pow(2).mean()
            loss_ref.backward()
            ref.step()
            loss8, g8 = loss_and_grad(p8)
            self.assertEqual(opt8.step(p8, g8, lr=1e-2, weight_decay=0.01), 0)
            self.assertLessEqual(abs(loss8 - loss_ref.item()), 0.05 * loss_ref.item() + 0.01 * loss0)
            opt32.step(p32, loss_and_grad(p32)[1], lr=1e-2, weight_decay=0.01)
        self.assertLess(loss_and_grad(p8)[0], 0.7 * loss0)
        self.assertLess((p32 - p_ref.detach()).abs().max().item(), 1e-4)
        self.assertEqual(opt8.step_count, 300)
        self.assertLess(opt8.bytes_per_parameter, 2.1)
        self.assertTrue(bool(torch.isfinite(p8).all()))
        with self.assertRaises((RuntimeError, ValueError)):
            opt8.step(p8, torch.randn(n - 1), lr=1e-2)
        with self.assertRaises(ValueError):
            agoq.AdamW8bit(16, v_format="int3")

    def test_adamw8bit_checkpoint_resumes_bit_for_bit(self):
        """state_bytes / from_state_bytes and pickling give a state that continues the run with
        the same parameters, bit for bit; a damaged record raises ValueError."""
        torch.manual_seed(5)
        n = 1000
        p = torch.randn(n)
        opt = agoq.AdamW8bit(n, seed=4)
        for _ in range(3):
            opt.step(p, torch.randn(n), lr=1e-2)
        record = opt.state_bytes()
        restored = agoq.AdamW8bit.from_state_bytes(record)
        pickled = pickle.loads(pickle.dumps(opt))
        self.assertEqual(restored.step_count, 3)
        self.assertEqual(pickled.state_bytes(), record)
        p1, p2, p3 = p.clone(), p.clone(), p.clone()
        for _ in range(3):
            g = torch.randn(n)
            opt.step(p1, g, lr=1e-2)
            restored.step(p2, g, lr=1e-2)
            pickled.step(p3, g, lr=1e-2)
        self.assertTrue(torch.equal(p1, p2))
        self.assertTrue(torch.equal(p1, p3))
        self.assertEqual(opt.state_bytes(), restored.state_bytes())
        with self.assertRaises(ValueError):
            agoq.AdamW8bit.from_state_bytes(record[: len(record) // 2])
        with self.assertRaises(ValueError):
            agoq.AdamW8bit.from_state_bytes(b"AGOQTNSR" + record[8:])


class PlanningTest(unittest.TestCase):
    def test_model_presets_are_whole_models(self):
        presets = agoq.model_presets()
        self.assertEqual(list(presets), ["llama3-8b", "llama3-70b", "llama3-405b", "qwen2.5-32b",
                                         "qwen3-8b", "qwen3-32b", "gpt3-1.3b", "mixtral-8x7b",
                                         "qwen3-30b-a3b", "qwen3-235b-a22b", "qwen1.5-moe-a2.7b",
                                         "qwen2-57b-a14b", "gemma2-2b", "gemma2-9b", "gemma2-27b",
                                         "gemma3-1b"])
        self.assertEqual(presets["qwen3-8b"]["style"], "qwen3")
        llama = presets["llama3-8b"]
        self.assertEqual(llama, dict(style="llama", layers=32, hidden=4096, ffn=14336, heads=32,
                                     kv_heads=8, head_dim=128, vocab=128256,
                                     tied_embeddings=False, experts=0, experts_per_token=0,
                                     expert_ffn=0, shared_expert_ffn=0,
                                     shared_expert_gate=False))
        self.assertEqual(presets["gpt3-1.3b"]["style"], "gpt")
        # The memory table of agoq_plan's README command (docs/activations.md, section 6), stage 0.
        mem = agoq.estimate_memory(llama, 1, 8192, gradients="int8", pp=4, tp=2, dp=4, zero=1,
                                   sp=True)
        self.assertEqual(round(mem[0]["total"] / 2**30, 2), 14.87)

    def test_model_from_hf_config(self):
        # Qwen2.5-32B's config.json as released: a dict, its JSON file, the directory holding it
        # and an object with to_dict() (as transformers' configs) give the preset's shape.
        qwen = {"architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0,
                "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu",
                "hidden_size": 5120, "initializer_range": 0.02, "intermediate_size": 27648,
                "max_position_embeddings": 131072, "max_window_layers": 64,
                "model_type": "qwen2", "num_attention_heads": 40, "num_hidden_layers": 64,
                "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
                "sliding_window": 131072, "tie_word_embeddings": False,
                "torch_dtype": "bfloat16", "transformers_version": "4.43.1", "use_cache": True,
                "use_sliding_window": False, "vocab_size": 152064, "rope_scaling": None}
        preset = agoq.model_presets()["qwen2.5-32b"]
        self.assertEqual(agoq.model_from_hf_config(qwen), preset)

        class Config:
            def to_dict(self):
                return dict(qwen)
        self.assertEqual(agoq.model_from_hf_config(Config()), preset)
        with tempfile.TemporaryDirectory() as d:
            path = pathlib.Path(d) / "config.json"
            path.write_text(json.dumps(qwen, indent=2))
            self.assertEqual(agoq.model_from_hf_config(path), preset)
            self.assertEqual(agoq.model_from_hf_config(str(path)), preset)
            self.assertEqual(agoq.model_from_hf_config(d), preset)
            path.write_text('{"model_type": "qwen2", }')
            with self.assertRaisesRegex(ValueError, "expected a string key at byte 24"):
                agoq.model_from_hf_config(d)
            with self.assertRaisesRegex(ValueError, "cannot open"):
                agoq.model_from_hf_config(pathlib.Path(d) / "missing.json")
        # The result is a model the planning calls take.
        gpt = agoq.model_from_hf_config({"model_type": "gpt2", "n_layer": 4, "n_embd": 128,
                                         "n_head": 4, "vocab_size": 256})
        self.assertEqual(gpt, dict(style="gpt", layers=4, hidden=128, ffn=512, heads=4,
                                   kv_heads=4, head_dim=32, vocab=256, tied_embeddings=True,
                                   experts=0, experts_per_token=0, expert_ffn=0,
                                   shared_expert_ffn=0, shared_expert_gate=False))
        self.assertGreater(agoq.estimate_memory(gpt, 1, 64)[0]["total"], 0)
        # Refusals: mixture-of-experts, other blocks, bad fields and values.
        with self.assertRaisesRegex(ValueError, "mixture-of-experts models \\(llama\\)"):
            agoq.model_from_hf_config({"model_type": "llama", "num_local_experts": 8})
        with self.assertRaisesRegex(ValueError, "model_type 'gemma3n' is not modelled"):
            agoq.model_from_hf_config({"model_type": "gemma3n"})
        with self.assertRaisesRegex(ValueError, "'hidden_size' must be a positive integer"):
            agoq.model_from_hf_config(dict(qwen, hidden_size=5120.5))
        with self.assertRaisesRegex(ValueError, "'tie_word_embeddings' must be true or false"):
            agoq.model_from_hf_config(dict(qwen, tie_word_embeddings=1))
        with self.assertRaisesRegex(ValueError, "the value of 'torch_dtype' is not a JSON value"):
            agoq.model_from_hf_config(dict(qwen, torch_dtype=torch.bfloat16))
        with self.assertRaises(TypeError):
            agoq.model_from_hf_config(42)

    def test_qwen3_block(self):
        # LLaMA's kinds and the QK-norm's inputs after the QKV projection's input, [T, q] and
        # [T, k]; kept bf16 under the default policy (attention core); Qwen3-8B's config.
        kinds = agoq.tensor_kinds("qwen3")
        self.assertEqual(kinds[:4], ["attn_norm_input", "qkv_input", "query_norm_input",
                                     "key_norm_input"])
        self.assertEqual(sorted(kinds), sorted(agoq.tensor_kinds("llama") +
                                               ["query_norm_input", "key_norm_input"]))
        qwen3 = dict(LLAMA, style="qwen3", kv_heads=2)
        shapes = agoq.saved_shapes(qwen3, 2, 64)
        self.assertEqual(shapes["query_norm_input"], (128, 128, 2))
        self.assertEqual(shapes["key_norm_input"], (128, 64, 2))
        self.assertEqual(agoq.default_policy()["query_norm_input"][0], "bf16")
        plan = agoq.make_plan(qwen3, 2, 64, 1 << 40)
        self.assertEqual({layer["key_norm_input"] for layer in plan["layers"]}, {"bf16"})
        llama = agoq.estimate_memory(dict(qwen3, style="llama"), 2, 64)[0]
        self.assertEqual(agoq.estimate_memory(qwen3, 2, 64)[0]["activations"] -
                         llama["activations"], 4 * 2 * 128 * (128 + 64))
        self.assertEqual(agoq.model_from_hf_config(
            {"model_type": "qwen3", "num_hidden_layers": 36, "hidden_size": 4096,
             "intermediate_size": 12288, "num_attention_heads": 32, "num_key_value_heads": 8,
             "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": False}),
            agoq.model_presets()["qwen3-8b"])
        with self.assertRaisesRegex(ValueError, "unknown block style 'mixtral'"):
            agoq.tensor_kinds("mixtral")
        with self.assertRaisesRegex(ValueError, "unknown block style 'mixtral'"):
            agoq.make_plan(dict(qwen3, style="mixtral"), 2, 64, 1 << 40)

    def test_moe_block(self):
        # A mixture-of-experts model: the router's fp32 probabilities (kept, routing) and the
        # experts' tensors, R = tokens k rows; Qwen3-MoE's config (an empty mlp_only_layers list);
        # the parameters and the experts' share of them.
        kinds = agoq.tensor_kinds("llama", moe=True)
        self.assertEqual(kinds[10:], ["router_probs", "expert_input", "expert_gate_output",
                                      "expert_up_output", "expert_swiglu_output"])
        self.assertEqual(agoq.tensor_kinds("qwen3", True)[:4], agoq.tensor_kinds("qwen3")[:4])
        moe = dict(LLAMA, ffn=0, experts=8, experts_per_token=2, expert_ffn=96)
        shapes = agoq.saved_shapes(moe, 2, 64)
        self.assertEqual(shapes["router_probs"], (128, 8, 4))
        self.assertEqual(shapes["expert_input"], (256, LLAMA["hidden"], 2))
        self.assertEqual(shapes["expert_swiglu_output"], (256, 96, 2))
        self.assertNotIn("gate_output", shapes)
        self.assertEqual(agoq.default_policy()["router_probs"], ("fp32", ["fp32"]))
        self.assertEqual(agoq.error_model_defaults()["router_probs"][0], "routing")
        plan = agoq.make_plan(moe, 2, 64, 1 << 40)
        self.assertEqual({layer["router_probs"] for layer in plan["layers"]}, {"fp32"})
        mixtral = agoq.model_presets()["mixtral-8x7b"]
        mem = agoq.estimate_memory(mixtral, 1, 4096, pp=4)
        self.assertEqual(sum(s["parameters"] for s in mem), 46702792704)
        self.assertEqual(sum(s["expert_parameters"] for s in mem), 45097156608)
        # agoq_plan's Mixtral command (docs/activations.md, section 6; its AGoQ table: default
        # policy, 8-bit gradients): EP 4, etp = tp = 2, one expert data-parallel rank; with
        # etp 1, 2 whole experts a rank and ZeRO over 2 ranks.
        args = dict(pp=4, tp=2, sp=True, dp=4, zero=1, ep=4)
        base = agoq.estimate_memory(mixtral, 1, 8192, gradients="int8", **args)
        self.assertEqual(round(max(s["total"] for s in base) / 2**30, 2), 33.74)
        plan = agoq.make_plan(mixtral, 1, 8192, 40 << 30, **args)
        self.assertLessEqual(max(s["total"] for s in plan["stages"]), 40 << 30)
        self.assertEqual({layer["router_probs"] for layer in plan["layers"]}, {"fp32"})
        whole = agoq.estimate_memory(mixtral, 1, 8192, gradients="int8", **dict(args, etp=1))
        self.assertEqual(whole[1]["expert_parameters"], 8 * 2 * 3 * 4096 * 14336)
        # Twice the experts' bf16 weights a rank, but the same Adam moments: the 2 expert
        # data-parallel ranks of etp 1 shard what etp 2 splits.
        self.assertEqual(whole[1]["weights"] - base[1]["weights"],
                         2 * (whole[1]["expert_parameters"] - base[1]["expert_parameters"]))
        self.assertEqual(whole[1]["expert_parameters"], 2 * base[1]["expert_parameters"])
        self.assertEqual(whole[1]["optimizer"], base[1]["optimizer"])
        self.assertEqual(agoq.saved_shapes(mixtral, 1, 8192, tp=2, sp=True, etp=1)
                         ["expert_input"], (8192, 4096, 2))
        self.assertEqual(agoq.saved_shapes(mixtral, 1, 8192, tp=2, sp=True)["expert_input"],
                         (16384, 4096, 2))
        # A capacity factor of 1.25 pads each expert's pairs: ceil(8192 / 8 x 1.25) = 1280 of each
        # rank's 4096 x 2, R = etp 2 x 8 x 1280.
        self.assertEqual(agoq.saved_shapes(mixtral, 1, 8192, tp=2, sp=True,
                                           expert_capacity_factor=1.25)["expert_input"],
                         (20480, 4096, 2))
        padded = agoq.estimate_memory(mixtral, 1, 8192, gradients="int8",
                                      expert_capacity_factor=1.25, **args)
        self.assertEqual(round(max(s["total"] for s in padded) / 2**30, 2), 35.58)
        # moe_act: the experts' SwiGLU output computed again (agoq_plan's Mixtral command with
        # --recompute-modules moe_act, docs/activations.md section 6); 12 sets of modules.
        act = agoq.estimate_memory(mixtral, 1, 8192, gradients="int8",
                                   recompute_modules=["moe_act"], **args)
        self.assertEqual(round(max(s["total"] for s in act) / 2**30, 2), 31.88)
        plan = agoq.make_plan(mixtral, 1, 8192, 40 << 30, recompute_modules=["moe_act"], **args)
        self.assertEqual(plan["recomputed_kinds"], ["expert_swiglu_output"])
        self.assertEqual(len(agoq.selective_options(mixtral, 1, 8192, 30 << 30, **args)
                             ["options"]), 12)
        # A measured routing's load factor (the busiest of 4 ranks takes 5120 of 16384 pairs) as
        # the capacity factor.
        topk = torch.tensor([0] * 2048 + [1] * 1024 + [2] * 2560 + [3] * 2560 + [4] * 1536
                            + [5] * 2048 + [6] * 2048 + [7] * 2560)
        load = agoq.expert_load_factor(torch.bincount(topk, minlength=8).tolist(), ep=4)
        self.assertEqual(load, 1.25)
        self.assertEqual(agoq.expert_load_factor([3, 1], 1), 1.0)
        with self.assertRaisesRegex(ValueError, "ep \\(3\\) must divide the experts \\(2\\)"):
            agoq.expert_load_factor([3, 1], 3)
        with self.assertRaisesRegex(ValueError, "capacity factor must be finite and >= 0"):
            agoq.estimate_memory(mixtral, 1, 8192, expert_capacity_factor=-1.0, **args)
        with self.assertRaisesRegex(ValueError, "ep \\(3\\) must divide the experts"):
            agoq.estimate_memory(mixtral, 1, 8192, **dict(args, ep=3))
        with self.assertRaisesRegex(ValueError, "ep and etp are a mixture-of-experts model's"):
            agoq.make_plan(LLAMA, 1, 64, 1 << 40, ep=2)
        config = {"model_type": "qwen3_moe", "num_hidden_layers": 48, "hidden_size": 2048,
                  "intermediate_size": 6144, "num_attention_heads": 32,
                  "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
                  "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
                  "mlp_only_layers": [], "decoder_sparse_step": 1, "tie_word_embeddings": False}
        self.assertEqual(agoq.model_from_hf_config(config), agoq.model_presets()["qwen3-30b-a3b"])
        with self.assertRaisesRegex(ValueError, "mlp_only_layers is not an empty list"):
            agoq.model_from_hf_config(dict(config, mlp_only_layers=[0, 1]))
        with self.assertRaisesRegex(ValueError, "a mixture-of-experts model has ffn 0"):
            agoq.estimate_memory(dict(moe, ffn=128), 1, 64)
        with self.assertRaisesRegex(ValueError, "with tp > 1 needs sequence parallelism"):
            agoq.estimate_memory(moe, 1, 64, tp=2)

    def test_shared_experts(self):
        # Shared experts: the dense MLP's three tensors at their width after the routed experts',
        # gated (Qwen2-MoE) also their output and gate score (bf16, kept: routing).
        kinds = agoq.tensor_kinds("llama", moe=True, shared="gated")
        self.assertEqual(kinds[:15], agoq.tensor_kinds("llama", moe=True))
        self.assertEqual(kinds[15:], ["gate_output", "up_output", "swiglu_output",
                                      "shared_expert_output", "shared_gate_score"])
        self.assertEqual(agoq.tensor_kinds("qwen3", True, "plain")[-3:],
                         ["gate_output", "up_output", "swiglu_output"])
        with self.assertRaisesRegex(ValueError, "shared is 'none', 'plain' or 'gated'"):
            agoq.tensor_kinds("llama", True, "both")
        moe = dict(LLAMA, ffn=0, experts=8, experts_per_token=2, expert_ffn=96,
                   shared_expert_ffn=192, shared_expert_gate=True)
        shapes = agoq.saved_shapes(moe, 2, 64, tp=2, sp=True)
        self.assertEqual(shapes["gate_output"], (128, 96, 2))
        self.assertEqual(shapes["shared_expert_output"], (64, LLAMA["hidden"], 2))
        self.assertEqual(shapes["shared_gate_score"], (64, 1, 2))
        self.assertEqual(agoq.default_policy()["shared_gate_score"], ("bf16", ["bf16"]))
        self.assertEqual(agoq.error_model_defaults()["shared_expert_output"][0],
                         "activation_input")
        plan = agoq.make_plan(moe, 2, 64, 1 << 40)
        self.assertEqual({layer["shared_gate_score"] for layer in plan["layers"]}, {"bf16"})
        # Qwen's published totals and their config: 57.4 B parameters, of which the routed
        # experts 53.9 B.
        qwen2 = agoq.model_presets()["qwen2-57b-a14b"]
        self.assertEqual(qwen2["shared_expert_ffn"], 20480)
        self.assertTrue(qwen2["shared_expert_gate"])
        mem = agoq.estimate_memory(qwen2, 1, 4096, pp=4)
        self.assertEqual(sum(s["parameters"] for s in mem), 57408529920)
        self.assertEqual(sum(s["expert_parameters"] for s in mem), 28 * 64 * 3 * 3584 * 2560)
        config = {"model_type": "qwen2_moe", "num_hidden_layers": 28, "hidden_size": 3584,
                  "intermediate_size": 18944, "num_attention_heads": 28,
                  "num_key_value_heads": 4, "vocab_size": 151936, "num_experts": 64,
                  "num_experts_per_tok": 8, "moe_intermediate_size": 2560,
                  "shared_expert_intermediate_size": 20480, "tie_word_embeddings": False}
        self.assertEqual(agoq.model_from_hf_config(config), qwen2)
        # agoq_plan's Qwen2-57B-A14B command (docs/activations.md, section 6).
        args = dict(pp=4, tp=4, sp=True, dp=8, zero=1, ep=8, etp=1)
        agoq_mem = agoq.estimate_memory(qwen2, 1, 8192, gradients="int8", **args)
        self.assertEqual(round(max(s["total"] for s in agoq_mem) / 2**30, 2), 18.67)
        ungated = agoq.estimate_memory(dict(qwen2, shared_expert_gate=False), 1, 8192,
                                       gradients="int8", **args)
        self.assertEqual(agoq_mem[1]["parameters"] - ungated[1]["parameters"], 7 * 3584)
        with self.assertRaisesRegex(ValueError, "shared_expert_gate needs shared experts"):
            agoq.estimate_memory(dict(moe, shared_expert_ffn=0), 1, 64)
        # Megatron-Core's MoE recompute modules: shared_experts drops their five tensors; every
        # set of the model's modules is an option (20 with shared experts, no mlp).
        kept = agoq.estimate_memory(qwen2, 1, 8192, gradients="int8", **args)
        shared = agoq.estimate_memory(qwen2, 1, 8192, gradients="int8",
                                      recompute_modules=["shared_experts"], **args)
        # Stage 1 holds 3 micro-batches of 7 layers; each drops the shared experts' three int4
        # [8192, 20480 / 4] tensors, their int4 output [2048, 3584] and bf16 gate score [2048, 1].
        dropped = (3 * agoq.quantized_bytes(INT4, 8192, 5120) +
                   agoq.quantized_bytes(INT4, 2048, 3584) + 2048 * 2)
        self.assertEqual(kept[1]["activations"] - shared[1]["activations"], 3 * 7 * dropped)
        options = agoq.selective_options(qwen2, 1, 8192, 17 << 30, **args)["options"]
        self.assertEqual(len(options), 20)
        self.assertNotIn("mlp", {m for o in options for m in o["modules"]})
        with self.assertRaisesRegex(ValueError, "a dense MLP's module is mlp"):
            agoq.estimate_memory(LLAMA, 1, 64, recompute_modules=["moe_act"])
        with self.assertRaisesRegex(ValueError, "shared_expert_gate need experts > 0"):
            agoq.estimate_memory(dict(LLAMA, shared_expert_ffn=64), 1, 64)

    def test_gemma(self):
        # Gemma 2 and 3: LLaMA's kinds with the post-norms' inputs (Gemma 3 also the QK-norm's),
        # the published parameter counts, transformers' defaults in their configs.
        self.assertEqual(agoq.tensor_kinds("gemma2")[8], "post_attn_norm_input")
        self.assertEqual(agoq.tensor_kinds("gemma3")[2:4], ["query_norm_input", "key_norm_input"])
        presets = agoq.model_presets()
        for name, total in (("gemma2-9b", 9241705984), ("gemma3-1b", 999885952)):
            self.assertEqual(agoq.estimate_memory(presets[name], 1, 4096)[0]["parameters"], total)
        config = {"model_type": "gemma2", "num_hidden_layers": 42, "hidden_size": 3584,
                  "intermediate_size": 14336, "num_attention_heads": 16,
                  "num_key_value_heads": 8, "vocab_size": 256000,
                  "hidden_activation": "gelu_pytorch_tanh"}
        self.assertEqual(agoq.model_from_hf_config(config), presets["gemma2-9b"])
        shapes = agoq.saved_shapes(presets["gemma2-9b"], 1, 64, tp=2, sp=True)
        self.assertEqual(shapes["post_mlp_norm_input"], (32, 3584, 2))
        # agoq_plan's Gemma-2-27B command (docs/activations.md, section 6).
        mem = agoq.estimate_memory(presets["gemma2-27b"], 1, 8192, gradients="int8", tp=4,
                                   sp=True, pp=2, dp=8, zero=1)
        self.assertEqual(round(max(s["total"] for s in mem) / 2**30, 2), 26.18)
        with self.assertRaisesRegex(ValueError, "nests its text model"):
            agoq.model_from_hf_config({"model_type": "gemma3"})
        with self.assertRaisesRegex(ValueError, "needs a LLaMA- or Qwen3-style block, not gemma2"):
            agoq.estimate_memory(dict(presets["gemma2-2b"], ffn=0, experts=8,
                                      experts_per_token=2, expert_ffn=512), 1, 64)

    def test_layer_bytes_match_the_shapes(self):
        shapes = agoq.saved_shapes(LLAMA, 8, 128)
        kinds = agoq.tensor_kinds("llama")
        self.assertEqual(list(shapes), kinds)
        store = {k: ("fp32" if k == "softmax_lse" else "bf16") for k in kinds}
        expected = sum(r * c * b for k, (r, c, b) in shapes.items() if k != "o_proj_input")
        self.assertEqual(agoq.layer_activation_bytes(LLAMA, 8, 128, store), expected)
        store = {k: (INT4 if k in ("qkv_input", "mlp_input") else v) for k, v in store.items()}
        quant = sum(agoq.quantized_bytes(INT4, *shapes[k][:2]) for k in ("qkv_input", "mlp_input"))
        bf16 = sum(2 * shapes[k][0] * shapes[k][1] for k in ("qkv_input", "mlp_input"))
        self.assertEqual(agoq.layer_activation_bytes(LLAMA, 8, 128, store),
                         expected - bf16 + quant)

    def test_recomputation(self):
        # LLAMA on 2 stages: chunks of 2 layers; stage 0 holds 2 micro-batches at its peak.
        base = agoq.estimate_memory(LLAMA, 8, 128, pp=2)
        every = agoq.estimate_memory(LLAMA, 8, 128, pp=2, recompute="uniform", recompute_layers=1)
        # Each layer keeps only its input, [8 x 128 tokens, 128] bf16; the largest checkpoint's
        # tensors (one layer, in bf16 as the planner keeps them) come back while it is recomputed.
        bf16 = {k: ("fp32" if k == "softmax_lse" else "bf16") for k in agoq.tensor_kinds("llama")}
        self.assertEqual(every[0]["in_flight"], [2])
        self.assertEqual(every[0]["activations"], 2 * 2 * (2 * 1024 * 128))
        self.assertEqual(every[0]["recompute"], agoq.layer_activation_bytes(LLAMA, 8, 128, bf16))
        for mem in every:
            self.assertEqual(mem["transient"], mem["working"] + mem["gradient_buffers"]
                             + mem["reserved"] + mem["recompute"])
        self.assertEqual(base[0]["recompute"], 0)
        plan = agoq.make_plan(LLAMA, 8, 128, 2 * base[0]["total"], pp=2, recompute="block",
                              recompute_layers=1)
        self.assertEqual(plan["recomputed"], [0, 2])  # the first layer of each chunk
        for layer in plan["recomputed"]:
            self.assertTrue(all(s in ("bf16", "fp32") for s in plan["layers"][layer].values()))
        self.assertGreater(plan["stages"][0]["recompute"], 0)
        self.assertEqual(agoq.make_plan(LLAMA, 8, 128, 2 * base[0]["total"], pp=2)["recomputed"],
                         [])
        # The fewest layers of each chunk to recompute (block) for a plan to fit: over a sweep of
        # budgets, a plan with that many fits and, where it is 1 or 2, none without; None where
        # even both layers do not fit.
        kw = dict(pp=2, reserved_bytes=0)
        total = agoq.estimate_memory(LLAMA, 8, 128, **kw)[0]["total"]
        seen = set()
        for budget in range(total // 4, total, total // 200):
            n = agoq.least_block_recompute(LLAMA, 8, 128, budget, **kw)
            seen.add(n)
            if n is None:
                with self.assertRaises(ValueError):
                    agoq.make_plan(LLAMA, 8, 128, budget, recompute="block", recompute_layers=2,
                                   **kw)
                continue
            if n > 0:
                agoq.make_plan(LLAMA, 8, 128, budget, recompute="block", recompute_layers=n, **kw)
                with self.assertRaises(ValueError):
                    agoq.make_plan(LLAMA, 8, 128, budget, **kw)
            else:
                agoq.make_plan(LLAMA, 8, 128, budget, **kw)
        # Never 1 here: its layer in bf16 while recomputed costs more than 2 micro-batches of it
        # quantized less its checkpoint's input save; with both, the checkpoints save more.
        self.assertEqual(seen, {None, 0, 2})
        with self.assertRaisesRegex(ValueError, "recompute: 'none', 'uniform' or 'block'"):
            agoq.estimate_memory(LLAMA, 8, 128, recompute="selective", recompute_layers=1)
        with self.assertRaisesRegex(ValueError, "at least 1 with recompute uniform"):
            agoq.estimate_memory(LLAMA, 8, 128, recompute="uniform")

    def test_uneven_pipeline_stages(self):
        # LLAMA's 4 layers on 3 stages, 1 on the first and the last, 2 on the other (Megatron-Core's
        # num_layers_in_first/last_pipeline_stage); the even split of 2 stages for comparison.
        uneven = dict(pp=3, first_stage_layers=1, last_stage_layers=1)
        mem = agoq.estimate_memory(LLAMA, 8, 128, **uneven)
        even = agoq.estimate_memory(LLAMA, 8, 128, pp=2)
        self.assertEqual([m["layers"] for m in mem], [1, 2, 1])
        self.assertEqual([m["layers"] for m in even], [2, 2])
        self.assertEqual(sum(m["parameters"] for m in mem), sum(m["parameters"] for m in even))
        self.assertEqual([m["in_flight"] for m in mem], [[3], [2], [1]])
        # Block recomputation of each chunk's first layer: layer 0, 1 and 3.
        budget = 2 * max(m["total"] for m in mem)
        plan = agoq.make_plan(LLAMA, 8, 128, budget, recompute="block", recompute_layers=1,
                              **uneven)
        self.assertEqual(plan["recomputed"], [0, 1, 3])
        self.assertEqual([s["layers"] for s in plan["stages"]], [1, 2, 1])
        # The largest chunk has 2 layers: the 8 sets, block 1, uniform 1 and 2.
        options = agoq.recompute_options(LLAMA, 8, 128, budget, **uneven)["options"]
        self.assertEqual(len(options), 11)
        self.assertEqual(agoq.least_block_recompute(LLAMA, 8, 128, budget, **uneven), 0)
        with self.assertRaisesRegex(ValueError, "4 layers do not split into 3 stages x 1 chunks"):
            agoq.estimate_memory(LLAMA, 8, 128, pp=3)
        with self.assertRaisesRegex(ValueError, "do not split evenly into the other 1 pipeline"):
            agoq.estimate_memory(LLAMA, 8, 128, pp=3, first_stage_layers=3, last_stage_layers=1)

    def test_embedding_and_loss_in_pipeline_split(self):
        # Megatron-Core's account_for_embedding/loss_in_pipeline_split: LLAMA's 4 layers and the
        # two counted on 3 stages, 2 units each: 1, 2, 1 layers, the same as uneven stages of 1.
        counted = dict(pp=3, account_for_embedding=True, account_for_loss=True)
        mem = agoq.estimate_memory(LLAMA, 8, 128, **counted)
        self.assertEqual([m["layers"] for m in mem], [1, 2, 1])
        self.assertEqual(mem, agoq.estimate_memory(LLAMA, 8, 128, pp=3, first_stage_layers=1,
                                                   last_stage_layers=1))
        budget = 2 * max(m["total"] for m in mem)
        plan = agoq.make_plan(LLAMA, 8, 128, budget, recompute="block", recompute_layers=1,
                              **counted)
        self.assertEqual(plan["recomputed"], [0, 1, 3])
        # Interleaved (vp 2, chunks of 1 unit), which uneven stages of 1 layer cannot be: the
        # first device's first chunk and the last device's last hold no layer.
        inter = dict(counted, vp=2, micro_batches=6)
        mem = agoq.estimate_memory(LLAMA, 8, 128, **inter)
        self.assertEqual([m["layers"] for m in mem], [1, 2, 1])
        plan = agoq.make_plan(LLAMA, 8, 128, budget, **inter)
        self.assertEqual([s["layers"] for s in plan["stages"]], [1, 2, 1])
        self.assertIsNone(agoq.find_shortfall(LLAMA, 8, 128, budget, **inter))
        # 1 unit a chunk: no block N below the largest chunk, uniform 1.
        self.assertEqual(len(agoq.recompute_options(LLAMA, 8, 128, budget, **inter)["options"]),
                         8 + 1)
        with self.assertRaisesRegex(ValueError,
                                    "4 layers and the embedding do not split into 2 stages"):
            agoq.estimate_memory(LLAMA, 8, 128, pp=2, account_for_embedding=True)
        with self.assertRaisesRegex(ValueError, "they exclude first_stage_layers"):
            agoq.estimate_memory(LLAMA, 8, 128, first_stage_layers=1, **counted)
        # The same interleaved split as Megatron-Core's layout string (vp from its 6 chunks).
        layout = dict(pp=3, pipeline_layout="E|t|t|t|t|L", micro_batches=6)
        self.assertEqual(agoq.estimate_memory(LLAMA, 8, 128, **layout), mem)
        self.assertEqual(agoq.make_plan(LLAMA, 8, 128, budget, **layout), plan)
        with self.assertRaisesRegex(ValueError, r"multi-token prediction layers \('m'\)"):
            agoq.estimate_memory(LLAMA, 8, 128, pp=2, pipeline_layout="Ett|ttm|L")
        with self.assertRaisesRegex(ValueError, "places 3 transformer layers, not the model's 4"):
            agoq.estimate_memory(LLAMA, 8, 128, pp=2, pipeline_layout="Ett|tL")

    def test_selective_recomputation(self):
        # Megatron's recompute_modules: layernorm recomputes the norms' outputs, mlp the MLP's
        # inner tensors, so of a layer's saved tensors only the others are kept, on every stage
        # and for every micro-batch in flight. The largest micro-batch count is stage 0's.
        modules = ["layernorm", "mlp"]
        gone = ["qkv_input", "mlp_input", "gate_output", "up_output", "swiglu_output"]
        bf16 = {k: ("fp32" if k == "softmax_lse" else "bf16") for k in agoq.tensor_kinds("llama")}
        layer = agoq.layer_activation_bytes(LLAMA, 8, 128, bf16)
        shapes = agoq.saved_shapes(LLAMA, 8, 128)
        dropped = sum(2 * shapes[k][0] * shapes[k][1] for k in gone)
        self.assertGreater(dropped, 0)
        kw = dict(pp=2, gradients="int8",
                  policy={k: (v, [v]) for k, v in bf16.items() if k != "o_proj_input"})
        base = agoq.estimate_memory(LLAMA, 8, 128, **kw)
        sel = agoq.estimate_memory(LLAMA, 8, 128, recompute_modules=modules, **kw)
        for b, s in zip(base, sel):
            flight = s["in_flight"][0]
            self.assertEqual(b["activations"], flight * 2 * layer)  # 2 layers a stage
            self.assertEqual(s["activations"], flight * 2 * (layer - dropped))
            self.assertLess(s["activations"], b["activations"])
            self.assertEqual(s["total"], s["states"] + s["activations"]
                             + s["head_activations"] + s["transient"])
        # The order given does not matter, nor does a module named twice.
        self.assertEqual(agoq.estimate_memory(LLAMA, 8, 128, recompute_modules=["mlp", "layernorm",
                                                                                 "mlp"], **kw),
                         sel)
        # The plan: those kinds recomputed in every layer (bf16 in 'layers', as recomputed
        # layers' tensors are), the others planned, and no layer fully recomputed.
        budget = 2 * sel[0]["total"]
        plan = agoq.make_plan(LLAMA, 8, 128, budget, pp=2, recompute_modules=modules)
        self.assertEqual(plan["recompute_modules"], modules)
        self.assertEqual(plan["recomputed_kinds"], gone)
        self.assertEqual(plan["recomputed"], [])
        for kinds in plan["layers"]:
            self.assertEqual(set(kinds), set(bf16))
            for k in gone:
                self.assertEqual(kinds[k], "bf16")
        plain = agoq.make_plan(LLAMA, 8, 128, budget, pp=2)
        self.assertEqual((plain["recompute_modules"], plain["recomputed_kinds"]), ([], []))
        # core_attn recomputes the logsumexp alone; GPT's norm outputs and MLP tensors by name.
        attn = agoq.make_plan(LLAMA, 8, 128, budget, pp=2, recompute_modules=["core_attn"])
        self.assertEqual(attn["recomputed_kinds"], ["softmax_lse"])
        self.assertEqual(attn["layers"][0]["softmax_lse"], "fp32")
        gpt = dict(LLAMA, style="gpt")
        gpt_plan = agoq.make_plan(gpt, 8, 128, 4 * sel[0]["total"], pp=2,
                                  recompute_modules=["mlp", "layernorm"])
        self.assertEqual(gpt_plan["recompute_modules"], modules)
        self.assertEqual(gpt_plan["recomputed_kinds"],
                         ["qkv_input", "fc1_input", "gelu_input", "fc2_input"])
        # The kept tensors that fit with the modules recomputed but not without: a plan with them
        # fits a budget that refuses one without (bf16 only: nothing to quantize instead).
        tight = max(s["total"] for s in sel)
        agoq.make_plan(LLAMA, 8, 128, tight, recompute_modules=modules, **kw)
        with self.assertRaisesRegex(ValueError, "falls short"):
            agoq.make_plan(LLAMA, 8, 128, tight, **kw)
        # An unknown name (or an empty one) and full recomputation beside it: ValueError.
        for bad in (["bogus"], ["mlp", ""]):
            with self.assertRaisesRegex(ValueError, "unknown module"):
                agoq.estimate_memory(LLAMA, 8, 128, recompute_modules=bad)
            with self.assertRaisesRegex(ValueError, "unknown module"):
                agoq.make_plan(LLAMA, 8, 128, budget, recompute_modules=bad)
        with self.assertRaisesRegex(ValueError, "exclude each other"):
            agoq.estimate_memory(LLAMA, 8, 128, recompute="uniform", recompute_layers=1,
                                 recompute_modules=["mlp"])
        with self.assertRaisesRegex(ValueError, "exclude each other"):
            agoq.make_plan(LLAMA, 8, 128, budget, recompute="uniform", recompute_layers=1,
                           recompute_modules=["mlp"])
        with self.assertRaises(TypeError):  # a list of names, not one string
            agoq.estimate_memory(LLAMA, 8, 128, recompute_modules="mlp")

    def test_recomputed_tensors_inherit_their_sources_error(self):
        # The planner lets a tensor recomputed from a quantized source inherit the source's
        # relative error (mean square, over the tensor's), 2 times it for the SwiGLU output (the
        # product of two tensors that each carry it) and 1 time for the others
        # (recompute_sources::factor). Here the measured ratios must be within 1.5x of those
        # factors, on a residual stream with massive channels, RMSNorm and random projections.
        torch.manual_seed(0)
        t, h, f = 2048, 1024, 2816
        x = torch.randn(t, h)
        x[:, :4] *= 30
        w = 1 + 0.1 * torch.randn(h)
        wg, wu = torch.randn(h, f) / h ** 0.5, torch.randn(h, f) / h ** 0.5
        w1 = torch.randn(h, 4 * h) / h ** 0.5

        def norm(v):
            return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + 1e-6) * w

        def swiglu(y):
            return torch.nn.functional.silu(y @ wg) * (y @ wu)

        def gelu(y):
            return torch.nn.functional.gelu(y @ w1, approximate="tanh")

        def rel(a, b):
            return ((a - b).pow(2).sum() / b.pow(2).sum()).item()

        for spec in (INT8, INT4):
            xq = agoq.fake_quantize(x, spec)
            y = norm(x)
            yq = agoq.fake_quantize(y, spec)
            source = rel(yq, y)
            ratios = {  # (measured ratio, the model's factor)
                "norm output": (rel(norm(xq), y) / rel(xq, x), 1),
                "gate output": (rel(yq @ wg, y @ wg) / source, 1),
                "gelu output": (rel(gelu(yq), gelu(y)) / source, 1),
                "swiglu output": (rel(swiglu(yq), swiglu(y)) / source, 2),
                "swiglu output from the residual": (rel(swiglu(norm(xq)), swiglu(y)) /
                                                    rel(xq, x), 2),
            }
            for name, (ratio, factor) in ratios.items():
                with self.subTest(spec=spec, tensor=name):
                    self.assertGreater(ratio, factor / 1.5)
                    self.assertLess(ratio, factor * 1.5)

    def test_context_parallelism(self):
        # CP 2 over 256-token sequences: each rank holds 128 tokens of each, so the activations of
        # CP 1 at 128 and the states of DP 4 (ZeRO-1 shards over dp x cp).
        kw = dict(pp=2, zero=1, gradients="int8")
        cp = agoq.estimate_memory(LLAMA, 8, 256, dp=2, cp=2, **kw)
        short = agoq.estimate_memory(LLAMA, 8, 128, dp=2, **kw)
        wide = agoq.estimate_memory(LLAMA, 8, 128, dp=4, **kw)
        for a, b, c in zip(cp, short, wide):
            self.assertEqual(a["activations"], b["activations"])
            self.assertEqual(a["head_activations"], b["head_activations"])
            for key in ("weights", "master_weights", "gradients", "optimizer", "gradient_buffers"):
                self.assertEqual(a[key], c[key], key)
            # The ring attention's buffers are the only other change: more, never less.
            self.assertGreaterEqual(a["working"], b["working"])
        budget = 2 * cp[0]["total"]
        plan = agoq.make_plan(LLAMA, 8, 256, budget, dp=2, cp=2, **kw)
        self.assertLessEqual(max(s["total"] for s in plan["stages"]), budget)
        self.assertEqual(agoq.least_block_recompute(LLAMA, 8, 256, budget, dp=2, cp=2, **kw), 0)
        with self.assertRaisesRegex(ValueError, "2 cp = 6 equal chunks"):
            agoq.estimate_memory(LLAMA, 8, 256, cp=3)
        with self.assertRaisesRegex(ValueError, "cp and virtual_stages must be positive"):
            agoq.make_plan(LLAMA, 8, 256, budget, cp=0)

    def test_selective_options(self):
        # Every set of recompute modules planned as make_plan plans it, by overhead, and the least
        # error among those adding at most max_overhead; over budgets where some sets fit and
        # some do not.
        kw = dict(pp=2, reserved_bytes=0, sensitivity={"mlp_input": 3.0})
        sets = sorted(tuple(m for m, on in zip(("core_attn", "layernorm", "mlp"), bits) if on)
                      for bits in [((i & 1), (i & 2), (i & 4)) for i in range(8)])
        # Within 1 byte none fits, and each option says the least its set needs.
        least = [o["peak_bytes"] for o in agoq.selective_options(LLAMA, 8, 128, 1, **kw)["options"]]
        lo, hi = min(least), max(least)
        self.assertLess(lo, hi)
        mixed = 0
        for budget in (lo - 1, lo, (lo + hi) // 2, hi, 2 * hi):
            got = agoq.selective_options(LLAMA, 8, 128, budget, max_overhead=0.05, **kw)
            options = got["options"]
            self.assertEqual(sorted(tuple(o["modules"]) for o in options), sets)
            overheads = [o["overhead"] for o in options]
            self.assertEqual(overheads, sorted(overheads))
            self.assertEqual(options[0]["modules"], [])
            for o in options:
                if o["fits"]:
                    plan = agoq.make_plan(LLAMA, 8, 128, budget, recompute_modules=o["modules"],
                                          **kw)
                    self.assertEqual(plan["error"], o["error"])
                    self.assertEqual(max(s["total"] for s in plan["stages"]), o["peak_bytes"])
                else:
                    self.assertGreater(o["peak_bytes"], budget)
                    with self.assertRaisesRegex(ValueError, "falls short"):
                        agoq.make_plan(LLAMA, 8, 128, budget, recompute_modules=o["modules"],
                                       **kw)
            fits = [o for o in options if o["fits"] and o["overhead"] <= 0.05]
            self.assertEqual(got["least_error"], min(fits, key=lambda o: o["error"])
                             if fits else None)
            mixed += 0 < sum(o["fits"] for o in options) < 8
        self.assertGreater(mixed, 0)
        with self.assertRaisesRegex(ValueError, "max_overhead must be a non-negative share"):
            agoq.selective_options(LLAMA, 8, 128, hi, max_overhead=-1.0)

    def test_recompute_options(self):
        # The sets of modules and every full recomputation (4 layers on 2 stages: block 1,
        # uniform 1 and 2), each planned as make_plan plans it, and the least error among all.
        kw = dict(pp=2, reserved_bytes=0, sensitivity={"mlp_input": 3.0})
        def names(options):
            return sorted((o["recompute"], o["recompute_layers"], tuple(o["modules"]))
                          for o in options)
        least = [o["peak_bytes"]
                 for o in agoq.recompute_options(LLAMA, 8, 128, 1, **kw)["options"]]
        lo, hi = min(least), max(least)
        self.assertLess(lo, hi)
        full_wins = 0
        for budget in (lo - 1, lo, (lo + hi) // 2, hi):
            got = agoq.recompute_options(LLAMA, 8, 128, budget, max_overhead=0.5, **kw)
            options = got["options"]
            sets = agoq.selective_options(LLAMA, 8, 128, budget, **kw)["options"]
            self.assertEqual(names(options), names(sets + [
                dict(recompute="block", recompute_layers=1, modules=[]),
                dict(recompute="uniform", recompute_layers=1, modules=[]),
                dict(recompute="uniform", recompute_layers=2, modules=[])]))
            for s in sets:
                self.assertIn(s, options)
            overheads = [o["overhead"] for o in options]
            self.assertEqual(overheads, sorted(overheads))
            for o in options:
                step = dict(recompute=o["recompute"], recompute_layers=o["recompute_layers"],
                            recompute_modules=o["modules"])
                if o["fits"]:
                    plan = agoq.make_plan(LLAMA, 8, 128, budget, **step, **kw)
                    self.assertEqual(plan["error"], o["error"])
                    self.assertEqual(max(s["total"] for s in plan["stages"]), o["peak_bytes"])
                else:
                    with self.assertRaisesRegex(ValueError, "falls short"):
                        agoq.make_plan(LLAMA, 8, 128, budget, **step, **kw)
            fits = [o for o in options if o["fits"] and o["overhead"] <= 0.5]
            self.assertEqual(got["least_error"], min(fits, key=lambda o: o["error"])
                             if fits else None)
            full_wins += fits != [] and got["least_error"]["recompute"] != "none"
        self.assertGreater(full_wins, 0)

    def test_error_model_defaults(self):
        defaults = agoq.error_model_defaults()
        # Every kind that owns storage, of every style; o_proj_input is the attention output's.
        owned = set(agoq.tensor_kinds("llama") + agoq.tensor_kinds("gpt") +
                    agoq.tensor_kinds("qwen3") +
                    agoq.tensor_kinds("qwen3", moe=True, shared="gated") +
                    agoq.tensor_kinds("gemma3")) - {"o_proj_input"}
        self.assertEqual(set(defaults), owned)
        self.assertEqual(defaults["shared_expert_output"], ("activation_input", 2.0, 6.0))
        self.assertEqual(defaults["shared_gate_score"], ("routing", 8.0, 2.0))
        self.assertEqual(defaults["post_mlp_norm_input"], ("residual_stream", 4.0, 6.0))
        self.assertEqual(defaults["qkv_input"], ("linear_input", 1.0, 3.0))
        self.assertEqual(defaults["gate_output"], ("activation_input", 2.0, 2.0))
        self.assertEqual(defaults["attn_norm_input"], ("residual_stream", 4.0, 6.0))
        self.assertEqual(defaults["swiglu_output"], ("linear_input", 1.0, 4.0))
        self.assertEqual(defaults["query"], ("attention_core", 8.0, 2.0))
        self.assertEqual(defaults["key_norm_input"], ("attention_core", 8.0, 2.0))
        self.assertEqual(defaults["gelu_input"], ("activation_input", 2.0, 2.0))
        self.assertEqual(defaults["router_probs"], ("routing", 8.0, 2.0))
        self.assertEqual(defaults["expert_input"], ("linear_input", 1.0, 3.0))
        self.assertEqual(defaults["expert_swiglu_output"], ("linear_input", 1.0, 4.0))
        self.assertEqual(defaults["expert_up_output"], ("activation_input", 2.0, 2.0))

    def test_memory_counts_the_transient_working_memory(self):
        mem = agoq.estimate_memory(LLAMA, 8, 128, gradients="int8")[0]
        self.assertEqual(mem["transient"],
                         mem["working"] + mem["gradient_buffers"] + mem["reserved"])
        self.assertEqual(mem["total"], mem["states"] + mem["activations"]
                         + mem["head_activations"] + mem["transient"])
        # T0 = 8 x 128 tokens, h = 128, f = 384: the residual gradient 2 T0 h and SwiGLU's phase
        # 6 T0 f, the largest of a layer's backward (the head's: 2 T0 (256 + 128) + 2 x 256 x 128).
        self.assertEqual(mem["working"], 2 * 1024 * 128 + 6 * 1024 * 384)
        # One rank, a model smaller than a bucket: the 8-bit buffer stages all its gradients in bf16.
        self.assertEqual(mem["gradient_buffers"], 2 * mem["parameters"])
        self.assertEqual(mem["reserved"], 1 << 30)
        bare = agoq.estimate_memory(LLAMA, 8, 128, gradients="int8", reserved_bytes=0)[0]
        self.assertEqual(bare["total"], mem["total"] - (1 << 30))
        # Room for the states and the activations, none for the transient memory: refused.
        with self.assertRaisesRegex(ValueError, f"falls short by {mem['transient']} bytes .*"
                                    f"{mem['transient']} of transient working memory"):
            agoq.make_plan(LLAMA, 8, 128, mem["total"] - mem["transient"])
        plan = agoq.make_plan(LLAMA, 8, 128, mem["total"])
        self.assertEqual(plan["stages"][0]["transient"], mem["transient"])

    def test_plan_is_monotone_in_the_budget_and_refuses_too_little(self):
        default = agoq.estimate_memory(LLAMA, 8, 128, gradients="int8")[0]["total"]
        small = agoq.make_plan(LLAMA, 8, 128, default)
        large = agoq.make_plan(LLAMA, 8, 128, 4 * default)
        self.assertLessEqual(small["stages"][0]["total"], default)
        bits = {"int4_g128_sym_rne_f32": 4, "int8_g128_sym_rne_f32": 8, "bf16": 16, "fp32": 32}
        for ls, ll in zip(small["layers"], large["layers"]):
            for k in ls:
                self.assertLessEqual(bits[ls[k]], bits[ll[k]])
        self.assertTrue(all(v in ("bf16", "fp32") for v in large["layers"][0].values()))
        with self.assertRaisesRegex(ValueError, "falls short"):
            agoq.make_plan(LLAMA, 8, 128, 1000)
        # The same shortfall as data: the device, what it needs, the message make_plan raises.
        short = agoq.find_shortfall(LLAMA, 8, 128, 1000)
        self.assertEqual(short["stage"], 0)
        self.assertEqual(short["budget_bytes"], 1000)
        least = short["need"]["total"]
        self.assertEqual(short["bytes"], least - 1000)
        with self.assertRaisesRegex(ValueError, re.escape(short["message"])):
            agoq.make_plan(LLAMA, 8, 128, 1000)
        self.assertIsNone(agoq.find_shortfall(LLAMA, 8, 128, least))
        agoq.make_plan(LLAMA, 8, 128, least)
        self.assertEqual(agoq.find_shortfall(LLAMA, 8, 128, least - 1)["bytes"], 1)
        with self.assertRaises(ValueError):
            agoq.make_plan(dict(LLAMA, heads=5), 8, 128, default)

    def test_interleaved_schedule_rules(self):
        # p = 2, v = 2 (one layer per chunk). m = 3: Megatron-Core refuses groups of p = 2 (a
        # last group of 1); in one group of 3, device 0 runs every forward first, (3, 3), and
        # device 1 peaks at (3, 1) (docs/activations.md, 4.1).
        layout = dict(pp=2, vp=2, gradients="int8")
        with self.assertRaisesRegex(ValueError, "last group of 1"):
            agoq.estimate_memory(LLAMA, 8, 128, micro_batches=3, **layout)
        three = agoq.estimate_memory(LLAMA, 8, 128, micro_batches=3, vp_group=3, **layout)
        self.assertEqual([s["in_flight"] for s in three], [[3, 3], [3, 1]])
        plan = agoq.make_plan(LLAMA, 8, 128, 4 * three[0]["total"], micro_batches=3, vp_group=3,
                              **layout)
        self.assertEqual([s["in_flight"] for s in plan["stages"]], [[3, 3], [3, 1]])
        # m == p: Megatron-Core runs every forward first only on device 0; the legacy rules on both.
        core = agoq.estimate_memory(LLAMA, 8, 128, micro_batches=2, **layout)
        legacy = agoq.estimate_memory(LLAMA, 8, 128, micro_batches=2, vp_rules="legacy", **layout)
        self.assertEqual([s["in_flight"] for s in core], [[2, 2], [2, 1]])
        self.assertEqual([s["in_flight"] for s in legacy], [[2, 2], [2, 2]])
        with self.assertRaises(ValueError):
            agoq.estimate_memory(LLAMA, 8, 128, micro_batches=2, vp_rules="megatron", **layout)
        with self.assertRaisesRegex(ValueError, "at least pp"):
            agoq.make_plan(LLAMA, 8, 128, 4 * three[0]["total"], vp_group=1, **layout)


    def test_measure_gives_the_error_model_statistics(self):
        torch.manual_seed(3)
        x = torch.randn(6, 300)
        x[1, 5] = float("nan")
        x[4, 200] = float("inf")
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            xt = x.to(dtype)
            st = agoq.measure(xt, INT4)
            xd = xt.double()
            finite = xd.isfinite()
            xf = torch.where(finite, xd, torch.zeros_like(xd))
            self.assertEqual(st["tile"], (1, 128))
            self.assertEqual(st["elements"], int(finite.sum()))
            ref = float((xf * xf).sum())
            self.assertAlmostEqual(st["sum_squares"], ref, delta=1e-12 * ref)
            absmax_sq, range_sq = 0.0, 0.0
            for g, f in zip(torch.split(xf, 128, dim=1), torch.split(finite, 128, dim=1)):
                n = f.sum(1).double()
                a = g.abs().amax(1)
                r = g.amax(1).clamp(min=0) - g.amin(1).clamp(max=0)
                absmax_sq += float((n * a * a).sum())
                range_sq += float((n * r * r).sum())
            self.assertAlmostEqual(st["sum_group_absmax_sq"], absmax_sq, delta=1e-12 * absmax_sq)
            self.assertAlmostEqual(st["sum_group_range_sq"], range_sq, delta=1e-12 * range_sq)
            # Dead zones of 4-bit codes: the elements under half a step, absmax / 14.
            dead, live = 0.0, 0.0
            for g, f in zip(torch.split(xf, 128, dim=1), torch.split(finite, 128, dim=1)):
                a = g.abs().amax(1, keepdim=True)
                half = (a.float() / 14.0).double()
                under = (g.abs() < half) & f
                dead += float((g * g * under).sum())
                live += float(((f & ~under).sum(1).double() * a.squeeze(1) ** 2).sum())
            self.assertAlmostEqual(st["dead_energy"][1], dead, delta=1e-12 * dead)
            self.assertAlmostEqual(st["live_absmax_sq"][1], live, delta=1e-12 * live)
            # The 2-bit live elements (not under absmax / 2) round to +-scale: with f32 scales
            # (scale = absmax) their error is the sum of (absmax - |x|)^2; rounded-up bf16 and
            # e8m0 scales give upper bounds.
            gap = 0.0
            for g, f in zip(torch.split(xf, 128, dim=1), torch.split(finite, 128, dim=1)):
                a = g.abs().amax(1, keepdim=True)
                live = (g.abs() >= (a.float() / 2.0).double()) & f
                gap += float(((a - g.abs()) ** 2 * live).sum())
            self.assertAlmostEqual(st["live_error_2bit"][0], gap, delta=1e-12 * gap)
            self.assertGreaterEqual(st["live_error_2bit"][1], st["live_error_2bit"][0])
            self.assertGreaterEqual(st["live_error_2bit"][2], st["live_error_2bit"][1])
            # Per-row groups (300 columns, two slices each) get theirs from a second pass: 8 bits,
            # half a step absmax / 254.
            row = agoq.measure(xt, "int8_row_sym_rne_f32")
            a = xf.abs().amax(1, keepdim=True)
            under = (xf.abs() < (a.float() / 254.0).double()) & finite
            dead = float((xf * xf * under).sum())
            live = float(((finite & ~under).sum(1).double() * a.squeeze(1) ** 2).sum())
            self.assertAlmostEqual(row["dead_energy"][2], dead, delta=1e-12 * dead)
            self.assertAlmostEqual(row["live_absmax_sq"][2], live, delta=1e-12 * live)
        with self.assertRaises(ValueError):
            agoq.measure(x, "int3_g128_sym_rne_f32")
        with self.assertRaises((RuntimeError, ValueError)):
            agoq.measure(x[0], INT4)

    def test_sensitivities_and_outlier_factors_steer_the_plan(self):
        # qkv_input and mlp_input have the same shape and defaults, and each may be int4 or int8;
        # the budget pays for int8 in every layer for one of them. The kind weighted more gets it.
        policy = {k: (d, [d]) for k, (d, _) in agoq.default_policy().items()}
        for kind in ("qkv_input", "mlp_input"):
            policy[kind] = (INT4, [INT4, INT8])
        rows, cols, _ = agoq.saved_shapes(LLAMA, 8, 128)["qkv_input"]
        self.assertEqual(agoq.saved_shapes(LLAMA, 8, 128)["mlp_input"][:2], (rows, cols))
        need = agoq.estimate_memory(LLAMA, 8, 128, gradients="int8", policy=policy)[0]
        delta = agoq.quantized_bytes(INT8, rows, cols) - agoq.quantized_bytes(INT4, rows, cols)
        budget = need["total"] + delta * need["in_flight"][0] * LLAMA["layers"]

        def chosen(**kw):
            plan = agoq.make_plan(LLAMA, 8, 128, budget, policy=policy, **kw)
            kinds = ("qkv_input", "mlp_input")
            return {k: {layer[k] for layer in plan["layers"]} for k in kinds}, plan["error"]

        more_qkv, e1 = chosen(sensitivity={"qkv_input": 3.0})
        self.assertEqual(more_qkv, {"qkv_input": {INT8}, "mlp_input": {INT4}})
        more_mlp, e2 = chosen(sensitivity={"mlp_input": 3.0})
        self.assertEqual(more_mlp, {"qkv_input": {INT4}, "mlp_input": {INT8}})
        self.assertAlmostEqual(e1, e2, delta=1e-12 * e1)  # the same choice, mirrored
        # A larger outlier factor means larger scales, so more error at int4: that kind gets int8.
        outliers, _ = chosen(outlier={"mlp_input": 6.0})
        self.assertEqual(outliers, {"qkv_input": {INT4}, "mlp_input": {INT8}})
        # The error is in units of the weights: each kind's term grows with its own weight.
        _, half_more = chosen(sensitivity={"qkv_input": 3.0, "mlp_input": 1.5})
        _, one_more = chosen(sensitivity={"qkv_input": 3.0, "mlp_input": 2.0})
        self.assertGreater(half_more, e1)
        self.assertAlmostEqual(one_more - e1, 2 * (half_more - e1), delta=1e-12 * e1)
        # One layer's weight: that layer's mlp_input is the one tensor kept at int8 beside
        # qkv_input's, which the budget now lacks room for in one other layer.
        per_layer, _ = chosen(sensitivity={"qkv_input": 3.0, (2, "mlp_input"): 30.0})
        self.assertEqual(per_layer["mlp_input"], {INT4, INT8})
        plan = agoq.make_plan(LLAMA, 8, 128, budget, policy=policy,
                              sensitivity={"qkv_input": 3.0, (2, "mlp_input"): 30.0})
        self.assertEqual([layer["mlp_input"] for layer in plan["layers"]],
                         [INT4, INT4, INT8, INT4])
        for bad in ({(LLAMA["layers"], "mlp_input"): 1.0}, {(-1, "mlp_input"): 1.0},
                    {(0, "mlp_input", 1): 1.0}):
            with self.assertRaises(ValueError):
                agoq.make_plan(LLAMA, 8, 128, budget, policy=policy, sensitivity=bad)
        for bad in ({"no_such_kind": 1.0}, {"qkv_input": -1.0}, {"qkv_input": math.nan}):
            with self.assertRaises(ValueError):
                agoq.make_plan(LLAMA, 8, 128, budget, policy=policy, sensitivity=bad)
        with self.assertRaises(ValueError):
            agoq.make_plan(LLAMA, 8, 128, budget, policy=policy, outlier={"mlp_input": 0.5})

    def test_measured_statistics_steer_the_plan(self):
        # Only qkv_input may change (int4 or int8); the budget pays for one layer's int8. With
        # measured statistics, the layer whose groups hold outliers gets it.
        policy = {k: (d, [d]) for k, (d, _) in agoq.default_policy().items()}
        policy["qkv_input"] = (INT4, [INT4, INT8])
        rows, cols, _ = agoq.saved_shapes(LLAMA, 8, 128)["qkv_input"]
        need = agoq.estimate_memory(LLAMA, 8, 128, gradients="int8", policy=policy)[0]
        delta = agoq.quantized_bytes(INT8, rows, cols) - agoq.quantized_bytes(INT4, rows, cols)
        budget = need["total"] + delta * need["in_flight"][0]
        torch.manual_seed(4)
        stats = {}
        for layer in range(LLAMA["layers"]):
            x = torch.randn(rows, cols)
            if layer == 2:
                x[:, ::128] *= 30.0  # one outlier channel per group
            stats[(layer, "qkv_input")] = agoq.measure(x, INT4)
        plan = agoq.make_plan(LLAMA, 8, 128, budget, policy=policy, statistics=stats)
        chosen = [layer["qkv_input"] for layer in plan["layers"]]
        self.assertEqual(chosen, [INT4, INT4, INT8, INT4])
        with self.assertRaises(ValueError):
            agoq.make_plan(LLAMA, 8, 128, budget, policy=policy,
                           statistics={(0, "no_such_kind"): stats[(0, "qkv_input")]})
        with self.assertRaises(ValueError):
            agoq.make_plan(LLAMA, 8, 128, budget, policy=policy,
                           statistics={(0, "qkv_input"): {"tile": (1, 128)}})
        partial = {k: v for k, v in stats[(0, "qkv_input")].items() if k != "live_error_2bit"}
        with self.assertRaisesRegex(ValueError, "come together"):
            agoq.make_plan(LLAMA, 8, 128, budget, policy=policy,
                           statistics={(0, "qkv_input"): partial})


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _all_reduce_worker(rank, world, port, n, queue):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        comm = agoq.ProcessGroupCommunicator(dist.distributed_c10d._get_default_group())
        gen = torch.Generator().manual_seed(100 + rank)
        x = torch.randn(n, generator=gen) * (1 + rank)
        out = torch.empty(n)
        res = agoq.all_reduce_8bit(comm, x, out, average=False)
        sent = comm.bytes_sent
        buf = agoq.GradientBuffer(n, seed=rank)
        buf.accumulate(x)
        out_b = torch.empty(n)
        comm.reset_counts()
        agoq.all_reduce_8bit(comm, buf, out_b, average=True, stochastic=True, seed=1, step=3)
        shard = torch.empty(n)
        rs = agoq.reduce_scatter_8bit(comm, x, shard, average=False)
        bad = None
        try:  # rank 0 passes a different length: every rank must get the error, none hang
            m = n + 128 if rank == 0 else n
            agoq.all_reduce_8bit(comm, torch.zeros(m), torch.zeros(m))
        except ValueError as e:
            bad = str(e)
        # numpy arrays travel by value (a tensor would be shared through a file descriptor that
        # dies with this process).
        arrays = [t.numpy() for t in (x, out, out_b, shard)]
        queue.put((rank, arrays, res, sent, rs, bad))
    finally:
        dist.destroy_process_group()


class AllReduceTest(unittest.TestCase):
    def test_all_reduce_over_gloo(self):
        for world, n in ((3, 10007), (4, 4096)):
            ctx = mp.get_context("spawn")
            queue = ctx.Queue()
            port = _free_port()
            procs = [ctx.Process(target=_all_reduce_worker, args=(r, world, port, n, queue))
                     for r in range(world)]
            for p in procs:
                p.start()
            results = []
            for rank, arrays, res, sent, rs, bad in (queue.get(timeout=300) for _ in procs):
                x, out, out_b, shard = (torch.from_numpy(a) for a in arrays)
                results.append((rank, x, out, out_b, res, sent, rs, shard, bad))
            results.sort(key=lambda r: r[0])
            for p in procs:
                p.join(timeout=60)
                self.assertEqual(p.exitcode, 0)
            exact = torch.stack([r[1] for r in results]).double().sum(0)
            for rank, x, out, out_b, res, sent, rs, shard, bad in results:
                self.assertTrue(torch.equal(out, results[0][2]), "identical bits on every rank")
                self.assertTrue(torch.equal(out_b, results[0][3]))
                self.assertFalse(res["nonfinite"])
                self.assertEqual(sent, agoq.all_reduce_bytes_sent(n, world))
                # Two quantizations, each within half a step of its group's scale.
                step = exact.abs().max().item() / 127
                self.assertLess((out.double() - exact).abs().max().item(), world * step)
                self.assertLess((out_b.double() - exact / world).abs().max().item(),
                                2 * world * step)
                begin, end = agoq.shard_range(n, world, rank)
                self.assertEqual((rs["begin"], rs["end"]), (begin, end))
                # The shard is the fp32 sum of the dequantized chunks; the all-reduce's output is
                # that sum requantized once more (nearest, fp32 scales) for the all-gather.
                mine = shard[: end - begin]
                self.assertLess((mine.double() - exact[begin:end]).abs().max().item(),
                                world * step / 2)
                self.assertTrue(torch.equal(out[begin:end],
                                            agoq.fake_quantize(mine.view(1, -1), INT8).view(-1)))
                self.assertIsNotNone(bad)
                self.assertIn("all_reduce_8bit", bad)


if __name__ == "__main__":
    unittest.main()
