-- Benchmark baseline: the exact sliding log on a sorted set
-- (ZREMRANGEBYSCORE + ZCARD + ZADD + PEXPIRE). KEYS[1] = key; ARGV = limit, window_seconds.
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2]) * 1000000
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local count = redis.call('ZCARD', KEYS[1])
if count >= limit then
  return {0, limit, 0, 1, math.ceil(window / 1000)}
end
redis.call('ZADD', KEYS[1], now, string.format('%d-%d', now, count))
redis.call('PEXPIRE', KEYS[1], math.ceil(window / 1000))
return {1, limit, limit - count - 1, -1, math.ceil(window / 1000)}
