"""Measures the planner's per-kind sensitivities on the small GPT (gpt.py), on the CPU.

agoq's planner minimises the sum over saved tensors of sensitivity x relative quantization error
(docs/activations.md, section 3); the defaults are per category (linear input 1, activation input
2, residual stream 4, attention core 8). This script measures them instead: for each saved-tensor
kind and scheme it quantizes that kind alone, in every layer (the others kept in fp32), and takes

    sensitivity = gradient error / (sum ||x^ - x||^2 / sum ||x||^2)

the gradient's relative error per unit of relative error in the kind's saved tensors, both summed
over the same batches. The gradient error is measured two ways (``--metric``):

- ``global``: ||g - g_ref||^2 / ||g_ref||^2 over all parameters at once (what SGD sees);
- ``per_tensor``: the mean over parameter tensors of their own relative errors (closer to what
  Adam sees, which normalises each parameter's update: a small weight gradient counts as much as
  a large one).

Both are printed, over the linear inputs' mean (the planner's scale, the category defaults beside
them). A sensitivity that holds for the error model's purpose is the same at 8 and 4 bits (the
gradient error grows in proportion to the activation error); the tables show both and their ratio.

``--per-layer`` also quantizes each layer alone (at ``--scheme`` and ``--metric``) and prints each
layer's sensitivity and how the layers' gradient errors add up against all layers' at once (the
error model assumes per-kind weights and errors that add).

``--plan-config FILE`` writes the sensitivities of one scheme and metric as ``agoq_plan --config``
lines (``sensitivity = kind=weight``, and with ``--per-layer`` each layer's ``kind@layer=weight``
too); ``--json FILE`` writes every figure. The model trains first
for ``--steps`` steps of fp32 AdamW on the Python standard library's sources (train.py's corpus).
Run with any python that can import torch: ``/usr/bin/python3 examples/pytorch/sensitivity.py``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import torch_check  # noqa: E402

torch_check.require_torch()

import torch  # noqa: E402

from gpt import GPT, KINDS, ActivationSaver, ModelConfig, SavedTensor, uniform_plan  # noqa: E402
from train import TrainConfig, corpus, split, windows  # noqa: E402

#: The kinds measured: every kind that owns bytes but the fp32 logsumexp, which the default
#: policy keeps as is (a [tokens x heads, 1] tensor, one value a row).
MEASURED = tuple(k for k in KINDS if k != "softmax_lse")


def defaults() -> dict:
    """{kind: (category, default sensitivity, default outlier factor)}: agoq's error model
    defaults (category_of, default_sensitivity, default_outlier), from the extension."""
    import agoq_torch

    return agoq_torch.error_model_defaults()


SCHEMES = ("int8_g128_sym_rne_f32", "int4_g128_sym_rne_f32")
METRICS = ("global", "per_tensor")


class RecordingSaver(ActivationSaver):
    """An ActivationSaver that also keeps what it saved, per (layer, kind), for comparison."""

    def __init__(self, plan: list[dict]):
        super().__init__(plan)
        self.saved: dict[tuple[int, str], SavedTensor] = {}
        self._layer_of: dict[str, int] = {}

    # Every saved tensor is recorded right after save() or, from a fused op, after stream().
    def save(self, x, layer, kind):
        self._layer_of[kind] = layer
        return super().save(x, layer, kind)

    def stream(self, layer, kind):
        self._layer_of[kind] = layer
        return super().stream(layer, kind)

    def record(self, kind, saved):
        self.saved[(self._layer_of.pop(kind), kind)] = saved
        return super().record(kind, saved)


def gradients(model: GPT, plan: list[dict], idx, tgt) -> tuple[list[torch.Tensor], RecordingSaver]:
    """(the gradient of every parameter, in model.parameters() order; the saver) of one batch
    with the activations saved as ``plan`` says."""
    saver = RecordingSaver(plan)
    saver.begin_micro_batch(0)
    loss = model(idx, tgt, saver)
    return list(torch.autograd.grad(loss, list(model.parameters()))), saver


def with_kind(plan: list[dict], kind: str, storage: str, layers=None) -> list[dict]:
    """``plan`` with ``kind`` stored as ``storage`` in ``layers`` (default: all)."""
    return [dict(p, **{kind: storage}) if layers is None or i in layers else dict(p)
            for i, p in enumerate(plan)]


def warm_up(model: GPT, batch, steps: int, log=print) -> None:
    """``steps`` steps of fp32 AdamW (train.py's default settings, at its peak learning rate) on
    ``batch()``'s batches."""
    d = TrainConfig()
    opt = torch.optim.AdamW(model.parameters(), lr=d.lr, betas=(d.beta1, d.beta2),
                            weight_decay=d.weight_decay)
    for step in range(steps):
        loss = model(*batch())
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), d.clip)
        opt.step()
        if step % 50 == 0 or step == steps - 1:
            log(f"  warm-up step {step}: loss {loss.item():.4f}")


