"""One forecast (dispatch.forecast.forecast) read by target URL against read by target origin, in
interleaved rounds of one command: the summary (dispatch_forecastgroup) holds --summary rows of a
URL each beyond the week and --week rows of a URL each within it, plus --deltas not folded, as a
fleet that puts an id in every target URL makes it. "By URL" is the read before the change (the
origin cut replaced by the column itself); both must count the same runs.

    .venv/bin/python bench/forecast_by_origin.py [--summary 2000000 --week 120000 --deltas 100000 --rounds 4]
"""

import argparse
import os
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--summary", type=int, default=2_000_000)
    ap.add_argument("--week", type=int, default=120_000)
    ap.add_argument("--deltas", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    C.setup_database("scheduler_bench_forecast_origin")
    from dispatch import forecast as fc
    from dispatch import forecast_store
    from dispatch.models import ForecastDelta, ForecastGroup

    print(C.machine_line())
    row = {"tenant_id": f"'{uuid.uuid4()}'::uuid", "expression": "'rate(1 day)'", "time_zone": "'UTC'",
           "dst_skipped": "'next_valid'", "dst_repeated": "'earlier'", "anchored": "now()",
           "spread_offset_seconds": "0", "misfire_grace_seconds": "60", "n": "1"}
    url = "'http://t' || mod(n, 3) || '.example:9000/{}/' || n"
    C.insert_series(ForecastGroup, args.summary, exprs={
        **row, "target_url": url.format("later"),
        "next_run_at": "now() + interval '30 days' + make_interval(secs => mod(n, 86400))"})
    C.insert_series(ForecastGroup, args.week, exprs={
        **row, "target_url": url.format("week"), "next_run_at": "now() + make_interval(secs => mod(n, 60))"})
    C.insert_series(ForecastDelta, args.deltas, exprs={
        **row, "target_url": url.format("delta"), "next_run_at": "now() + make_interval(secs => 60 + mod(n, 60))"})
    C.vacuum_analyze("dispatch_forecastgroup", "dispatch_forecastdelta")
    forecast_store.FOLD_AT = 10 ** 12  # the read alone, not a fold
    by_origin = forecast_store.origin_sql
    sides = {"url": lambda column, vendor: column, "origin": by_origin}
    took = {name: [] for name in sides}
    for r in range(args.rounds):
        due = {}
        for name, cut in sides.items():
            forecast_store.origin_sql = cut
            t = time.monotonic()
            f = fc.forecast()
            took[name].append(time.monotonic() - t)
            due[name] = sum(b.due for b in f.tiers["week"])
        assert due["url"] == due["origin"], due
        print(f"round {r}: by URL {took['url'][-1]:.2f} s, by origin {took['origin'][-1]:.2f} s, "
              f"{took['url'][-1] / took['origin'][-1]:.1f}x; runs in the week {due['origin']:,.0f} both", flush=True)
    forecast_store.origin_sql = by_origin
    u, o = C.median(took["url"]), C.median(took["origin"])
    print(f"median: by URL {u:.2f} s, by origin {o:.2f} s: {u / o:.1f}x; load average now {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
