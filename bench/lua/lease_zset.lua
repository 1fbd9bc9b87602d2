-- Benchmark baseline: a concurrency limit on a sorted set of holders scored by their expiry
-- (ZREMRANGEBYSCORE + ZCARD + ZADD + PEXPIRE), as commonly written. KEYS[1] = key;
-- ARGV = limit, lease_seconds, token. Times in microseconds. Replies like RL.LEASE (roughly).
local limit = tonumber(ARGV[1])
local lease = tonumber(ARGV[2]) * 1000000
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local held = redis.call('ZCARD', KEYS[1])
if held >= limit then
  return {0, limit, 0, 1, math.ceil(lease / 1000)}
end
redis.call('ZADD', KEYS[1], now + lease, ARGV[3])
redis.call('PEXPIRE', KEYS[1], math.ceil(lease / 1000))
return {1, limit, limit - held - 1, -1, math.ceil(lease / 1000)}
