#!/usr/bin/env python3
"""A straggler under synchronous and asynchronous training (make bench).

Runs the DLRM sample under mpirun on N ranks four times: synchronous
(NoStrategy with sync_replicas, every rank a worker) and asynchronous
(sync_replicas: false, one server and N-1 workers), each without and with
one worker sleeping --delay-ms after every step (train_eval's bench-only
--straggler flag). Prints the other workers' samples/s side by side: the
synchronous job slows to the straggler's pace, the asynchronous one should
keep the others within 20% of their pace without it. Loopback only; every
run stops by itself (num_steps)."""

import argparse
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(args, ranks, sync, straggler, model_dir):
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(ranks), args.bin,
           "--pipeline_config_path", os.path.join(ROOT, "samples/dlrm_criteo_sample.config"),
           "--model_dir", model_dir,
           "--train_input_path", os.path.join(ROOT, "data/criteo_sample.csv"),
           "--eval_input_path", os.path.join(ROOT, "data/criteo_sample.csv"),
           "--data_config.batch_size=%d" % args.batch,
           "--data_config.num_epochs=0",
           "--train_config.save_checkpoints_steps=1000000",
           "--train_config.log_step_count_steps=1000000"]
    workers = ranks if sync else ranks - 1
    # The same samples either way: a synchronous step is one batch per worker.
    steps = args.batches // workers if sync else args.batches
    cmd.append("--train_config.num_steps=%d" % steps)
    if not sync:
        cmd += ["--train_config.sync_replicas=false", "--num_ps", "1"]
    if straggler:
        cmd += ["--straggler", "0:%d" % args.delay_ms]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        sys.exit("straggler bench: %s failed:\n%s" % (" ".join(cmd), out.stderr[-4000:]))
    if sync:
        # Every worker steps in lockstep: each has the job's rate / workers.
        m = re.search(r"([0-9.]+) samples/s \(the whole job\)", out.stderr)
        rate = float(m.group(1)) / workers
        return rate, rate, ""
    m = re.search(r"samples/s by worker: (.*)", out.stderr)
    rates = [float(x) for x in re.findall(r"worker \d+ ([0-9.]+)", m.group(1))]
    updates = re.search(r"asynchronous updates: (.*)", out.stderr).group(1)
    others = rates[1:]
    return sum(others) / len(others), rates[0], updates


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bin", required=True, help="train_eval binary")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--batches", type=int, default=1200, help="worker batches per run")
    ap.add_argument("--delay-ms", type=int, default=20)
    args = ap.parse_args()
    print("\nStraggler: DLRM sample, %d ranks, batch %d, worker 0 sleeps %d ms after each step"
          % (args.ranks, args.batch, args.delay_ms))
    print("%-14s %22s %22s %8s  %s" % ("training", "others' samples/s", "with a straggler", "ratio",
                                       "straggler's samples/s"))
    with tempfile.TemporaryDirectory() as tmp:
        for name, sync in [("synchronous", True), ("asynchronous", False)]:
            base, _, _ = run(args, args.ranks, sync, False, os.path.join(tmp, name + "_base"))
            slow, straggler, updates = run(args, args.ranks, sync, True, os.path.join(tmp, name + "_slow"))
            print("%-14s %22.0f %22.0f %7.2fx  %.0f" % (name, base, slow, slow / base, straggler))
            if updates:
                print("%-14s %s" % ("", updates))


if __name__ == "__main__":
    main()