def measure(model: GPT, batches: list, kinds=MEASURED, schemes=SCHEMES, layers=None,
            log=print) -> dict:
    """{kind: {scheme: {"activation": rel, "gradient": {metric: rel},
    "sensitivity": {metric: gradient / activation}}}}, every error summed over ``batches``
    ((inputs, targets) pairs) before the ratios are taken. Each kind is quantized in
    ``layers`` (default: all), whose saved tensors make the activation error."""
    layers = range(model.cfg.layers) if layers is None else sorted(layers)
    exact = uniform_plan(model.cfg, "fp32")
    # Per kind and scheme: per parameter tensor (squared error, squared reference), then the
    # activations' (squared error, squared reference).
    n = len(list(model.parameters()))
    sums = {k: {s: ([[0.0, 0.0] for _ in range(n)], [0.0, 0.0]) for s in schemes} for k in kinds}
    for b, (idx, tgt) in enumerate(batches):
        g_ref, ref = gradients(model, exact, idx, tgt)
        for kind in kinds:
            for scheme in schemes:
                g, saver = gradients(model, with_kind(exact, kind, scheme, set(layers)), idx, tgt)
                per_param, act = sums[kind][scheme]
                for p, (a, r) in enumerate(zip(g, g_ref)):
                    per_param[p][0] += float((a - r).square().sum())
                    per_param[p][1] += float(r.square().sum())
                for layer in layers:
                    x = ref.saved[(layer, kind)].load()
                    act[0] += float((saver.saved[(layer, kind)].load() - x).square().sum())
                    act[1] += float(x.square().sum())
        log(f"  batch {b + 1} of {len(batches)} measured")
    out: dict = {}
    for kind in kinds:
        out[kind] = {}
        for scheme in schemes:
            per_param, (dx, x2) = sums[kind][scheme]
            grad = {"global": sum(e for e, _ in per_param) / sum(r for _, r in per_param),
                    "per_tensor": sum(e / r for e, r in per_param if r > 0)
                    / sum(1 for _, r in per_param if r > 0)}
            act = dx / x2
            out[kind][scheme] = dict(
                activation=act, gradient=grad,
                sensitivity={m: grad[m] / act if act > 0 else math.nan for m in METRICS})
    return out


def linear_unit(result: dict, scheme: str, metric: str) -> float:
    """The mean sensitivity of the linear inputs measured, the planner's unit (its default for
    linear inputs is 1)."""
    category = defaults()
    linear = [result[k][scheme]["sensitivity"][metric] for k in result
              if category[k][0] == "linear_input"]
    if not linear:
        raise ValueError("relative sensitivities need at least one linear-input kind measured")
    return sum(linear) / len(linear)


def relative(result: dict, scheme: str, metric: str) -> dict:
    """{kind: sensitivity} at ``scheme`` and ``metric`` in the planner's unit."""
    unit = linear_unit(result, scheme, metric)
    return {k: result[k][scheme]["sensitivity"][metric] / unit for k in result}


def per_layer_relative(result: dict, per_layer: list, scheme: str, metric: str) -> dict:
    """{(layer, kind): sensitivity} from ``per_layer`` (measure's results with one layer
    quantized each) in the units of ``relative``, times the number of layers: one layer's
    tensor weighs that much in the planner's objective, and their mean is comparable with the
    kind's weight."""
    unit = linear_unit(result, scheme, metric) / len(per_layer)
    return {(layer, k): r[k][scheme]["sensitivity"][metric] / unit
            for layer, r in enumerate(per_layer) for k in r}


def per_layer_table(result: dict, per_layer: list, scheme: str, metric: str) -> str:
    """per_layer_relative as a table, one row a kind, and the sum of the layers' gradient errors
    over the gradient error of all layers at once (1 where the errors of different layers add,
    the error model's assumption)."""
    w = per_layer_relative(result, per_layer, scheme, metric)
    head = f"{'kind':<18}" + "".join(f"{'layer ' + str(i):>10}" for i in range(len(per_layer)))
    rows = [f"per layer: {scheme}, gradient error {metric}", head + f"{'sum/all':>9}"]
    for k in result:
        row = f"{k:<18}" + "".join(f"{w[(layer, k)]:>10.3g}" for layer in range(len(per_layer)))
        added = sum(r[k][scheme]["gradient"][metric] for r in per_layer)
        rows.append(row + f"{added / result[k][scheme]['gradient'][metric]:>9.3f}")
    return "\n".join(rows)


