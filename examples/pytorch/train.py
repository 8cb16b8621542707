"""Data-parallel training of the small GPT (gpt.py) on the CPU, with or without agoq.

P processes (torch.multiprocessing, gloo over 127.0.0.1) start from the same seeded weights and
each trains on its own shard of byte windows drawn from the Python standard library's sources
(sorted ``<stdlib>/*.py`` concatenated, 90% train / 10% validation). What a run quantizes:

- **activations**: ``fp32`` (the baseline: every saved tensor kept as is), ``bf16``, ``agoq``
  (agoq's planner with its default policy under a per-GPU budget), ``uniform:<spec>`` (every saved
  tensor, attention included, in one scheme; the logsumexp stays fp32) or ``layer-aware:<spec>``
  (the default policy's layer awareness with ``<spec>`` for the linear and activation-function
  inputs: attention kept in bf16, the residual stream at int8), or ``hooks:<spec>`` (the model's
  plain torch forward, unchanged, under ``agoq_torch.QuantizedSaves(<spec>)``: every tensor
  autograd saves, attention's probabilities included, through the saved-tensor hooks; parameters,
  inputs and per-token vectors kept; ``hooks:none`` keeps everything, the plain path's baseline),
  or ``hooks-layer-aware:<spec>`` (``<spec>`` in the blocks but for their attention core,
  ``blocks.*.core``; the embedding and the head kept, as agoq's memory model keeps them);
- **gradients**: ``fp32`` (a flat fp32 gradient, torch all-reduce), ``agoq8`` (micro-batch
  gradients accumulated into agoq's 8-bit GradientBuffer with stochastic rounding, then agoq's
  8-bit all-reduce over the torch process group), or ``int4_g128`` / ``int4_tensor`` (each rank's
  gradient fake-quantized to 4 bits with per-group or per-tensor scales, then an fp32 all-reduce);
- **optimizer**: ``fp32`` (torch.optim.AdamW) or ``adam8`` (agoq's AdamW8bit).

Every step checks that the reduced gradient is bit-identical on every rank; the end checks the
parameters. Rank 0 prints progress and writes a JSON log (``--out``) with the loss curves, the
measured saved-activation bytes per micro-batch and agoq's memory-model prediction, the
gradient-buffer and optimizer-state bytes, the bytes each rank sent per step, and the wall time.

Run ``/usr/bin/python3 examples/pytorch/train.py --help`` (any python that can import torch).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import glob
import io
import json
import math
import os
import socket
import sys
import sysconfig
import tempfile
import time
import zlib
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import torch_check  # noqa: E402  (clear messages when torch or a feature is missing)

torch_check.require_torch()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from gpt import GPT, KINDS, ActivationSaver, ModelConfig, is_quantized, uniform_plan  # noqa: E402

GRADIENT_MODES = ("fp32", "agoq8", "int4_g128", "int4_tensor")
OPTIMIZERS = ("fp32", "adam8")
#: Fake-quantization spec of the 4-bit gradient modes.
GRADIENT_SPECS = {"int4_g128": "int4_g128_sym_rne_f32", "int4_tensor": "int4_tensor_sym_rne_f32"}


@dataclass
class TrainConfig:
    """One training run. The defaults are the configuration of docs/results.md."""

    name: str = "baseline"
    activations: str = "fp32"
    budget_headroom: float = 0.05
    sensitivity: str = ""
    gradients: str = "fp32"
    optimizer: str = "fp32"
    ranks: int = 4
    micro_batches: int = 2
    micro_batch: int = 4
    steps: int = 300
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup: int = 15
    beta1: float = 0.9
    beta2: float = 0.95
    weight_decay: float = 0.01
    clip: float = 1.0
    eval_interval: int = 25
    val_sequences: int = 64
    seed: int = 0
    log_every: int = 25
    model: ModelConfig = field(default_factory=ModelConfig)

    def validate(self) -> None:
        """Raises ValueError naming the first bad field."""
        if (self.activations not in ("fp32", "bf16", "agoq")
                and not self.activations.startswith(
                    ("uniform:", "layer-aware:", "hooks:", "hooks-layer-aware:"))):
            raise ValueError(f"activations must be fp32, bf16, agoq, uniform:<spec>, "
                             f"layer-aware:<spec>, hooks:<spec> or hooks-layer-aware:<spec>, "
                             f"got {self.activations!r}")
        if self.gradients not in GRADIENT_MODES:
            raise ValueError(f"gradients must be one of {GRADIENT_MODES}, got {self.gradients!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        for name in ("ranks", "micro_batches", "micro_batch", "steps", "eval_interval",
                     "val_sequences", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.val_sequences % self.ranks:
            raise ValueError(f"val_sequences ({self.val_sequences}) must be a multiple of ranks")

    def uses_hooks(self) -> bool:
        """Whether the run stores its activations through QuantizedSaves (``hooks:``,
        ``hooks-layer-aware:``) rather than gpt.py's saver."""
        return self.activations.startswith(("hooks:", "hooks-layer-aware:"))

    def uses_agoq(self) -> bool:
        """Whether the run needs the agoq_torch extension."""
        return (self.activations not in ("fp32", "bf16") or self.gradients != "fp32"
                or self.optimizer != "fp32")


