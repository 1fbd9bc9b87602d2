-- Benchmark baseline: GCRA in Lua, the way it is usually written (TIME + GET + PSETEX).
-- KEYS[1] = key; ARGV = burst, rate, period_seconds. Times in microseconds.
local burst = tonumber(ARGV[1])
local interval = tonumber(ARGV[3]) * 1000000 / tonumber(ARGV[2])
local tolerance = burst * interval
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
local new_tat = tat + interval
if new_tat - now > tolerance then
  local retry = math.ceil((new_tat - tolerance - now) / 1000)
  return {0, burst, math.floor((tolerance - (tat - now)) / interval), retry, math.ceil((tat - now) / 1000)}
end
local ttl_ms = math.ceil((new_tat - now) / 1000)
redis.call('PSETEX', KEYS[1], ttl_ms, string.format('%d', new_tat))
return {1, burst, math.floor((tolerance - (new_tat - now)) / interval), -1, ttl_ms}
