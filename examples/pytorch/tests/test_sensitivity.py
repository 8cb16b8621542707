"""Tests of examples/pytorch/sensitivity.py, which measures the planner's per-kind sensitivities:
where each kind's quantization error enters the gradients (the reasoning behind the category
defaults, docs/activations.md section 3), the measurement's figures, and its plan-config lines
read back by the planner. Run: python3 -m unittest discover -s examples/pytorch/tests"""

import contextlib
import io
import math
import os
import sys
import tempfile
import unittest

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import agoq_torch as agoq  # noqa: E402
import sensitivity as sens  # noqa: E402
from gpt import GPT, ModelConfig, uniform_plan  # noqa: E402

INT4 = "int4_g128_sym_rne_f32"
CFG = ModelConfig(layers=2, hidden=128, heads=4, ffn=256, seq=32)


def random_batch(seed: int, n: int = 2):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randint(0, CFG.vocab, (n, CFG.seq + 1), generator=gen)
    return w[:, :-1], w[:, 1:]


class WhereErrorsEnterTest(unittest.TestCase):
    """One kind quantized in the last layer only; which parameters' gradients change at all."""

    @classmethod
    def setUpClass(cls):
        torch.manual_seed(0)
        cls.model = GPT(CFG)
        cls.names = [n for n, _ in cls.model.named_parameters()]
        cls.batch = random_batch(1)
        cls.exact = uniform_plan(CFG, "fp32")
        cls.g_ref, _ = sens.gradients(cls.model, cls.exact, *cls.batch)

    def changed(self, kind):
        """{parameter: relative change of its gradient}."""
        plan = sens.with_kind(self.exact, kind, INT4, layers={CFG.layers - 1})
        g, _ = sens.gradients(self.model, plan, *self.batch)
        return {n: float((a - r).norm() / r.norm()) for n, a, r in zip(self.names, g, self.g_ref)}

    def test_a_linear_input_error_enters_only_its_weight_gradient(self):
        last = CFG.layers - 1
        for kind, weight in (("qkv_input", "wqkv"), ("mlp_input", "w_gate_up"),
                             ("swiglu_output", "w_down")):
            with self.subTest(kind=kind):
                changed = self.changed(kind)
                self.assertEqual({n for n, d in changed.items() if d != 0},
                                 {f"blocks.{last}.{weight}"})
                self.assertGreater(changed[f"blocks.{last}.{weight}"], 1e-3)

    def test_other_errors_reach_every_earlier_layer(self):
        # Activation inputs (through f'), the residual stream (through the norm's backward) and
        # the attention core (through the softmax) change the input gradient, and with it the
        # gradient of every parameter before them (by 2e-3 to 2e-2 here). The head, after the
        # last block, sees only the fused RMSNorm's forward, whose output differs from torch's
        # in rounding (1e-7).
        for kind in ("gate_output", "up_output", "mlp_norm_input", "attn_norm_input", "query",
                     "key", "value", "attention_output"):
            with self.subTest(kind=kind):
                changed = self.changed(kind)
                self.assertGreater(changed["tok_emb"], 1e-4)
                self.assertGreater(changed["blocks.0.wqkv"], 1e-4)
                self.assertLess(changed["head"], 1e-6)


class MeasureTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.manual_seed(0)
        model = GPT(CFG)
        gen = torch.Generator().manual_seed(3)
        data = torch.randint(0, CFG.vocab, (4096,), generator=gen)

        def batch():
            starts = torch.randint(0, data.numel() - CFG.seq - 1, (4,), generator=gen)
            return data[starts[:, None] + torch.arange(CFG.seq)], \
                data[starts[:, None] + 1 + torch.arange(CFG.seq)]

        # A few steps, so that attention is no longer uniform (query and key then matter).
        sens.warm_up(model, batch, 20, log=lambda *_: None)
        batches = [batch() for _ in range(2)]
        cls.result = sens.measure(model, batches, log=lambda *_: None)
        cls.per_layer = [sens.measure(model, batches, schemes=sens.SCHEMES[:1], layers={layer},
                                      log=lambda *_: None) for layer in range(CFG.layers)]

    def test_every_kind_at_every_scheme(self):
        self.assertEqual(tuple(self.result), sens.MEASURED)
        for kind, by_scheme in self.result.items():
            self.assertEqual(tuple(by_scheme), sens.SCHEMES)
            int8, int4 = (by_scheme[s] for s in sens.SCHEMES)
            # int4's step is 127/7 times int8's: about 330 times the noise power.
            ratio = int4["activation"] / int8["activation"]
            self.assertTrue(150 < ratio < 700, f"{kind}: int4 / int8 noise {ratio}")
            for r in (int8, int4):
                for m in sens.METRICS:
                    s = r["sensitivity"][m]
                    self.assertTrue(math.isfinite(s) and s > 0, f"{kind} {m}: {s}")
                    self.assertAlmostEqual(s, r["gradient"][m] / r["activation"], delta=1e-12 * s)

    def test_linear_inputs_scale_with_the_activation_error(self):
        # dW = X^T dY with dY exact: the gradient error is linear in the saved copy's error, so
        # its ratio to the activation error is the same at 8 and 4 bits, up to how the noise
        # lines up with dY (0.74-0.98 measured on the trained 4-layer model).
        for kind in ("qkv_input", "mlp_input", "swiglu_output"):
            for m in sens.METRICS:
                s8, s4 = (self.result[kind][s]["sensitivity"][m] for s in sens.SCHEMES)
                self.assertTrue(0.5 < s8 / s4 < 2.0, f"{kind} {m}: {s8} / {s4}")

    def test_errors_of_different_layers_add(self):
        # Exactly for the linear inputs (each layer's error lands in its own weight's gradient,
        # unchanged by the others): the error model's assumption that errors add holds there to
        # the summation's rounding. For the other kinds only roughly (their errors meet in the
        # gradients of the earlier layers; 0.985-1.052 here).
        s8 = sens.SCHEMES[0]
        for kind in sens.MEASURED:
            for m in sens.METRICS:
                added = sum(r[kind][s8]["gradient"][m] for r in self.per_layer)
                whole = self.result[kind][s8]["gradient"][m]
                if sens.defaults()[kind][0] == "linear_input":
                    self.assertAlmostEqual(added, whole, delta=1e-12 * whole)
                else:
                    self.assertTrue(0.8 < added / whole < 1.25, f"{kind} {m}: {added} / {whole}")
        table = sens.per_layer_table(self.result, self.per_layer, s8, "global")
        rows = {line.split()[0]: line.split()[1:] for line in table.splitlines()[2:]}
        self.assertEqual(tuple(rows), sens.MEASURED)
        self.assertEqual(rows["qkv_input"][-1], "1.000")
        # Each layer's weight, in the kind table's units: their mean is the kind's weight where
        # the errors add and every layer's activation error is the same.
        rel = sens.relative(self.result, s8, "global")
        for kind in ("qkv_input", "mlp_input", "swiglu_output"):
            mean = sum(float(v) for v in rows[kind][:-1]) / CFG.layers
            self.assertTrue(0.5 < mean / rel[kind] < 2.0, f"{kind}: {mean} against {rel[kind]}")

    def test_relative_sensitivities_and_plan_config(self):
        for m in sens.METRICS:
            rel = sens.relative(self.result, sens.SCHEMES[0], m)
            linear = [rel[k] for k in rel if sens.defaults()[k][0] == "linear_input"]
            self.assertAlmostEqual(sum(linear) / len(linear), 1.0, places=12)
        rel = sens.relative(self.result, sens.SCHEMES[0], "per_tensor")
        text = sens.plan_config(rel, "measured\non a test model")
        lines = text.splitlines()
        self.assertEqual(lines[:2], ["# measured", "# on a test model"])
        read = {}
        for line in lines[2:]:
            key, value = (s.strip() for s in line.split("=", 1))
            self.assertEqual(key, "sensitivity")
            kind, weight = value.split("=")
            read[kind] = float(weight)
        self.assertEqual(tuple(read), sens.MEASURED)
        for k, w in read.items():
            self.assertAlmostEqual(w, rel[k], delta=1e-5 * rel[k])
        # The planner takes them as they are, and the per-layer ones keyed (layer, kind).
        layers = sens.per_layer_relative(self.result, self.per_layer, sens.SCHEMES[0], "global")
        self.assertEqual(set(layers), {(i, k) for i in range(CFG.layers) for k in sens.MEASURED})
        text = sens.plan_config(rel, "per layer", layers)
        self.assertIn(f"sensitivity = swiglu_output@1={layers[(1, 'swiglu_output')]:.6g}", text)
        plan = agoq.make_plan(CFG.planner_model(), 4, CFG.seq, 1 << 34,
                              sensitivity={**read, **layers})
        self.assertEqual(plan["error"], 0.0)  # a budget that keeps everything precise
        with self.assertRaises(ValueError):
            sens.relative({"query": self.result["query"]}, sens.SCHEMES[0], "global")

    def test_main_writes_json_and_plan_config(self):
        with tempfile.TemporaryDirectory() as d:
            conf, js = os.path.join(d, "s.conf"), os.path.join(d, "s.json")
            args = ["--layers", "1", "--hidden", "128", "--ffn", "256", "--seq", "16",
                    "--steps", "2", "--batches", "1", "--micro-batch", "2", "--json", js,
                    "--plan-config", conf, "--scheme", INT4, "--metric", "global", "--per-layer"]
            with contextlib.redirect_stdout(io.StringIO()) as out:
                self.assertEqual(sens.main(args), 0)
            self.assertIn("gradient error: per_tensor", out.getvalue())
            self.assertIn(f"per layer: {INT4}, gradient error global", out.getvalue())
            with open(conf) as f:
                lines = f.read().splitlines()
            self.assertTrue(lines[0].startswith("# sensitivity.py --layers 1"))
            self.assertEqual(lines[1], f"# {INT4}, gradient error global, linear inputs' mean 1")
            # A line per kind, then one per kind and layer (one layer here).
            self.assertEqual(len(lines), 2 + 2 * len(sens.MEASURED))
            self.assertTrue(lines[2].startswith("sensitivity = attn_norm_input="))
            self.assertTrue(lines[2 + len(sens.MEASURED)].startswith(
                "sensitivity = attn_norm_input@0="))
            self.assertTrue(os.path.getsize(js) > 0)


