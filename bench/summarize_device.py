"""Writes the device-check summary: test results, and each kernel's GB/s with its ratio to a
device-to-device copy of the same size measured in the same run."""
import json
import re
import sys
from pathlib import Path

out = Path(sys.argv[1])
tests_rc, example_rc, bench_rc = (int(a) for a in sys.argv[2:5])

print("# agoq device check\n")
print("## Tests\n")
log = (out / "tests.log").read_text(errors="replace") if (out / "tests.log").exists() else ""
for line in log.splitlines():
    m = re.search(r"Test\s+#\d+: (\S+) \.+\s*(.*)$", line)
    if m:
        print(f"- {m.group(1)}: {m.group(2).strip()}")
print(f"\nctest exit code {tests_rc}")
if (out / "example.log").exists():
    example = (out / "example.log").read_text(errors="replace").strip()
    print(f"\nquantized_matmul (exit {example_rc}): {example}\n")
print(f"\nbenchmarks exit code {bench_rc}\n")

# Quantize, dequantize and measure beside a copy of the same size (bench/quantize_device_bench.cu).
if (out / "bench.json").exists():
    print("## Benchmarks (bytes read + written per second; ratio to the copy of the same size)\n")
    data = json.loads((out / "bench.json").read_text())
    copy = {}
    copy_time = {}
    rows = []
    for b in data["benchmarks"]:
        if b.get("error_occurred"):
            continue
        name = b["name"]
        size = int(re.search(r"/(\d+)/", name + "/").group(1))
        gbps = b["bytes_per_second"] / 1e9
        if name.startswith("bm_copy"):
            copy[size] = gbps
            copy_time[size] = b["real_time"]
        rows.append((name, size, gbps, b["real_time"]))
    print("| benchmark | MiB of bf16 | GB/s | bandwidth / copy's | time / copy's |")
    print("|---|---|---|---|---|")
    for name, size, gbps, t in rows:
        ratio = gbps / copy[size] if copy.get(size) else float("nan")
        tratio = t / copy_time[size] if copy_time.get(size) else float("nan")
        label = "/".join(name.split("/")[:2]) if name.count("/") > 2 else name.split("/")[0]
        print(f"| {label} | {size >> 20} | {gbps:.0f} | {ratio:.2f} | {tratio:.2f} |")

# The AdamW step beside a copy moving the same bytes (bench/optim_device_bench.cu; target >= 0.80).
optim = out / "optim_bench.json"
if optim.exists():
    print("\n## AdamW step (bytes moved per second; ratio to a copy of the same bytes)\n")
    steps, copies = {}, {}
    states = {0: "8-bit (default)", 1: "fp32 moments"}
    for b in json.loads(optim.read_text())["benchmarks"]:
        if b.get("error_occurred"):
            continue
        shape = re.search(r"/(\d+)(?:/(\d+))?", b["name"])
        key = (int(shape.group(2) or 0), int(shape.group(1)))
        target = copies if b["name"].startswith("bm_adamw_copy") else steps
        target[key] = b["bytes_per_second"] / 1e9
    print("| state | Mi parameters | step GB/s | copy GB/s | step / copy |")
    print("|---|---|---|---|---|")
    for key in sorted(steps):
        c = copies.get(key, float("nan"))
        state = states.get(key[0], str(key[0]))
        print(f"| {state} | {key[1] >> 20} | {steps[key]:.0f} | {c:.0f} | {steps[key] / c:.2f} |")

