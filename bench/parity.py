"""Side-by-side quality against EasyRec itself (`make parity`).

Trains each MovieLens-100k config of bench/parity/ with this trainer RUNS
times (`--seed 1..RUNS`) and with EasyRec (pai-easy-rec 0.7.1 on TensorFlow,
in its own virtual environment) RUNS times, then scores every model,
EasyRec's included, with this trainer's `eval` on the same eval rows: `eval`
reads EasyRec's TensorFlow checkpoints and reproduces EasyRec's own
predictions on them, so both sides get the same exact AUC and logloss
(EasyRec's own eval reports a 200-threshold AUC). Prints each run as it
ends, then one line per model with both sides' means and spreads, and exits
1 when a model's mean AUC is further from EasyRec's mean than EasyRec's own
spread or --tolerance, whichever is wider.
"""
import argparse
import json
import os
import subprocess
import sys
import time

MODELS = ["wide_and_deep", "deepfm", "dcn", "multi_tower"]


def run(cmd, log):
    with open(log, "w") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}; see {log}")


def config_for(model, model_dir, out):
    with open(os.path.join("bench/parity", model + ".config")) as f:
        text = f.read().replace("MODEL_DIR", model_dir)
    with open(out, "w") as f:
        f.write(text)
    return out


def metrics(path):
    with open(path) as f:
        m = json.load(f)
    return m["auc"], m["logloss"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="folder of train_eval and eval")
    ap.add_argument("--python", required=True, help="the EasyRec environment's python")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tolerance", type=float, default=0.003)
    ap.add_argument("--work", default="experiments/parity")
    ap.add_argument("--models", nargs="*", default=MODELS)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    rows = []
    for m in a.models:
        base = os.path.join(a.work, m)
        subprocess.run(["rm", "-rf", base], check=True)
        os.makedirs(base)
        mine, ours_s = [], []
        for k in range(a.runs):
            d = os.path.join(base, f"ours_{k}")
            cfg_k = config_for(m, d, os.path.join(base, f"ours_{k}.config"))
            t = time.time()
            run([os.path.join(a.bin, "train_eval"), "--pipeline_config_path", cfg_k, "--seed", str(k + 1)],
                os.path.join(base, f"ours_{k}.log"))
            ours_s.append(time.time() - t)
            mine.append(metrics(os.path.join(d, "eval_result.txt")))
            print(f"{m}: ours, seed {k + 1}: AUC {mine[-1][0]:.4f} ({ours_s[-1]:.0f} s)", flush=True)
        ours = (sum(x[0] for x in mine) / len(mine), sum(x[1] for x in mine) / len(mine))
        theirs, their_s = [], []
        for k in range(a.runs):
            d = os.path.join(base, f"easyrec_{k}")
            cfg_k = config_for(m, d, os.path.join(base, f"easyrec_{k}.config"))
            t = time.time()
            run([a.python, "-m", "easy_rec.python.train_eval", "--pipeline_config_path", cfg_k],
                os.path.join(base, f"easyrec_{k}.log"))
            their_s.append(time.time() - t)
            # Scored by our eval on EasyRec's checkpoint: exact metrics, same rows.
            run([os.path.join(a.bin, "eval"), "--pipeline_config_path", cfg_k, "--checkpoint_path", d,
                 "--eval_result_path", "exact_eval_result.txt"], os.path.join(base, f"easyrec_{k}_eval.log"))
            theirs.append(metrics(os.path.join(d, "exact_eval_result.txt")))
            print(f"{m}: EasyRec run {k + 1}: AUC {theirs[-1][0]:.4f} ({their_s[-1]:.0f} s)", flush=True)
        auc = sum(x[0] for x in theirs) / len(theirs)
        ll = sum(x[1] for x in theirs) / len(theirs)
        rows.append((m, ours, [x[0] for x in mine], auc, ll, [x[0] for x in theirs],
                     sum(ours_s) / len(ours_s), sum(their_s) / len(their_s)))
    print(f"{'model':<14} {'ours AUC (mean, runs)':>34} {'EasyRec AUC (mean, runs)':>34} {'diff':>8} "
          f"{'ours logloss':>12} {'EasyRec logloss':>15} {'time ours/EasyRec':>18}")
    bad = 0
    for m, ours, my_aucs, auc, ll, aucs, os_, es in rows:
        diff = ours[0] - auc
        # EasyRec's own spread, or the tolerance, whichever is wider.
        bound = max(a.tolerance, max(aucs) - min(aucs))
        ok = abs(diff) <= bound
        bad += not ok
        mine = ", ".join(f"{x:.4f}" for x in my_aucs)
        spread = ", ".join(f"{x:.4f}" for x in aucs)
        print(f"{m:<14} {ours[0]:>9.4f} ({mine}) {auc:>9.4f} ({spread}) {diff:>+8.4f} {ours[1]:>12.4f} {ll:>15.4f} "
              f"{os_:>8.1f}s/{es:.1f}s {'ok' if ok else f'OUTSIDE {bound:.4f}'}", flush=True)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