class PlanConfigTest(unittest.TestCase):
    def test_read_back(self):
        weights = {"qkv_input": 1.25, "gate_output": 0.5}
        layers = {(0, "gate_output"): 3.0, (3, "key"): 1e-7}
        read = sens.read_plan_config(sens.plan_config(weights, "a\nb", layers) + "\n  # end\n")
        self.assertEqual(read, {**weights, **layers})
        for bad in ("tp = 2", "sensitivity = qkv_input", "sensitivity = qkv_input@x=1",
                    "sensitivity = qkv_input=lots", "sensitivity qkv_input=1"):
            with self.subTest(line=bad), self.assertRaisesRegex(ValueError, "line 2"):
                sens.read_plan_config("# ok\n" + bad)

    def test_train_plans_with_the_file(self):
        # train.py --activations agoq --sensitivity FILE: the weights reach the plan. By default
        # every gate output stays int4; weighted 50 in layer 3 alone, that one gets int8.
        import train

        base = dict(activations="agoq", gradients="agoq8", optimizer="adam8")
        gates = [layer["gate_output"] for layer in train.agoq_plan(
            train.TrainConfig(**base))["layers"]]
        self.assertEqual(gates, [INT4] * 4)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "s.conf")
            with open(path, "w") as f:
                f.write("# measured\nsensitivity = gate_output@3=50\n")
            plan = train.agoq_plan(train.TrainConfig(**base, sensitivity=path))
        self.assertEqual([layer["gate_output"] for layer in plan["layers"]],
                         [INT4, INT4, INT4, "int8_g128_sym_rne_f32"])


if __name__ == "__main__":
    unittest.main()