def plan_config(weights: dict, comment: str, per_layer: dict | None = None) -> str:
    """``agoq_plan --config`` lines setting each kind's sensitivity and, from ``per_layer``
    ({(layer, kind): weight}), each layer's (``kind@layer=weight``), after comment lines."""
    lines = [f"# {line}" for line in comment.splitlines()]
    lines += [f"sensitivity = {k}={w:.6g}" for k, w in weights.items()]
    lines += [f"sensitivity = {k}@{layer}={w:.6g}" for (layer, k), w in (per_layer or {}).items()]
    return "\n".join(lines) + "\n"


def read_plan_config(text: str) -> dict:
    """{kind or (layer, kind): weight} from plan_config's lines (``#`` comments and blank lines
    skipped), the form ``make_plan(sensitivity=...)`` takes. Raises ValueError on a line that is
    not ``sensitivity = kind=w`` or ``sensitivity = kind@layer=w``."""
    out: dict = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        key, _, value = (part.strip() for part in line.partition("="))
        name, eq, weight = value.partition("=")
        if key != "sensitivity" or not eq:
            raise ValueError(f"line {n}: expected 'sensitivity = kind[@layer]=weight', "
                             f"got {line!r}")
        kind, at, layer = name.strip().partition("@")
        try:
            out[(int(layer), kind) if at else kind] = float(weight)
        except ValueError:
            raise ValueError(f"line {n}: bad layer or weight in {line!r}") from None
    return out


def table(result: dict, metric: str) -> str:
    """The measurements at every scheme for one metric, one row a kind."""
    rel = {s: relative(result, s, metric) for s in SCHEMES}
    head = f"{'kind':<18}{'category':<18}{'default':>8}" + "".join(
        f"{s[:4] + ' act':>12}{s[:4] + ' grad':>12}{s[:4] + ' rel':>10}" for s in SCHEMES)
    rows = [f"gradient error: {metric}", head + f"{'8/4':>7}"]
    known = defaults()
    for k in result:
        category, default, _ = known[k]
        row = f"{k:<18}{category:<18}{default:>8.1f}"
        for s in SCHEMES:
            r = result[k][s]
            row += f"{r['activation']:>12.3e}{r['gradient'][metric]:>12.3e}{rel[s][k]:>10.3g}"
        ratio = result[k][SCHEMES[0]]["sensitivity"][metric] / \
            result[k][SCHEMES[1]]["sensitivity"][metric]
        rows.append(row + f"{ratio:>7.2f}")
    return "\n".join(rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=384)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=300, help="fp32 training steps before measuring")
    p.add_argument("--batches", type=int, default=4)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--json", help="write every measurement here")
    p.add_argument("--plan-config", help="write agoq_plan --config lines with the sensitivities")
    p.add_argument("--scheme", choices=SCHEMES, default=SCHEMES[0],
                   help="the scheme whose sensitivities --plan-config writes")
    p.add_argument("--metric", choices=METRICS, default="per_tensor",
                   help="the gradient error --plan-config's sensitivities use")
    p.add_argument("--per-layer", action="store_true",
                   help="also measure each layer alone (at --scheme and --metric)")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    cfg = ModelConfig(layers=a.layers, hidden=a.hidden, heads=a.heads, ffn=a.ffn, seq=a.seq)
    torch.manual_seed(a.seed)
    model = GPT(cfg)
    train_data, _ = split(corpus())
    gen = torch.Generator().manual_seed(a.seed)

    def batch():
        starts = torch.randint(0, train_data.numel() - cfg.seq - 1, (a.micro_batch,),
                               generator=gen)
        return windows(train_data, starts, cfg.seq)

    warm_up(model, batch, a.steps)
    batches = [batch() for _ in range(a.batches)]
    result = measure(model, batches)
    for metric in METRICS:
        print("\n" + table(result, metric))
    per_layer = None
    if a.per_layer:
        per_layer = [measure(model, batches, schemes=(a.scheme,), layers={layer})
                     for layer in range(cfg.layers)]
        print("\n" + per_layer_table(result, per_layer, a.scheme, a.metric))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(model=vars(a), measured=result, per_layer=per_layer,
                           relative={m: {s: relative(result, s, m) for s in SCHEMES}
                                     for m in METRICS}), f, indent=1)
    if a.plan_config:
        with open(a.plan_config, "w") as f:
            layers = per_layer and per_layer_relative(result, per_layer, a.scheme, a.metric)
            f.write(plan_config(relative(result, a.scheme, a.metric),
                                f"sensitivity.py {' '.join(sys.argv[1:] if argv is None else argv)}"
                                f"\n{a.scheme}, gradient error {a.metric}, linear inputs' mean 1",
                                layers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
