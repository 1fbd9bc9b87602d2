-- RL.WINDOW in Lua, for servers where MODULE LOAD is not allowed (managed Redis services).
--
--   EVALSHA <sha> 1 key limit window [FIXED | SLIDING | LOG] [QUANTITY n] [PEEK]
--
-- Same arguments and the same five-integer reply as the module's RL.WINDOW:
--   {allowed, limit, remaining, retry_after_ms, reset_after_ms}
-- Windows are aligned to the Unix epoch; time comes from the server (TIME), in microseconds;
-- every write sets the key's expiry in this same script.
--   FIXED   a hash {a=FIXED, s=window start, c=count, u=last write}
--   SLIDING a hash {a=SLIDING, s=current window start, p=previous count, c=current count, u}
--   LOG     a sorted set: one member per admitted request (score = its instant, member
--           "<instant>-<n>", unique), trimmed to the window on every write
-- Differences from the module: microsecond arithmetic in Lua doubles (durations agree to the
-- millisecond); LOG costs a sorted-set member per request (about 100 bytes, against 4 for the
-- module) and has no rl.log-max-limit; keys are plain Redis types, so the two must not share
-- keys.

local function err(msg) return redis.error_reply('ERR ' .. msg) end

local limit_text = ARGV[1]
if type(limit_text) ~= 'string' or not string.match(limit_text, '^%d+$') or tonumber(limit_text) < 1 then
  return err('limit must be a positive integer')
end
local limit = tonumber(limit_text)

local wmsg = 'window must be seconds as a plain decimal (digits, optionally \'.\' and 1 to 9 more digits), > 0 and <= 315360000'
local wt = ARGV[2]
if type(wt) ~= 'string' then return err(wmsg) end
local int, frac = string.match(wt, '^(%d+)%.(%d+)$')
if not int then int = string.match(wt, '^(%d+)$'); frac = '' end
if not int or #frac > 9 then return err(wmsg) end
local w = tonumber(int) * 1000000 + tonumber(string.sub(frac .. '000000000', 1, 9)) / 1000
if w <= 0 or tonumber(int) > 315360000 or (tonumber(int) == 315360000 and tonumber('0' .. frac) > 0) then
  return err(wmsg)
end

local algo, quantity, peek, seen_q = nil, 1, false, false
local i = 3
while ARGV[i] do
  local kw = string.upper(ARGV[i])
  if kw == 'FIXED' or kw == 'SLIDING' or kw == 'LOG' then
    if algo then return err('syntax error: the algorithm (FIXED | SLIDING | LOG) given more than once') end
    algo = kw
    i = i + 1
  elseif kw == 'QUANTITY' then
    if seen_q then return err('syntax error: QUANTITY given more than once') end
    seen_q = true
    local q = ARGV[i + 1]
    if not q then return err('syntax error: QUANTITY needs a value') end
    if not string.match(q, '^%d+$') then return err('QUANTITY must be a non-negative integer') end
    quantity = tonumber(q)
    i = i + 2
  elseif kw == 'PEEK' then
    if peek then return err('syntax error: PEEK given more than once') end
    peek = true
    i = i + 1
  else
    return err("syntax error: unknown argument '" .. ARGV[i] .. "'")
  end
end
algo = algo or 'SLIDING'

local key = KEYS[1]
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local function ceil_ms(us) return math.ceil(us / 1000 - 1e-9) end
local write = not peek and quantity > 0

-- The key's algorithm is part of its state.
local held = redis.call('TYPE', key)['ok']
local held_algo = nil
if held == 'hash' then held_algo = redis.call('HGET', key, 'a') elseif held == 'zset' then held_algo = 'LOG' end
if held ~= 'none' and held_algo ~= algo then
  if held_algo then
    local shown = string.sub(key, 1, 64)
    return err("key '" .. shown .. "' holds a " .. held_algo .. ' window, not a ' .. algo .. ' window: use the same algorithm for a key, or another key')
  end
  return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
end

local start = now - (now % w)
local finish = start + w

