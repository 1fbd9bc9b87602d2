#!lua name=redis_rl
--[[
redis_rl: the Lua fallback of the redis-rl module, for servers that cannot load modules.

A Redis Functions library (Redis 7.0+, Valkey 8+). Load it once (it persists in RDB/AOF and
replicates with the data):

    FUNCTION LOAD REPLACE "<this file>"

and call it with exactly the module command's arguments, the key(s) moved into FCALL's keys:

    FCALL rl_gcra    1 key burst rate period [QUANTITY n] [PEEK] [MAXWAIT ms] [FORCE]
    FCALL rl_window  1 key limit window [FIXED | SLIDING | LOG] [QUANTITY n] [PEEK] [FORCE]
    FCALL rl_all     numkeys key [key ...] spec [spec ...] [QUANTITY n] [PEEK] [FORCE]
          spec := GCRA burst rate period [COST n]
                | WINDOW limit window [FIXED | SLIDING | LOG] [COST n]
                | LEASE limit lease token [COST n]
    FCALL rl_refund  1 key quantity
    FCALL rl_lease   1 key limit lease token [QUANTITY n] [PEEK] [RENEW]
    FCALL rl_release 1 key token
    FCALL_RO rl_version 0          -> the library's version ("1.1.0")
    FCALL_RO rl_config 0           -> {"log-max-limit", n, "lease-max-limit", n,
                                       "all-max-keys", n, "version", v}

Replies and error texts are the module's (RL.GCRA, RL.WINDOW, RL.ALL, RL.REFUND, RL.LEASE,
RL.RELEASE; see docs/reference.md and the README).

Servers without Functions (Redis 6.2): drop the first line of this file (the "#!lua" line),
SCRIPT LOAD the rest, and call EVALSHA sha numkeys key ... name arg ..., where ARGV[1] is the
function's name (rl_gcra, ...) and the rest are its arguments. Same replies.

Configuration. The three lines below starting "local LOG_MAX_LIMIT =", "local LEASE_MAX_LIMIT ="
and "local ALL_MAX_KEYS =" are the fallback's rl.log-max-limit (largest LOG limit, 1 to 10000000,
default 100000), rl.lease-max-limit (largest LEASE limit, 1 to 1000000, default 10000) and
rl.all-max-keys (largest rl_all numkeys, 1 to 10000, default 64). To change one, replace the
number on that line and FUNCTION LOAD REPLACE the text: the setting then persists and
replicates with the library. rl_config reports the values in force.

Time. The clock is the server's TIME (microseconds), read once per call; it must stay below
2^53 microseconds (the year 2255). All arithmetic is exact integer arithmetic in nanoseconds,
like the module's: instants are (seconds, nanoseconds) pairs of exact Lua numbers, other values
are Lua numbers up to 2^53 - 1 (where doubles stop being exact) and arrays of base-2^24 limbs
above, so every time and count has the module's 64-bit range and every product the module's
128-bit one; nothing is rounded unless the module rounds it. What the fallback cannot do is
reply an integer above 2^53 - 1: burst and limit (which every reply carries) must be at most
9007199254740991, and an error naming the argument says so.

Keys. Every key is a string starting with the 3 bytes FF 'r' 'l' and one byte naming the
algorithm ('G' GCRA, 'F' FIXED, 'S' SLIDING, 'L' LOG, 'E' LEASE); anything else (another type,
another string) answers WRONGTYPE and is never touched. Fields are little-endian: durations and
counts u64, burst and limit 7 bytes, instants 9 bytes (seconds: 5 bytes, nanoseconds: u32).
  G: tat, emission interval, burst, updated                           (37 bytes)
  F: window, limit, count, updated (the window holding it)            (36 bytes)
  S: window, limit, prev, curr, updated (the window holding it)       (44 bytes)
  L: window, limit, head u32, tail u32, base u24, then 10-byte entries from offset 31:
     instant (microseconds, 7 bytes) and the running request count (mod 2^24, 3 bytes)
  E: limit, then per lease: token length (1 byte), token, slots (u32), expiry (microseconds,
     7 bytes, and the nanoseconds past them, u16)
]]

local VERSION = '1.1.0'
local LOG_MAX_LIMIT = 100000
local LEASE_MAX_LIMIT = 10000
local ALL_MAX_KEYS = 64

-- A library's code runs at FUNCTION LOAD with no globals but `redis` (Redis 7.0): the standard
-- libraries are bound on the first call instead (init).
local floor, fmod, max, pack, unpack, byte, char, sub_s, find, match, concat

if not (LOG_MAX_LIMIT % 1 == 0 and LOG_MAX_LIMIT >= 1 and LOG_MAX_LIMIT <= 10000000) then
  local _ = redis_rl_LOG_MAX_LIMIT_must_be_an_integer_from_1_to_10000000
end
if not (LEASE_MAX_LIMIT % 1 == 0 and LEASE_MAX_LIMIT >= 1 and LEASE_MAX_LIMIT <= 1000000) then
  local _ = redis_rl_LEASE_MAX_LIMIT_must_be_an_integer_from_1_to_1000000
end
if not (ALL_MAX_KEYS % 1 == 0 and ALL_MAX_KEYS >= 1 and ALL_MAX_KEYS <= 10000) then
  local _ = redis_rl_ALL_MAX_KEYS_must_be_an_integer_from_1_to_10000
end

---------------------------------------------------------------------------------------------
-- Exact unsigned integers ("wide"): a Lua number when <= 2^53 - 1, else a table of base-2^24
-- limbs, least significant first, without leading zero limbs. Every function returns the
-- normalised form, so a table always holds a value above 2^53 - 1.
---------------------------------------------------------------------------------------------

local MAXI = 9007199254740991 -- 2^53 - 1
local B = 16777216 -- 2^24

local function L(x) -- limbs of x (a table is returned as is: callers never modify it)
  if type(x) == 'table' then return x end
  local t, i = {}, 0
  while x > 0 do
    local q = floor(x / B)
    i = i + 1
    t[i] = x - q * B
    x = q
  end
  return t
end

local function N(t) -- normalise a fresh limb table
  local n = #t
  while n > 0 and t[n] == 0 do
    t[n] = nil
    n = n - 1
  end
  if n == 0 then return 0 end
  if n == 1 then return t[1] end
  if n == 2 then return t[2] * B + t[1] end
  if n == 3 and t[3] < 32 then return (t[3] * B + t[2]) * B + t[1] end
  return t
end

local function cmp(a, b)
  local ta, tb = type(a) == 'table', type(b) == 'table'
  if not ta and not tb then
    if a < b then return -1 elseif a > b then return 1 else return 0 end
  end
  if not ta then return -1 end
  if not tb then return 1 end
  if #a ~= #b then return #a < #b and -1 or 1 end
  for i = #a, 1, -1 do
    if a[i] ~= b[i] then return a[i] < b[i] and -1 or 1 end
  end
  return 0
end

