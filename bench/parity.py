"""Side-by-side quality against EasyRec itself (`make parity`).

Trains each MovieLens-100k config of bench/parity/ with this trainer once and
with EasyRec (pai-easy-rec 0.7.1 on TensorFlow, in its own virtual
environment) RUNS times, then scores every model, EasyRec's included, with
this trainer's `eval` on the same eval rows: `eval` reads EasyRec's
TensorFlow checkpoints and reproduces EasyRec's own predictions on them, so
both sides get the same exact AUC and logloss (EasyRec's own eval reports a
200-threshold AUC). Prints one line per model and exits 1 when a model's AUC
is further than --tolerance from the mean of EasyRec's runs.
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
        ours_dir = os.path.join(base, "ours")
        cfg = config_for(m, ours_dir, os.path.join(base, "ours.config"))
        t = time.time()
        run([os.path.join(a.bin, "train_eval"), "--pipeline_config_path", cfg], os.path.join(base, "ours.log"))
        ours_s = time.time() - t
        ours = metrics(os.path.join(ours_dir, "eval_result.txt"))
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
        auc = sum(x[0] for x in theirs) / len(theirs)
        ll = sum(x[1] for x in theirs) / len(theirs)
        rows.append((m, ours, auc, ll, [x[0] for x in theirs], ours_s, sum(their_s) / len(their_s)))
    print(f"{'model':<14} {'ours AUC':>9} {'EasyRec AUC (mean, runs)':>34} {'diff':>8} "
          f"{'ours logloss':>12} {'EasyRec logloss':>15} {'time ours/EasyRec':>18}")
    bad = 0
    for m, ours, auc, ll, aucs, os_, es in rows:
        diff = ours[0] - auc
        ok = abs(diff) <= a.tolerance
        bad += not ok
        spread = ", ".join(f"{x:.4f}" for x in aucs)
        print(f"{m:<14} {ours[0]:>9.4f} {auc:>9.4f} ({spread}) {diff:>+8.4f} {ours[1]:>12.4f} {ll:>15.4f} "
              f"{os_:>8.1f}s/{es:.1f}s {'ok' if ok else 'OUTSIDE ' + str(a.tolerance)}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