# ---------------------------------------------------------------------------------------------
# Data


def corpus() -> torch.Tensor:
    """The sorted standard-library sources (``<stdlib>/*.py``) concatenated, as uint8."""
    stdlib = sysconfig.get_paths()["stdlib"]
    files = sorted(glob.glob(os.path.join(stdlib, "*.py")))
    if not files:
        raise FileNotFoundError(f"no *.py files in the standard library folder {stdlib}")
    data = bytearray()
    for path in files:
        with open(path, "rb") as f:
            data += f.read()
    return torch.frombuffer(data, dtype=torch.uint8).clone()


def split(data: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, validation): the first 90% and the last 10% of the corpus."""
    cut = int(0.9 * data.numel())
    return data[:cut], data[cut:]


def windows(data: torch.Tensor, starts: torch.Tensor, seq: int):
    """(inputs, targets) int64 [len(starts), seq]: byte windows and the same shifted by one."""
    idx = starts[:, None] + torch.arange(seq + 1)
    w = data[idx].long()
    return w[:, :-1], w[:, 1:]


def train_batch(data, cfg: TrainConfig, rank: int, step: int, micro: int):
    """The micro-batch ``micro`` of ``step`` on ``rank``: random windows, the same in every run
    with the same seed, different on every rank."""
    g = torch.Generator().manual_seed(
        ((cfg.seed * 1_000_003 + step) * 64 + micro) * 256 + rank)
    starts = torch.randint(0, data.numel() - cfg.model.seq - 1, (cfg.micro_batch,), generator=g)
    return windows(data, starts, cfg.model.seq)


def val_starts(data, cfg: TrainConfig) -> torch.Tensor:
    """The fixed validation windows: ``val_sequences`` evenly spaced starts."""
    last = data.numel() - cfg.model.seq - 1
    return torch.linspace(0, last, cfg.val_sequences).long()


# ---------------------------------------------------------------------------------------------
# Plans, parameters, schedule


def activation_plan(cfg: TrainConfig) -> list[dict]:
    """The per-layer storages of the run's ``activations`` setting."""
    mcfg, act = cfg.model, cfg.activations
    if act in ("fp32", "bf16"):
        return uniform_plan(mcfg, act)
    import agoq_torch

    if cfg.uses_hooks():
        return uniform_plan(mcfg, "fp32")  # the saver is not used: QuantizedSaves stores them
    if act.startswith("uniform:"):
        return uniform_plan(mcfg, act.split(":", 1)[1])
    defaults = {k: v[0] for k, v in agoq_torch.default_policy().items()}
    if act.startswith("layer-aware:"):
        spec = act.split(":", 1)[1]
        layer = {k: (spec if defaults[k].startswith("int4") else defaults[k]) for k in KINDS}
        return [dict(layer) for _ in range(mcfg.layers)]
    if act == "agoq":
        return agoq_plan(cfg)["layers"]
    raise ValueError(f"unknown activations setting {act!r}")


def hooks_spec(cfg: TrainConfig) -> str | None:
    """The ``<spec>`` of a ``hooks:<spec>`` or ``hooks-layer-aware:<spec>`` run (None for
    ``none``)."""
    spec = cfg.activations.split(":", 1)[1]
    return None if spec == "none" else spec


