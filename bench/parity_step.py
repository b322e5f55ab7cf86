"""Training-step cross-check against EasyRec (`make parity-steps`).

Runs in EasyRec's virtual environment (it reads TensorFlow checkpoints).
For each model of `make parity`: EasyRec trains STEPS steps from its own
initialisation, saving a checkpoint after every step, with the input in file
order (`shuffle: false`) and dropout off; then our train_eval starts from
EasyRec's step-0 checkpoint (`--fine_tune_checkpoint`) on the same config and
trains the same steps. After each step every variable of EasyRec's
checkpoint is compared with ours of the same name, and so are Adam's first
moments where both keep them (they are the gradients, scaled, without Adam's
division, which turns a gradient that is zero but for rounding, such as a
bias feeding a batch norm, into a step of up to the learning rate).

A variable agrees when its values are within WEIGHT_TOL of EasyRec's or
MOVED_TOL of how far EasyRec moved it from step 0, or when its first moments are within MOMENT_TOL of the largest first moment in
the model. Prints one line per model and step, then each disagreeing
variable; exits 1 if any model disagrees.
"""
import argparse
import json
import os
import re
import struct
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import parity  # noqa: E402

STEPS = 3
WEIGHT_TOL = 1e-6
MOVED_TOL = 1e-3
MOMENT_TOL = 1e-4


def step_config(model, model_dir, out):
    """The parity config of `model`, set to train STEPS steps in file
    order, with a checkpoint per step and no dropout."""
    parity.config_for(model, model_dir, out)
    with open(out) as f:
        text = f.read()
    text = re.sub(r"num_steps:\s*\d+", f"num_steps: {STEPS}", text)
    text = re.sub(r"save_checkpoints_steps:\s*\d+", "save_checkpoints_steps: 1\n  keep_checkpoint_max: 10", text)
    text = re.sub(r"log_step_count_steps:\s*\d+", "log_step_count_steps: 1", text)
    text = re.sub(r"(?m)^\s*shuffle:.*$", "", text)
    text = re.sub(r"(?m)^(\s*)(input_type:\s*\w+Input)", r"\1\2\n\1shuffle: false", text, count=1)
    # Every dropout setting, a number or a list of them.
    text = re.sub(r"(\w*dropout\w*):\s*\[[^\]]*\]", lambda m: f"{m.group(1)}: 0", text)
    text = re.sub(r"(\w*dropout\w*):\s*[0-9.eE+-]+", r"\1: 0", text)
    with open(out, "w") as f:
        f.write(text)
    return out


def safetensors(path):
    with open(path, "rb") as f:
        b = f.read()
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8 : 8 + n])
    types = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "U64": np.uint64, "I32": np.int32}
    out = {}
    for k, v in head.items():
        if k == "__metadata__" or v["dtype"] not in types:
            continue
        s, e = v["data_offsets"]
        out[k] = np.frombuffer(b[8 + n + s : 8 + n + e], dtype=types[v["dtype"]]).reshape(v["shape"])
    return out


def ours_at(model_dir, step):
    d = os.path.join(model_dir, f"model.ckpt-{step}")
    out = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            out.update(safetensors(os.path.join(d, f)))
    return out


