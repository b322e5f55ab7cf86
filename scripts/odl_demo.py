#!/usr/bin/env python3
"""`make odl-demo`: EasyRec's online-training recipe, end to end on one machine.

1. MovieLens-100k's ratings in time order (`prep_movielens --by_time`: the
   last 10% in time held out for evaluation); the first half goes into a
   Kafka topic, and an offline job trains on it and exports (the day's model).
2. The second half is replayed into the topic at a steady rate while the same
   job goes on from its checkpoint (--continue_train, the checkpoint's stream
   offsets), writing incremental updates every two seconds.
3. `serve` serves the export and applies each update live; this script asks
   its /metrics which step it answers with and prints how fresh it is: the
   seconds from an update being written to `serve` answering with it.

Standard library only. Arguments: BIN_DIR DATA_DIR KAFKA_SERVER WORK_DIR
[POLL_SECONDS] (serve's --file_system_poll_wait_seconds, 1 by default).
"""

import json
import os
import re
import statistics
import subprocess
import sys
import time
import urllib.request

BIN, DATA, SERVER, WORK = sys.argv[1:5]
POLL = sys.argv[5] if len(sys.argv) > 5 else "1"
RATE = 2000  # rows a second in the online phase
CONFIG = "samples/odl_ml100k.config"


def run(*args, **kw):
    print("$", " ".join(args), flush=True)
    return subprocess.run(args, check=True, **kw)


def train_args(topic, eval_topic, steps):
    edits = {
        "kafka_train_input.server": SERVER,
        "kafka_train_input.topic": topic,
        "kafka_eval_input.server": SERVER,
        "kafka_eval_input.topic": eval_topic,
        "train_config.num_steps": steps,
    }
    return [f"{BIN}/train_eval", "--pipeline_config_path", CONFIG, "--model_dir", f"{WORK}/model",
            "--edit_config_json", json.dumps(edits)]


def served_step(port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    m = re.search(r"^\w*model_global_step(?:\{[^}]*\})? (\d+)", text, re.M)
    return int(m.group(1)) if m else -1


def updates(incr_dir):
    """{step: time its .done flag was written} of the complete updates."""
    out = {}
    for name in os.listdir(incr_dir) if os.path.isdir(incr_dir) else []:
        m = re.fullmatch(r"(?:dense|sparse)_update_(\d+)\.done", name)
        if m:
            step = int(m.group(1))
            t = os.stat(os.path.join(incr_dir, name)).st_mtime
            out[step] = max(out.get(step, 0), t)
    return out


def main():
    csv = f"{DATA}/train.csv"
    rows = sum(1 for _ in open(csv)) - 1
    half = rows // 2
    stamp = str(int(time.time()))
    topic, eval_topic = f"ml100k_train_{stamp}", f"ml100k_eval_{stamp}"
    os.makedirs(WORK, exist_ok=True)
    produce = [f"{BIN}/kafka_produce", "--server", SERVER, "--with_header", "--partitions", "4"]
    run(*produce, "--topic", eval_topic, "--input", f"{DATA}/eval.csv")
    run(*produce, "--topic", topic, "--input", csv, "--rows", str(half))

    print(f"== offline: {half} rows from the topic, then an export", flush=True)
    run(*train_args(topic, eval_topic, half // 256))
    exports = f"{WORK}/model/export/final"

    serve = subprocess.Popen([f"{BIN}/serve", "--model_dir", exports, "--port", "0", "--host", "127.0.0.1",
                              "--file_system_poll_wait_seconds", POLL],
                             stdout=subprocess.PIPE, text=True)
    line = serve.stdout.readline()
    port = int(line.rsplit(":", 1)[1])
    print(f"== serve on port {port}, at step {served_step(port)}", flush=True)

    print(f"== online: the other {rows - half} rows at {RATE} rows/s; updates every 2 s", flush=True)
    producer = subprocess.Popen([*produce, "--topic", topic, "--input", csv, "--skip", str(half),
                                 "--rate", str(RATE)], stdout=subprocess.DEVNULL)
    trainer = subprocess.Popen([*train_args(topic, eval_topic, 0), "--continue_train"])
    incr = f"{WORK}/model/incr_save"
    fresh, seen, last_print, done_at = [], set(), 0.0, None
    try:
        # Until the stream has been quiet for 8 seconds.
        while done_at is None or time.time() - done_at < 8:
            if done_at is None and producer.poll() is not None:
                done_at = time.time()
            step = served_step(port)
            now = time.time()
            for s, t in sorted(updates(incr).items()):
                if s not in seen and step >= s:
                    seen.add(s)
                    fresh.append(now - t)
            if now - last_print >= 2 and fresh:
                print(f"serving step {step}; last update {now - max(updates(incr).values()):.1f}s old; "
                      f"freshness so far p50 {statistics.median(fresh):.2f}s", flush=True)
                last_print = now
            time.sleep(0.1)
    finally:
        open(f"{WORK}/model/OSS_STOP_SIGNAL", "w").close()
        trainer.wait()
        serve.terminate()
        serve.wait()
        os.remove(f"{WORK}/model/OSS_STOP_SIGNAL")
    fresh.sort()
    if fresh:
        p99 = fresh[min(len(fresh) - 1, int(0.99 * len(fresh)))]
        print(f"== {len(fresh)} updates followed (serve polling every {POLL}s); "
              f"freshness p50 {statistics.median(fresh):.2f}s p99 {p99:.2f}s")
    with open(f"{WORK}/model/eval_result.txt") as f:
        print("== online model's evaluation:", f.read().strip().replace("\n", " "))


if __name__ == "__main__":
    main()
