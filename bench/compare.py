"""`make bench`: rustrec against the PyTorch baseline on the same machine,
threads and shapes, in one run. Repetitions alternate between the stacks so
machine noise hits both; each run is its own process so peak memory is its
own. Prints medians, the ratio rustrec / PyTorch (median of per-repetition
ratios) and a scaling table of rustrec's DLRM over table size and batch.
`--device gpu`: rustrec's GPU executor against PyTorch on CUDA on the same
GPU (peak memory is still the host's). Standard library only."""

import argparse
import json
import statistics
import subprocess
import sys


def run(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    if not lines:
        sys.exit(f"no result from {' '.join(cmd)}:\n{out.stdout}\n{out.stderr}")
    return json.loads(lines[-1])


def ours(a, model, cap=None, batch=None):
    return run([a.bench, "--json", "--models", model, "--threads", str(a.threads), "--steps", str(a.steps),
                "--rows", str(a.rows), "--cap", str(cap or a.cap), "--batch_size", str(batch or a.batch_size),
                "--device", a.device])


def theirs(a, model):
    return run([a.python, a.baseline, "--model", model, "--threads", str(a.threads), "--steps", str(a.steps),
                "--cap", str(a.cap), "--batch_size", str(a.batch_size),
                "--device", "cuda" if a.device == "gpu" else "cpu"])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bench", required=True, help="rustrec's release bench binary")
    p.add_argument("--python", default=sys.executable, help="python with torch installed")
    p.add_argument("--baseline", default="bench/pytorch_baseline.py")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--rows", type=int, default=262144)
    p.add_argument("--cap", type=int, default=1_000_000)
    p.add_argument("--batch_size", type=int, default=2048)
    p.add_argument("--no_scaling", action="store_true")
    p.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
    p.add_argument("--models", default="DLRM,WideAndDeep,DeepFM,DCN,MMoE")
    a = p.parse_args()

    first = ours(a, a.models.split(",")[0], batch=64)
    isa = first.get("isa", "unknown ISA")
    print(f"rustrec's matrix products by {first.get('kernels', 'unknown kernels')}")
    where = f"the GPU (host {isa})" if a.device == "gpu" else isa
    print(f"== rustrec vs PyTorch on {where}: {a.threads} threads, batch {a.batch_size}, tables capped at {a.cap} rows, "
          f"{a.steps} timed steps, {a.reps} repetitions (median)")
    print(f"{'model':<12} {'rustrec samp/s':>15} {'pytorch samp/s':>15} {'ratio':>7} {'rustrec MB':>11} {'pytorch MB':>11}")
    for model in a.models.split(","):
        r, t = [], []
        for _ in range(a.reps):
            r.append(ours(a, model))
            t.append(theirs(a, model))
        ratios = [x["samples_per_sec"] / y["samples_per_sec"] for x, y in zip(r, t)]
        med = lambda runs, k: statistics.median(x[k] for x in runs)
        print(f"{model:<12} {med(r, 'samples_per_sec'):>15.0f} {med(t, 'samples_per_sec'):>15.0f} "
              f"{statistics.median(ratios):>6.2f}x {med(r, 'peak_mb'):>11.0f} {med(t, 'peak_mb'):>11.0f}"
              f"   ({isa}; per-repetition ratios {', '.join(f'{x:.2f}' for x in ratios)}; {t[0]['stack']})")

    if a.no_scaling:
        return
    print("\n== rustrec DLRM scaling (one run each)")
    print(f"{'rows/table cap':>14} {'batch':>6} {'table rows':>11} {'samp/s':>9} {'peak MB':>9}")
    for cap, batch in [(100_000, a.batch_size), (1_000_000, a.batch_size), (10_000_000, a.batch_size),
                       (1_000_000, 512), (1_000_000, 8192)]:
        m = ours(a, "DLRM", cap=cap, batch=batch)
        print(f"{cap:>14} {batch:>6} {m['table_rows']:>11} {m['samples_per_sec']:>9.0f} {m['peak_mb']:>9.0f}")


if __name__ == "__main__":
    main()
