-- RL.GCRA in Lua, for servers where MODULE LOAD is not allowed (managed Redis services).
--
--   EVALSHA <sha> 1 key burst rate period [QUANTITY n] [PEEK]
--
-- Same arguments and the same five-integer reply as the module's RL.GCRA:
--   {allowed, limit, remaining, retry_after_ms, reset_after_ms}
-- GCRA (ATM Forum TM 4.0): the key holds the theoretical arrival time (TAT); a request of
-- quantity n is allowed iff max(TAT, now) + n*T - now <= burst*T, with T = period / rate.
-- Time comes from the server (TIME), in microseconds (Lua numbers hold integers exactly up to
-- 2^53, so nanoseconds would not fit); the key always gets its TTL in this same script.
-- The key is a string "tat_us emission_interval_us burst updated_us".
-- Differences from the module: microsecond rather than nanosecond arithmetic (durations agree
-- to the millisecond); no MAXWAIT; keys are plain strings, so the two must not share keys.

local function err(msg) return redis.error_reply('ERR ' .. msg) end

local function count(text, name, min)
  if type(text) ~= 'string' or not string.match(text, '^%d+$') then
    return nil, err(name .. ' must be a ' .. (min == 0 and 'non-negative' or 'positive') .. ' integer')
  end
  local n = tonumber(text)
  if n < min or n > 9007199254740991 then
    return nil, err(name .. ' must be a ' .. (min == 0 and 'non-negative' or 'positive') .. ' integer')
  end
  return n
end

local function seconds_us(text, name)
  local msg = name .. ' must be seconds as a plain decimal (digits, optionally \'.\' and 1 to 9 more digits), > 0 and <= 315360000'
  if type(text) ~= 'string' then return nil, err(msg) end
  local int, frac = string.match(text, '^(%d+)%.(%d+)$')
  if not int then int = string.match(text, '^(%d+)$'); frac = '' end
  if not int or #frac > 9 then return nil, err(msg) end
  local us = tonumber(int) * 1000000 + tonumber(string.sub(frac .. '000000000', 1, 9)) / 1000
  if us <= 0 or tonumber(int) > 315360000 or (tonumber(int) == 315360000 and tonumber('0' .. frac) > 0) then
    return nil, err(msg)
  end
  return us
end

local burst, e1 = count(ARGV[1], 'burst', 1); if not burst then return e1 end
local rate, e2 = count(ARGV[2], 'rate', 1); if not rate then return e2 end
local period, e3 = seconds_us(ARGV[3], 'period'); if not period then return e3 end
local quantity, peek = 1, false
local seen_q = false
local i = 4
while ARGV[i] do
  local kw = string.upper(ARGV[i])
  if kw == 'QUANTITY' then
    if seen_q then return err('syntax error: QUANTITY given more than once') end
    seen_q = true
    if not ARGV[i + 1] then return err('syntax error: QUANTITY needs a value') end
    local q, e = count(ARGV[i + 1], 'QUANTITY', 0); if not q then return e end
    quantity = q
    i = i + 2
  elseif kw == 'PEEK' then
    if peek then return err('syntax error: PEEK given more than once') end
    peek = true
    i = i + 1
  else
    return err("syntax error: unknown argument '" .. ARGV[i] .. "'")
  end
end

local t = period / rate                    -- emission interval, us
if t * 1000 < 0.5 then return err('rate is too high for period: the emission interval period/rate is below 1 ns') end
local tolerance = burst * t
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])

local tat = now
local stored = redis.call('GET', KEYS[1])
if stored then
  local s_tat, s_t, _, s_upd = string.match(stored, '^(%S+) (%S+) (%S+) (%S+)$')
  s_tat, s_t, s_upd = tonumber(s_tat), tonumber(s_t), tonumber(s_upd)
  if s_tat and s_tat > now then
    if math.abs(s_t - t) < 1e-9 then
      tat = s_tat
    else
      -- capacity in use at the last write, re-expressed in the new emission interval
      tat = math.max(now, s_upd + (s_tat - s_upd) * t / s_t)
    end
  end
end

local function ceil_ms(us) return math.ceil(us / 1000 - 1e-9) end
local function remaining(tat_after) return math.max(0, math.floor((tolerance - (tat_after - now)) / t + 1e-9)) end

if quantity == 0 then return {1, burst, remaining(tat), -1, ceil_ms(tat - now)} end
if quantity > burst then return {0, burst, remaining(tat), -1, ceil_ms(tat - now)} end
local new_tat = tat + quantity * t
if new_tat - now <= tolerance + 1e-6 then
  if not peek then
    redis.call('SET', KEYS[1], string.format('%.3f %.6f %d %d', new_tat, t, burst, now), 'PXAT', math.ceil(new_tat / 1000))
  end
  return {1, burst, remaining(new_tat), -1, ceil_ms(new_tat - now)}
end
return {0, burst, remaining(tat), math.max(1, ceil_ms(new_tat - tolerance - now)), ceil_ms(tat - now)}
