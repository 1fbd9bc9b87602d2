-- Benchmark baseline: the sliding window counter on two keys (previous and current window),
-- the weighted estimate in floating point, as commonly written.
-- KEYS[1] = key prefix; ARGV = limit, window_seconds.
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local index = math.floor(now / window)
local elapsed = now - index * window
local cur_key = KEYS[1] .. ':' .. index
local prev_key = KEYS[1] .. ':' .. (index - 1)
local prev = tonumber(redis.call('GET', prev_key) or 0)
local cur = tonumber(redis.call('GET', cur_key) or 0)
local estimate = prev * (window - elapsed) / window + cur
if estimate + 1 > limit then
  return {0, limit, 0, 1, math.ceil((2 * window - elapsed) * 1000)}
end
redis.call('INCR', cur_key)
redis.call('EXPIRE', cur_key, 2 * window)
return {1, limit, math.floor(limit - estimate - 1), -1, math.ceil((2 * window - elapsed) * 1000)}
