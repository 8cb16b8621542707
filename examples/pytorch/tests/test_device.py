"""Tests of the agoq PyTorch extension's calls on GPU tensors (the device module,
csrc/device.cuh): every saved-tensor call, fused op and measure(), the GradientBuffer and
AdamW8bit classes and the 8-bit collectives, against the CPU module, bit for bit (so the CPU tests' bounds and float64
references hold for it too), its non-finite counts and its argument checks. On a GPU they run on CUDA tensors; without one, under
AGOQ_TORCH_DEVICE=emulated, on agoq's CUDA emulator (ctest pytorch_device_emulated), whose device
tensors are CPU tensors over its memory; else they skip.
Run: python3 -m unittest discover -s examples/pytorch/tests -p test_device.py"""

import math
import os
import socket
import sys
import unittest

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import agoq_torch as agoq  # noqa: E402

INT4 = "int4_g128_sym_rne_f32"
INT8 = "int8_g128_sym_rne_f32"
# Every code family and grouping the CPU tests use: nearest and stochastic rounding, asymmetric,
# FP8 with e8m0 scales, per row, per tensor, 2-bit codes.
SPECS = (INT4, INT8, "int8_g128_sym_sr_f32", "int2_g64_asym_rne_f32", "fp8e4m3_g32_rne_e8m0",
         "int8_row_sym_sr_bf16", "int4_tensor_sym_rne_f32", "int4_g128_asym_sr_f32")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def setUpModule():
    global dev, on_device, host
    if torch.cuda.is_available():
        dev, on_device, host = (lambda t: t.cuda()), (lambda t: t.is_cuda), (lambda t: t.cpu())
    elif os.environ.get("AGOQ_TORCH_DEVICE", "") == "emulated":
        module = agoq.device_module()
        # The emulator's device tensors are CPU tensors over its memory; clone() copies one out.
        dev, on_device, host = module.to_device, module.holds, (lambda t: t.clone())
    else:
        raise unittest.SkipTest("no GPU: set AGOQ_TORCH_DEVICE=emulated to run these tests on "
                                "agoq's CUDA emulator")


