-- wrk script of bench/api_create.py --client wrk: POST /api/v1/schedules (or WRK_PATH: the DRF floor
-- app's /items takes the same body) with a one-time at() schedule, a new name each request; KEY and TAG from the environment. At the end, one JSON line
-- with what wrk saw (requests, answers that were not 2xx, latency percentiles in microseconds).
wrk.method = "POST"
wrk.path = os.getenv("WRK_PATH") or "/api/v1/schedules"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. os.getenv("KEY")
local tag = os.getenv("TAG")
local n = 0

request = function()
  n = n + 1
  return wrk.format(nil, nil, nil, '{"expression": "at(2030-01-01T00:00:00)", "timeZone": "UTC", '
    .. '"target": {"url": "http://127.0.0.1:9/run"}, "name": "' .. tag .. '-' .. n .. '"}')
end

done = function(summary, latency, requests)
  io.write(string.format('{"requests": %d, "not_2xx": %d, "socket_errors": %d, "p50_us": %d, "p99_us": %d}\n',
    summary.requests, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    latency:percentile(50), latency:percentile(99)))
end
