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
k = load("kernels")
if k:
    bad = [c["kernel"] for c in k["checks"] if not c["passed"]]
    worst = max(k["checks"], key=lambda c: c["rel_error"] / c["bound"])
    rows.append(("kernels within bound", f"{len(k['checks']) - len(bad)} of {len(k['checks'])} (seed {k['seed']}); worst {worst['kernel']} {worst['rel_error']:.2e} / {worst['bound']:.0e}" + (f"; FAILED {' '.join(bad)}" if bad else "")))
else:
    rows.append(("kernels within bound", "not run: " + first_line("kernels")))
c = load("calibrate")
rows.append(("cuBLAS bf16 GEMMs (calibrate)", "measured, see calibrate.out" if c else "not run: " + first_line("calibrate")))
t = load("pytorch-eager")
if t:
    rows.append(("GPT-2 124M tokens/s, PyTorch eager", f"{t['tokens_per_s']:,.0f} (step {t['step_s_median'] * 1e3:.1f} ms, MFU {100 * t['mfu']:.1f}%, peak {t['peak_memory_bytes'] / 2**30:.2f} GiB)"))
else:
    rows.append(("GPT-2 124M tokens/s, PyTorch eager", "not run: " + first_line("pytorch-eager")))
rows.append(("GPT-2 124M tokens/s, Strata", "not run: " + first_line("train-1rank")))
rows.append(("tp2·pp2·dp2 on one GPU vs single rank", "not built: the CUDA executor and its shared-GPU communicator are not built yet"))
rows.append(("step time predicted vs measured", "not available without the CUDA executor"))
w = max(len(r[0]) for r in rows)
for name, value in rows:
    print(f"{name:<{w}}  {value}")