def quantized_saves(cfg: TrainConfig, model: torch.nn.Module, seed: int):
    """The QuantizedSaves context of a hooks run: ``<spec>`` everywhere (``hooks:``), or in the
    blocks but for their attention cores (``hooks-layer-aware:``; the first matching pattern
    wins)."""
    import agoq_torch

    spec = hooks_spec(cfg)
    if cfg.activations.startswith("hooks:"):
        return agoq_torch.QuantizedSaves(spec, seed=seed)
    return agoq_torch.QuantizedSaves(None, model, {"blocks.*.core": None, "blocks.*": spec},
                                     seed=seed)


def _memory_formats(cfg: TrainConfig) -> dict:
    return dict(gradients="int8" if cfg.gradients == "agoq8" else "fp32",
                optimizer="int8" if cfg.optimizer == "adam8" else "fp32")


def agoq_plan(cfg: TrainConfig) -> dict:
    """agoq's plan for this model with the default policy, data-parallel over ``ranks``, under a
    budget of the default policy's memory plus ``budget_headroom`` of the room between its
    activations and bf16 activations (0: the default policy itself; 1: everything bf16), with
    the error model's default sensitivities or, where ``sensitivity`` names a file, those its
    lines set (sensitivity.py --plan-config)."""
    import agoq_torch

    weights = None
    if cfg.sensitivity:
        from sensitivity import read_plan_config

        with open(cfg.sensitivity) as f:
            weights = read_plan_config(f.read())

    model, mb, seq = cfg.model.planner_model(), cfg.micro_batch, cfg.model.seq
    formats = _memory_formats(cfg)
    least = agoq_torch.estimate_memory(model, mb, seq, dp=cfg.ranks, **formats)[0]
    bf16 = cfg.model.layers * agoq_torch.layer_activation_bytes(
        model, mb, seq, uniform_plan(cfg.model, "bf16")[0])
    budget = least["total"] + cfg.budget_headroom * (bf16 - least["activations"])
    return agoq_torch.make_plan(model, mb, seq, int(budget), dp=cfg.ranks,
                                micro_batches=cfg.micro_batches, sensitivity=weights, **formats)


def predicted_activation_bytes(cfg: TrainConfig, plan: list[dict]) -> int:
    """agoq's memory model: the bytes one micro-batch's blocks save under ``plan``."""
    import agoq_torch

    model = cfg.model.planner_model()
    return sum(agoq_torch.layer_activation_bytes(model, cfg.micro_batch, cfg.model.seq, layer)
               for layer in plan)


def fp32_ring_bytes(n: int, ranks: int) -> int:
    """Bytes each rank sends in a ring all-reduce of n fp32 values: 2 (P-1)/P * 4n (formula)."""
    return 2 * (ranks - 1) * n * 4 // ranks


class FlatParameters:
    """Every parameter of a module as a view of one fp32 vector, every gradient a view of
    another, so the whole model is reduced and updated as one flat buffer."""

    def __init__(self, module: torch.nn.Module):
        self.params = list(module.parameters())
        n = sum(p.numel() for p in self.params)
        self.data = torch.empty(n)
        self.grad = torch.zeros(n)
        offset = 0
        for p in self.params:
            k = p.numel()
            self.data[offset:offset + k].copy_(p.detach().reshape(-1))
            p.data = self.data[offset:offset + k].view_as(p)
            p.grad = self.grad[offset:offset + k].view_as(p)
            offset += k

    @property
    def size(self) -> int:
        return self.data.numel()

    def check_views(self) -> None:
        """Raises if autograd replaced a gradient view instead of accumulating into it."""
        for p in self.params:
            if p.grad is None or p.grad.storage().data_ptr() != self.grad.storage().data_ptr():
                raise RuntimeError("a parameter's gradient is no longer a view of the flat buffer")


def learning_rate(cfg: TrainConfig, step: int) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine decay to ``min_lr_ratio`` of the peak."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup - 1)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def crc(t: torch.Tensor) -> int:
    """CRC-32 of a tensor's bytes (cross-rank bit-identity checks)."""
    return zlib.crc32(t.contiguous().numpy().tobytes())


def same_on_every_rank(value: int) -> bool:
    """Whether every rank passed the same integer (all_gather)."""
    mine = torch.tensor([value], dtype=torch.int64)
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return all(int(v) == value for v in every)


# ---------------------------------------------------------------------------------------------
# One rank


