"""Celery's side of bench/peers.py. Runs ONLY in bench/.venv-peers (Celery is not a dependency of
the project); bench/peers.py drives it, it is not meant to be run by hand.

    python peers_celery.py BROKER enqueue N URL     send N tasks, each POSTing {} to URL
    celery -A peers_celery worker -P prefork|gevent -c C ...   (started by bench/peers.py)

The task is what a scheduler run does: one HTTP POST of a small JSON body to the target, with a
time limit, through one kept-alive connection pool per worker process (requests' Session; under
the gevent pool Celery patches the socket module, so each greenlet blocks only itself). Results
are not stored (task_ignore_result): the benchmark counts the requests the target answered.
"""

import os
import sys
import time

from celery import Celery

BROKER = os.environ.get("PEERS_CELERY_BROKER", "redis://127.0.0.1:6379/15")
app = Celery("peers_celery", broker=BROKER)
app.conf.update(
    task_ignore_result=True,
    worker_prefetch_multiplier=int(os.environ.get("PEERS_CELERY_PREFETCH", "64")),
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    task_default_queue="peers",
)

_session = None


def session():
    global _session
    if _session is None:
        import requests
        from requests.adapters import HTTPAdapter

        _session = requests.Session()
        pool = int(os.environ.get("PEERS_CELERY_POOL", "256"))
        _session.mount("http://", HTTPAdapter(pool_connections=1, pool_maxsize=pool))
    return _session


@app.task(name="call")
def call(url: str) -> None:
    r = session().post(url, json={}, timeout=10)
    r.raise_for_status()


def enqueue(n: int, url: str) -> float:
    t = time.perf_counter()
    with app.producer_or_acquire() as producer:
        for _ in range(n):
            call.apply_async((url,), producer=producer)
    return time.perf_counter() - t


if __name__ == "__main__":
    broker, mode, *rest = sys.argv[1:]
    assert broker == BROKER, "set PEERS_CELERY_BROKER to the same broker"
    if mode == "enqueue":
        print(f"seconds={enqueue(int(rest[0]), rest[1])}")
    elif mode == "purge":
        print(f"purged={app.control.purge()}")