def compare(tf, easyrec_dir, ours_dir, step, before):
    """(disagreeing variables with their numbers, variables compared,
    EasyRec variables we do not hold, each variable's largest difference).
    `before`: the differences after the step before.

    A batch norm's moving mean takes (1 - momentum) of its batch's mean,
    which holds the layer's bias: where that bias moves by rounding noise
    (its moments agree, its values need not), the moving mean may differ by
    as much as the bias did the step before."""
    theirs = tf.train.load_checkpoint(os.path.join(easyrec_dir, f"model.ckpt-{step}"))
    ours = ours_at(ours_dir, step)
    first = tf.train.load_checkpoint(os.path.join(easyrec_dir, "model.ckpt-0"))
    start = {n: first.get_tensor(n) for n, _ in tf.train.list_variables(os.path.join(easyrec_dir, "model.ckpt-0"))}
    names = [
        n
        for n, _ in tf.train.list_variables(os.path.join(easyrec_dir, f"model.ckpt-{step}"))
        if not re.search(r"(/Adam(_\d+)?$|_power$|^global_step$|/Momentum$|/Adagrad$)", n)
    ]
    moments = {}
    for n in names:
        m = n + "/Adam"
        if m in ours and theirs.has_tensor(m):
            moments[n] = (theirs.get_tensor(m).astype(np.float64), ours[m].astype(np.float64))
    top = max([np.abs(e).max() for e, _ in moments.values() if e.size] + [1e-30])
    bad, compared, missing, diffs = [], 0, [], {}
    for n in names:
        e = theirs.get_tensor(n)
        if e.dtype.kind != "f":
            continue
        o = ours.get(n)
        if o is None:
            missing.append(n)
            continue
        compared += 1
        if o.size < e.size and e.ndim == 2 and o.ndim == 2 and o.shape[1] == e.shape[1]:
            # A table we size smaller (rows EasyRec never reads): its first rows.
            e = e[: o.shape[0]]
        if o.shape != e.shape and o.size == e.size:
            # One variable kept in another shape (UNITER's `cls_emb`, [1, 1, d] in EasyRec).
            o = o.reshape(e.shape)
        if o.shape != e.shape:
            bad.append((n, f"shape ours {o.shape}, EasyRec {e.shape}"))
            continue
        w = float(np.abs(o.astype(np.float64) - e).max()) if e.size else 0.0
        moved = float(np.abs(e.astype(np.float64).ravel() - start[n].ravel()[: e.size]).max()) if n in start and e.size else 0.0
        diffs[n] = w
        bias = re.sub(r"/bn/moving_mean$", "/bias", n)
        follows = before.get(bias, 0.0) if bias != n else 0.0
        if w <= max(WEIGHT_TOL, MOVED_TOL * moved, follows * (1 + 1e-3)):
            continue
        if n in moments:
            me, mo = moments[n]
            me = me[: mo.shape[0]] if me.ndim == 2 and mo.ndim == 2 and me.shape[1] == mo.shape[1] else me
            mo = mo.reshape(me.shape) if mo.size == me.size else mo
            if me.shape != mo.shape:
                bad.append((n, f"weights {w:.2e}; first moments of shape ours {mo.shape}, EasyRec {me.shape}"))
                continue
            if float(np.abs(me - mo).max()) <= MOMENT_TOL * top:
                continue
            detail = f"weights {w:.2e}, first moments {float(np.abs(me - mo).max()) / top:.2e} of the largest"
        else:
            detail = f"weights {w:.2e}"
        bad.append((n, detail))
    return bad, compared, missing, diffs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="folder of train_eval")
    ap.add_argument("--work", default="experiments/parity_steps")
    ap.add_argument("--models", nargs="*", default=parity.MODELS)
    a = ap.parse_args()
    import tensorflow as tf  # EasyRec's environment

    os.makedirs(a.work, exist_ok=True)
    failed = []
    for m in a.models:
        base = os.path.join(a.work, m)
        subprocess.run(["rm", "-rf", base], check=True)
        os.makedirs(base)
        easyrec_dir, ours_dir = os.path.join(base, "easyrec"), os.path.join(base, "ours")
        cfg = step_config(m, easyrec_dir, os.path.join(base, "easyrec.config"))
        ours_cfg = step_config(m, ours_dir, os.path.join(base, "ours.config"))
        try:
            parity.run([sys.executable, "-m", "easy_rec.python.train_eval", "--pipeline_config_path", cfg],
                       os.path.join(base, "easyrec.log"))
            parity.run([os.path.join(a.bin, "train_eval"), "--pipeline_config_path", ours_cfg,
                        "--fine_tune_checkpoint", os.path.join(easyrec_dir, "model.ckpt-0")],
                       os.path.join(base, "ours.log"))
        except parity.Failed as e:
            print(f"{m}: {e}", flush=True)
            failed.append(m)
            continue
        ok = True
        before = {}
        for step in range(1, STEPS + 1):
            bad, compared, missing, before = compare(tf, easyrec_dir, ours_dir, step, before)
            print(f"{m}: step {step}: {compared - len(bad)} of {compared} variables agree"
                  + (f"; {len(missing)} of EasyRec's not held by ours: {', '.join(missing)}" if missing else ""),
                  flush=True)
            for n, detail in bad:
                print(f"    {n}: {detail}", flush=True)
            ok &= not bad and not missing
        if not ok:
            failed.append(m)
    if failed:
        print(f"training steps differ from EasyRec's: {', '.join(failed)}", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
