"""The chaos target (harness.ChaosTarget) as a process of its own, for a target host in a network
namespace. Every delivery is appended to a JSON-lines log as it arrives: the target's own record
of what it was asked, with its own clock.

    python -m tests.faults.target_host --host 198.18.0.5 --port 8080 --log target.jsonl --seed 7
"""

import argparse
import json
import signal
import threading
import time

from tests.faults.harness import ChaosTarget


class LoggingTarget(ChaosTarget):
    def __init__(self, log_path: str, **kwargs):
        self.log = open(log_path, "a", buffering=1)
        self.log_lock = threading.Lock()
        super().__init__(**kwargs)
        self.deliveries = _Recorder(self)


class _Recorder(list):
    """ChaosTarget appends (run, generation, key, acted, behaviour); each also goes to the log
    with the time it arrived."""

    def __init__(self, target):
        super().__init__()
        self.target = target

    def append(self, d):
        super().append(d)
        line = json.dumps({"run": d[0], "generation": d[1], "key": d[2], "acted": d[3], "behaviour": d[4],
                           "at": time.time()})
        with self.target.log_lock:
            self.target.log.write(line + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--log", required=True)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--latency-max", type=float, default=0.5)
    args = ap.parse_args()
    target = LoggingTarget(args.log, seed=args.seed, stall_rate=0.02, error_rate=0.05, drop_rate=0.02,
                           latency=(0.05, args.latency_max), host=args.host, port=args.port)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    print(f"target on {target.url}", flush=True)
    while not stop.wait(0.5):
        pass
    target.close()
    target.log.close()


def read_log(path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


if __name__ == "__main__":
    main()
