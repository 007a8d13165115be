-- wrk reporter: prints one machine-readable line that models_bench.py parses.
-- NOTE: no request()/response() callbacks on purpose; defining response() makes wrk hand every
-- response's headers and body to Lua, which costs CPU on the cores the servers share.
-- Latencies are in microseconds, duration in microseconds, as wrk reports them.
-- errors.status counts responses with status > 399 (wrk's rule); the harness also checks one
-- request before and after the run for an exact 200.

local function int(x)
  return string.format("%d", math.floor(x + 0.5))
end

done = function(summary, latency, requests)
  local e = summary.errors
  local parts = {
    '"requests":' .. int(summary.requests),
    '"duration_us":' .. int(summary.duration),
    '"bytes":' .. int(summary.bytes),
    '"errors":{"connect":' .. int(e.connect) .. ',"read":' .. int(e.read) ..
      ',"write":' .. int(e.write) .. ',"status":' .. int(e.status) ..
      ',"timeout":' .. int(e.timeout) .. '}',
    '"latency_us":{"min":' .. int(latency.min) .. ',"max":' .. int(latency.max) ..
      ',"mean":' .. string.format("%.2f", latency.mean) ..
      ',"stdev":' .. string.format("%.2f", latency.stdev) ..
      ',"p50":' .. int(latency:percentile(50)) ..
      ',"p90":' .. int(latency:percentile(90)) ..
      ',"p99":' .. int(latency:percentile(99)) ..
      ',"p99_9":' .. int(latency:percentile(99.9)) .. '}',
  }
  io.write("WRK_JSON {" .. table.concat(parts, ",") .. "}\n")
end