class DeviceTest(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)
        agoq.reset_nonfinite()

    def same(self, device_result, cpu_result, what):
        """Every tensor of a call's device result is on the device and equal, bit for bit, to the
        CPU module's."""
        if isinstance(cpu_result, torch.Tensor):
            device_result, cpu_result = (device_result,), (cpu_result,)
        self.assertEqual(len(device_result), len(cpu_result), what)
        for i, (d, c) in enumerate(zip(device_result, cpu_result)):
            self.assertTrue(on_device(d), f"{what}: output {i} is not on the device")
            d = host(d)
            self.assertEqual((d.dtype, d.shape), (c.dtype, c.shape), f"{what}: output {i}")
            self.assertTrue(torch.equal(d.view(-1).view(torch.uint8),
                                        c.view(-1).view(torch.uint8)),
                            f"{what}: output {i} differs from the CPU module's")

    def test_compress_decompress_fake_quantize_match_the_cpu(self):
        for dtype in DTYPES:
            x = (torch.randn(37, 384) * 3).to(dtype)
            x[5, 7] = 40.0  # an outlier in one group
            xd = dev(x)
            for spec in SPECS:
                what = f"{spec} {dtype}"
                buf = agoq.compress(xd, spec, seed=5, offset=11)
                self.same(buf, agoq.compress(x, spec, seed=5, offset=11), "compress " + what)
                self.same(agoq.decompress(buf, spec, 37, 384, dtype),
                          agoq.decompress(host(buf), spec, 37, 384, dtype), "decompress " + what)
                self.same(agoq.fake_quantize(xd, spec, seed=5, offset=11),
                          agoq.fake_quantize(x, spec, seed=5, offset=11), "fake_quantize " + what)

    def test_fused_ops_match_the_cpu(self):
        for dtype in DTYPES:
            x = torch.randn(19, 256).to(dtype)
            g, u = torch.randn(19, 256).to(dtype), torch.randn(19, 256).to(dtype)
            w = (1 + 0.1 * torch.randn(256)).to(dtype)
            dy = torch.randn(19, 256).to(dtype)
            xd, gd, ud, wd, dyd = map(dev, (x, g, u, w, dy))
            for spec in (INT8, INT4, "int8_g128_sym_sr_f32", "int4_row_sym_rne_f32"):
                what = f"{spec} {dtype}"
                fwd = agoq.rmsnorm_forward(xd, wd, 1e-6, spec, seed=3, offset=9)
                self.same(fwd, agoq.rmsnorm_forward(x, w, 1e-6, spec, seed=3, offset=9),
                          "rmsnorm_forward " + what)
                self.same(agoq.rmsnorm_forward_plain(xd, wd, 1e-6), (host(fwd[0]), host(fwd[2])),
                          "rmsnorm_forward_plain " + what)
                self.same(agoq.rmsnorm_backward(dyd, fwd[1], spec, fwd[2], wd),
                          agoq.rmsnorm_backward(dy, host(fwd[1]), spec, host(fwd[2]), w),
                          "rmsnorm_backward " + what)

                fwd = agoq.swiglu_forward(gd, ud, spec, INT4, seed=3, offset=9)
                self.same(fwd, agoq.swiglu_forward(g, u, spec, INT4, seed=3, offset=9),
                          "swiglu_forward " + what)
                self.same(agoq.swiglu_forward_plain(gd, ud), host(fwd[0]),
                          "swiglu_forward_plain " + what)
                self.same(agoq.swiglu_backward(dyd, fwd[1], spec, fwd[2], INT4),
                          agoq.swiglu_backward(dy, host(fwd[1]), spec, host(fwd[2]), INT4),
                          "swiglu_backward " + what)

                fwd = agoq.gelu_forward(xd, spec, seed=3, offset=9)
                self.same(fwd, agoq.gelu_forward(x, spec, seed=3, offset=9), "gelu_forward " + what)
                self.same(agoq.gelu_forward_plain(xd), host(fwd[0]), "gelu_forward_plain " + what)
                self.same(agoq.gelu_backward(dyd, fwd[1], spec),
                          agoq.gelu_backward(dy, host(fwd[1]), spec), "gelu_backward " + what)

                self.same(agoq.residual_add(xd, gd, spec, seed=3, offset=9),
                          agoq.residual_add(x, g, spec, seed=3, offset=9), "residual_add " + what)

    def test_wide_rows_and_many_groups(self):
        # Rows wider than the fused kernels' shared-memory row and a ragged last group.
        x = torch.randn(67, 4100).to(torch.bfloat16)
        w = (1 + 0.1 * torch.randn(4100)).to(torch.bfloat16)
        dy = torch.randn(67, 4100).to(torch.bfloat16)
        xd, wd = dev(x), dev(w)
        for spec in (INT8, "int4_g128_sym_sr_f32"):
            self.same(agoq.compress(xd, spec, seed=1), agoq.compress(x, spec, seed=1),
                      "compress " + spec)
            fwd = agoq.rmsnorm_forward(xd, wd, 1e-5, spec, seed=1)
            self.same(fwd, agoq.rmsnorm_forward(x, w, 1e-5, spec, seed=1), "rmsnorm " + spec)
            self.same(agoq.rmsnorm_backward(dev(dy), fwd[1], spec, fwd[2], wd),
                      agoq.rmsnorm_backward(dy, host(fwd[1]), spec, host(fwd[2]), w),
                      "rmsnorm_backward " + spec)

    @unittest.skipUnless(torch.cuda.is_available(), "needs a GPU (streams)")
    def test_runs_on_the_current_stream(self):
        x = torch.randn(64, 1024)
        x[3, 5] = math.nan
        expected = agoq.fake_quantize(x, INT4)
        agoq.reset_nonfinite()
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            xd = x.cuda(non_blocking=True)
            y = agoq.fake_quantize(xd, INT4)
            y2 = agoq.rmsnorm_forward_plain(y, torch.ones(1024, device="cuda"), 1e-6)[0]
        agoq.compress(dev(x), INT8)  # on the default stream: a total of its own
        self.assertEqual(agoq.nonfinite_seen(), 2)  # synchronizes both streams' work
        stream.synchronize()
        self.assertTrue(torch.equal(y.cpu(), expected))  # NaN's codes are those of zero
        self.assertTrue(torch.equal(y2.cpu(), agoq.rmsnorm_forward_plain(expected,
                                                                         torch.ones(1024),
                                                                         1e-6)[0]))

    def test_measure_and_compress_measured_match_the_cpu(self):
        # One pass (groups of 128 in a row) and two (per row, 1100 columns: the dead zones' pass
        # under each row's absmax), with non-finite values left out.
        for dtype in (torch.float32, torch.bfloat16):
            x = (torch.randn(33, 1100) * 2).to(dtype)
            x[4, 17], x[9, 1000] = 60.0, math.nan
            for spec in (INT4, "int8_row_sym_rne_f32", "int2_g32_sym_rne_e8m0"):
                self.assertEqual(agoq.measure(dev(x), spec), agoq.measure(x, spec),
                                 f"measure {spec} {dtype}")
                buf, st = agoq.compress_measured(dev(x), spec, seed=3)
                self.assertTrue(torch.equal(buf.cpu(), agoq.compress(x, spec, seed=3)), spec)
                self.assertEqual(st, agoq.measure(x, spec), f"compress_measured {spec} {dtype}")

    def test_measured_forms_match_the_cpu(self):
        # No NaN: the executors' NaN payloads differ (the C++ device tests compare them as NaN).
        x, g = torch.randn(9, 1100), torch.randn(9, 1100)
        w = torch.rand(1100) + 0.5
        xd, gd = dev(x), dev(g)
        for spec in (INT4, "int8_row_sym_rne_f32", "int4_tensor_sym_rne_f32"):
            *fwd, st = agoq.rmsnorm_forward_measured(xd, dev(w), 1e-6, spec, seed=3)
            *ref, st_ref = agoq.rmsnorm_forward_measured(x, w, 1e-6, spec, seed=3)
            self.same(tuple(fwd), tuple(ref), "rmsnorm_forward_measured " + spec)
            self.assertEqual(st, st_ref, spec)
            *fwd, st, su = agoq.swiglu_forward_measured(xd, gd, spec, INT4, seed=3)
            *ref, st_ref, su_ref = agoq.swiglu_forward_measured(x, g, spec, INT4, seed=3)
            self.same(tuple(fwd), tuple(ref), "swiglu_forward_measured " + spec)
            self.assertEqual((st, su), (st_ref, su_ref), spec)
            *fwd, st = agoq.gelu_forward_measured(xd, spec, seed=3)
            *ref, st_ref = agoq.gelu_forward_measured(x, spec, seed=3)
            self.same(tuple(fwd), tuple(ref), "gelu_forward_measured " + spec)
            self.assertEqual(st, st_ref, spec)
            *fwd, st = agoq.residual_add_measured(xd, gd, spec, seed=3)
            *ref, st_ref = agoq.residual_add_measured(x, g, spec, seed=3)
            self.same(tuple(fwd), tuple(ref), "residual_add_measured " + spec)
            self.assertEqual(st, st_ref, spec)

    def test_nonfinite_values_are_counted(self):
        x = torch.randn(8, 256)
        x[1, 3], x[2, 4], x[7, 255] = math.nan, math.inf, -math.inf
        agoq.compress(dev(x), INT8)
        self.assertEqual(agoq.nonfinite_seen(), 3)
        agoq.gelu_forward(dev(x), INT4)
        agoq.fake_quantize(x, INT4)  # the CPU module's count adds to the device's
        self.assertEqual(agoq.nonfinite_seen(), 9)
        agoq.reset_nonfinite()
        self.assertEqual(agoq.nonfinite_seen(), 0)
        agoq.compress(dev(torch.randn(8, 256)), INT8)
        self.assertEqual(agoq.nonfinite_seen(), 0)

    def test_empty_tensors(self):
        x = dev(torch.randn(0, 256))
        buf = agoq.compress(x, INT8)
        self.assertTrue(on_device(buf))
        self.assertEqual(buf.numel(), agoq.quantized_bytes(INT8, 0, 256))
        self.assertEqual(tuple(agoq.decompress(buf, INT8, 0, 256).shape), (0, 256))
        y, saved, rstd = agoq.rmsnorm_forward(x, dev(torch.ones(256)), 1e-6, INT8)
        self.assertEqual((tuple(y.shape), tuple(rstd.shape)), ((0, 256), (0,)))

    def test_bad_arguments(self):
        x = torch.randn(4, 256)
        xd = dev(x)
        # A second tensor on the CPU.
        with self.assertRaisesRegex(RuntimeError, r"rmsnorm_forward \(weight\): expected"):
            agoq.rmsnorm_forward(xd, torch.ones(256), 1e-6, INT8)
        with self.assertRaisesRegex(RuntimeError, r"swiglu_forward \(up\): expected"):
            agoq.swiglu_forward(xd, x, INT4, INT4)
        _, saved = agoq.gelu_forward(xd, INT4)
        with self.assertRaisesRegex(RuntimeError, r"gelu_backward \(saved_x\): expected"):
            agoq.gelu_backward(xd, host(saved), INT4)
        # A buffer of another spec's size, an invalid spec, an unsupported dtype, a 1-D tensor.
        with self.assertRaisesRegex(RuntimeError, r"decompress: a int4_g128_sym_rne_f32 buffer"):
            agoq.decompress(agoq.compress(xd, INT8), INT4, 4, 256)
        with self.assertRaises(ValueError):
            agoq.compress(xd, "int9_g128_sym_rne_f32")
        with self.assertRaisesRegex(RuntimeError, "expected float32, bfloat16 or float16"):
            agoq.compress(dev(x.double()), INT8)
        with self.assertRaisesRegex(RuntimeError, "expected a contiguous tensor"):
            agoq.fake_quantize(dev(torch.randn(256, 8)).t(), INT8)
        with self.assertRaisesRegex(RuntimeError, "expected a 2-D tensor"):
            agoq.compress(dev(torch.randn(256)), INT8)
        with self.assertRaisesRegex(RuntimeError, "shapes differ"):
            agoq.residual_add(xd, dev(torch.randn(4, 128)), INT8)
        with self.assertRaisesRegex(RuntimeError, r"decompress \(dtype\)"):
            agoq.decompress(agoq.compress(xd, INT8), INT8, 4, 256, torch.float64)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _collectives_worker(rank, world, port, n, backend, queue):
    """One rank of DeviceCollectivesTest: the device module's all-reduce and reduce-scatter over
    its ProcessGroupCommunicator, and the CPU module's over gloo from the same inputs. Puts
    (rank, mismatches, error) in the queue: the calls whose results differ from the CPU's, and
    the message of a deliberately mismatched call."""
    torch.set_num_threads(1)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        dm = agoq.device_module()
        if torch.cuda.is_available():
            to_dev, to_host = (lambda t: t.cuda()), (lambda t: t.cpu())
        else:
            to_dev, to_host = dm.to_device, (lambda t: t.clone())
        pg = dist.distributed_c10d._get_default_group()
        cpu_pg = pg if backend == "gloo" else dist.new_group(backend="gloo")
        dcomm, ccomm = dm.ProcessGroupCommunicator(pg), agoq.ProcessGroupCommunicator(cpu_pg)
        gen = torch.Generator().manual_seed(100 + rank)
        x = torch.randn(n, generator=gen) * (1 + rank)
        if rank == world - 1:
            x[7] = math.nan
        mismatches = []

        def check(what, device_tensor, cpu_tensor):
            if not torch.equal(to_host(device_tensor).view(torch.uint8),
                               cpu_tensor.view(torch.uint8)):
                mismatches.append(what)

        def counts(res):
            return {k: int(to_host(v)) if isinstance(v, torch.Tensor) else v
                    for k, v in res.items() if k != "corrupt"}

        out, ref = to_dev(torch.empty(n)), torch.empty(n)
        res = agoq.all_reduce_8bit(dcomm, to_dev(x), out, average=False)
        ref_res = agoq.all_reduce_8bit(ccomm, x, ref, average=False)
        check("all_reduce", out, ref)
        if counts(res) != {k: int(v) for k, v in ref_res.items()} or int(to_host(res["corrupt"])):
            mismatches.append(f"all_reduce counts {counts(res)} {ref_res}")
        if dcomm.bytes_sent != ccomm.bytes_sent:
            mismatches.append(f"bytes sent {dcomm.bytes_sent} {ccomm.bytes_sent}")
        # A GradientBuffer in, a bfloat16 mean out, stochastic rounding.
        buf, cbuf = dm.GradientBuffer(n, seed=rank), agoq.GradientBuffer(n, seed=rank)
        buf.accumulate(to_dev(x))
        cbuf.accumulate(x)
        out_b, ref_b = to_dev(torch.empty(n, dtype=torch.bfloat16)), torch.empty(
            n, dtype=torch.bfloat16)
        agoq.all_reduce_8bit(dcomm, buf, out_b, average=True, stochastic=True, seed=1, step=3)
        agoq.all_reduce_8bit(ccomm, cbuf, ref_b, average=True, stochastic=True, seed=1, step=3)
        check("all_reduce of a GradientBuffer", out_b, ref_b)
        shard, ref_shard = to_dev(torch.empty(n)), torch.empty(n)
        rs = agoq.reduce_scatter_8bit(dcomm, to_dev(x.half()), shard, average=False)
        ref_rs = agoq.reduce_scatter_8bit(ccomm, x.half(), ref_shard, average=False)
        begin, end = ref_rs["begin"], ref_rs["end"]
        check("reduce_scatter", shard[: end - begin], ref_shard[: end - begin])
        if counts(rs) != {k: int(v) for k, v in ref_rs.items()}:
            mismatches.append(f"reduce_scatter {counts(rs)} {ref_rs}")
        error = None
        try:  # rank 0 passes a different length: every rank must get the error, none hang
            m = n + 128 if rank == 0 else n
            agoq.all_reduce_8bit(dcomm, to_dev(torch.zeros(m)), to_dev(torch.zeros(m)))
        except ValueError as e:
            error = str(e)
        queue.put((rank, mismatches, error))
    finally:
        dist.destroy_process_group()