# The fused dequantize-sum(-divide) kernel of the CUDA 8-bit all-reduce beside a copy of the same
# bytes (bench/all_reduce_device_bench.cu; target >= 0.85).
reduce = out / "all_reduce_bench.json"
if reduce.exists():
    print("\n## 8-bit all-reduce: fused reduce kernel (ratio to a copy of the same bytes)\n")
    kernels, copies = {}, {}
    for b in json.loads(reduce.read_text())["benchmarks"]:
        if b.get("error_occurred"):
            continue
        shape = re.search(r"chunk:(\d+)/ranks:(\d+)", b["name"])
        key = (int(shape.group(1)), int(shape.group(2)))
        if b["name"].startswith("bm_copy"):
            copies[key] = b["bytes_per_second"] / 1e9
        else:
            kernels[(b["name"].split("/")[1],) + key] = b["bytes_per_second"] / 1e9
    print("| kernel | chunk elements | ranks | GB/s | copy GB/s | kernel / copy |")
    print("|---|---|---|---|---|---|")
    for (variant, chunk, ranks), gbps in sorted(kernels.items()):
        c = copies.get((chunk, ranks), float("nan"))
        print(f"| {variant} | {chunk} | {ranks} | {gbps:.0f} | {c:.0f} | {gbps / c:.2f} |")

# The fused activation ops: each fused forward op's time over its plain op's (same size, same run;
# bench/fused_device_bench.cu; target <= 1.15), and the backward ops' bandwidth.
fused = out / "fused_bench.json"
if fused.exists():
    print("\n## Fused activation ops (time of the fused op over the plain op's)\n")
    # bm_floor/<op>: the op's bytes moved with (fused:1) and without (fused:0) its saved copies.
    times, gbps, floors = {}, {}, {}
    for b in json.loads(fused.read_text())["benchmarks"]:
        if b.get("error_occurred"):
            continue
        parts = b["name"].split("/")
        size = int(re.search(r"bytes:(\d+)", b["name"]).group(1))
        m = re.search(r"fused:(\d)", b["name"])
        f = int(m.group(1)) if m else -1
        if parts[0] == "bm_floor":
            floors[("bm_" + parts[1], size, f)] = b["real_time"]
            continue
        times[(parts[0], size, f)] = b["real_time"]
        gbps[(parts[0], size, f)] = b["bytes_per_second"] / 1e9
    print("Floor: the fused op's bytes moved over the plain op's (a copy kernel), the least")
    print("fused / plain can be where memory bounds the op.\n")
    print("| op | MiB of bf16 | plain us | fused us | fused / plain | floor | GB/s |")
    print("|---|---|---|---|---|---|---|")
    for (op, size, f), t in sorted(times.items()):
        if f == 1:
            p = times.get((op, size, 0), float("nan"))
            floor = floors.get((op, size, 1), float("nan")) / floors.get((op, size, 0), float("nan"))
            print(f"| {op} | {size >> 20} | {p:.1f} | {t:.1f} | {t / p:.2f} | {floor:.2f} "
                  f"| {gbps[(op, size, f)]:.0f} |")
        elif f == -1:
            print(f"| {op} | {size >> 20} | | {t:.1f} | | | {gbps[(op, size, f)]:.0f} |")

# The gradient buffer's accumulate (dequantize, add, requantize in one pass) beside a copy of the
# same bytes (bench/buffer_device_bench.cu).
buffer = out / "buffer_bench.json"
if buffer.exists():
    print("\n## Gradient buffer accumulate (ratio to a copy of the same bytes)\n")
    kernels, copies = {}, {}
    for b in json.loads(buffer.read_text())["benchmarks"]:
        if b.get("error_occurred"):
            continue
        size = int(re.search(r"elements:(\d+)", b["name"]).group(1))
        if b["name"].startswith("bm_copy"):
            copies[size] = b["bytes_per_second"] / 1e9
        else:
            kernels[(b["name"].split("/")[1], size)] = b["bytes_per_second"] / 1e9
    print("| rounding | Mi elements | GB/s | copy GB/s | accumulate / copy |")
    print("|---|---|---|---|---|")
    for (variant, size), gbps in sorted(kernels.items()):
        c = copies.get(size, float("nan"))
        print(f"| {variant} | {size >> 20} | {gbps:.0f} | {c:.0f} | {gbps / c:.2f} |")
