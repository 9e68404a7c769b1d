"""The table `cargo xtask device-check` reports, from the step outputs under $OUT."""
import json, pathlib, sys

out = pathlib.Path(sys.argv[1])


def load(name):
    try:
        return json.loads((out / f"{name}.out").read_text())
    except Exception:
        return None


def first_line(name):
    p = out / f"{name}.err"
    return p.read_text().strip().splitlines()[-1][:150] if p.exists() and p.read_text().strip() else ""


rows = []
summary = (out / "summary.txt").read_text() if (out / "summary.txt").exists() else ""
attn = [l.split(None, 1)[1].strip() for l in summary.splitlines() if l.startswith("attention ")]
if attn:
    rows.append(("attention kernels used", attn[0]))
k = load("kernels")
if k:
    bad = [c["kernel"] for c in k["checks"] if not c["passed"]]
    # A bound of 0 means bit-exact: any error is infinitely over it.
    worst = max(k["checks"], key=lambda c: c["rel_error"] / c["bound"] if c["bound"] else (float("inf") if c["rel_error"] else 0.0))
    rows.append(("kernels within bound", f"{len(k['checks']) - len(bad)} of {len(k['checks'])} (seed {k['seed']}); worst {worst['kernel']} {worst['rel_error']:.2e} / {worst['bound']:.0e}" + (f"; FAILED {' '.join(bad)}" if bad else "")))
else:
    rows.append(("kernels within bound", "not run: " + first_line("kernels")))
pr = load("probe")
if pr:
    cl = pr["cluster"]
    rows.append(("probe", f"{cl['nodes']} node(s) x {cl['gpus_per_node']} {cl['gpu']}, {cl['nics_per_node']} NIC(s) x {cl['nic_gbps']:g} Gb/s"))
else:
    rows.append(("probe", "not run: " + first_line("probe")))
c = load("calibrate")
if c:
    f, b = c["fit"]["profile"]["compute"], c["builtin"]["compute"]
    rows.append(("cuBLAS bf16 GEMM fit vs built-in", f"efficiency {f['gemm_efficiency']:.3f} vs {b['gemm_efficiency']:.3f}, k_half {f['gemm_k_half']:g} vs {b['gemm_k_half']:g} ({len(c['gemms_bf16'])} shapes, worst residual {100 * c['fit']['gemm_worst']:.1f}%, best {max(g['tflops'] for g in c['gemms_bf16']):.0f} TFLOP/s)"))
    m = c["memory"]
    ew = f"{m['elementwise_gb_per_s']:.0f}" if m.get("elementwise_gb_per_s") else "not measured"
    rows.append(("HBM copy / element-wise add (GB/s)", f"{m['copy_gb_per_s']:.0f} / {ew} (datasheet {b['hbm_gb_per_s']:.0f})"))
    ar = [r for r in c["fit"]["residuals"] if r["label"].startswith("all-reduce")]
    if ar:
        rows.append(("NCCL all-reduce busbw (measured / model)", ", ".join(f"{r['label'][11:]}: {r['measured']:.0f} / {r['model']:.0f}" for r in ar)))
    a = f.get("attention")
    if a and c["attention"]:
        rows.append(("Strata attention kernel fit", f"{a['kernel']}: fwd {a['fwd_efficiency']:.4f}, bwd {a['bwd_efficiency']:.4f} of the bf16 peak (worst residual {100 * (c['fit']['attention_worst'] or 0):.1f}%)"))
else:
    rows.append(("GPU profile fit (calibrate)", "not run: " + first_line("calibrate")))
pb, pm = load("predicted-builtin"), load("predicted-measured")
if pb:
    rows.append(("GPT-2 124M step predicted", f"{pb['step_time_s'] * 1e3:.1f} ms (built-in profile)" + (f", {pm['step_time_s'] * 1e3:.1f} ms (measured profile)" if pm else "")))
t = load("pytorch-eager")
if t:
    rows.append(("GPT-2 124M tokens/s, PyTorch eager", f"{t['tokens_per_s']:,.0f} (step {t['step_s_median'] * 1e3:.1f} ms, MFU {100 * t['mfu']:.1f}%, peak {t['peak_memory_bytes'] / 2**30:.2f} GiB)"))
else:
    rows.append(("GPT-2 124M tokens/s, PyTorch eager", "not run: " + first_line("pytorch-eager")))