class DeviceCollectivesTest(unittest.TestCase):
    """The device module's 8-bit all-reduce and reduce-scatter against the CPU module's over gloo,
    bit for bit on every rank: three ranks on the emulator (gloo), one on a GPU (NCCL, which
    takes one GPU per rank)."""

    def test_collectives_match_the_cpu_on_every_rank(self):
        world, backend = (1, "nccl") if torch.cuda.is_available() else (3, "gloo")
        n = 5000  # a ragged last group and uneven chunks
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        port = _free_port()
        procs = [ctx.Process(target=_collectives_worker, args=(r, world, port, n, backend, queue))
                 for r in range(world)]
        for p in procs:
            p.start()
        results = sorted(queue.get(timeout=600) for _ in procs)
        for p in procs:
            p.join(timeout=60)
            self.assertEqual(p.exitcode, 0)
        for rank, mismatches, error in results:
            self.assertEqual(mismatches, [], f"rank {rank}")
            self.assertIsNotNone(error, f"rank {rank}")
            self.assertIn("all_reduce_8bit", error)


class DeviceOptimTest(unittest.TestCase):
    """The device module's GradientBuffer and AdamW8bit against the CPU module's classes, bit for
    bit: codes and scales (through to_tensor), counts, parameters and state records."""

    def setUp(self):
        torch.manual_seed(1)
        self.dm = agoq.device_module()

    def same_values(self, device_tensor, cpu_tensor, what):
        self.assertTrue(on_device(device_tensor), f"{what}: not on the device")
        self.assertTrue(torch.equal(host(device_tensor).view(torch.uint8),
                                    cpu_tensor.view(torch.uint8)), what)

    def test_gradient_buffer_matches_the_cpu(self):
        n = 1000  # a ragged last group at every group size
        for group_size, stochastic in ((128, True), (32, False), (256, True)):
            what = f"g{group_size} {'sr' if stochastic else 'rne'}"
            cpu = agoq.GradientBuffer(n, group_size, stochastic, seed=7)
            gpu = self.dm.GradientBuffer(n, group_size, stochastic, seed=7)
            self.assertEqual((gpu.size, gpu.group_size, gpu.bytes, gpu.spec),
                             (cpu.size, cpu.group_size, cpu.bytes, cpu.spec), what)
            for round_ in range(2):  # before and after zero()
                for k, dtype in enumerate(DTYPES):
                    g = (torch.randn(n) * (k + 1)).to(dtype)
                    if k == 1:
                        g[10], g[999] = math.nan, -math.inf
                    count = gpu.accumulate(dev(g))
                    self.assertTrue(on_device(count), what)
                    self.assertEqual(int(host(count)), cpu.accumulate(g), what)
                    self.same_values(gpu.to_tensor(), cpu.to_tensor(),
                                     f"{what}, accumulate {k} of round {round_}")
                self.assertEqual(gpu.nonfinite_count, cpu.nonfinite_count, what)
                gpu.zero()
                cpu.zero()
                self.same_values(gpu.to_tensor(), cpu.to_tensor(), f"{what}: zero()")

    def test_adamw_matches_the_cpu_and_resumes_from_its_records(self):
        n = 700
        for m_format, v_format, block in (("int8_linear", "e4m3_sqrt", 128),
                                          ("f32", "f32", 128), ("bf16", "uint8_sqrt", 64)):
            what = f"{m_format}/{v_format} block {block}"
            cpu = agoq.AdamW8bit(n, block, seed=3, m_format=m_format, v_format=v_format)
            gpu = self.dm.AdamW8bit(n, block, seed=3, m_format=m_format, v_format=v_format)
            self.assertEqual((gpu.size, gpu.bytes, gpu.bytes_per_parameter),
                             (cpu.size, cpu.bytes, cpu.bytes_per_parameter), what)
            p = torch.randn(n)
            pd = dev(p)
            for k, dtype in enumerate(DTYPES):
                g = (torch.randn(n) * 0.1).to(dtype)
                if k == 2:
                    g[5] = math.nan
                skipped = gpu.step(pd, dev(g), lr=1e-2, weight_decay=0.01)
                self.assertEqual(int(host(skipped)), cpu.step(p, g, lr=1e-2, weight_decay=0.01))
                self.same_values(pd, p, f"{what}: step {k}")
            self.assertEqual(gpu.step_count, 3)
            self.assertEqual(gpu.state_bytes(), cpu.state_bytes(), what)
            # A GradientBuffer as the gradient.
            buf, dbuf = agoq.GradientBuffer(n, 128, seed=1), self.dm.GradientBuffer(n, 128, seed=1)
            g = torch.randn(n)
            buf.accumulate(g)
            dbuf.accumulate(dev(g))
            gpu.step(pd, dbuf, lr=1e-2)
            cpu.step(p, buf, lr=1e-2)
            self.same_values(pd, p, f"{what}: a GradientBuffer's step")
            # A device state made from the CPU state's record continues it bit for bit.
            resumed = self.dm.AdamW8bit.from_state_bytes(cpu.state_bytes())
            self.assertEqual(resumed.step_count, 4)
            pr = dev(p)
            g = torch.randn(n)
            resumed.step(pr, dev(g), lr=1e-2)
            cpu.step(p, g, lr=1e-2)
            self.same_values(pr, p, f"{what}: the resumed state's step")
            self.assertEqual(resumed.state_bytes(), cpu.state_bytes(), what)

    def test_empty_buffer_and_state(self):
        buf = self.dm.GradientBuffer(0)
        self.assertEqual(int(host(buf.accumulate(dev(torch.randn(0))))), 0)
        self.assertEqual(tuple(buf.to_tensor().shape), (0,))
        adamw = self.dm.AdamW8bit(0)
        self.assertEqual(int(host(adamw.step(dev(torch.randn(0)), dev(torch.randn(0)), 1e-3))),
                         0)
        cpu = agoq.AdamW8bit(0)
        cpu.step(torch.randn(0), torch.randn(0), 1e-3)
        self.assertEqual(adamw.state_bytes(), cpu.state_bytes())

    def test_bad_arguments(self):
        buf = self.dm.GradientBuffer(256)
        adamw = self.dm.AdamW8bit(256)
        with self.assertRaisesRegex(RuntimeError, r"GradientBuffer.accumulate: expected 256"):
            buf.accumulate(dev(torch.randn(255)))
        with self.assertRaisesRegex(RuntimeError, r"GradientBuffer.accumulate: expected a"):
            buf.accumulate(torch.randn(256))  # host memory
        with self.assertRaisesRegex(RuntimeError, "must be float32"):
            adamw.step(dev(torch.randn(256).half()), dev(torch.randn(256)), 1e-3)
        with self.assertRaisesRegex(RuntimeError, r"AdamW8bit.step \(grad\): expected 256"):
            adamw.step(dev(torch.randn(256)), dev(torch.randn(128)), 1e-3)
        with self.assertRaisesRegex(RuntimeError, "a GradientBuffer of this module"):
            adamw.step(dev(torch.randn(256)), agoq.GradientBuffer(256), 1e-3)
        with self.assertRaises(ValueError):
            self.dm.GradientBuffer(256, group_size=16)
        with self.assertRaises(ValueError):
            self.dm.AdamW8bit(256, m_format="e4m3")
        with self.assertRaisesRegex(ValueError, "block"):  # the device step's blocks: 32 to 256
            self.dm.AdamW8bit(256, block=100).step(dev(torch.randn(256)), dev(torch.randn(256)),
                                                   1e-3)


if __name__ == "__main__":
    unittest.main()