class Rank:
    """The state of one data-parallel rank: model, flat parameters, gradient path, optimizer."""

    def __init__(self, cfg: TrainConfig, rank: int, data: torch.Tensor):
        self.cfg, self.rank = cfg, rank
        self.agoq = self.comm = None
        if cfg.uses_agoq():
            # The parent process built the extension and showed its messages; the ranks only
            # load it, and their copies of those messages would repeat them P times.
            quiet = io.StringIO()
            with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
                import agoq_torch

            self.agoq = agoq_torch
        self.train_data, self.val_data = split(data)
        self.val_starts = val_starts(self.val_data, cfg)[rank::cfg.ranks]
        torch.manual_seed(cfg.seed)
        self.model = GPT(cfg.model)
        self.flat = FlatParameters(self.model)
        self.plan = activation_plan(cfg)
        self.saver = ActivationSaver(self.plan, seed=cfg.seed * 1000 + rank)
        self.hooks = (quantized_saves(cfg, self.model, cfg.seed * 1000 + rank)
                      if cfg.uses_hooks() else None)
        n = self.flat.size
        self.reduced = torch.empty(n)
        self.zeroed = 0.0  # sum over steps of the share of non-zero gradients 4 bits rounded to 0
        if cfg.gradients == "agoq8":
            self.buffer = self.agoq.GradientBuffer(n, group_size=128, stochastic=True,
                                                   seed=cfg.seed * 1000 + rank)
            self.comm = self.agoq.ProcessGroupCommunicator(
                dist.distributed_c10d._get_default_group())
        if cfg.optimizer == "adam8":
            self.adam8 = self.agoq.AdamW8bit(n, block=128, seed=cfg.seed)
        else:
            self.master = torch.nn.Parameter(self.flat.data)
            self.adamw = torch.optim.AdamW([self.master], lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                                           eps=1e-8, weight_decay=cfg.weight_decay)

    def gradient_bytes(self) -> int:
        """Bytes of the gradient kept across micro-batches (agoq8: the 8-bit buffer)."""
        return self.buffer.bytes if self.cfg.gradients == "agoq8" else self.flat.size * 4

    def optimizer_bytes(self) -> int:
        """Bytes of the optimizer states (after the first step)."""
        if self.cfg.optimizer == "adam8":
            return self.adam8.bytes
        state = self.adamw.state[self.master]
        return sum(t.numel() * t.element_size() for t in state.values()
                   if torch.is_tensor(t) and t.numel() > 1)

    def forward_backward(self, step: int) -> tuple[float, list[int]]:
        """Runs the step's micro-batches; returns (mean loss, saved bytes of each micro-batch)."""
        cfg, losses, saved = self.cfg, [], []
        self.flat.grad.zero_()
        if cfg.gradients == "agoq8":
            self.buffer.zero()
        for micro in range(cfg.micro_batches):
            x, y = train_batch(self.train_data, cfg, self.rank, step, micro)
            if self.hooks is None:
                self.saver.begin_micro_batch(step * cfg.micro_batches + micro)
                loss = self.model(x, y, self.saver)
            else:
                with self.hooks:
                    loss = self.model(x, y)
            (loss / cfg.micro_batches).backward()
            losses.append(loss.item())
            saved.append(self.saver.total_bytes() if self.hooks is None
                         else self.hooks.stats["stored_bytes"] + self.hooks.stats["kept_bytes"])
            if cfg.gradients == "agoq8":
                self.buffer.accumulate(self.flat.grad)
                self.flat.grad.zero_()
        if step == 0:
            self.flat.check_views()
        return sum(losses) / len(losses), saved

    def all_reduce(self, step: int) -> int:
        """Leaves the rank-averaged gradient in ``self.reduced``; returns the bytes this rank
        sent (measured by the communicator for agoq8, the ring formula for fp32)."""
        cfg = self.cfg
        if cfg.gradients == "agoq8":
            self.comm.reset_counts()
            info = self.agoq.all_reduce_8bit(self.comm, self.buffer, self.reduced, group_size=128,
                                             average=True, step=step)
            if info["nonfinite"]:
                raise FloatingPointError(f"non-finite gradient at step {step}")
            return self.comm.bytes_sent
        g = self.flat.grad
        if cfg.gradients in GRADIENT_SPECS:
            q = self.agoq.fake_quantize(g.view(1, -1), GRADIENT_SPECS[cfg.gradients]).view(-1)
            nonzero = g != 0
            self.zeroed += float((nonzero & (q == 0)).sum()) / max(1, int(nonzero.sum()))
            g = q
        self.reduced.copy_(g)
        dist.all_reduce(self.reduced)
        self.reduced.div_(cfg.ranks)
        return fp32_ring_bytes(self.flat.size, cfg.ranks)

    def optimizer_step(self, step: int) -> None:
        """Clips the reduced gradient to ``clip`` (global norm) and applies AdamW."""
        cfg, lr = self.cfg, learning_rate(self.cfg, step)
        norm = float(self.reduced.norm())
        if norm > cfg.clip:
            self.reduced.mul_(cfg.clip / norm)
        if cfg.optimizer == "adam8":
            self.adam8.step(self.flat.data, self.reduced, lr, beta1=cfg.beta1, beta2=cfg.beta2,
                            eps=1e-8, weight_decay=cfg.weight_decay)
        else:
            for group in self.adamw.param_groups:
                group["lr"] = lr
            self.master.grad = self.reduced
            self.adamw.step()

    @torch.no_grad()
    def validation_loss(self) -> float:
        """Mean loss over the fixed validation windows (each rank evaluates its share)."""
        total = torch.zeros(1, dtype=torch.float64)
        for chunk in self.val_starts.split(8):
            x, y = windows(self.val_data, chunk, self.cfg.model.seq)
            total += self.model(x, y).double() * len(chunk)
        dist.all_reduce(total)
        return float(total) / self.cfg.val_sequences


