-- Benchmark baseline: the classic fixed window in Lua (INCR + EXPIRE in one script).
-- KEYS[1] = key; ARGV = limit, window_seconds. Replies like RL.WINDOW … FIXED (approximately).
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local count = redis.call('INCR', KEYS[1])
if count == 1 then
  redis.call('EXPIRE', KEYS[1], window)
end
local ttl = redis.call('PTTL', KEYS[1])
if count > limit then
  return {0, limit, 0, ttl, ttl}
end
return {1, limit, limit - count, -1, ttl}