sim = load("predicted-builtin")
tr = load("train-1rank")
if tr and tr.get("steps"):
    steady = sorted(st["seconds"] for st in tr["steps"][2:] or tr["steps"])
    step_s = steady[len(steady) // 2]
    tps = tr["steps"][0]["tokens_per_s"] * tr["steps"][0]["seconds"] / step_s  # tokens per step / median step
    # MFU with the simulator's model FLOPs per step and peak (the same model and batch).
    mfu = f", MFU {100 * sim['mfu'] * sim['step_time_s'] / step_s:.1f}%" if sim else ""
    vs = f"; {tps / t['tokens_per_s']:.2f}x PyTorch eager" if t else ""
    rows.append(("GPT-2 124M tokens/s, Strata", f"{tps:,.0f} (median step {step_s * 1e3:.1f} ms{mfu}){vs}; losses {tr['steps'][0]['loss']:.3f} -> {tr['steps'][-1]['loss']:.3f}"))
    m = tr["memory"][0]
    pred = f"{max(sim['peak_memory_bytes']) / 2**30:.2f} GiB simulated, " if sim else ""
    rows.append(("peak memory predicted / measured", f"{pred}{m['predicted_bytes'] / 2**30:.2f} GiB plan buffers / {m['measured_bytes'] / 2**30:.2f} GiB measured (pool high-water + context)"))
    terms = sorted(((v, k) for k, v in m.get("overhead_bytes", {}).items() if v), key=lambda t: -abs(t[0]))
    if terms:
        rows.append(("measured - predicted, by name", ", ".join(f"{k} {v / 2**20:+.1f} MiB" for v, k in terms)))
    rows.append(("step time predicted / measured", (f"{sim['step_time_s'] * 1e3:.1f} ms / " if sim else "not simulated / ") + f"{step_s * 1e3:.1f} ms"))
    sc = load("train-scalar-attn")
    if sc and sc.get("steps"):
        s_steady = sorted(st["seconds"] for st in sc["steps"][1:] or sc["steps"])
        rows.append(("GPT-2 124M step, scalar attention kernels", f"{s_steady[len(s_steady) // 2] * 1e3:.1f} ms median ({len(sc['steps'])} steps)"))
else:
    rows.append(("GPT-2 124M tokens/s, Strata", "not run: " + first_line("train-1rank")))
    rows.append(("step time predicted / measured", "not available: the training step did not run"))
cmp_err = out / "compare-cuda.err"
if cmp_err.exists():
    line = next((l for l in cmp_err.read_text().splitlines() if "predicted" in l and "measured" in l), None)
    rows.append(("compare --backend cuda (measured profile)", line.strip()[:150] if line else "not run: " + first_line("compare-cuda")))
gc, cc = load("tiny-cuda"), load("tiny-cpu")
if gc and cc:
    pairs = list(zip([st["loss"] for st in gc["steps"]], [st["loss"] for st in cc["steps"]]))
    k, (g, c_) = max(enumerate(pairs), key=lambda kv: abs(kv[1][0] - kv[1][1]))
    rows.append(("tiny GPT loss, CUDA vs CPU executor", f"max |Δ| {abs(g - c_):.4f} at step {k} ({g:.4f} vs {c_:.4f}; {len(pairs)} steps, bf16 vs fp32)"))
else:
    rows.append(("tiny GPT loss, CUDA vs CPU executor", "not run: " + (first_line("tiny-cuda") or first_line("tiny-cpu"))))
# Multi-rank and recomputation runs against the single rank's losses, one row each.
for run, what, note in [
    ("tiny-tp2pp2dp2", "tp2·pp2·dp2 on one GPU vs single rank", "host stand-in bound 2e-4 under tp"),
    ("tiny-dp2-zero3", "dp2 ZeRO-3 on one GPU vs single rank", "host stand-in: 0"),
    ("tiny-recompute-full", "full recomputation vs none", "host stand-in: 0"),
    ("tiny-pp2vpp2", "pp2·vpp2 (interleaved) vs single rank", "host stand-in: 0"),
    ("tiny-tp2-sp", "tp2 + sequence parallelism vs single rank", "host stand-in bound 2e-4 under tp"),
    ("tiny-nccl-all-gpus", "NCCL executor (--all-gpus, 1 GPU) vs single rank", "the same one-rank plan"),
]:
    r = load(run)
    if gc and r:
        pairs = list(zip([st["loss"] for st in r["steps"]], [st["loss"] for st in gc["steps"]]))
        k, (g, c_) = max(enumerate(pairs), key=lambda kv: abs(kv[1][0] - kv[1][1]))
        rows.append((what, f"max |Δ| {abs(g - c_):.2e} at step {k} ({g:.6f} vs {c_:.6f}; {len(pairs)} steps; {note})"))
    else:
        rows.append((what, "not run: " + (first_line(run) or first_line("tiny-cuda"))))
lg, lc = load("tiny-llama-cuda"), load("tiny-llama-cpu")
if lg and lc:
    pairs = list(zip([st["loss"] for st in lg["steps"]], [st["loss"] for st in lc["steps"]]))
    k, (g, c_) = max(enumerate(pairs), key=lambda kv: abs(kv[1][0] - kv[1][1]) / abs(kv[1][1]))
    rows.append(("tiny Llama loss, CUDA vs CPU executor", f"max relative |Δ| {abs(g - c_) / abs(c_):.2e} at step {k} ({g:.4f} vs {c_:.4f}; {len(pairs)} steps, bf16 vs fp32; host stand-in 3.5e-5 over 3 steps)"))
else:
    rows.append(("tiny Llama loss, CUDA vs CPU executor", "not run: " + (first_line("tiny-llama-cuda") or first_line("tiny-llama-cpu"))))
w = max(len(r[0]) for r in rows)
for name, value in rows:
    print(f"{name:<{w}}  {value}")