local function add(a, b)
  if type(a) ~= 'table' and type(b) ~= 'table' then
    local s = a + b
    if s <= MAXI then return s end
  end
  local x, y = L(a), L(b)
  local r, carry = {}, 0
  local n = max(#x, #y)
  for i = 1, n do
    local s = (x[i] or 0) + (y[i] or 0) + carry
    if s >= B then
      r[i] = s - B
      carry = 1
    else
      r[i] = s
      carry = 0
    end
  end
  if carry > 0 then r[n + 1] = carry end
  return N(r)
end

local function sub(a, b) -- a - b, a >= b
  if type(a) ~= 'table' and type(b) ~= 'table' then
    if a < b then error('redis_rl: negative difference') end
    return a - b
  end
  local x, y = L(a), L(b)
  local r, borrow = {}, 0
  for i = 1, #x do
    local s = x[i] - (y[i] or 0) - borrow
    if s < 0 then
      r[i] = s + B
      borrow = 1
    else
      r[i] = s
      borrow = 0
    end
  end
  if borrow ~= 0 or #y > #x then error('redis_rl: negative difference') end
  return N(r)
end

local function mul(a, b)
  if type(a) ~= 'table' and type(b) ~= 'table' then
    local p = a * b
    if p <= MAXI then return p end
  end
  local x, y = L(a), L(b)
  local nx, ny = #x, #y
  if nx == 0 or ny == 0 then return 0 end
  local r = {}
  for i = 1, nx + ny do r[i] = 0 end
  for i = 1, nx do
    local carry, xi = 0, x[i]
    for j = 1, ny do
      local t = r[i + j - 1] + xi * y[j] + carry
      carry = floor(t / B)
      r[i + j - 1] = t - carry * B
    end
    r[i + ny] = carry
  end
  return N(r)
end

-- Quotient and remainder (b > 0). Knuth's algorithm D for divisors of two limbs or more.
local function divmod(a, b)
  if type(a) ~= 'table' and type(b) ~= 'table' then
    local r = fmod(a, b)
    return (a - r) / b, r
  end
  if cmp(a, b) < 0 then return 0, a end
  local u, v = L(a), L(b)
  local n = #v
  if n == 1 then
    local d, q, r = v[1], {}, 0
    for i = #u, 1, -1 do
      local cur = r * B + u[i]
      local qi = floor(cur / d)
      local rr = cur - qi * d
      if rr < 0 then
        qi, rr = qi - 1, rr + d
      elseif rr >= d then
        qi, rr = qi + 1, rr - d
      end
      q[i], r = qi, rr
    end
    return N(q), r
  end
  local f = 1
  while v[n] * f < B / 2 do f = f * 2 end
  local vn, un = {}, {}
  local carry = 0
  for i = 1, n do
    local t = v[i] * f + carry
    carry = floor(t / B)
    vn[i] = t - carry * B
  end
  carry = 0
  for i = 1, #u do
    local t = u[i] * f + carry
    carry = floor(t / B)
    un[i] = t - carry * B
  end
  un[#u + 1] = carry
  local m = #u - n
  local q = {}
  local vtop, vnext = vn[n], vn[n - 1]
  for j = m, 0, -1 do
    local num = un[j + n + 1] * B + un[j + n]
    local qhat = floor(num / vtop)
    local rhat = num - qhat * vtop
    while rhat < 0 do
      qhat, rhat = qhat - 1, rhat + vtop
    end
    while rhat >= vtop do
      qhat, rhat = qhat + 1, rhat - vtop
    end
    while rhat < B and (qhat >= B or qhat * vnext > rhat * B + un[j + n - 1]) do
      qhat, rhat = qhat - 1, rhat + vtop
    end
    local borrow, c = 0, 0
    for i = 1, n do
      local p = qhat * vn[i] + c
      c = floor(p / B)
      local t = un[i + j] - (p - c * B) - borrow
      if t < 0 then
        un[i + j] = t + B
        borrow = 1
      else
        un[i + j] = t
        borrow = 0
      end
    end
    local top = un[j + n + 1] - c - borrow
    if top < 0 then
      qhat = qhat - 1
      local c2 = 0
      for i = 1, n do
        local s = un[i + j] + vn[i] + c2
        if s >= B then
          un[i + j] = s - B
          c2 = 1
        else
          un[i + j] = s
          c2 = 0
        end
      end
      top = top + c2
    end
    un[j + n + 1] = top
    q[j + 1] = qhat
  end
  local r = {}
  carry = 0
  for i = n, 1, -1 do
    local t = un[i] + carry * B
    local qq = floor(t / f)
    r[i] = qq
    carry = t - qq * f
  end
  return N(q), N(r)
end

local function div(a, b) return (divmod(a, b)) end
local function ceil_div(a, b)
  local q, r = divmod(a, b)
  if r ~= 0 then return add(q, 1) end
  return q
end
local function ssub(a, b) -- saturating a - b
  if cmp(a, b) <= 0 then return 0 end
  return sub(a, b)
end
local function wmin(a, b) return cmp(a, b) <= 0 and a or b end
local function wmax(a, b) return cmp(a, b) >= 0 and a or b end

local U64 = {0, 0, 65536} -- 2^64
local U64MAX = {16777215, 16777215, 65535} -- 2^64 - 1
local NS_PER_S, NS_PER_MS, NS_PER_US = 1000000000, 1000000, 1000
local MAX_PERIOD_NS = {6160384, 6438856, 1120} -- 315360000 s in ns

local initialised = false
local function init()
  if initialised then return end
  floor, fmod, max = math.floor, math.fmod, math.max
  pack, unpack = struct.pack, struct.unpack
  byte, char, sub_s, find, match = string.byte, string.char, string.sub, string.find, string.match
  concat = table.concat
  initialised = true
end

local function ceil_ms(d) return ceil_div(d, NS_PER_MS) end

local function pack64(w) -- little-endian u64 (w < 2^64)
  local t = L(w)
  return pack('<I3I3I2', t[1] or 0, t[2] or 0, t[3] or 0)
end
local function unpack64(s, pos)
  local a, b, c = unpack('<I3I3I2', s, pos)
  if c < 32 then return (c * B + b) * B + a end
  return N({a, b, c})
end

-- Counts that replies carry (burst, limit: at most 2^53 - 1) take 7 bytes.
local function pack7(n)
  local hi = floor(n / B)
  return pack('<I3I4', n - hi * B, hi)
end
local function unpack7(s, pos)
  local lo, hi = unpack('<I3I4', s, pos)
  return hi * B + lo
end

---------------------------------------------------------------------------------------------
-- Instants: nanoseconds since the epoch held as two exact numbers, seconds and nanoseconds
-- (like a timespec), over the module's whole 64-bit range. Durations are wide values.
---------------------------------------------------------------------------------------------

local U64_S, U64_N = 18446744073, 709551616 -- 2^64 ns

local function ilt(as, an, bs, bn) return as < bs or (as == bs and an < bn) end

-- a - b (a >= b), a wide value of nanoseconds.
local function idiff(as, an, bs, bn)
  local ds, dn = as - bs, an - bn
  if dn < 0 then ds, dn = ds - 1, dn + NS_PER_S end
  if ds < 9000000 then return ds * NS_PER_S + dn end
  return add(mul(ds, NS_PER_S), dn)
end

-- a - b, or 0 when a <= b.
local function isince(as, an, bs, bn)
  if ilt(bs, bn, as, an) then return idiff(as, an, bs, bn) end
  return 0
end

-- a + d; a result of 2^64 ns or more comes back as an instant that does not fit (see fits).
local function iplus(s, n, d)
  local q, r = divmod(d, NS_PER_S)
  if type(q) == 'table' then return U64_S + 1, 0 end
  s, n = s + q, n + r
  if n >= NS_PER_S then s, n = s + 1, n - NS_PER_S end
  return s, n
end

-- a - d, not below 0.
local function iminus(s, n, d)
  local q, r = divmod(d, NS_PER_S)
  if type(q) == 'table' or q > s then return 0, 0 end
  s, n = s - q, n - r
  if n < 0 then s, n = s - 1, n + NS_PER_S end
  if s < 0 then return 0, 0 end
  return s, n
end

local function fits(s, n) return s < U64_S or (s == U64_S and n < U64_N) end

-- The instant modulo w (w >= 1 ns): exact number arithmetic while w <= 9e12 ns.
local function imod(s, n, w)
  if type(w) ~= 'table' and w <= 9000000000000 then
    local x = fmod(s, w)
    x = fmod(x * 1000, w)
    x = fmod(x * 1000, w)
    x = fmod(x * 1000, w)
    return fmod(x + n, w)
  end
  local _, r = divmod(add(mul(s, NS_PER_S), n), w)
  return r
end

-- Milliseconds since the epoch, rounded up (an absolute expiry).
local function ims(s, n)
  return s * 1000 + floor((n + 999999) / 1000000)
end

local function pack_instant(s, n)
  local hi = floor(s / B)
  return pack('<I3I2I4', s - hi * B, hi, n)
end
local function unpack_instant(str, pos)
  local lo, hi, n = unpack('<I3I2I4', str, pos)
  return hi * B + lo, n
end

---------------------------------------------------------------------------------------------
-- Errors: the module's texts.
---------------------------------------------------------------------------------------------

-- The text of the error being raised by fail(): Redis 7's pcall turns error values into
-- strings, so the reply is taken from here rather than from what pcall returns.
local failure
local function fail(text)
  failure = text
  error(text, 0)
end

local WRONGTYPE = 'WRONGTYPE Operation against a key holding the wrong kind of value'
local OVERFLOW = 'ERR arithmetic overflow: QUANTITY, period and rate would move the key\'s time past '
  .. '64-bit nanoseconds'
local OOM = 'OOM command not allowed when used memory > \'maxmemory\'.'
local RENEW_WITH_QUANTITY_ZERO = 'ERR RENEW cannot be used with QUANTITY 0: a renewal holds at '
  .. 'least one slot, QUANTITY 0 only reports'
local RENEW_IN_ALL = 'ERR RENEW cannot be used in RL.ALL: renew a lease on its own with RL.LEASE '
  .. 'key limit lease token RENEW'
local READONLY = 'READONLY You can\'t write against a read only replica.'

-- Client bytes as errors show them: lossy UTF-8 (invalid sequences become U+FFFD), at most 64
-- characters.
local function shown(s)
  local out, chars, i, n = {}, 0, 1, #s
  while i <= n and chars < 64 do
    local c = byte(s, i)
    local len = 0
    if c < 0x80 then
      len = 1
    elseif c >= 0xC2 and c <= 0xDF then
      len = 2
    elseif c >= 0xE0 and c <= 0xEF then
      len = 3
    elseif c >= 0xF0 and c <= 0xF4 then
      len = 4
    end
    if len == 1 then
      out[#out + 1] = char(c)
      i = i + 1
    elseif len == 0 then
      out[#out + 1] = '\239\191\189'
      i = i + 1
    else
      local lo, hi = 0x80, 0xBF
      if c == 0xE0 then lo = 0xA0 elseif c == 0xED then hi = 0x9F
      elseif c == 0xF0 then lo = 0x90 elseif c == 0xF4 then hi = 0x8F end
      local j, ok = 1, true
      while j < len do
        local b = byte(s, i + j)
        if not b or b < lo or b > hi then
          ok = false
          break
        end
        lo, hi = 0x80, 0xBF
        j = j + 1
      end
      if ok then
        out[#out + 1] = sub_s(s, i, i + len - 1)
        i = i + len
      else
        out[#out + 1] = '\239\191\189'
        i = i + j
      end
    end
    chars = chars + 1
  end
  return concat(out)
end

local function not_positive(name) fail('ERR ' .. name .. ' must be a positive integer') end
local function not_non_negative(name) fail('ERR ' .. name .. ' must be a non-negative integer') end
local function not_seconds(name)
  fail('ERR ' .. name .. ' must be seconds as a plain decimal (digits, optionally \'.\' and 1 to 9 '
    .. 'more digits), > 0 and <= 315360000')
end
local function duplicate(kw) fail('ERR syntax error: ' .. kw .. ' given more than once') end
local function missing_value(kw) fail('ERR syntax error: ' .. kw .. ' needs a value') end
local function unknown(arg) fail('ERR syntax error: unknown argument \'' .. shown(arg) .. '\'') end
-- The server's own arity check of the module command, on the module's argument count (command
-- name, numkeys for RL.ALL, keys, arguments): `want` is exact, or at least -want when negative.
local function arity(cmd, argc, want)
  if (want >= 0 and argc ~= want) or (want < 0 and argc < -want) then
    fail('ERR wrong number of arguments for \'' .. cmd .. '\' command')
  end
end
local function out_of_range(name)
  fail('ERR ' .. name .. ' must be at most 9007199254740991 (2^53 - 1) in the Lua fallback, which '
    .. 'cannot reply larger integers')
end

---------------------------------------------------------------------------------------------
-- Parsing: exactly the module's grammar.
---------------------------------------------------------------------------------------------

-- A count: ASCII digits only, at most 2^64 - 1 (leading zeros allowed). Returns a wide value,
-- or nil, and the digits without leading zeros (for messages).
local function parse_count(s)
  if s == '' or find(s, '[^0-9]') then return nil end
  local d = (string.gsub(s, '^0+', ''))
  if d == '' then return 0, '0' end
  if #d > 20 then return nil end
  if #d <= 15 then return tonumber(d), d end
  local v = 0
  local i = 1
  while i <= #d do
    local chunk = sub_s(d, i, i + 6)
    v = add(mul(v, 10 ^ #chunk), tonumber(chunk))
    i = i + #chunk
  end
  if cmp(v, U64) >= 0 then return nil end
  return v, d
end

local function positive(s, name)
  local v, d = parse_count(s)
  if v == nil or v == 0 then not_positive(name) end
  return v, d
end

local function non_negative(s, name)
  local v = parse_count(s)
  if v == nil then not_non_negative(name) end
  return v
end

-- Seconds as a plain decimal (digits, optionally '.' and 1 to 9 digits), > 0 and <= 315360000;
-- returns nanoseconds.
local function seconds(s, name)
  local int, frac = match(s, '^([0-9]+)%.([0-9]+)$')
  if not int then
    int, frac = match(s, '^([0-9]+)$'), ''
  end
  if not int or #frac > 9 then not_seconds(name) end
  int = (string.gsub(int, '^0+', ''))
  if #int > 9 then not_seconds(name) end
  local ns = add(mul(tonumber(int) or 0, NS_PER_S), tonumber(frac .. string.rep('0', 9 - #frac)))
  if ns == 0 or cmp(ns, MAX_PERIOD_NS) > 0 then not_seconds(name) end
  return ns
end

local function token_arg(s)
  if #s < 1 or #s > 64 then fail('ERR token must be 1 to 64 bytes') end
  return s
end

-- Reads the keywords after the positional arguments.
local function Options(args, i)
  local o = {args = args, i = i}
  function o.next()
    local a = o.args[o.i]
    if a ~= nil then o.i = o.i + 1 end
    return a
  end
  function o.peek() return o.args[o.i] end
  function o.value(kw)
    local a = o.next()
    if a == nil then missing_value(kw) end
    return a
  end
  return o
end

-- QUANTITY n, PEEK and FORCE (when `force_ok`); returns true if `kw` was one of them.
local function take_request_option(req, kw, o, force_ok)
  local k = string.upper(kw)
  if k == 'QUANTITY' then
    if req.seen_quantity then duplicate('QUANTITY') end
    req.seen_quantity = true
    req.quantity = non_negative(o.value('QUANTITY'), 'QUANTITY')
    return true
  elseif k == 'PEEK' then
    if req.peek then duplicate('PEEK') end
    req.peek = true
    return true
  elseif k == 'FORCE' and force_ok then
    if req.force then duplicate('FORCE') end
    req.force = true
    return true
  end
  return false
end

local ALGORITHMS = {FIXED = 'F', SLIDING = 'S', LOG = 'L'}
local HELD = {G = 'GCRA limiter', F = 'FIXED window', S = 'SLIDING window', L = 'LOG window',
  E = 'LEASE limit'}

local function gcra_params(burst, rate, period_ns)
  -- T = period / rate rounded half up, >= 1 ns; burst * T < 2^64.
  local t = div(add(period_ns, div(rate, 2)), rate)
  if t == 0 then
    fail('ERR rate is too high for period: the emission interval period/rate is below 1 ns')
  end
  local tol = mul(burst, t)
  if cmp(tol, U64) >= 0 then
    fail('ERR burst is too large: burst * period / rate overflows 64-bit nanoseconds')
  end
  return {algo = 'G', burst = burst, T = t, tol = tol}
end

local function check_log_limit(algo, limit, digits)
  if algo == 'L' and cmp(limit, LOG_MAX_LIMIT) > 0 then
    fail('ERR limit ' .. digits .. ' is above rl.log-max-limit (' .. LOG_MAX_LIMIT .. ') for LOG, '
      .. 'which stores every request: use SLIDING for large limits, or raise rl.log-max-limit')
  end
end

local function check_lease_limit(limit, digits)
  if cmp(limit, LEASE_MAX_LIMIT) > 0 then
    fail('ERR limit ' .. digits .. ' is above rl.lease-max-limit (' .. LEASE_MAX_LIMIT .. ') for '
      .. 'LEASE, which stores every lease: raise rl.lease-max-limit for larger concurrency limits')
  end
end

local function reply_range(v, name) -- a count that every reply carries
  if type(v) == 'table' then out_of_range(name) end
end

---------------------------------------------------------------------------------------------
-- The server: clock, memory, keys.
---------------------------------------------------------------------------------------------

local eval_mode = false -- true when run by EVAL/EVALSHA instead of FCALL

-- Now, read once per call: {s, n} the instant (seconds, nanoseconds) and us in microseconds.
local function clock()
  local t = redis.call('TIME')
  local sec, usec = tonumber(t[1]), tonumber(t[2])
  local us = sec * 1000000 + usec
  if us > MAXI then
    fail('ERR the server clock is past 2^53 microseconds since the epoch (the year 2255), the Lua '
      .. 'fallback\'s range')
  end
  return {s = sec, n = usec * NS_PER_US, us = us}
end

-- docs/reference.md#r-oom-1: a request that would write answers OOM when maxmemory is reached
-- (after eviction) and changes nothing; denials, PEEK and QUANTITY 0 answer as usual. The
-- write functions carry the allow-oom flag, so they check memory themselves (INFO memory,
-- about 20 us; its "enough room" answer is kept for 10 ms while at least a tenth of maxmemory
-- is free, or maxmemory is off). Under EVAL the server itself refuses a script's first write
-- when out of memory.
local memory_ok_until = -1
local memory_checked_at = -1
local function check_memory(now_us)
  if eval_mode then return end
  if now_us >= memory_checked_at and now_us < memory_ok_until then return end
  local s = redis.call('INFO', 'memory')
  local maxmemory = tonumber(match(s, '\nmaxmemory:(%d+)')) or 0
  local used = tonumber(match(s, '\nused_memory:(%d+)')) or 0
  local not_counted = tonumber(match(s, '\nmem_not_counted_for_evict:(%d+)')) or 0
  local counted = used - not_counted
  memory_checked_at, memory_ok_until = now_us, -1
  if maxmemory > 0 and counted > maxmemory then fail(OOM) end
  if maxmemory == 0 or counted <= maxmemory - maxmemory / 10 then
    memory_ok_until = now_us + 10000
  end
end

-- Every write goes through here; under EVAL the server's own OOM refusal of the first write
-- comes back as an error reply instead of a script error.
local function write(...)
  if eval_mode then
    local r = redis.pcall(...)
    if type(r) == 'table' and r.err then fail(r.err) end
    return r
  end
  return redis.call(...)
end

local MAGIC = '\255rl'
local LOG_H = 31 -- LOG header bytes; entries start at this offset
local ENTRY = 10 -- LOG entry bytes
local CUM = 16777216 -- LOG running counts are kept modulo 2^24

-- Loads the limiter state of `key`: nil for a missing key, or a table with `algo`.
-- Another type, or a string that is not a valid state of ours, is WRONGTYPE.
local function load(key)
  local head = redis.pcall('GETRANGE', key, 0, 63)
  if type(head) == 'table' then fail(WRONGTYPE) end
  if head == '' then
    if redis.call('EXISTS', key) == 1 then fail(WRONGTYPE) end
    return nil
  end
  if #head < 4 or sub_s(head, 1, 3) ~= MAGIC then fail(WRONGTYPE) end
  local a = sub_s(head, 4, 4)
  local st
  if a == 'G' and #head == 37 then
    st = {algo = 'G', T = unpack64(head, 14), burst = unpack7(head, 22)}
    st.tat_s, st.tat_n = unpack_instant(head, 5)
    st.upd_s, st.upd_n = unpack_instant(head, 29)
    if st.T == 0 or st.burst == 0 or cmp(st.T, MAX_PERIOD_NS) > 0
      or cmp(mul(st.T, st.burst), U64) >= 0 then fail(WRONGTYPE) end
  elseif a == 'F' and #head == 36 then
    st = {algo = 'F', W = unpack64(head, 5), limit = unpack7(head, 13), count = unpack64(head, 20)}
    st.upd_s, st.upd_n = unpack_instant(head, 28)
  elseif a == 'S' and #head == 44 then
    st = {algo = 'S', W = unpack64(head, 5), limit = unpack7(head, 13), prev = unpack64(head, 20),
      curr = unpack64(head, 28)}
    st.upd_s, st.upd_n = unpack_instant(head, 36)
  elseif a == 'L' and #head >= LOG_H then
    local hd, tl, base = unpack('<I4I4I3', head, 21)
    st = {algo = 'L', key = key, W = unpack64(head, 5), limit = unpack64(head, 13), head = hd,
      tail = tl, base = base, cache = {}}
    st.E = (tl - hd) / ENTRY
    if hd < LOG_H or tl < hd or st.E ~= floor(st.E) or redis.call('STRLEN', key) < tl
      or cmp(st.limit, 10000000) > 0 then fail(WRONGTYPE) end
  elseif a == 'E' and #head >= 12 then
    -- The leases are read by lease_scan, which checks their layout.
    st = {algo = 'E', limit = unpack64(head, 5), whole = redis.call('GET', key)}
  else
    fail(WRONGTYPE)
  end
  if st.W ~= nil and (st.W == 0 or cmp(st.W, MAX_PERIOD_NS) > 0) then fail(WRONGTYPE) end
  if st.limit == 0 then fail(WRONGTYPE) end
  if st.upd_s and (st.upd_n >= NS_PER_S or not fits(st.upd_s, st.upd_n)) then fail(WRONGTYPE) end
  if st.tat_s and (st.tat_n >= NS_PER_S or not fits(st.tat_s, st.tat_n)) then fail(WRONGTYPE) end
  return st
end

local function wrong_algorithm(key, held, asked)
  fail('ERR key \'' .. shown(key) .. '\' holds a ' .. HELD[held] .. ', not a ' .. HELD[asked]
    .. ': use the same algorithm for a key, or another key')
end

-- The absolute expiry (ms) of a key idle `reset` ns from now.
local function expire_at(now, reset) return ims(iplus(now.s, now.n, reset)) end

---------------------------------------------------------------------------------------------
-- Decisions: {verdict = 'allowed' | 'reserved' | 'denied' | 'never', delay, retry, limit,
-- remaining, reset} with durations in ns; `write` (a function) when the request would store.
---------------------------------------------------------------------------------------------

local function allowed(v) return v == 'allowed' or v == 'reserved' end

local function five(d)
  local retry = -1
  if d.verdict == 'denied' then
    retry = wmax(ceil_ms(d.retry), 1)
  elseif d.verdict == 'reserved' then
    retry = ceil_ms(d.delay)
  end
  local out = {allowed(d.verdict) and 1 or 0, d.limit, d.remaining, retry, ceil_ms(d.reset)}
  for i = 1, 5 do
    if type(out[i]) == 'table' then fail('ERR a reply value is above 2^53 - 1, the largest integer '
      .. 'the Lua fallback can reply') end
  end
  return out
end

-- Signed instant arithmetic for LOG instants (microseconds): instant + w - now, in ns, at least 0.
local function us_plus_ns_minus_now(instant_us, w, now_us)
  local d = instant_us - now_us
  if d >= 0 then return add(mul(d, NS_PER_US), w) end
  return ssub(w, mul(-d, NS_PER_US))
end

------------------------------------------------------------------------------------- GCRA

-- The stored TAT under the call's parameters, never before now (see the module's
-- effective_tat: capacity in use at the last write is kept in requests across a change of
-- emission interval, rounded up).
local function gcra_effective_tat(p, st, now)
  if st == nil or not ilt(now.s, now.n, st.tat_s, st.tat_n) then return now.s, now.n end
  if cmp(st.T, p.T) == 0 then return st.tat_s, st.tat_n end
  local ws, wn = st.upd_s, st.upd_n
  if ilt(st.tat_s, st.tat_n, ws, wn) then ws, wn = st.tat_s, st.tat_n end
  local converted = ceil_div(mul(idiff(st.tat_s, st.tat_n, ws, wn), p.T), st.T)
  local ts, tn = iplus(ws, wn, converted)
  if not fits(ts, tn) then ts, tn = U64_S, U64_N - 1 end
  if ilt(ts, tn, now.s, now.n) then return now.s, now.n end
  return ts, tn
end

local function gcra_decide(key, p, st, now, n, max_wait, force)
  local tat_s, tat_n = gcra_effective_tat(p, st, now)
  local function report(verdict, as, an, extra)
    local d = extra or {}
    local ahead = isince(as, an, now.s, now.n)
    d.verdict, d.limit, d.reset = verdict, p.burst, ahead
    d.remaining = div(ssub(p.tol, ahead), p.T)
    return d
  end
  local admitted = max_wait ~= nil and 'reserved' or 'allowed'
  if n == 0 then return report(admitted, tat_s, tat_n, {delay = 0}) end
  if not force and cmp(n, p.burst) > 0 then return report('never', tat_s, tat_n) end
  local cost = mul(n, p.T)
  local ahead = add(idiff(tat_s, tat_n, now.s, now.n), cost)
  local function store(verdict, delay)
    local new_s, new_n = iplus(tat_s, tat_n, cost)
    if not fits(new_s, new_n) then fail(OVERFLOW) end
    -- A reservation is written as if it arrived when allowed: at now + delay.
    local arr_s, arr_n = now.s, now.n
    if verdict == 'reserved' then
      arr_s, arr_n = iplus(now.s, now.n, delay)
      if ilt(new_s, new_n, arr_s, arr_n) then arr_s, arr_n = new_s, new_n end
    end
    local d = report(verdict, new_s, new_n, {delay = delay})
    d.write = function()
      local value = MAGIC .. 'G' .. pack_instant(new_s, new_n) .. pack64(p.T) .. pack7(p.burst)
        .. pack_instant(arr_s, arr_n)
      write('SET', key, value, 'PXAT', ims(new_s, new_n))
    end
    return d
  end
  if force then return store('allowed', 0) end
  if cmp(ahead, p.tol) <= 0 then return store(admitted, 0) end
  local wait = wmin(sub(ahead, p.tol), U64MAX)
  if max_wait ~= nil and cmp(wait, max_wait) <= 0 then return store('reserved', wait) end
  return report('denied', tat_s, tat_n, {retry = wait})
end

------------------------------------------------------------------------------------- windows

-- FIXED and SLIDING evaluate at max(now, the state's last write): a state dated later than now
-- (the clock stepped back) is never re-dated; durations in replies still run from now.
local function eval_time(st, now)
  if st ~= nil and ilt(now.s, now.n, st.upd_s, st.upd_n) then return st.upd_s, st.upd_n end
  return now.s, now.n
end

-- The start of the window of length w holding instant (s, n), and the offset into it.
local function window_start(s, n, w)
  local off = imod(s, n, w)
  local ss, sn = iminus(s, n, off)
  return ss, sn, off
end

local function fixed_decide(key, p, st, now, q, force)
  local es, en = eval_time(st, now)
  local ss, sn = window_start(es, en, p.W)
  local fs, fn = iplus(ss, sn, p.W)
  if not fits(fs, fn) then fail(OVERFLOW) end
  local to_end = idiff(fs, fn, now.s, now.n)
  local count = 0
  if st ~= nil and not ilt(st.upd_s, st.upd_n, ss, sn) then count = st.count end
  local function report(verdict, c, extra)
    local d = extra or {}
    d.verdict, d.limit, d.remaining = verdict, p.limit, ssub(p.limit, c)
    d.reset = c ~= 0 and to_end or 0
    return d
  end
  if q == 0 then return report('allowed', count) end
  if not force and cmp(q, p.limit) > 0 then return report('never', count) end
  if not force and cmp(count, sub(p.limit, q)) > 0 then
    return report('denied', count, {retry = to_end})
  end
  local after = add(count, q)
  if cmp(after, U64) >= 0 then fail(OVERFLOW) end
  local d = report('allowed', after)
  d.write = function()
    local value = MAGIC .. 'F' .. pack64(p.W) .. pack7(p.limit) .. pack64(after) .. pack_instant(es, en)
    write('SET', key, value, 'PXAT', ims(fs, fn))
  end
  return d
end

-- The stored counts re-expressed in the windows of length w starting at (ss, sn): a count
-- whose requests may lie in the current window counts there, one that reaches only into the
-- previous window counts there, older ones are gone.
local function sliding_counts(st, ss, sn, w)
  local prev, curr = 0, 0
  if st == nil then return prev, curr end
  local ps, pn = iminus(ss, sn, w)
  local at_zero = ss == 0 and sn == 0
  local function place(ls, ln, n)
    if n == 0 then return end
    if not ilt(ls, ln, ss, sn) then
      curr = wmin(add(curr, n), U64MAX)
    elseif not ilt(ls, ln, ps, pn) and not at_zero then
      prev = wmin(add(prev, n), U64MAX)
    end
  end
  -- The stored current window is the one holding the last write.
  local cs, cn = window_start(st.upd_s, st.upd_n, st.W)
  place(st.upd_s, st.upd_n, st.curr)
  if cs ~= 0 or cn ~= 0 then
    local bs, bn = iminus(cs, cn, 1)
    place(bs, bn, st.prev)
  end
  return prev, curr
end

-- The earliest offset into a window (>= from) at which prev * (w - e) <= room * w, or nil.
local function earliest_offset(prev, room, from, w)
  if prev == 0 then return from end
  local k = div(mul(room, w), prev)
  if cmp(k, w) >= 0 then return from end
  local e = sub(w, k)
  if cmp(e, w) < 0 then return wmax(e, from) end
  return nil
end

local function sliding_decide(key, p, st, now, q, force)
  local w = p.W
  local es, en = eval_time(st, now)
  local ss, sn, elapsed = window_start(es, en, w)
  local fs, fn = iplus(ss, sn, w)
  if not fits(fs, fn) then fail(OVERFLOW) end
  local xs, xn = iplus(fs, fn, w)
  if not fits(xs, xn) then fail(OVERFLOW) end
  local prev, curr = sliding_counts(st, ss, sn, w)
  -- The previous window's weight in requests, rounded up: prev * (w - elapsed) / w. With it
  -- the exact comparison prev * (w - elapsed) + (curr + q) * w <= limit * w reads
  -- curr + q + weight <= limit, and floor(limit - estimate) is limit - curr - weight.
  local left = sub(w, elapsed)
  local weight = prev ~= 0 and ceil_div(mul(prev, left), w) or 0
  local function report(verdict, cv, extra)
    local d = extra or {}
    d.verdict, d.limit = verdict, p.limit
    d.remaining = ssub(p.limit, add(cv, weight))
    if cv ~= 0 then
      d.reset = idiff(xs, xn, now.s, now.n)
    elseif prev ~= 0 then
      d.reset = idiff(fs, fn, now.s, now.n)
    else
      d.reset = 0
    end
    return d
  end
  if q == 0 then return report('allowed', curr) end
  if not force and cmp(q, p.limit) > 0 then return report('never', curr) end
  if force or cmp(add(add(curr, q), weight), p.limit) <= 0 then
    local after = add(curr, q)
    if cmp(after, U64) >= 0 then fail(OVERFLOW) end
    local d = report('allowed', after)
    d.write = function()
      local value = MAGIC .. 'S' .. pack64(w) .. pack7(p.limit) .. pack64(prev) .. pack64(after)
        .. pack_instant(es, en)
      write('SET', key, value, 'PXAT', expire_at(now, d.reset))
    end
    return d
  end
  local as, an
  local in_this
  if cmp(p.limit, add(curr, q)) >= 0 then
    in_this = earliest_offset(prev, sub(p.limit, add(curr, q)), elapsed, w)
  end
  if in_this ~= nil then
    as, an = iplus(ss, sn, in_this)
  else
    local off = earliest_offset(curr, sub(p.limit, q), 0, w)
    if off ~= nil then as, an = iplus(fs, fn, off) else as, an = xs, xn end
  end
  return report('denied', curr, {retry = wmax(isince(as, an, now.s, now.n), 1)})
end

------------------------------------------------------------------------------------- LOG

local function log_entry(st, i) -- i: 0-based index among the stored entries
  local c = st.cache[i]
  if c then return c[1], c[2] end
  local off = st.head + ENTRY * i
  local s = redis.call('GETRANGE', st.key, off, off + ENTRY - 1)
  local lo, hi, cum = unpack('<I3I4I3', s)
  local us = hi * B + lo
  st.cache[i] = {us, cum}
  return us, cum
end

-- First index in [lo, hi) for which pred(i) holds (pred is monotone), else hi.
local function search(lo, hi, pred)
  while lo < hi do
    local mid = floor((lo + hi) / 2)
    if pred(mid) then hi = mid else lo = mid + 1 end
  end
  return lo
end

-- What the log holds at now under window w: the first entry inside the window (k), the running
-- count before it, the requests inside the window, the newest instant inside it (or nil).
local function log_scan(st, now_us, w)
  if st == nil or st.E == 0 then return 0, st and st.base or 0, 0, nil end
  local w_us = ceil_div(w, NS_PER_US)
  local cutoff_us = -1 -- entries at or before this instant have left the window
  if cmp(w_us, now_us) <= 0 then cutoff_us = now_us - w_us end
  local last_us, last_cum = log_entry(st, st.E - 1)
  if last_us <= cutoff_us then return st.E, last_cum, 0, nil end
  local k = 0
  if log_entry(st, 0) <= cutoff_us then
    k = search(1, st.E - 1, function(i) return log_entry(st, i) > cutoff_us end)
  end
  local before = st.base
  if k > 0 then
    local _, c = log_entry(st, k - 1)
    before = c
  end
  return k, before, (last_cum - before) % CUM, last_us
end

local function log_header(w, limit, head, tail, base)
  return MAGIC .. 'L' .. pack64(w) .. pack64(limit) .. pack('<I4I4I3', head, tail, base)
end

local function log_entry_bytes(us, cum)
  local hi = floor(us / B)
  return pack('<I3I4I3', us - hi * B, hi, cum)
end

local function log_decide(key, p, st, now, q)
  local now_us = now.us
  local w = p.W
  local k, before, in_window, newest = log_scan(st, now_us, w)
  local function report(verdict, count, newest_us, extra)
    local d = extra or {}
    d.verdict, d.limit, d.remaining = verdict, p.limit, ssub(p.limit, count)
    d.reset = newest_us and us_plus_ns_minus_now(newest_us, w, now_us) or 0
    return d
  end
  if q == 0 then return report('allowed', in_window, newest) end
  if cmp(q, p.limit) > 0 then return report('never', in_window, newest) end
  local after = add(in_window, q)
  if cmp(after, p.limit) <= 0 then
    local newest_after = newest and max(newest, now_us) or now_us
    local d = report('allowed', after, newest_after)
    d.write = function()
      local expire = expire_at(now, d.reset)
      if st == nil or k == st.E then
        local value = log_header(w, p.limit, LOG_H, LOG_H + ENTRY, 0) .. log_entry_bytes(now_us, q)
        write('SET', key, value, 'PXAT', expire)
        return
      end
      local last_us, last_cum = log_entry(st, st.E - 1)
      local cum = (last_cum + q) % CUM
      local merge = now_us <= last_us -- the same instant, or a clock that stepped back
      local head = st.head + ENTRY * k
      local tail = merge and st.tail or st.tail + ENTRY
      local waste = (head - LOG_H) + max(0, redis.call('STRLEN', key) - tail)
      if waste > tail - head then
        -- Compact: rewrite the live entries at the front (O(live), paid for by the waste).
        local live = redis.call('GETRANGE', key, head, st.tail - 1)
        if merge then
          live = sub_s(live, 1, #live - 3) .. pack('<I3', cum)
        else
          live = live .. log_entry_bytes(now_us, cum)
        end
        write('SET', key, log_header(w, p.limit, LOG_H, LOG_H + #live, before) .. live, 'PXAT', expire)
        return
      end
      if merge then
        write('SETRANGE', key, st.tail - 3, pack('<I3', cum))
      else
        write('SETRANGE', key, st.tail, log_entry_bytes(now_us, cum))
      end
      write('SETRANGE', key, 0, log_header(w, p.limit, head, tail, before))
      write('PEXPIREAT', key, expire)
    end
    return d
  end
  -- Denied: until `need` of the oldest requests in the window have left it.
  local need = after - p.limit
  local j = search(k, st.E - 1, function(i)
    local _, c = log_entry(st, i)
    return (c - before) % CUM >= need
  end)
  local at_us = log_entry(st, j)
  return report('denied', in_window, newest, {retry = wmax(us_plus_ns_minus_now(at_us, w, now_us), 1)})
end

------------------------------------------------------------------------------------- LEASE

-- A lease entry: token length (1 byte), token, slots (u32), expiry as microseconds (7 bytes)
-- and the nanoseconds past them (u16). Counts and instants stay plain Lua numbers here (slots
-- are at most rl.lease-max-limit), so a key of 10,000 leases is read in one pass of cheap steps.
local function lease_entry(token, n, us, rem)
  local hi = floor(us / B)
  return char(#token) .. token .. pack('<I4I3I4I2', n, us - hi * B, hi, rem)
end

-- One pass over the stored leases at now_us: the slots held by live leases, the live lease of
-- `token` (its slots), the byte ranges of the other live leases (kept as they are on a write),
-- the latest expiry among those others and among all live leases, and the first to expire
-- among the others (with its slots).
local function lease_scan(st, now_us, token)
  local whole = st.whole
  local len, pos = #whole, 13
  local held, own_n = 0, nil
  local runs, run_from = {}, nil
  local last_us, last_rem = -1, 0
  local all_us, all_rem = -1, 0
  local first_us, first_rem, first_n = -1, 0, 0
  local tlen = token and #token or -1
  while pos <= len do
    local tl = byte(whole, pos)
    local nxt = pos + tl + 14
    if tl < 1 or tl > 64 or nxt - 1 > len then fail(WRONGTYPE) end
    local n, lo, hi, rem = unpack('<I4I3I4I2', whole, pos + tl + 1)
    local us = hi * B + lo
    local live = us > now_us or (us == now_us and rem > 0)
    local own = live and tl == tlen and sub_s(whole, pos + 1, pos + tl) == token
    if live then
      held = held + n
      if us > all_us or (us == all_us and rem > all_rem) then all_us, all_rem = us, rem end
    end
    if own then own_n = n end
    if live and not own then
      run_from = run_from or pos
      if us > last_us or (us == last_us and rem > last_rem) then last_us, last_rem = us, rem end
      if first_us < 0 or us < first_us or (us == first_us and rem < first_rem) then
        first_us, first_rem, first_n = us, rem, n
      end
    elseif run_from then
      runs[#runs + 1] = sub_s(whole, run_from, pos - 1)
      run_from = nil
    end
    pos = nxt
  end
  if run_from then runs[#runs + 1] = sub_s(whole, run_from, len) end
  return {held = held, own_n = own_n, runs = runs, last_us = last_us, last_rem = last_rem,
    all_us = all_us, all_rem = all_rem, first_us = first_us, first_rem = first_rem,
    first_n = first_n}
end

-- Nanoseconds from now_us until the later of two expiries (us, rem); 0 when none.
local function lease_reset(now_us, us, rem, us2, rem2)
  if us2 and (us2 > us or (us2 == us and rem2 > rem)) then us, rem = us2, rem2 end
  if us < 0 then return 0 end
  return add(mul(us - now_us, NS_PER_US), rem)
end

-- Denied: the time until enough of the other live leases expire (none released early).
local function lease_wait(st, now_us, token, need)
  local whole = st.whole
  local len, pos = #whole, 13
  local order = {}
  while pos <= len do
    local tl = byte(whole, pos)
    local n, lo, hi, rem = unpack('<I4I3I4I2', whole, pos + tl + 1)
    local us = hi * B + lo
    if (us > now_us or (us == now_us and rem > 0)) and sub_s(whole, pos + 1, pos + tl) ~= token then
      local uhi = floor(us / B)
      -- Big-endian keys sort by expiry as plain strings (in C).
      order[#order + 1] = pack('>I4I3I2I4', uhi, us - uhi * B, rem, n)
    end
    pos = pos + tl + 14
  end
  table.sort(order)
  local freed = 0
  for i = 1, #order do
    local uhi, ulo, rem, n = unpack('>I4I3I2I4', order[i])
    freed = freed + n
    if freed >= need then return add(mul(uhi * B + ulo - now_us, NS_PER_US), rem) end
  end
  return 1
end

local function lease_decide(key, p, st, now, n)
  local now_us = now.us
  local scan = st and lease_scan(st, now_us, p.token)
    or {held = 0, runs = {}, last_us = -1, last_rem = 0, all_us = -1, all_rem = 0}
  local held, own_n = scan.held, scan.own_n
  -- docs/reference.md#r-lease-9: RENEW renews a live lease only; without one nothing is written.
  if p.renew and own_n == nil then
    fail('LEASELOST lease \'' .. shown(p.token) .. '\' on key \'' .. shown(key) .. '\' is not held')
  end
  local function report(verdict, held_after, reset, extra)
    local d = extra or {}
    d.verdict, d.limit, d.remaining = verdict, p.limit, ssub(p.limit, held_after)
    d.reset = reset
    return d
  end
  local now_reset = lease_reset(now_us, scan.all_us, scan.all_rem)
  if n == 0 then return report('allowed', held, now_reset) end
  if cmp(n, p.limit) > 0 then return report('never', held, now_reset) end
  local others = held - (own_n or 0)
  if others + n <= p.limit then
    local q, rem = divmod(p.lease, NS_PER_US)
    local exp_us = now_us + q
    local d = report('allowed', others + n, lease_reset(now_us, scan.last_us, scan.last_rem, exp_us, rem))
    d.write = function()
      local value = MAGIC .. 'E' .. pack64(p.limit) .. concat(scan.runs) .. lease_entry(p.token, n, exp_us, rem)
      write('SET', key, value, 'PXAT', expire_at(now, d.reset))
    end
    return d
  end
  local need = others + n - p.limit
  local wait
  if scan.first_n >= need then
    -- The lease that expires first frees enough (the usual case): no sort.
    wait = lease_reset(now_us, scan.first_us, scan.first_rem)
  else
    wait = lease_wait(st, now_us, p.token, need)
  end
  return report('denied', held, now_reset, {retry = wmax(wait, 1)})
end

---------------------------------------------------------------------------------------------
-- One limit on one key (RL.GCRA, RL.WINDOW, RL.LEASE and each key of RL.ALL).
---------------------------------------------------------------------------------------------

local function evaluate(key, spec, now, q, force, max_wait)
  local st = load(key)
  if st ~= nil and st.algo ~= spec.algo then wrong_algorithm(key, st.algo, spec.algo) end
  if spec.algo == 'G' then return gcra_decide(key, spec, st, now, q, max_wait, force) end
  if spec.algo == 'F' then return fixed_decide(key, spec, st, now, q, force) end
  if spec.algo == 'S' then return sliding_decide(key, spec, st, now, q, force) end
  if spec.algo == 'L' then return log_decide(key, spec, st, now, q) end
  return lease_decide(key, spec, st, now, q)
end

local function single_key(keys, name)
  if #keys ~= 1 then
    fail('ERR ' .. name .. ' takes exactly one key: FCALL ' .. name .. ' 1 key …')
  end
end

-- The module's argument vector: the key, then the arguments.
local function argv(keys, args)
  local a = {keys[1]}
  for i = 1, #args do a[#a + 1] = args[i] end
  return a
end

local function run_one(key, spec, req)
  local now = clock()
  local d = evaluate(key, spec, now, req.quantity, req.force, req.max_wait)
  if d.write and not req.peek and req.quantity ~= 0 then
    check_memory(now.us)
    d.write()
  end
  return five(d)
end

-- Parsed parameters, by their argument text (only valid ones are kept; parsing is pure, so a
-- hit answers exactly as parsing again would). Bounded: cleared at 512 entries.
local memo, memo_size = {}, 0
local function remember(k, v)
  if memo_size >= 512 then memo, memo_size = {}, 0 end
  memo[k] = v
  memo_size = memo_size + 1
  return v
end

local function rl_gcra(keys, args)
  arity('RL.GCRA', 1 + #keys + #args, -5)
  single_key(keys, 'rl_gcra')
  local a = argv(keys, args)
  local mk = 'G' .. a[2] .. '\0' .. a[3] .. '\0' .. a[4]
  local spec = memo[mk]
  if not spec then
    local burst = positive(a[2], 'burst')
    local rate = positive(a[3], 'rate')
    local period = seconds(a[4], 'period')
    spec = remember(mk, gcra_params(burst, rate, period))
  end
  local burst = spec.burst
  local req = {quantity = 1}
  local o = Options(a, 5)
  local seen_max_wait = false
  for kw in o.next do
    if not take_request_option(req, kw, o, true) then
      if string.upper(kw) == 'MAXWAIT' then
        if seen_max_wait then duplicate('MAXWAIT') end
        seen_max_wait = true
        local ms = non_negative(o.value('MAXWAIT'), 'MAXWAIT')
        req.max_wait = wmin(mul(ms, NS_PER_MS), U64MAX)
      else
        unknown(kw)
      end
    end
  end
  if req.force and req.peek then fail('ERR FORCE cannot be used with PEEK: FORCE records usage, PEEK records nothing') end
  if req.force and seen_max_wait then
    fail('ERR FORCE cannot be used with MAXWAIT: FORCE records usage that already happened, '
      .. 'MAXWAIT reserves a later start')
  end
  reply_range(burst, 'burst')
  return run_one(keys[1], spec, req)
end

local function window_spec(limit, w, algo)
  return {algo = algo, limit = limit, W = w}
end

local function rl_window(keys, args)
  arity('RL.WINDOW', 1 + #keys + #args, -4)
  single_key(keys, 'rl_window')
  local a = argv(keys, args)
  local mk = 'W' .. a[2] .. '\0' .. a[3]
  local parsed = memo[mk]
  if not parsed then
    local limit, digits = positive(a[2], 'limit')
    parsed = remember(mk, {limit, digits, seconds(a[3], 'window')})
  end
  local limit, digits, w = parsed[1], parsed[2], parsed[3]
  local req = {quantity = 1}
  local algo
  local o = Options(a, 4)
  for kw in o.next do
    local alg = ALGORITHMS[string.upper(kw)]
    if alg then
      if algo then duplicate('the algorithm (FIXED | SLIDING | LOG)') end
      algo = alg
    elseif not take_request_option(req, kw, o, true) then
      unknown(kw)
    end
  end
  algo = algo or 'S'
  check_log_limit(algo, limit, digits)
  if req.force and req.peek then fail('ERR FORCE cannot be used with PEEK: FORCE records usage, PEEK records nothing') end
  if req.force and algo == 'L' then
    fail('ERR FORCE cannot be used with LOG: a LOG records each admitted request and never holds '
      .. 'more than its limit; use FIXED or SLIDING to record usage after the fact')
  end
  reply_range(limit, 'limit')
  return run_one(keys[1], window_spec(limit, w, algo), req)
end

local function rl_lease(keys, args)
  arity('RL.LEASE', 1 + #keys + #args, -5)
  single_key(keys, 'rl_lease')
  local a = argv(keys, args)
  local limit, digits = positive(a[2], 'limit')
  local lease = seconds(a[3], 'lease')
  local token = token_arg(a[4])
  check_lease_limit(limit, digits)
  local req = {quantity = 1}
  local renew = false
  local o = Options(a, 5)
  for kw in o.next do
    if not take_request_option(req, kw, o, true) then
      if string.upper(kw) == 'RENEW' then
        if renew then duplicate('RENEW') end
        renew = true
      else
        unknown(kw)
      end
    end
  end
  if req.force then
    fail('ERR FORCE cannot be used on a LEASE limit: its slots are taken with RL.LEASE and given '
      .. 'back with RL.RELEASE')
  end
  if renew and req.quantity == 0 then fail(RENEW_WITH_QUANTITY_ZERO) end
  return run_one(keys[1], {algo = 'E', limit = limit, lease = lease, token = token, renew = renew},
    req)
end

---------------------------------------------------------------------------------------------
-- RL.ALL
---------------------------------------------------------------------------------------------

local function rl_all(keys, args)
  arity('RL.ALL', 2 + #keys + #args, -5)
  local n = #keys
  if n == 0 then not_positive('numkeys') end
  -- docs/reference.md#r-all-9: numkeys is capped before any key or spec is looked at.
  if n > ALL_MAX_KEYS then
    fail('ERR numkeys ' .. n .. ' is above rl.all-max-keys (' .. ALL_MAX_KEYS .. '): give fewer '
      .. 'keys per call, or raise rl.all-max-keys')
  end
  -- numkeys that swallowed spec words as keys: the words after the keys cannot hold one spec
  -- per key (each has at least 3 words) and a spec keyword stands among the keys.
  if #args < 3 * n then
    for i, k in ipairs(keys) do
      local u = string.upper(k)
      if u == 'GCRA' or u == 'WINDOW' or u == 'LEASE' then
        fail('ERR syntax error: numkeys is ' .. n .. ', but the specs do not match it: the first '
          .. 'spec starts after ' .. (i - 1) .. ' key(s) (give numkeys keys, then one spec per key)')
      end
    end
  end
  local seen = {}
  for _, k in ipairs(keys) do
    if seen[k] then fail('ERR syntax error: key \'' .. shown(k) .. '\' given more than once') end
    seen[k] = true
  end
  local o = Options(args, 1)
  local function spec_value(what)
    local v = o.next()
    if v == nil then fail('ERR syntax error: spec is missing its ' .. what) end
    return v
  end
  local specs = {}
  for i = 1, n do
    local kind = o.next()
    if kind == nil then
      fail('ERR syntax error: expected ' .. n .. ' specs (GCRA … or WINDOW … or LEASE …), got '
        .. (i - 1))
    end
    local k = string.upper(kind)
    if k == 'RENEW' then fail(RENEW_IN_ALL) end
    local spec
    if k == 'GCRA' then
      local burst = positive(spec_value('GCRA burst'), 'burst')
      local rate = positive(spec_value('GCRA rate'), 'rate')
      local period = seconds(spec_value('GCRA period'), 'period')
      spec = gcra_params(burst, rate, period)
    elseif k == 'WINDOW' then
      local limit, digits = positive(spec_value('WINDOW limit'), 'limit')
      local w = seconds(spec_value('WINDOW window'), 'window')
      local algo = 'S'
      local nxt = o.peek()
      if nxt ~= nil and ALGORITHMS[string.upper(nxt)] then
        algo = ALGORITHMS[string.upper(nxt)]
        o.next()
      end
      check_log_limit(algo, limit, digits)
      spec = window_spec(limit, w, algo)
    elseif k == 'LEASE' then
      local limit, digits = positive(spec_value('LEASE limit'), 'limit')
      local lease = seconds(spec_value('LEASE lease'), 'lease')
      local token = token_arg(spec_value('LEASE token'))
      check_lease_limit(limit, digits)
      spec = {algo = 'E', limit = limit, lease = lease, token = token}
    else
      fail('ERR syntax error: expected GCRA or WINDOW or LEASE for key ' .. i .. ' of ' .. n
        .. ', got \'' .. shown(kind) .. '\'')
    end
    local nxt = o.peek()
    if nxt ~= nil and string.upper(nxt) == 'COST' then
      o.next()
      spec.cost = non_negative(o.value('COST'), 'COST')
    end
    specs[i] = spec
  end
  local req = {quantity = 1}
  for kw in o.next do
    if not take_request_option(req, kw, o, true) then
      if string.upper(kw) == 'RENEW' then fail(RENEW_IN_ALL) end
      unknown(kw)
    end
  end
  if req.force then
    if req.peek then fail('ERR FORCE cannot be used with PEEK: FORCE records usage, PEEK records nothing') end
    for _, s in ipairs(specs) do
      if s.algo == 'L' then
        fail('ERR FORCE cannot be used with LOG: a LOG records each admitted request and never holds '
      .. 'more than its limit; use FIXED or SLIDING to record usage after the fact')
      elseif s.algo == 'E' then
        fail('ERR FORCE cannot be used on a LEASE limit: its slots are taken with RL.LEASE and given '
      .. 'back with RL.RELEASE')
      end
    end
  end
  for _, s in ipairs(specs) do
    if s.algo == 'G' then reply_range(s.burst, 'burst') else reply_range(s.limit, 'limit') end
  end

  local now = clock()
  local decisions, charges = {}, {}
  local any_charged = false
  for i = 1, n do
    local charge = specs[i].cost
    if charge == nil then charge = req.quantity end
    charges[i] = charge
    if charge ~= 0 then any_charged = true end
    decisions[i] = evaluate(keys[i], specs[i], now, charge, req.force)
  end
  -- The combined reply: limits charged 0 only report, unless every limit is charged 0.
  local binding, bkey
  local all_allowed, never = true, false
  local retry, reset = nil, 0
  for i = 1, n do
    local d, c = decisions[i], charges[i]
    if c ~= 0 or not any_charged then
      local key_i = c ~= 0 and div(d.remaining, c) or d.remaining
      if binding == nil or cmp(key_i, bkey) < 0
        or (cmp(key_i, bkey) == 0 and cmp(d.remaining, binding.remaining) < 0) then
        binding, bkey = d, key_i
      end
      if not allowed(d.verdict) then
        all_allowed = false
        if d.verdict == 'never' then
          never = true
        else
          retry = retry and wmax(retry, d.retry) or d.retry
        end
      end
      reset = wmax(reset, d.reset)
    end
  end
  local combined = {verdict = 'allowed', limit = binding.limit, remaining = binding.remaining,
    reset = reset}
  if not all_allowed then
    combined.verdict = never and 'never' or 'denied'
    combined.retry = retry or 1
  end
  if all_allowed and not req.peek then
    local pending = false
    for i = 1, n do
      if decisions[i].write then pending = true end
    end
    if pending then
      check_memory(now.us)
      for i = 1, n do
        if decisions[i].write then decisions[i].write() end
      end
    end
  end
  local per_key = {}
  for i = 1, n do per_key[i] = five(decisions[i]) end
  return {five(combined), per_key}
end

---------------------------------------------------------------------------------------------
-- RL.REFUND and RL.RELEASE
---------------------------------------------------------------------------------------------

local function status(key, st, now)
  -- The state's own report under the parameters it stores.
  if st.algo == 'G' then
    local p = {algo = 'G', burst = st.burst, T = st.T, tol = mul(st.burst, st.T)}
    return gcra_decide(key, p, st, now, 0, nil, false)
  elseif st.algo == 'F' then
    return fixed_decide(key, window_spec(st.limit, st.W, 'F'), st, now, 0, false)
  elseif st.algo == 'S' then
    return sliding_decide(key, window_spec(st.limit, st.W, 'S'), st, now, 0, false)
  end
  return log_decide(key, window_spec(st.limit, st.W, 'L'), st, now, 0)
end

local function three(refunded, remaining, reset_ns)
  local out = {refunded, remaining, ceil_ms(reset_ns)}
  for i = 1, 3 do
    if type(out[i]) == 'table' then fail('ERR a reply value is above 2^53 - 1, the largest integer '
      .. 'the Lua fallback can reply') end
  end
  return out
end

local function rl_refund(keys, args)
  arity('RL.REFUND', 1 + #keys + #args, 3)
  single_key(keys, 'rl_refund')
  local a = argv(keys, args)
  local key = a[1]
  local q = positive(a[2], 'quantity')
  local now = clock()
  local st = load(key)
  if st == nil then return {0, 0, 0} end
  if st.algo == 'E' then
    fail('ERR key \'' .. shown(key) .. '\' holds a LEASE limit: give its slots back with '
      .. 'RL.RELEASE key token')
  end
  if st.algo == 'L' then
    local k, before, in_window = log_scan(st, now.us, st.W)
    if in_window == 0 then
      local d = status(key, st, now)
      return three(0, d.remaining, d.reset)
    end
    local refunded = wmin(q, in_window)
    local keep = in_window - refunded
    if keep == 0 then
      write('DEL', key)
      return three(refunded, st.limit, 0)
    end
    local j = search(k, st.E - 1, function(i)
      local _, c = log_entry(st, i)
      return (c - before) % CUM >= keep
    end)
    local at_us = log_entry(st, j)
    local head, tail = st.head + ENTRY * k, st.head + ENTRY * (j + 1)
    local reset = us_plus_ns_minus_now(at_us, st.W, now.us)
    write('SETRANGE', key, tail - 3, pack('<I3', (before + keep) % CUM))
    write('SETRANGE', key, 0, log_header(st.W, st.limit, head, tail, before))
    write('PEXPIREAT', key, expire_at(now, reset))
    return three(refunded, ssub(st.limit, keep), reset)
  end
  local refunded, after, value -- after: the new state (nil: back to idle)
  if st.algo == 'G' then
    -- The TAT moves back by quantity * T, not before now.
    local t = st.T
    local in_use = isince(st.tat_s, st.tat_n, now.s, now.n)
    refunded = wmin(q, ceil_div(in_use, t))
    local back = mul(q, t)
    if cmp(back, in_use) < 0 then
      local ts, tn = iminus(st.tat_s, st.tat_n, back)
      local us_, un = st.upd_s, st.upd_n
      if ilt(ts, tn, us_, un) then us_, un = ts, tn end
      after = {algo = 'G', tat_s = ts, tat_n = tn, T = t, burst = st.burst, upd_s = us_, upd_n = un}
      value = MAGIC .. 'G' .. pack_instant(ts, tn) .. pack64(t) .. pack7(st.burst) .. pack_instant(us_, un)
    end
  elseif st.algo == 'F' then
    -- The current window's count goes down, not below zero.
    local es, en = eval_time(st, now)
    local ss, sn = window_start(es, en, st.W)
    local count = ilt(st.upd_s, st.upd_n, ss, sn) and 0 or st.count
    refunded = wmin(q, count)
    local left = sub(count, refunded)
    if left ~= 0 then
      after = {algo = 'F', W = st.W, limit = st.limit, count = left, upd_s = st.upd_s, upd_n = st.upd_n}
      value = MAGIC .. 'F' .. pack64(st.W) .. pack7(st.limit) .. pack64(left)
        .. pack_instant(st.upd_s, st.upd_n)
    end
  else
    local w = st.W
    local es, en = eval_time(st, now)
    local ss, sn = window_start(es, en, w)
    local prev, curr = sliding_counts(st, ss, sn, w)
    refunded = wmin(q, curr)
    curr = sub(curr, refunded)
    if not (curr == 0 and prev == 0) then
      -- The last write moves into the current window (where the count now lives).
      local us_, un = ss, sn
      if curr ~= 0 and ilt(ss, sn, st.upd_s, st.upd_n) then us_, un = st.upd_s, st.upd_n end
      after = {algo = 'S', W = w, limit = st.limit, prev = prev, curr = curr, upd_s = us_, upd_n = un}
      value = MAGIC .. 'S' .. pack64(w) .. pack7(st.limit) .. pack64(prev) .. pack64(curr)
        .. pack_instant(us_, un)
    end
  end
  if refunded == 0 then
    local d = status(key, st, now)
    return three(0, d.remaining, d.reset)
  end
  if after == nil then
    write('DEL', key)
    return three(refunded, st.algo == 'G' and st.burst or st.limit, 0)
  end
  local d = status(key, after, now)
  write('SET', key, value, 'PXAT', expire_at(now, d.reset))
  return three(refunded, d.remaining, d.reset)
end

local function rl_release(keys, args)
  arity('RL.RELEASE', 1 + #keys + #args, 3)
  single_key(keys, 'rl_release')
  local a = argv(keys, args)
  local key = a[1]
  local token = token_arg(a[2])
  local now = clock()
  local now_us = now.us
  local st = load(key)
  if st == nil then return {0, 0, 0} end
  if st.algo ~= 'E' then wrong_algorithm(key, st.algo, 'E') end
  local scan = lease_scan(st, now_us, token)
  local released = scan.own_n or 0
  local reset = lease_reset(now_us, scan.last_us, scan.last_rem)
  if released == 0 then
    return three(0, ssub(st.limit, scan.held), lease_reset(now_us, scan.all_us, scan.all_rem))
  end
  if #scan.runs == 0 then
    write('DEL', key)
    return three(released, st.limit, 0)
  end
  write('SET', key, MAGIC .. 'E' .. pack64(st.limit) .. concat(scan.runs), 'PXAT', expire_at(now, reset))
  return three(released, ssub(st.limit, scan.held - released), reset)
end

local function rl_version() return VERSION end

local function rl_config()
  return {'log-max-limit', LOG_MAX_LIMIT, 'lease-max-limit', LEASE_MAX_LIMIT, 'all-max-keys',
    ALL_MAX_KEYS, 'version', VERSION}
end

---------------------------------------------------------------------------------------------
-- Registration (FUNCTION LOAD) or dispatch (EVAL / EVALSHA).
---------------------------------------------------------------------------------------------

-- Turns raised errors into error replies: ours as written, the server's (a failed write) as
-- the server sent them, anything else (a bug) as an ERR naming the fallback.
local function guarded(f)
  return function(keys, args)
    init()
    failure = nil
    local ok, res = pcall(f, keys, args)
    if ok then return res end
    if failure then return redis.error_reply(failure) end
    if type(res) == 'table' and res.err then return redis.error_reply(res.err) end
    if type(res) == 'string' and match(res, '^[A-Z][A-Z_]* ') then return redis.error_reply(res) end
    return redis.error_reply('ERR internal error in the redis_rl Lua fallback: ' .. tostring(res))
  end
end

local WRITES = {'allow-oom'}
local READS = {'no-writes', 'allow-oom', 'allow-stale'}
local FUNCTIONS = {
  {'rl_gcra', rl_gcra, WRITES},
  {'rl_window', rl_window, WRITES},
  {'rl_all', rl_all, WRITES},
  {'rl_refund', rl_refund, WRITES},
  {'rl_lease', rl_lease, WRITES},
  {'rl_release', rl_release, WRITES},
  {'rl_version', rl_version, READS},
  {'rl_config', rl_config, READS},
}

if redis.register_function then
  for i = 1, #FUNCTIONS do
    local f = FUNCTIONS[i]
    redis.register_function{function_name = f[1], callback = guarded(f[2]), flags = f[3]}
  end
else
  eval_mode = true
  init()
  local name = ARGV[1]
  local args = {}
  for i = 2, #ARGV do args[i - 1] = ARGV[i] end
  for _, f in ipairs(FUNCTIONS) do
    if f[1] == name then
      if f[3] == WRITES then
        -- A script cannot carry flags here: refuse on a replica, as FCALL does.
        local role = redis.call('INFO', 'replication')
        if find(role, 'role:slave', 1, true) then return redis.error_reply(READONLY) end
      end
      return guarded(f[2])(KEYS, args)
    end
  end
  return redis.error_reply('ERR unknown redis_rl function \'' .. shown(tostring(name)) .. '\'')
end