def _worker(rank: int, cfg: TrainConfig, port: int, out: str) -> None:
    """One process of a run: trains, checks, and on rank 0 writes the JSON log to ``out``."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=cfg.ranks, timeout=_timeout())
    r = None
    try:
        r = Rank(cfg, rank, corpus())
        log = _train(cfg, r)
        if rank == 0:
            with open(out, "w") as f:
                json.dump(log, f)
    finally:
        # Drop agoq's communicator (a reference to the process group) first, so torch destroys the
        # group (the communicator also drops it without the GIL, which gloo's threads need).
        if r is not None:
            r.comm = None
        dist.destroy_process_group()


def _train(cfg: TrainConfig, r: Rank) -> dict:
    """The training loop of one rank; returns the log (complete on rank 0)."""
    log = dict(config=_config_dict(cfg), parameters=r.flat.size, plan=r.plan, train=[], val=[])
    start = time.time()
    for step in range(cfg.steps):
        loss, saved = r.forward_backward(step)
        sent = r.all_reduce(step)
        if not same_on_every_rank(crc(r.reduced)):
            raise RuntimeError(f"the reduced gradient differs across ranks at step {step}")
        r.optimizer_step(step)
        mean = torch.tensor([loss])
        dist.all_reduce(mean)
        loss = float(mean) / cfg.ranks
        if step == 0:
            log.update(saved_bytes=saved[0], bytes_sent=sent)
        if any(s != saved[0] for s in saved) or sent != log["bytes_sent"]:
            raise RuntimeError(f"saved or sent bytes changed between micro-batches or steps "
                               f"at step {step}: {saved}, {sent}")
        log["train"].append([step + 1, loss, round(time.time() - start, 3)])
        last = step + 1 == cfg.steps
        if (step + 1) % cfg.eval_interval == 0 or last or step == 0:
            log["val"].append([step + 1, r.validation_loss()])
        if r.rank == 0 and ((step + 1) % cfg.log_every == 0 or last):
            _progress(cfg, log, step + 1, time.time() - start)
    if not same_on_every_rank(crc(r.flat.data)):
        raise RuntimeError("the parameters differ across ranks at the end of training")
    log.update(_summary(cfg, r, log, time.time() - start))
    return log


def _timeout():
    import datetime

    return datetime.timedelta(seconds=300)


def _config_dict(cfg: TrainConfig) -> dict:
    d = dataclasses.asdict(cfg)
    d["model"] = dataclasses.asdict(cfg.model)
    return d


def _summary(cfg: TrainConfig, r: Rank, log: dict, wall: float) -> dict:
    """What results.py tabulates, measured on rank 0, with the memory model's predictions."""
    s = dict(
        wall_s=round(wall, 2),
        step_s=round(wall / cfg.steps, 4),
        gradient_bytes=r.gradient_bytes(),
        gradient_bytes_fp32=r.flat.size * 4,
        optimizer_bytes=r.optimizer_bytes(),
        bytes_sent_fp32_ring=fp32_ring_bytes(r.flat.size, cfg.ranks),
        bytes_sent_source="communicator" if cfg.gradients == "agoq8" else "formula",
        saved_bytes_by_kind=r.saver.bytes_by_kind,
        final_val_loss=log["val"][-1][1],
        checks=dict(allreduce_identical_steps=cfg.steps, params_identical=True),
    )
    if r.hooks is not None:
        s["saved_tensors_hooks"] = r.hooks.stats
    elif r.agoq is not None:
        s["saved_bytes_predicted"] = predicted_activation_bytes(cfg, r.plan)
        s["saved_bytes_bf16_predicted"] = predicted_activation_bytes(
            cfg, uniform_plan(cfg.model, "bf16"))
    if cfg.gradients in GRADIENT_SPECS:
        s["gradient_zeroed_fraction"] = r.zeroed / cfg.steps
    if cfg.gradients == "agoq8":
        s["bytes_sent_predicted"] = r.agoq.all_reduce_bytes_sent(r.flat.size, cfg.ranks, 128)
    return s