if algo == 'FIXED' then
  local s = redis.call('HMGET', key, 'c', 'u')
  local count = 0
  if s[1] and tonumber(s[2]) >= start then count = tonumber(s[1]) end
  local function reply(allowed, c, retry)
    return {allowed, limit, math.max(0, limit - c), retry, c > 0 and ceil_ms(finish - now) or 0}
  end
  if quantity == 0 then return reply(1, count, -1) end
  if quantity > limit then return reply(0, count, -1) end
  if count + quantity > limit then return reply(0, count, math.max(1, ceil_ms(finish - now))) end
  if write then
    redis.call('HSET', key, 'a', 'FIXED', 's', string.format('%.3f', start), 'c', count + quantity, 'u', now)
    redis.call('PEXPIREAT', key, math.ceil(finish / 1000))
  end
  return reply(1, count + quantity, -1)
end

if algo == 'SLIDING' then
  local s = redis.call('HMGET', key, 's', 'p', 'c', 'u')
  local prev, curr = 0, 0
  if s[1] then
    local s_start, s_prev, s_curr, s_upd = tonumber(s[1]), tonumber(s[2]), tonumber(s[3]), tonumber(s[4])
    local function place(last, n)
      if n > 0 then
        if last >= start then curr = curr + n elseif last >= start - w then prev = prev + n end
      end
    end
    place(math.max(s_upd, s_start), s_curr)
    place(s_start - 0.001, s_prev)
  end
  local elapsed = now - start
  local function estimate(p, c) return p * (w - elapsed) / w + c end
  local function reply(allowed, p, c, retry)
    local reset = 0
    if c > 0 then reset = ceil_ms(finish + w - now) elseif p > 0 then reset = ceil_ms(finish - now) end
    return {allowed, limit, math.max(0, math.floor(limit - estimate(p, c) + 1e-9)), retry, reset}
  end
  if quantity == 0 then return reply(1, prev, curr, -1) end
  if quantity > limit then return reply(0, prev, curr, -1) end
  if estimate(prev, curr) + quantity <= limit + 1e-9 then
    if write then
      redis.call('HSET', key, 'a', 'SLIDING', 's', string.format('%.3f', start), 'p', prev, 'c', curr + quantity, 'u', now)
      redis.call('PEXPIREAT', key, math.ceil((finish + w) / 1000))
    end
    return reply(1, prev, curr + quantity, -1)
  end
  -- earliest instant the estimate admits the request
  local at
  local room = limit - curr - quantity
  if room >= 0 and prev > 0 and room * w / prev > 0 then
    at = start + math.max(elapsed, w - room * w / prev)
  end
  if not at or at >= finish then
    local room2 = limit - quantity
    if curr == 0 then at = finish else at = finish + math.max(0, w - room2 * w / curr) end
  end
  return reply(0, prev, curr, math.max(1, ceil_ms(at - now)))
end

-- LOG
local cutoff = now - w
local in_window = redis.call('ZCOUNT', key, '(' .. string.format('%.3f', cutoff), '+inf')
local function newest()
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last[2] and tonumber(last[2]) > cutoff then return tonumber(last[2]) end
  return nil
end
local function reply(allowed, c, retry, newest_at)
  return {allowed, limit, math.max(0, limit - c), retry, newest_at and ceil_ms(newest_at + w - now) or 0}
end
if quantity == 0 then return reply(1, in_window, -1, newest()) end
if quantity > limit then return reply(0, in_window, -1, newest()) end
if in_window + quantity <= limit then
  if write then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%.3f', cutoff))
    local same = redis.call('ZCOUNT', key, now, now)
    for j = 1, quantity do
      redis.call('ZADD', key, now, string.format('%d-%d', now, same + j))
    end
    redis.call('PEXPIREAT', key, math.ceil((now + w) / 1000))
  end
  return reply(1, in_window + quantity, -1, now)
end
local need = in_window + quantity - limit
local oldest = redis.call('ZRANGEBYSCORE', key, '(' .. string.format('%.3f', cutoff), '+inf', 'WITHSCORES', 'LIMIT', need - 1, 1)
local leaves = tonumber(oldest[2]) + w
return reply(0, in_window, math.max(1, ceil_ms(leaves - now)), newest())