def _progress(cfg: TrainConfig, log: dict, step: int, elapsed: float) -> None:
    """One progress line: step, train loss (mean of the last steps), last validation loss."""
    recent = [row[1] for row in log["train"][-cfg.log_every:]]
    eta = elapsed / step * (cfg.steps - step)
    print(f"  {cfg.name:<16} step {step:4d}/{cfg.steps}  loss {sum(recent) / len(recent):.3f}  "
          f"val {log['val'][-1][1]:.3f}  {1000 * elapsed / step:5.0f} ms/step  "
          f"eta {eta:4.0f} s", flush=True)


def free_port() -> int:
    """A TCP port nobody listens on right now (127.0.0.1)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cfg: TrainConfig) -> dict:
    """Trains ``cfg`` with ``cfg.ranks`` processes and returns rank 0's log."""
    cfg.validate()
    if cfg.uses_agoq():
        agoq = torch_check.require_agoq()  # build the extension once, before the ranks load it
        for storage in {s for layer in activation_plan(cfg) for s in layer.values()}:
            if is_quantized(storage):
                agoq.quantized_bytes(storage, 1, 128)  # a ValueError naming a bad spec, up front
        if cfg.uses_hooks():
            quantized_saves(cfg, GPT(cfg.model), 0)  # the same for the hooks' spec
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "log.json")
        mp.spawn(_worker, args=(cfg, free_port(), out), nprocs=cfg.ranks, join=True)
        with open(out) as f:
            return json.load(f)


def parse_args(argv=None) -> tuple[TrainConfig, str | None]:
    """TrainConfig from the command line (every field a flag), and the JSON output path."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = TrainConfig()
    choices = dict(gradients=GRADIENT_MODES, optimizer=OPTIMIZERS)
    for f in dataclasses.fields(TrainConfig):
        if f.name == "model":
            continue
        p.add_argument("--" + f.name.replace("_", "-"), type=type(getattr(defaults, f.name)),
                       default=getattr(defaults, f.name), choices=choices.get(f.name))
    for f in dataclasses.fields(ModelConfig):
        p.add_argument("--model-" + f.name, type=type(f.default), default=f.default)
    p.add_argument("--out", help="write rank 0's JSON log here")
    a = vars(p.parse_args(argv))
    model = ModelConfig(**{f.name: a.pop("model_" + f.name)
                           for f in dataclasses.fields(ModelConfig)})
    out = a.pop("out")
    cfg = TrainConfig(model=model, **a)
    try:
        cfg.validate()
    except ValueError as e:
        p.error(str(e))
    return cfg, out


def main(argv=None) -> None:
    cfg, out = parse_args(argv)
    try:
        log = run(cfg)
    except ValueError as e:
        torch_check.fail(str(e))
    print(f"final validation loss {log['final_val_loss']:.4f}; saved activations "
          f"{log['saved_bytes']} B per micro-batch; gradient {log['gradient_bytes']} B; "
          f"optimizer {log['optimizer_bytes']} B; sent {log['bytes_sent']} B per step per rank; "
          f"{log['step_s']:.3f} s per step")
    if out:
        with open(out, "w") as f:
            json.dump(log, f, indent=1)


if __name__ == "__main__":
    main()
