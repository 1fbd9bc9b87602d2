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
    FCALL_RO rl_gcra_ro | rl_window_ro | rl_all_ro | rl_lease_ro ... -> the same, never writing:
                                      where the call would write, the OOM error (see Memory)
    FCALL_RO rl_version 0          -> the library's version ("1.3.0")
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
9007199254740991, and an error naming the argument says so. The usual calls (parameters seen
before, a state of the same parameters, every value below 2^52) take a fast path of plain Lua
numbers with the same replies; anything else takes the general code.

Memory. rl_gcra, rl_window, rl_lease and rl_all carry no allow-oom flag: when the server is out
of memory (after eviction) it refuses their FCALL whole with the module's OOM error, exactly as
it refuses SET, and nothing is written. Their twins rl_gcra_ro, rl_window_ro, rl_lease_ro and
rl_all_ro (no-writes, same arguments, run by FCALL_RO, under OOM too) answer exactly as the
writing function where the call writes nothing (a denial, PEEK, QUANTITY 0, an error) and the
module's OOM error where it would write: a client retries an OOM reply of FCALL rl_x once as
FCALL_RO rl_x_ro. rl_refund and rl_release only free, carry allow-oom and answer as usual.
Under EVAL/EVALSHA the server itself refuses a script's first write when out of memory, and the
first write of every call is one it refuses (SET, SETRANGE or ZADD).

Keys. Every key is a string starting with the 3 bytes FF 'r' 'l' and one byte naming the
algorithm ('G' GCRA, 'F' FIXED, 'S' SLIDING, 'L' LOG), or, for LEASE, a sorted set whose
lowest member is the header "\0rlE" (score: minus the limit of the last write); anything else
(another type, another string, another sorted set) answers WRONGTYPE and is never touched.
String fields are little-endian: durations and counts u64, burst and limit 7 bytes, instants
9 bytes (seconds: 5 bytes, nanoseconds: u32).
  G: tat, emission interval, burst, updated                           (37 bytes)
  F: window, limit, count, updated (the window holding it)            (36 bytes)
  S: window, limit, prev, curr, updated (the window holding it)       (44 bytes)
  L: window, limit, head u32, tail u32, base u24, then 10-byte entries from offset 31:
     instant (microseconds, 7 bytes) and the running request count (mod 2^24, 3 bytes)
  LEASE (sorted set): the header, then one member per slot held: a lease of token t with n
     slots is the members char(#t)..t and char(#t)..t..k (k = 1 .. n-1 as 3 big-endian
     bytes), all scored by the lease's expiry in microseconds (rounded up, which changes no
     reply: every reply rounds up to the millisecond from a microsecond clock). A renewal or a
     release rewrites only its own members; expired members are dropped at the next write.
  Library 1.1.0 kept a lease key as one string (FF 'r' 'l' 'E', the limit, then per lease:
     token length, token, slots u32, expiry microseconds (7 bytes) and nanoseconds u16): such a
     key is still read as it is, and its next write rewrites it as a sorted set.
]]

local VERSION = '1.3.0'
local LOG_MAX_LIMIT = 100000
local LEASE_MAX_LIMIT = 10000
local ALL_MAX_KEYS = 64

-- A library's code runs at FUNCTION LOAD with no globals but `redis` (Redis 7.0): the standard
-- libraries are bound on the first call instead (init).
local floor, fmod, max, pack, unpack, byte, char, sub_s, find, match, concat
local rcall, rpcall, tonum, fmt, upper, tunpack, tconcat

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

local FAST = 4503599627370496 -- 2^52: the fast paths' bound (see the fast-path helpers)
local init_fast -- the fast paths' tables, built on the first call
local us_text -- the decimal text of a microsecond instant (fast-path caches)
local us_to_pxat -- the PXAT text (ms, rounded up) of a microsecond instant

local initialised = false
local function init()
  if initialised then return end
  floor, fmod, max = math.floor, math.fmod, math.max
  pack, unpack = struct.pack, struct.unpack
  byte, char, sub_s, find, match = string.byte, string.char, string.sub, string.find, string.match
  concat = table.concat
  rcall, rpcall, tonum, fmt, upper = redis.call, redis.pcall, tonumber, string.format, string.upper
  tunpack = _G.unpack -- the base library's (the local `unpack` is struct.unpack)
  tconcat = table.concat
  init_fast()
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

-- The fixed error texts.
local E = {
  WRONGTYPE = 'WRONGTYPE Operation against a key holding the wrong kind of value',
  OVERFLOW = 'ERR arithmetic overflow: QUANTITY, period and rate would move the key\'s time past '
    .. '64-bit nanoseconds',
  OOM = 'OOM command not allowed when used memory > \'maxmemory\'.',
  RENEW_WITH_QUANTITY_ZERO = 'ERR RENEW cannot be used with QUANTITY 0: a renewal holds at '
    .. 'least one slot, QUANTITY 0 only reports',
  RENEW_IN_ALL = 'ERR RENEW cannot be used in RL.ALL: renew a lease on its own with RL.LEASE '
    .. 'key limit lease token RENEW',
  READONLY = 'READONLY You can\'t write against a read only replica.',
}

-- Client bytes as errors show them: lossy UTF-8 (invalid sequences become U+FFFD), at most 64
-- characters, a NUL byte as the two characters backslash and 0 (as the module sends it: an error
-- reply is a C string).
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
      out[#out + 1] = c == 0 and '\\0' or char(c)
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

-- What a fast path already read in this call, handed to the general code so that both decide
-- on one instant and one state: the clock (seconds, microseconds) and one key's GETRANGE 0 63
-- (RL.ALL: pre_raws, by key). Cleared as each call starts.
local pre_sec, pre_usec, pre_key, pre_raw, pre_raws
local pre_zkey, pre_zr -- a LEASE call's ZRANGE key 0 0 WITHSCORES
local last_ss, last_sec = nil, 0 -- TIME's seconds as text and as a number, last seen

-- Now, read once per call: {s, n} the instant (seconds, nanoseconds) and us in microseconds.
local function clock()
  local sec, usec = pre_sec, pre_usec
  if sec then
    pre_sec = nil
  else
    local t = rcall('TIME')
    sec, usec = tonum(t[1]), tonum(t[2])
  end
  local us = sec * 1000000 + usec
  if us > MAXI then
    fail('ERR the server clock is past 2^53 microseconds since the epoch (the year 2255), the Lua '
      .. 'fallback\'s range')
  end
  return {s = sec, n = usec * NS_PER_US, us = us}
end

-- docs/reference.md#r-oom-1, #r-fb-9: a request that would write answers OOM when maxmemory is
-- reached (after eviction) and changes nothing; denials, PEEK, QUANTITY 0, refunds and releases
-- answer as usual. The server checks, exactly and for free: rl_gcra, rl_window, rl_lease and
-- rl_all carry no allow-oom flag, so the server refuses their FCALL whole when out of memory
-- (as it refuses SET), and their no-writes twins (rl_gcra_ro, ...), run by FCALL_RO under
-- OOM, set `ro`: they answer as usual where the call writes nothing and the module's OOM
-- error where it would write. Under EVAL the server itself refuses a script's first write
-- when out of memory (write, wcall). rl_refund and rl_release keep allow-oom: they only free.
local ro = false -- this call is a twin's (FCALL_RO rl_x_ro): any write answers OOM

local function check_memory()
  if ro then fail(E.OOM) end
end

-- The server's error as the module words it: Redis 6.2 puts the script's position in front of
-- an error that redis.pcall returns ("@user_script: 757: -OOM command not allowed ...").
local function server_error(e)
  return match(e, '^@user_script: %d+: %-(.*)$') or e
end

-- Every write of the general code goes through here; under EVAL the server's own OOM refusal
-- of the first write comes back as an error reply instead of a script error.
local function write(...)
  if ro then fail(E.OOM) end
  if eval_mode then
    local r = rpcall(...)
    if type(r) == 'table' and r.err then fail(server_error(r.err)) end
    return r
  end
  return rcall(...)
end

-- A fast path's write: nil when the server refused it (under EVAL: out of memory), and the
-- general code then answers the call.
local function wcall(...)
  if ro then return nil end
  if eval_mode then
    local r = rpcall(...)
    if type(r) == 'table' and r.err then return nil end
    return r
  end
  return rcall(...)
end

local MAGIC = '\255rl'
local LOG_H = 31 -- LOG header bytes; entries start at this offset
local ENTRY = 10 -- LOG entry bytes
local CUM = 16777216 -- LOG running counts are kept modulo 2^24

-- A LEASE key is a sorted set whose lowest member is this header, scored by minus the limit of
-- its last write; every other member is one slot of a lease, scored by its expiry (us).
local LEASE_HEADER = '\0rlE'

local function lease_head(score)
  local limit = -(tonum(score) or 0)
  if limit < 1 or limit > MAXI or limit % 1 ~= 0 then fail(E.WRONGTYPE) end
  return {algo = 'E', zset = true, limit = limit}
end

-- Loads the limiter state of `key`: nil for a missing key, or a table with `algo`.
-- Another type, or a string that is not a valid state of ours, is WRONGTYPE; a sorted set with
-- the LEASE header is a LEASE state ({zset = true, limit}).
local function load(key)
  local head
  if pre_key == key then
    head, pre_key = pre_raw, nil
  elseif pre_raws and pre_raws[key] ~= nil then
    head = pre_raws[key]
  else
    head = rpcall('GETRANGE', key, '0', '63')
  end
  if type(head) == 'table' then
    local score = rpcall('ZSCORE', key, LEASE_HEADER)
    if type(score) == 'string' then return lease_head(score) end
    fail(E.WRONGTYPE)
  end
  if head == '' then
    if rcall('EXISTS', key) == 1 then fail(E.WRONGTYPE) end
    return nil
  end
  if #head < 4 or sub_s(head, 1, 3) ~= MAGIC then fail(E.WRONGTYPE) end
  local a = sub_s(head, 4, 4)
  local st
  if a == 'G' and #head == 37 then
    st = {algo = 'G', T = unpack64(head, 14), burst = unpack7(head, 22)}
    st.tat_s, st.tat_n = unpack_instant(head, 5)
    st.upd_s, st.upd_n = unpack_instant(head, 29)
    if st.T == 0 or st.burst == 0 or cmp(st.T, MAX_PERIOD_NS) > 0
      or cmp(mul(st.T, st.burst), U64) >= 0 then fail(E.WRONGTYPE) end
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
    if hd < LOG_H or tl < hd or st.E ~= floor(st.E) or rcall('STRLEN', key) < tl
      or cmp(st.limit, 10000000) > 0 then fail(E.WRONGTYPE) end
  elseif a == 'E' and #head >= 12 then
    -- The string layout of library 1.1.0, read as it is; the leases are read by lease_scan,
    -- which checks their layout. The next write rewrites the key as a sorted set.
    st = {algo = 'E', limit = unpack64(head, 5), whole = rcall('GET', key)}
  else
    fail(E.WRONGTYPE)
  end
  if st.W ~= nil and (st.W == 0 or cmp(st.W, MAX_PERIOD_NS) > 0) then fail(E.WRONGTYPE) end
  if st.limit == 0 then fail(E.WRONGTYPE) end
  if st.upd_s and (st.upd_n >= NS_PER_S or not fits(st.upd_s, st.upd_n)) then fail(E.WRONGTYPE) end
  if st.tat_s and (st.tat_n >= NS_PER_S or not fits(st.tat_s, st.tat_n)) then fail(E.WRONGTYPE) end
  return st
end

-- The state of a LEASE call's key: ZRANGE key 0 0 WITHSCORES first (`h` when a fast path
-- already read it). Another type goes through load (a string of this library: another
-- algorithm, or the lease layout of 1.1.0).
local function load_lease(key, h)
  h = h or rpcall('ZRANGE', key, '0', '0', 'WITHSCORES')
  if h.err then return load(key) end
  if h[1] == nil then return nil end
  if h[1] ~= LEASE_HEADER then fail(E.WRONGTYPE) end
  return lease_head(h[2])
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


local function five(d)
  local retry = -1
  if d.verdict == 'denied' then
    retry = wmax(ceil_ms(d.retry), 1)
  elseif d.verdict == 'reserved' then
    retry = ceil_ms(d.delay)
  end
  local ok = d.verdict == 'allowed' or d.verdict == 'reserved'
  local out = {ok and 1 or 0, d.limit, d.remaining, retry, ceil_ms(d.reset)}
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
local gcra_decide
do
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

function gcra_decide(key, p, st, now, n, max_wait, force)
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
    if not fits(new_s, new_n) then fail(E.OVERFLOW) end
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
  if not fits(fs, fn) then fail(E.OVERFLOW) end
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
  if cmp(after, U64) >= 0 then fail(E.OVERFLOW) end
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

local sliding_decide
do
-- The earliest offset into a window (>= from) at which prev * (w - e) <= room * w, or nil.
local function earliest_offset(prev, room, from, w)
  if prev == 0 then return from end
  local k = div(mul(room, w), prev)
  if cmp(k, w) >= 0 then return from end
  local e = sub(w, k)
  if cmp(e, w) < 0 then return wmax(e, from) end
  return nil
end

function sliding_decide(key, p, st, now, q, force)
  local w = p.W
  local es, en = eval_time(st, now)
  local ss, sn, elapsed = window_start(es, en, w)
  local fs, fn = iplus(ss, sn, w)
  if not fits(fs, fn) then fail(E.OVERFLOW) end
  local xs, xn = iplus(fs, fn, w)
  if not fits(xs, xn) then fail(E.OVERFLOW) end
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
    if cmp(after, U64) >= 0 then fail(E.OVERFLOW) end
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

-- The same, probing lo, lo + 1, lo + 3, lo + 7, ... first, then halving: O(log d) look-ups for
-- an answer d entries after lo (the first entry inside a window is usually near the head).
local function gallop(lo, hi, pred)
  local step = 1
  while lo < hi do
    local i = lo + step - 1
    if i >= hi then break end
    if pred(i) then
      hi = i
      break
    end
    lo, step = i + 1, step * 2
  end
  return search(lo, hi, pred)
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
    k = gallop(1, st.E - 1, function(i) return log_entry(st, i) > cutoff_us end)
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
  -- Each entry holds at least one request, so the answer is at most need - 1 entries after k.
  local need = after - p.limit
  local function pred(i)
    local _, c = log_entry(st, i)
    return (c - before) % CUM >= need
  end
  local j = k + need - 1
  if j >= st.E - 1 then
    j = search(k, st.E - 1, pred)
  elseif pred(j) then
    j = search(k, j, pred)
  else
    j = search(j + 1, st.E - 1, pred)
  end
  local at_us = log_entry(st, j)
  return report('denied', in_window, newest, {retry = wmax(us_plus_ns_minus_now(at_us, w, now_us), 1)})
end

------------------------------------------------------------------------------------- LEASE

-- The LEASE code (its helpers stay inside this block: Lua 5.1 allows a chunk 200 locals).
local lease_scan, lease_reset, lease_member, lease_remove, lease_own
local lease_others_top, lease_drop, lease_convert, lease_decide_z, lease_decide
do
-- The 1.1.0 string layout of a lease: token length (1 byte), token, slots (u32), expiry as
-- microseconds (7 bytes) and the nanoseconds past them (u16); read only (kept until the key's
-- next write). Counts and instants stay plain Lua numbers here (slots are at most
-- rl.lease-max-limit), so a key of 10,000 leases is read in one pass of cheap steps.

-- One pass over the stored leases at now_us: the slots held by live leases, the live lease of
-- `token` (its slots), the byte ranges of the other live leases (kept as they are on a write),
-- the latest expiry among those others and among all live leases, and the first to expire
-- among the others (with its slots).
function lease_scan(st, now_us, token)
  local whole = st.whole
  local len, pos = #whole, 13
  local held, own_n = 0, nil
  -- The other live leases: where each starts, its expiry (us, rounded up) and slots.
  local others, others_us, others_n, on = {}, {}, {}, 0
  -- The token's own entry is found with one plain search (then the next, if a match is not
  -- where an entry starts), not by comparing every entry.
  local mine = token and char(#token) .. token
  local np = mine and find(whole, mine, 13, true)
  local last_us, last_rem = -1, 0
  local all_us, all_rem = -1, 0
  local first_us, first_rem, first_n = -1, 0, 0
  while pos <= len do
    local tl = byte(whole, pos)
    local nxt = pos + tl + 14
    if tl < 1 or tl > 64 or nxt - 1 > len then fail(E.WRONGTYPE) end
    local n1, n2, n3, n4, u1, u2, u3, u4, u5, u6, u7, r1, r2 = byte(whole, pos + tl + 1, nxt - 1)
    local n = n1 + 256 * (n2 + 256 * (n3 + 256 * n4))
    local us = u1 + 256 * (u2 + 256 * (u3 + 256 * (u4 + 256 * (u5 + 256 * (u6 + 256 * u7)))))
    local rem = r1 + 256 * r2
    local live = us > now_us or (us == now_us and rem > 0)
    while np and np < pos do np = find(whole, mine, pos, true) end
    local own = false
    if np == pos then
      own = live
      np = find(whole, mine, pos + 1, true)
    end
    if live then
      held = held + n
      if us > all_us or (us == all_us and rem > all_rem) then all_us, all_rem = us, rem end
    end
    if own then own_n = n end
    if live and not own then
      on = on + 1
      others[on], others_us[on], others_n[on] = pos, rem > 0 and us + 1 or us, n
      if us > last_us or (us == last_us and rem > last_rem) then last_us, last_rem = us, rem end
      if first_us < 0 or us < first_us or (us == first_us and rem < first_rem) then
        first_us, first_rem, first_n = us, rem, n
      end
    end
    pos = nxt
  end
  return {held = held, own_n = own_n, others = others, others_us = others_us,
    others_n = others_n, last_us = last_us, last_rem = last_rem,
    all_us = all_us, all_rem = all_rem, first_us = first_us, first_rem = first_rem,
    first_n = first_n}
end

-- Nanoseconds from now_us until the later of two expiries (us, rem); 0 when none.
function lease_reset(now_us, us, rem, us2, rem2)
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

-- The member of slot k (1 .. n) of the lease of `token` in the sorted-set layout.
function lease_member(token, k)
  if k == 1 then return char(#token) .. token end
  local j = k - 1
  local c = j % 256
  j = (j - c) / 256
  local b = j % 256
  return char(#token) .. token .. char((j - b) / 256, b, c)
end

-- ZADD key score member ... for the flat list {score, member, ...}, in calls of at most 2000
-- members (Lua's unpack limit); the header first when `head` (its score as text) is given.
local function zadd_all(key, list, head)
  local args, i = {'ZADD', key}, 2
  if head then args[3], args[4], i = head, LEASE_HEADER, 4 end
  for j = 1, #list, 2 do
    args[i + 1] = list[j]
    args[i + 2] = list[j + 1]
    i = i + 2
    if i >= 4002 then
      write(tunpack(args))
      args, i = {'ZADD', key}, 2
    end
  end
  if i > 2 then write(tunpack(args)) end
end

-- ZREM the members of slots from .. to of the lease of `token`.
function lease_remove(key, token, from, to)
  local args, i = {'ZREM', key}, 2
  for k = from, to do
    i = i + 1
    args[i] = lease_member(token, k)
    if i >= 2002 then
      write(tunpack(args))
      args, i = {'ZREM', key}, 2
    end
  end
  if i > 2 then write(tunpack(args)) end
end

-- The slots of the lease of `token`, whose members 1 and 2 exist: members 1 .. n always exist
-- together, so the last one is found by doubling, then halving (O(log n) look-ups).
local function lease_count(key, token)
  local lo, hi = 2, 4
  while rcall('ZSCORE', key, lease_member(token, hi)) do lo, hi = hi, hi * 2 end
  while hi - lo > 1 do
    local mid = (lo + hi - (lo + hi) % 2) / 2
    if rcall('ZSCORE', key, lease_member(token, mid)) then lo = mid else hi = mid end
  end
  return lo
end

-- The lease of `token` on a sorted-set key: its expiry (us) and slots, or nil.
function lease_own(key, token)
  local e = rcall('ZSCORE', key, lease_member(token, 1))
  if not e then return nil, 0 end
  local n = 1
  if rcall('ZSCORE', key, lease_member(token, 2)) then n = lease_count(key, token) end
  return tonum(e), n
end

local function lease_lost(key, token)
  fail('LEASELOST lease \'' .. shown(token) .. '\' on key \'' .. shown(key) .. '\' is not held')
end

-- The latest expiry among the live slots of other tokens than `token` (0: none), given the top
-- member of the key (`name`, `score`) and the token's own live slots (own_n, or 0).
function lease_others_top(key, token, name, score, own_n, now_us)
  local m1 = char(#token) .. token
  if own_n > 0 and sub_s(name, 1, #m1) == m1 then
    -- The token's own slots are the top members (contiguous): the next one down.
    local t = rcall('ZRANGE', key, -(own_n + 1), -(own_n + 1), 'WITHSCORES')
    if t[1] == nil or t[1] == LEASE_HEADER then return 0 end
    score = tonum(t[2])
  end
  if score > now_us then return score end
  return 0
end


-- Drops expired slots of a sorted-set LEASE key holding `live` live slots: all of them, or the
-- 1,000 that expired first when there are more (the rest at the next writes), so that no call
-- removes more than 1,000 members (about 0.5 ms). Expired members are never counted.
function lease_drop(key, live, nows)
  local expired = rcall('ZCARD', key) - 1 - live
  if expired > 1000 then
    write('ZREMRANGEBYRANK', key, '1', '1000')
  elseif expired > 0 then
    write('ZREMRANGEBYSCORE', key, '0', nows)
  end
end

-- LEASE on the sorted-set layout: O(log n) look-ups, and a write of the token's own members.
function lease_decide_z(key, p, st, now, n)
  local now_us, token, limit = now.us, p.token, p.limit
  local own_exp, own_n, held, top, top_name = nil, 0, 0, 0, nil
  local stale_n = 0 -- the slots of the token's expired lease, still stored
  local nows = us_text(now_us)
  if st then
    own_exp, own_n = lease_own(key, token)
    if own_exp and own_exp <= now_us then own_exp, own_n, stale_n = nil, 0, own_n end
    held = rcall('ZCOUNT', key, '(' .. nows, '+inf')
    local t = rcall('ZRANGE', key, '-1', '-1', 'WITHSCORES')
    top_name, top = t[1], tonum(t[2])
    if top <= now_us then top = 0 end
  end
  -- docs/reference.md#r-lease-9: RENEW renews a live lease only; without one nothing is written.
  if p.renew and not own_exp then lease_lost(key, token) end
  local now_reset = top > 0 and mul(top - now_us, NS_PER_US) or 0
  if n == 0 then
    return {verdict = 'allowed', limit = limit, remaining = ssub(limit, held), reset = now_reset}
  end
  if cmp(n, limit) > 0 then
    return {verdict = 'never', limit = limit, remaining = ssub(limit, held), reset = now_reset}
  end
  local others = held - own_n
  if others + n <= limit then
    local exp_us = now_us + p.lease_us
    local last = exp_us
    if top > exp_us then
      last = lease_others_top(key, token, top_name, top, own_n, now_us)
      if last < exp_us then last = exp_us end
    end
    local d = {verdict = 'allowed', limit = limit, remaining = ssub(limit, others + n),
      reset = mul(last - now_us, NS_PER_US)}
    d.write = function()
      -- ZADD first: the write that the server refuses under EVAL when out of memory.
      local score, list = us_text(exp_us), {}
      for k = 1, n do
        list[2 * k - 1] = score
        list[2 * k] = lease_member(token, k)
      end
      zadd_all(key, list, (st == nil or st.limit ~= limit) and fmt('%d', -limit) or nil)
      local old_n = own_n > stale_n and own_n or stale_n
      if old_n > n then lease_remove(key, token, n + 1, old_n) end
      if st then lease_drop(key, held + n - own_n, nows) end
      write('PEXPIREAT', key, us_to_pxat(last))
    end
    return d
  end
  -- Denied: until the need-th slot of the others expires (ranks: the header 0, the expired
  -- slots 1 .. E, the live ones after, the token's own slots among them contiguous).
  local need = others + n - limit
  local idx = rcall('ZCOUNT', key, '0', nows) + need
  if own_n > 0 and idx >= rcall('ZRANK', key, lease_member(token, 1)) then idx = idx + own_n end
  local t = rcall('ZRANGE', key, idx, idx, 'WITHSCORES')
  return {verdict = 'denied', limit = limit, remaining = ssub(limit, held), reset = now_reset,
    retry = wmax(mul((tonum(t[2]) or now_us) - now_us, NS_PER_US), 1)}
end

-- Rewrites a key of the 1.1.0 string layout as a sorted set: the header, the other live
-- leases that `scan` found (a member per slot, scored by the expiry rounded up to the
-- microsecond) and `n` slots of `token` scored `score` (none when n is 0). O(live slots), once
-- per key, in ZADD calls of at most 2000 members; under EVAL the first write is one the server
-- refuses when out of memory.
function lease_convert(key, limit, st, scan, token, n, score)
  if eval_mode then write('SETRANGE', key, '0', '\255') end
  write('DEL', key)
  local whole, others, others_us, others_n = st.whole, scan.others, scan.others_us, scan.others_n
  local args, i = {'ZADD', key, fmt('%d', -limit), LEASE_HEADER}, 4
  local function add(sc, member)
    args[i + 1] = sc
    args[i + 2] = member
    i = i + 2
    if i >= 4002 then
      write(tunpack(args))
      args, i = {'ZADD', key}, 2
    end
  end
  for j = 1, #others do
    local pos = others[j]
    local q = pos + byte(whole, pos)
    local sc = us_text(others_us[j])
    add(sc, sub_s(whole, pos, q))
    if others_n[j] > 1 then
      local t = sub_s(whole, pos + 1, q)
      for k = 2, others_n[j] do add(sc, lease_member(t, k)) end
    end
  end
  for k = 1, n do add(score, lease_member(token, k)) end
  if i > 2 then write(tunpack(args)) end
end

-- LEASE on a key of the 1.1.0 string layout: decided as that library decided (one pass over
-- the leases); a write rewrites the key as a sorted set.
function lease_decide(key, p, st, now, n)
  local now_us = now.us
  local scan = lease_scan(st, now_us, p.token)
  local held, own_n = scan.held, scan.own_n
  -- docs/reference.md#r-lease-9: RENEW renews a live lease only; without one nothing is written.
  if p.renew and own_n == nil then lease_lost(key, p.token) end
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
    local exp_us = now_us + p.lease_us
    local last = scan.last_us + ((scan.last_rem > 0) and 1 or 0)
    if last < exp_us then last = exp_us end
    local d = report('allowed', others + n, mul(last - now_us, NS_PER_US))
    d.write = function()
      lease_convert(key, p.limit, st, scan, p.token, n, us_text(exp_us))
      write('PEXPIREAT', key, us_to_pxat(last))
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
end

---------------------------------------------------------------------------------------------
-- One limit on one key (RL.GCRA, RL.WINDOW, RL.LEASE and each key of RL.ALL).
---------------------------------------------------------------------------------------------

local function evaluate(key, spec, now, q, force, max_wait)
  local st
  if spec.algo == 'E' then
    local h
    if pre_zkey == key then h, pre_zkey = pre_zr, nil end
    st = load_lease(key, h)
  else
    st = load(key)
  end
  if st ~= nil and st.algo ~= spec.algo then wrong_algorithm(key, st.algo, spec.algo) end
  if spec.algo == 'G' then return gcra_decide(key, spec, st, now, q, max_wait, force) end
  if spec.algo == 'F' then return fixed_decide(key, spec, st, now, q, force) end
  if spec.algo == 'S' then return sliding_decide(key, spec, st, now, q, force) end
  if spec.algo == 'L' then return log_decide(key, spec, st, now, q) end
  if st and st.whole then return lease_decide(key, spec, st, now, q) end
  return lease_decide_z(key, spec, st, now, q)
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

-- One limit on one key, decided at one instant. Every error comes before any write: the
-- module's own (key type, algorithm, overflow, a lost lease), then out of memory, then the
-- fallback's reply range (a burst or limit it cannot reply, `cap` named `cap_name`).
local function run_one(key, spec, req, cap, cap_name)
  local now = clock()
  local d = evaluate(key, spec, now, req.quantity, req.force, req.max_wait)
  local writing = d.write and not req.peek and req.quantity ~= 0
  if writing then check_memory() end
  reply_range(cap, cap_name)
  local out = five(d)
  if writing then d.write() end
  return out
end

-- Parsed parameters, by their argument text (only valid ones are kept; parsing is pure, so a
-- hit answers exactly as parsing again would). Bounded: cleared at 512 entries.
local memo = {n = 0}
local function remember(k, v)
  if memo.n >= 256 then memo = {n = 0} end
  memo[k] = v
  memo.n = memo.n + 1
  return v
end

-- The same parameters for the fast paths, by argument text in nested tables (no string built
-- per call): GCRA burst -> rate -> period, WINDOW limit -> window, LEASE limit -> lease.
local fast_specs = {G = {}, W = {}, E = {}, n = 0, gen = 0} -- gen: bumped by every put
local function fast_put(kind, a, b, c, v)
  if fast_specs.n >= 256 then fast_specs = {G = {}, W = {}, E = {}, n = 0, gen = fast_specs.gen} end
  fast_specs.gen = fast_specs.gen + 1
  local t = fast_specs[kind]
  local t1 = t[a]
  if t1 == nil then
    t1 = {}
    t[a] = t1
  end
  if c == nil then
    t1[b] = v
  else
    local t2 = t1[b]
    if t2 == nil then
      t2 = {}
      t1[b] = t2
    end
    t2[c] = v
  end
  fast_specs.n = fast_specs.n + 1
end

-- Registers parameters the fast paths can decide with (their values below 2^52).
local function fast_gcra(bw, rw, pw, spec)
  local T, tol = spec.T, spec.tol
  if type(T) ~= 'table' and T <= FAST and type(tol) ~= 'table' and tol <= FAST then
    spec.Tb = pack64(T) .. pack7(spec.burst)
    -- One request on a missing key: T split into seconds and nanoseconds, the reply's
    -- remaining and reset_after_ms.
    spec.Tn = T % NS_PER_S
    spec.Ts = (T - spec.Tn) / NS_PER_S
    spec.rem1 = spec.burst - 1
    spec.reset1 = (T + 999999 - (T + 999999) % NS_PER_MS) / NS_PER_MS
    fast_put('G', bw, rw, pw, spec)
  end
end

local function fast_window(lw, ww, limit, w)
  if type(limit) ~= 'table' and type(w) ~= 'table' and w <= FAST then
    local wl = pack64(w) .. pack7(limit)
    local f = {limit = limit, W = w, WL = wl, FP = MAGIC .. 'F' .. wl, SP = MAGIC .. 'S' .. wl,
      Wms = ceil_ms(w), log = cmp(limit, LOG_MAX_LIMIT) <= 0}
    if w % NS_PER_S == 0 then f.ws = w / NS_PER_S end
    if f.log then
      f.LH1 = log_header(w, limit, LOG_H, LOG_H + ENTRY, 0)
      f.LP, f.Wus = sub_s(f.LH1, 1, 20), ceil_div(w, NS_PER_US)
    end
    fast_put('W', lw, ww, nil, f)
  end
end

local function gcra_general(keys, args)
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
    fast_gcra(a[2], a[3], a[4], spec)
  end
  local burst = spec.burst
  local req = {quantity = 1}
  local o = Options(a, 5)
  local seen_max_wait = false
  for kw in o.next do
    if not take_request_option(req, kw, o, true) then
      if upper(kw) == 'MAXWAIT' then
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
  return run_one(keys[1], spec, req, burst, 'burst')
end

local function window_spec(limit, w, algo)
  return {algo = algo, limit = limit, W = w}
end

local function window_general(keys, args)
  arity('RL.WINDOW', 1 + #keys + #args, -4)
  single_key(keys, 'rl_window')
  local a = argv(keys, args)
  local mk = 'W' .. a[2] .. '\0' .. a[3]
  local parsed = memo[mk]
  if not parsed then
    local limit, digits = positive(a[2], 'limit')
    parsed = remember(mk, {limit, digits, seconds(a[3], 'window')})
    fast_window(a[2], a[3], limit, parsed[3])
  end
  local limit, digits, w = parsed[1], parsed[2], parsed[3]
  local req = {quantity = 1}
  local algo
  local o = Options(a, 4)
  for kw in o.next do
    local alg = ALGORITHMS[upper(kw)]
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
  return run_one(keys[1], window_spec(limit, w, algo), req, limit, 'limit')
end

local function lease_general(keys, args)
  arity('RL.LEASE', 1 + #keys + #args, -5)
  single_key(keys, 'rl_lease')
  local a = argv(keys, args)
  local limit, digits = positive(a[2], 'limit')
  local lease = seconds(a[3], 'lease')
  local token = token_arg(a[4])
  check_lease_limit(limit, digits)
  local lease_us = ceil_div(lease, NS_PER_US)
  fast_put('E', a[2], a[3], nil, {limit = limit, lease_us = lease_us, lms = ceil_ms(lease),
    head = fmt('%d', -limit)})
  local req = {quantity = 1}
  local renew = false
  local o = Options(a, 5)
  for kw in o.next do
    if not take_request_option(req, kw, o, true) then
      if upper(kw) == 'RENEW' then
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
  if renew and req.quantity == 0 then fail(E.RENEW_WITH_QUANTITY_ZERO) end
  return run_one(keys[1], {algo = 'E', limit = limit, lease = lease, lease_us = lease_us,
    token = token, renew = renew}, req)
end

-- Runs the general code of a command: raised errors become error replies (ours as written,
-- the server's as it sent them, anything else, a bug, as an ERR naming the fallback).
local function run_guarded(f, keys, args)
  failure = nil
  local ok, res = pcall(f, keys, args)
  -- What a fast path handed over belongs to this call only.
  pre_sec, pre_key, pre_zkey, pre_raws = nil, nil, nil, nil
  if ok then return res end
  if failure then return redis.error_reply(failure) end
  if type(res) == 'table' and res.err then return redis.error_reply(res.err) end
  if type(res) == 'string' and match(res, '^[A-Z][A-Z_]* ') then return redis.error_reply(res) end
  return redis.error_reply('ERR internal error in the redis_rl Lua fallback: ' .. tostring(res))
end

local rl_gcra, rl_window, rl_lease, rl_all
-- Each command's general code: GCRA, WINDOW, LEASE, ALL (set after its definition).
local general = {G = gcra_general, W = window_general, E = lease_general}
do
---------------------------------------------------------------------------------------------
-- Fast-path helpers. Below 2^52 every sum, difference and product of integers that stays below
-- 2^52, every x % m and every (x - x % m) / m is exact in a double, so the fast paths compute
-- with plain numbers and the `%` operator (no math.floor call). A state is read with one
-- string.byte call and written with one struct.pack whose c-fields copy cached pieces (one new
-- string per write); numbers become text through cached pieces, never tostring or format.
---------------------------------------------------------------------------------------------

-- D1[d], D2[dd]: the texts '0' .. '9' and '00' .. '99' (3 digits c: D1[c // 100] .. D2[c % 100]).
-- Few cached strings on purpose: every live object of the library costs each call GC work.
local D1, D2 = {}, {}
local OPT = {} -- a keyword as clients write it -> its code (any other spelling: general code)
local R5 = {0, 0, 0, 0, 0} -- the reply of the fast single-key paths, filled per call
local sec_str, sec_b = {}, {} -- decimal text and 5 little-endian bytes of seconds
-- Bounded caches: n (entries of sec_str and sec_b), ms_at (decimal text of s * 1000, by s:
-- window ends), cnt (count text -> value, for counts of at most 15 digits) and its size.
local fc = {n = 0, ms_at = {}, cnt = {}, cnt_n = 0}

function init_fast()
  for i = 0, 9 do D1[i] = fmt('%d', i) end
  for i = 0, 99 do D2[i] = fmt('%02d', i) end
  local words = {QUANTITY = 1, PEEK = 2, FORCE = 3, MAXWAIT = 4, FIXED = 5, SLIDING = 6, LOG = 7,
    RENEW = 8}
  for w, c in pairs(words) do
    OPT[w] = c
    OPT[string.lower(w)] = c
    OPT[sub_s(w, 1, 1) .. string.lower(sub_s(w, 2))] = c
  end
end

local function sec_full()
  sec_str, sec_b = {}, {}
  fc.n, fc.ms_at = 0, {}
end

-- The decimal text of s (seconds, an integer below 2^52).
local function sstr(s)
  local v = sec_str[s]
  if v == nil then
    if fc.n >= 64 then sec_full() end
    v = fmt('%d', s)
    sec_str[s] = v
    fc.n = fc.n + 1
  end
  return v
end

-- The decimal text of an instant in microseconds (below 2^53).
function us_text(us)
  local u = us % 1000000
  local m = u % 1000
  local h = (u - m) / 1000
  local hl, ml = h % 100, m % 100
  return sstr((us - u) / 1000000) .. D1[(h - hl) / 100] .. D2[hl] .. D1[(m - ml) / 100] .. D2[ml]
end

-- The PXAT text of an instant in microseconds: its milliseconds, rounded up.
function us_to_pxat(us)
  local ms = (us + 999 - (us + 999) % 1000) / 1000
  local m = ms % 1000
  local ml = m % 100
  return sstr((ms - m) / 1000) .. D1[(m - ml) / 100] .. D2[ml]
end

-- The decimal text of s * 1000 + c (an absolute expiry in ms), 0 <= c <= 1000.
local function mstr(s, c)
  if c < 1000 then
    local cl = c % 100
    return sstr(s) .. D1[(c - cl) / 100] .. D2[cl]
  end
  return sstr(s + 1) .. '000'
end

-- The decimal text of s * 1000 (a window's end in ms).
local function sxat(s)
  local v = fc.ms_at[s]
  if v == nil then
    v = sstr(s) .. '000'
    fc.ms_at[s] = v
  end
  return v
end

-- The 5 little-endian bytes of s (seconds of an instant, below 2^40).
local function sbytes(s)
  local v = sec_b[s]
  if v == nil then
    if fc.n >= 64 then sec_full() end
    local a = s % 256
    local r = (s - a) / 256
    local b = r % 256
    r = (r - b) / 256
    local c = r % 256
    r = (r - c) / 256
    local d = r % 256
    v = char(a, b, c, d, (r - d) / 256)
    sec_b[s] = v
    fc.n = fc.n + 1
  end
  return v
end

-- A count of at most 15 digits (below 2^50): its value, else nil (the general code decides).
local function fast_count(s)
  local v = fc.cnt[s]
  if v ~= nil then return v end
  if s == nil or #s > 15 or s == '' or find(s, '[^0-9]') then return nil end
  v = tonum(s)
  if fc.cnt_n >= 64 then fc.cnt, fc.cnt_n = {}, 0 end
  fc.cnt[s] = v
  fc.cnt_n = fc.cnt_n + 1
  return v
end

-- The keywords after the positional arguments when each is plainly written and given once:
-- QUANTITY, PEEK, FORCE, MAXWAIT (as ns), the algorithm code, RENEW. nil when anything needs
-- the general code (a duplicate, another spelling, a value it reads otherwise, an error).
local function fast_opts(args, i, na)
  local q, peek, force, mw, algo, renew = 1, false, false, nil, nil, false
  local seen_q = false
  while i <= na do
    local c = OPT[args[i]]
    if c == nil then return nil end
    if c == 1 then
      if seen_q then return nil end
      seen_q = true
      q = fast_count(args[i + 1])
      if q == nil then return nil end
      i = i + 2
    elseif c == 2 then
      if peek then return nil end
      peek = true
      i = i + 1
    elseif c == 3 then
      if force then return nil end
      force = true
      i = i + 1
    elseif c == 4 then
      if mw then return nil end
      local ms = fast_count(args[i + 1])
      if ms == nil or ms > 4000000000 then return nil end
      mw = ms * NS_PER_MS
      i = i + 2
    elseif c <= 7 then
      if algo then return nil end
      algo = c
      i = i + 1
    else
      if renew then return nil end
      renew = true
      i = i + 1
    end
  end
  return q, peek, force, mw, algo, renew
end

---------------------------------------------------------------------------------------------
-- Fast paths (docs/reference.md#r-fb-10): the usual calls decided with plain numbers, with the
-- general code's replies, TTLs and stored bytes. A fast decider never raises and never writes:
-- it returns false when the general code must decide (another state or algorithm, changed
-- parameters, a value of 2^52 or more, a denial whose retry needs the general arithmetic), or
-- true, allowed, remaining, retry_after_ms, reset_after_ms and, when the request would store,
-- the new value and its absolute expiry (PXAT text). The callers read the clock and the keys
-- once and hand both to the general code when it takes over, so both decide on one instant.
---------------------------------------------------------------------------------------------

-- GCRA: the stored TAT (37 bytes, T and burst equal to the call's: `p.Tb`) against now.
local function gcra_fast(raw, p, q, force, mw, sec, usec)
  local nsn = usec * 1000
  local ahead0 = 0
  if raw == '' and q ~= 0 and (force or q <= p.burst) then
    -- A missing key (the usual first call): the TAT starts at now.
    local T = p.T
    local ahead = q * T
    if ahead > FAST then return false end
    local rem, x = 0, ahead + 999999
    if q < p.burst then rem = p.burst - q end
    x = (x - x % 1000000) / 1000000
    local r = ahead % 1000000000
    local ts, tn = sec + (ahead - r) / 1000000000, nsn + r
    if tn >= 1000000000 then ts, tn = ts + 1, tn - 1000000000 end
    local px = tn + 999999
    px = (px - px % 1000000) / 1000000
    return true, 1, rem, mw and 0 or -1, x,
      pack('<c4c5I4c15c5I4', '\255rlG', sec_b[ts] or sbytes(ts), tn, p.Tb,
        sec_b[sec] or sbytes(sec), nsn),
      px < 1000 and (sec_str[ts] or sstr(ts)) .. D1[(px - px % 100) / 100] .. D2[px % 100]
        or mstr(ts, px)
  end
  if raw ~= '' then
    if #raw ~= 37 then return false end
    local m1, m2, m3, m4, t1, t2, t3, t4, t5, n1, n2, n3, n4 = byte(raw, 1, 13)
    if m4 ~= 71 or m1 ~= 255 or m2 ~= 114 or m3 ~= 108 or find(raw, p.Tb, 14, true) ~= 14 then
      return false
    end
    local u1, u2, u3, u4, u5, v1, v2, v3, v4 = byte(raw, 29, 37)
    local tn = n1 + 256 * (n2 + 256 * (n3 + 256 * n4))
    local ds = t1 + 256 * (t2 + 256 * (t3 + 256 * (t4 + 256 * t5))) - sec
    if tn >= 1000000000 or ds >= 4000000 or v1 + 256 * (v2 + 256 * (v3 + 256 * v4)) >= 1000000000
      or u1 + 256 * (u2 + 256 * (u3 + 256 * (u4 + 256 * u5))) >= U64_S then
      return false
    end
    if ds > -4000000 then
      ahead0 = ds * 1000000000 + tn - nsn
      if ahead0 < 0 then ahead0 = 0 end
    end
  end
  local T, tol = p.T, p.tol
  local rem, x = 0, ahead0 + 999999
  local reset = (x - x % 1000000) / 1000000
  if ahead0 < tol then
    x = tol - ahead0
    rem = (x - x % T) / T
  end
  if q == 0 then return true, 1, rem, mw and 0 or -1, reset end
  if not force and q > p.burst then return true, 0, rem, -1, reset end
  local ahead = ahead0 + q * T
  if ahead > FAST then return false end
  local delay, retry = 0, -1
  if mw then retry = 0 end
  if not force and ahead > tol then
    local wait = ahead - tol
    x = wait + 999999
    retry = (x - x % 1000000) / 1000000
    if not mw or wait > mw then return true, 0, rem, retry, reset end
    delay = wait
  end
  rem, x = 0, ahead + 999999
  reset = (x - x % 1000000) / 1000000
  if ahead < tol then
    x = tol - ahead
    rem = (x - x % T) / T
  end
  -- The new TAT, now + ahead, and the arrival, now + delay (a reservation's start).
  x = ahead % 1000000000
  local ts, tn = sec + (ahead - x) / 1000000000, nsn + x
  if tn >= 1000000000 then ts, tn = ts + 1, tn - 1000000000 end
  local as, an = sec, nsn
  if delay > 0 then
    x = delay % 1000000000
    as, an = sec + (delay - x) / 1000000000, nsn + x
    if an >= 1000000000 then as, an = as + 1, an - 1000000000 end
  end
  x = tn + 999999
  x = (x - x % 1000000) / 1000000
  return true, 1, rem, retry, reset,
    pack('<c4c5I4c15c5I4', '\255rlG', sec_b[ts] or sbytes(ts), tn, p.Tb, sec_b[as] or sbytes(as),
      an),
    x < 1000 and (sec_str[ts] or sstr(ts)) .. D1[(x - x % 100) / 100] .. D2[x % 100]
      or mstr(ts, x)
end

-- FIXED, a window of whole seconds (`p.ws`): the stored count (36 bytes, window and limit
-- equal to the call's: `p.WL`) if it belongs to the window of max(now, its last write).
local function fixed_fast(raw, p, q, force, sec, usec)
  local ws = p.ws
  local es, en, count = sec, usec * 1000, 0
  if raw == '' and q ~= 0 and (force or q <= p.limit) then
    -- A missing key (the usual first call): the window of now holds the request.
    local limit = p.limit
    local fs = sec - sec % ws + ws
    local rem = 0
    if q < limit then rem = limit - q end
    if q > MAXI then return false end
    return true, 1, rem, -1, (fs - sec) * 1000 - (usec - usec % 1000) / 1000,
      pack('<c19I8c5I4', p.FP, q, sec_b[sec] or sbytes(sec), en),
      fc.ms_at[fs] or sxat(fs)
  end
  if raw ~= '' then
    if #raw ~= 36 then return false end
    local m1, m2, m3, m4 = byte(raw, 1, 4)
    if m4 ~= 70 or m1 ~= 255 or m2 ~= 114 or m3 ~= 108 or find(raw, p.WL, 5, true) ~= 5 then
      return false
    end
    local c1, c2, c3, c4, c5, c6, c7, c8, u1, u2, u3, u4, u5, v1, v2, v3, v4 = byte(raw, 20, 36)
    local un = v1 + 256 * (v2 + 256 * (v3 + 256 * v4))
    local us_ = u1 + 256 * (u2 + 256 * (u3 + 256 * (u4 + 256 * u5)))
    if c8 ~= 0 or c7 >= 32 or un >= 1000000000 or us_ >= U64_S then return false end
    if us_ > sec or (us_ == sec and un > en) then es, en = us_, un end
    if us_ >= es - es % ws then
      count = c1 + 256 * (c2 + 256 * (c3 + 256 * (c4 + 256 * (c5 + 256 * (c6 + 256 * c7)))))
    end
  end
  local fs = es - es % ws + ws
  local to_end = (fs - sec) * 1000 - (usec - usec % 1000) / 1000
  local limit = p.limit
  local rem, reset = 0, 0
  if limit > count then rem = limit - count end
  if count ~= 0 then reset = to_end end
  if q == 0 then return true, 1, rem, -1, reset end
  if not force then
    if q > limit then return true, 0, rem, -1, reset end
    if count + q > limit then return true, 0, rem, to_end > 1 and to_end or 1, reset end
  end
  local after = count + q
  if after > MAXI then return false end
  rem = 0
  if limit > after then rem = limit - after end
  return true, 1, rem, -1, to_end, pack('<c19I8c5I4', p.FP, after, sec_b[es] or sbytes(es), en),
    fc.ms_at[fs] or sxat(fs)
end

-- SLIDING, a window of whole seconds: the stored counts (44 bytes) placed in the current and
-- previous windows of max(now, the last write), the previous one weighted exactly.
local function sliding_fast(raw, p, q, force, sec, usec)
  local ws, W = p.ws, p.W
  local es, en, prev, curr = sec, usec * 1000, 0, 0
  if raw == '' and q ~= 0 and (force or q <= p.limit) then
    -- A missing key (the usual first call): no previous count, the current one the request.
    local limit = p.limit
    local xs = sec - sec % ws + ws + ws
    local rem = 0
    if q < limit then rem = limit - q end
    if q > MAXI then return false end
    return true, 1, rem, -1, (xs - sec) * 1000 - (usec - usec % 1000) / 1000,
      pack('<c19I8I8c5I4', p.SP, 0, q, sec_b[sec] or sbytes(sec), en),
      fc.ms_at[xs] or sxat(xs)
  end
  if raw ~= '' then
    if #raw ~= 44 then return false end
    local m1, m2, m3, m4 = byte(raw, 1, 4)
    if m4 ~= 83 or m1 ~= 255 or m2 ~= 114 or m3 ~= 108 or find(raw, p.WL, 5, true) ~= 5 then
      return false
    end
    local p1, p2, p3, p4, p5, p6, p7, p8, c1, c2, c3, c4, c5, c6, c7, c8, u1, u2, u3, u4, u5,
      v1, v2, v3, v4 = byte(raw, 20, 44)
    local un = v1 + 256 * (v2 + 256 * (v3 + 256 * v4))
    local us_ = u1 + 256 * (u2 + 256 * (u3 + 256 * (u4 + 256 * u5)))
    if p8 ~= 0 or p7 >= 32 or c8 ~= 0 or c7 >= 32 or un >= 1000000000 or us_ >= U64_S then
      return false
    end
    if us_ > sec or (us_ == sec and un > en) then es, en = us_, un end
    local cs, ss = us_ - us_ % ws, es - es % ws
    if cs == ss then
      prev = p1 + 256 * (p2 + 256 * (p3 + 256 * (p4 + 256 * (p5 + 256 * (p6 + 256 * p7)))))
      curr = c1 + 256 * (c2 + 256 * (c3 + 256 * (c4 + 256 * (c5 + 256 * (c6 + 256 * c7)))))
    elseif cs + ws == ss then
      prev = c1 + 256 * (c2 + 256 * (c3 + 256 * (c4 + 256 * (c5 + 256 * (c6 + 256 * c7)))))
    end
  end
  local ss = es - es % ws
  if ss == 0 then return false end
  local weight = 0
  if prev ~= 0 then
    local x = prev * (W - (es - ss) * 1000000000 - en)
    if x >= 2251799813685248 or W >= 2251799813685248 then return false end -- 2^51
    x = x + W - 1
    weight = (x - x % W) / W
  end
  local msu = (usec - usec % 1000) / 1000
  local limit = p.limit
  local used, rem, reset = curr + weight, 0, 0
  if limit > used then rem = limit - used end
  if curr ~= 0 then
    reset = (ss + ws + ws - sec) * 1000 - msu
  elseif prev ~= 0 then
    reset = (ss + ws - sec) * 1000 - msu
  end
  if q == 0 then return true, 1, rem, -1, reset end
  if not force and q > limit then return true, 0, rem, -1, reset end
  if not force and used + q > limit then return false end
  local after = curr + q
  if after > MAXI then return false end
  used, rem = after + weight, 0
  if limit > used then rem = limit - used end
  local xs = ss + ws + ws
  return true, 1, rem, -1, (xs - sec) * 1000 - msu,
    pack('<c19I8I8c5I4', p.SP, prev, after, sec_b[es] or sbytes(es), en), fc.ms_at[xs] or sxat(xs)
end

-- LOG on a missing key: one entry at now holding the request.
local function log_fast(raw, p, q, sec, usec)
  if raw ~= '' then return false end
  local limit = p.limit
  if q == 0 then return true, 1, limit, -1, 0 end
  if q > limit then return true, 0, limit, -1, 0 end
  local us = sec * 1000000 + usec
  local lo = us % 16777216
  local W = p.W
  local x = W % 1000000000
  local s2, n2 = sec + (W - x) / 1000000000, usec * 1000 + x
  if n2 >= 1000000000 then s2, n2 = s2 + 1, n2 - 1000000000 end
  x = n2 + 999999
  return true, 1, limit - q, -1, p.Wms,
    pack('<c31I3I4I3', p.LH1, lo, (us - lo) / 16777216, q % 16777216),
    mstr(s2, (x - x % 1000000) / 1000000)
end

-- The decimal text of an integer 0 <= x < 10^9 (a byte offset, a rank), from cached pieces.
local function itext(x)
  if x < 100 then return x < 10 and D1[x] or D2[x] end
  local l = x % 100
  if x < 1000 then return D1[(x - l) / 100] .. D2[l] end
  local r = x % 1000
  l = r % 100
  return itext((x - r) / 1000) .. D1[(r - l) / 100] .. D2[l]
end

-- LOG on a key of the call's parameters (its first 20 bytes are p.LP): log_decide's decision
-- and stored bytes in plain numbers, entries read from `raw` (the key's first 256 bytes) or by
-- GETRANGE as log_decide reads them (the last, the first, a search), a write of the new entry
-- and the header (a whole value of under 256 bytes: one SET). Returns the reply, or nil when the
-- general code must decide (having written nothing).
local log_more
do
-- The entry at byte offset pos: its instant (us) and running count.
local function lget(key, raw, lastblk, tl, pos)
  local lo, hi, cum
  if pos + 10 <= #raw then
    lo, hi, cum = unpack('<I3I4I3', raw, pos + 1)
  elseif lastblk and pos == tl - 10 then
    lo, hi, cum = unpack('<I3I4I3', lastblk)
  else
    lo, hi, cum = unpack('<I3I4I3', rcall('GETRANGE', key, itext(pos), itext(pos + 9)))
  end
  return hi * 16777216 + lo, cum
end

-- instant + W - now in ns (at least 0), or nil when it would leave the exact range.
local function upm(instant_us, w, now_us)
  local d = instant_us - now_us
  if d >= 0 then
    if d > 4000000000000 then return nil end
    return d * 1000 + w
  end
  d = w + d * 1000
  return d > 0 and d or 0
end

function log_more(key, raw, p, q, peek, sec, usec)
  if type(raw) ~= 'string' or sub_s(raw, 1, 20) ~= p.LP then return nil end
  local n = #raw
  local hd, tl, base = unpack('<I4I4I3', raw, 21)
  local E = (tl - hd) / 10
  if hd < 31 or E < 1 or E % 1 ~= 0 then return nil end
  local lastblk
  if n < 256 then
    if tl > n then return nil end
  else
    -- The last entry, and the key's length: 10 bytes when the key ends at the tail.
    lastblk = rcall('GETRANGE', key, itext(tl - 10), itext(tl))
    if #lastblk ~= 10 then return nil end
    n = tl
  end
  local now_us = sec * 1000000 + usec
  local W, limit, wu = p.W, p.limit, p.Wus
  local cutoff = wu <= now_us and now_us - wu or -1
  local last_us, last_cum = lget(key, raw, lastblk, tl, tl - 10)
  local k, before, inw, newest
  if last_us <= cutoff then
    k, before, inw = E, last_cum, 0
  else
    newest = last_us
    local u, c = lget(key, raw, lastblk, tl, hd)
    if u > cutoff then
      k, before = 0, base
    else
      -- The first entry inside the window among 1 .. E-2 (else E-1): doubling steps, then
      -- halving; the entry before it was read (its running count is `before`).
      local lo, hi, step = 1, E - 1, 1
      before = c
      while lo < hi do
        local i = lo + step - 1
        if i >= hi then break end
        u, c = lget(key, raw, lastblk, tl, hd + 10 * i)
        if u > cutoff then
          hi = i
          break
        end
        lo, step, before = i + 1, step * 2, c
      end
      while lo < hi do
        local mid = (lo + hi - (lo + hi) % 2) / 2
        u, c = lget(key, raw, lastblk, tl, hd + 10 * mid)
        if u > cutoff then hi = mid else lo, before = mid + 1, c end
      end
      k = lo
    end
    inw = (last_cum - before) % 16777216
  end
  local reset = newest and upm(newest, W, now_us) or 0
  if reset == nil then return nil end
  local R = R5
  R[2], R[4] = limit, -1
  if q == 0 or q > limit then
    R[1], R[3], R[5] = q == 0 and 1 or 0, inw < limit and limit - inw or 0,
      (reset + 999999 - (reset + 999999) % 1000000) / 1000000
    return R
  end
  local after = inw + q
  if after > limit then
    -- Denied: until the need-th request in the window leaves it; each entry holds at least one
    -- request, so that is at most need - 1 entries after the first.
    local need = after - limit
    local lo, hi, at = k, k + need - 1, last_us
    if hi >= E - 1 then
      hi = E - 1
    else
      local u, c = lget(key, raw, lastblk, tl, hd + 10 * hi)
      if (c - before) % 16777216 >= need then at = u else lo, hi = hi + 1, E - 1 end
    end
    while lo < hi do
      local mid = (lo + hi - (lo + hi) % 2) / 2
      local u, c = lget(key, raw, lastblk, tl, hd + 10 * mid)
      if (c - before) % 16777216 >= need then hi, at = mid, u else lo = mid + 1 end
    end
    local wait = upm(at, W, now_us)
    if wait == nil then return nil end
    wait = (wait + 999999 - (wait + 999999) % 1000000) / 1000000
    R[1], R[3], R[4], R[5] = 0, inw < limit and limit - inw or 0, wait > 1 and wait or 1,
      (reset + 999999 - (reset + 999999) % 1000000) / 1000000
    return R
  end
  if newest == nil or newest < now_us then
    reset = W
  else
    reset = upm(newest, W, now_us)
  end
  R[1], R[3], R[5] = 1, limit - after, (reset + 999999 - (reset + 999999) % 1000000) / 1000000
  if peek then return R end
  if ro then return nil end
  -- The absolute expiry: now + reset, in ms rounded up.
  local x = reset % 1000000000
  local s2, n2 = sec + (reset - x) / 1000000000, usec * 1000 + x
  if n2 >= 1000000000 then s2, n2 = s2 + 1, n2 - 1000000000 end
  x = n2 + 999999
  local pxat = mstr(s2, (x - x % 1000000) / 1000000)
  local lo = now_us % 16777216
  if k == E then
    -- Every entry has left the window: a new log (log_decide's first case).
    if not wcall('SET', key, pack('<c31I3I4I3', p.LH1, lo, (now_us - lo) / 16777216, q), 'PXAT',
      pxat) then return nil end
    return R
  end
  local cum = (last_cum + q) % 16777216
  local merge = now_us <= last_us -- the same instant, or a clock that stepped back
  local head = hd + 10 * k
  local tail = merge and tl or tl + 10
  local hi = (now_us - lo) / 16777216
  local value
  local extra = n - tail
  if extra < 0 then extra = 0 end
  if (head - 31) + extra > tail - head then
    -- Compact: the live entries at the front (log_decide's rewrite).
    local live = tl <= #raw and sub_s(raw, head + 1, merge and tl - 3 or tl)
      or rcall('GETRANGE', key, itext(head), itext(merge and tl - 4 or tl - 1))
    if merge then
      value = pack('<c20I4I4I3c0I3', p.LP, 31, 34 + #live, before, live, cum)
    else
      value = pack('<c20I4I4I3c0I3I4I3', p.LP, 31, 41 + #live, before, live, lo, hi, cum)
    end
  elseif n < 256 then
    -- The whole value is known: the same bytes as log_decide's SETRANGEs, in one SET (c0:
    -- the whole string).
    if merge then
      value = pack('<c20I4I4I3c0I3', p.LP, head, tail, before, sub_s(raw, 32, tl - 3), cum)
      if n > tl then value = value .. sub_s(raw, tl + 1) end
    else
      value = pack('<c20I4I4I3c0I3I4I3', p.LP, head, tail, before, sub_s(raw, 32, tl), lo, hi,
        cum)
      if n > tl + 10 then value = value .. sub_s(raw, tl + 11) end
    end
  end
  if value then
    if not wcall('SET', key, value, 'PXAT', pxat) then return nil end
    return R
  end
  if merge then
    if not wcall('SETRANGE', key, itext(tl - 3), pack('<I3', cum)) then return nil end
  elseif not wcall('SETRANGE', key, itext(tl), pack('<I3I4I3', lo, hi, cum)) then
    return nil
  end
  wcall('SETRANGE', key, '0', pack('<c20I4I4I3', p.LP, head, tail, before))
  wcall('PEXPIREAT', key, pxat)
  return R
end
end

-- LEASE on a key of the sorted-set layout holding the call's limit (`h`: its header and lowest
-- slots, from ZRANGE key 0 LEASE_READ - 1 WITHSCORES), for a token holding at most one slot:
-- lease_decide_z's decision in plain numbers with fewer look-ups (the lowest slot tells whether
-- any expired: when none did, no count of the expired and no drop; a key of fewer than
-- LEASE_READ members was read whole, so its counts, ranks and top come from `h` with no more
-- commands), the same writes. Returns the reply, or nil when the general code must decide
-- (having written nothing).
local LEASE_READ = 8
local LEASE_READ_TEXT = '7' -- LEASE_READ - 1
local function lease_more(key, h, p, q, peek, renew, token, sec, usec)
  local limit = p.limit
  if h[2] ~= p.head and tonum(h[2]) ~= -limit then return nil end
  local now_us = sec * 1000000 + usec
  local low = h[4] and tonum(h[4]) -- the earliest expiry, nil: no slots
  local expired = low ~= nil and low <= now_us
  local m1 = char(#token) .. token
  local nh = #h
  local whole = nh < 2 * LEASE_READ
  local own_n, own_i, nexp, held = 0, nil, 0, 0
  if whole then
    -- The whole set: the token's slot (its index in h), the live and the expired slots.
    local n1 = #m1
    for i = 3, nh - 1, 2 do
      local m = h[i]
      if tonum(h[i + 1]) > now_us then held = held + 1 else nexp = nexp + 1 end
      if q > 0 and sub_s(m, 1, n1) == m1 then
        if #m ~= n1 then return nil end -- a lease of several slots: the general code counts them
        if tonum(h[i + 1]) > now_us then own_n, own_i = 1, i end
      end
    end
  elseif q > 0 then
    local s = rcall('ZMSCORE', key, m1, m1 .. '\0\0\1')
    if s[2] then return nil end -- a lease of several slots: the general code counts them
    if s[1] and (not expired or tonum(s[1]) > now_us) then own_n = 1 end
  end
  if renew and own_n == 0 then return nil end
  local nows
  if expired then nows = us_text(now_us) end
  if not whole then
    if expired then
      held = rcall('ZCOUNT', key, '(' .. nows, '+inf')
    elseif low then
      held = rcall('ZCARD', key) - 1
    end
  end
  local R = R5
  R[2], R[4] = limit, -1
  local others = held - own_n
  local top = 0
  if q == 0 or others + q > limit then
    if held > 0 then
      if whole then
        top = tonum(h[nh])
      else
        local t = rcall('ZRANGE', key, '-1', '-1', 'WITHSCORES')
        top = tonum(t[2])
      end
    end
    R[3] = held < limit and limit - held or 0
    local x = top > 0 and top - now_us + 999 or 0
    R[5] = (x - x % 1000) / 1000
    if q == 0 then
      R[1] = 1
      return R
    end
    -- Denied: until the need-th slot of the others expires (lease_decide_z's ranks).
    local idx = others + q - limit
    local at
    if whole then
      idx = idx + nexp
      if own_n > 0 and idx >= (own_i - 1) / 2 then idx = idx + own_n end
      at = h[2 * idx + 2]
    else
      if expired then idx = idx + rcall('ZCOUNT', key, '0', nows) end
      if own_n > 0 and idx >= rcall('ZRANK', key, m1) then idx = idx + own_n end
      at = rcall('ZRANGE', key, itext(idx), itext(idx), 'WITHSCORES')[2]
    end
    x = (tonum(at) or now_us) - now_us + 999
    x = (x - x % 1000) / 1000
    R[1], R[4] = 0, x > 1 and x or 1
    return R
  end
  local exp_us = now_us + p.lease_us
  local last = exp_us
  local score = us_text(exp_us)
  -- A slot expiring after the new lease (a longer lease, a clock stepped back) is the latest.
  if whole then
    if held > 0 and tonum(h[nh]) > exp_us then
      -- The latest among the others' live slots (lease_others_top on the whole set).
      local i = nh - 1
      if own_i == i then i = i - 2 end
      local s = i >= 3 and tonum(h[i + 1]) or 0
      if s > last then last = s end
    end
  elseif held > 0 and rcall('ZCOUNT', key, '(' .. score, '+inf') > 0 then
    local t = rcall('ZRANGE', key, '-1', '-1', 'WITHSCORES')
    last = lease_others_top(key, token, t[1], tonum(t[2]), own_n, now_us)
    if last < exp_us then last = exp_us end
  end
  local x = last - now_us + 999
  R[1], R[3], R[5] = 1, limit - others - q, (x - x % 1000) / 1000
  if peek then return R end
  if ro then return nil end
  local done
  if q == 1 then
    done = wcall('ZADD', key, score, m1)
  else
    local zargs = {'ZADD', key}
    for k = 1, q do
      zargs[2 * k + 1] = score
      zargs[2 * k + 2] = lease_member(token, k)
    end
    done = wcall(tunpack(zargs))
  end
  if not done then return nil end
  if expired then lease_drop(key, held + q - own_n, nows) end
  wcall('PEXPIREAT', key, us_to_pxat(last))
  return R
end

function rl_gcra(keys, args, twin)
  ro = twin or false
  if not initialised then init() end
  local key = keys[1]
  local p = fast_specs.G[args[1]]
  if p then p = p[args[2]] end
  if p then p = p[args[3]] end
  if p == nil or key == nil or keys[2] ~= nil then return run_guarded(general.G, keys, args) end
  local q, peek, force, mw = 1, false, false, nil
  if args[4] ~= nil then
    local algo, renew
    q, peek, force, mw, algo, renew = fast_opts(args, 4, #args)
    if q == nil or algo or renew or (force and (peek or mw)) then
      return run_guarded(general.G, keys, args)
    end
  end
  local t = rcall('TIME')
  local ss = t[1]
  local sec = last_sec
  if ss ~= last_ss then
    sec = ss + 0
    last_ss, last_sec = ss, sec
  end
  local usec = t[2] + 0
  local raw
  if sec < 9007199254 then -- now in microseconds below 2^53
    raw = rpcall('GETRANGE', key, '0', '63')
    local ok, a, rem, retry, reset, value, pxat
    if raw == '' and q ~= 0 and (force or q <= p.burst) and not peek then
      -- A missing key (gcra_fast's first case, here without a call): the TAT starts at now.
      local ahead = q * p.T
      if ahead <= FAST then
        local nsn = usec * 1000
        local ts, tn
        if q == 1 then
          ok, a, rem, retry, reset = true, 1, p.rem1, mw and 0 or -1, p.reset1
          ts, tn = sec + p.Ts, nsn + p.Tn
        else
          local x = ahead + 999999
          ok, a, rem, retry, reset = true, 1, 0, mw and 0 or -1, (x - x % 1000000) / 1000000
          if q < p.burst then rem = p.burst - q end
          x = ahead % 1000000000
          ts, tn = sec + (ahead - x) / 1000000000, nsn + x
        end
        if tn >= 1000000000 then ts, tn = ts + 1, tn - 1000000000 end
        local x = tn + 999999
        x = (x - x % 1000000) / 1000000
        -- One struct.pack, one string (c-fields copy the cached pieces).
        value = pack('<c4c5I4c15c5I4', '\255rlG', sec_b[ts] or sbytes(ts), tn, p.Tb,
          sec_b[sec] or sbytes(sec), nsn)
        pxat = x < 1000 and (sec_str[ts] or sstr(ts)) .. D1[(x - x % 100) / 100] .. D2[x % 100]
          or mstr(ts, x)
      end
    else
      ok, a, rem, retry, reset, value, pxat = gcra_fast(raw, p, q, force, mw, sec, usec)
    end
    if ok then
      local done
      if value and not peek then
        if not ro then
          if eval_mode then
            done = wcall('SET', key, value, raw == '' and 'NX' or 'XX', 'PXAT', pxat)
          elseif raw == '' then
            done = rcall('SET', key, value, 'NX', 'PXAT', pxat)
          else
            done = rcall('SET', key, value, 'PXAT', pxat)
          end
        end
      else
        done = raw ~= '' or rcall('EXISTS', key) == 0
      end
      if done then
        local R = R5
        R[1], R[2], R[3], R[4], R[5] = a, p.burst, rem, retry, reset
        return R
      end
    end
  end
  pre_sec, pre_usec, pre_key, pre_raw = sec, usec, key, raw
  return run_guarded(general.G, keys, args)
end

-- The window fast paths, by the algorithm's keyword code (5 FIXED, 6 or none SLIDING, 7 LOG).
function rl_window(keys, args, twin)
  ro = twin or false
  if not initialised then init() end
  local key = keys[1]
  local p = fast_specs.W[args[1]]
  if p then p = p[args[2]] end
  if p == nil or key == nil or keys[2] ~= nil then return run_guarded(general.W, keys, args) end
  local q, peek, force, algo = 1, false, false, nil
  local a3 = args[3]
  if a3 ~= nil then
    local c = OPT[a3]
    if c and c >= 5 and c <= 7 and args[4] == nil then
      algo = c
    else
      local mw, renew
      q, peek, force, mw, algo, renew = fast_opts(args, 3, #args)
      if q == nil or mw or renew or (force and peek) then return run_guarded(general.W, keys, args) end
    end
  end
  local decide
  if algo == 7 then
    if not p.log or force then return run_guarded(general.W, keys, args) end
  elseif p.ws == nil then
    return run_guarded(general.W, keys, args)
  elseif algo == 5 then
    decide = fixed_fast
  else
    decide = sliding_fast
  end
  local t = rcall('TIME')
  local ss = t[1]
  local sec = last_sec
  if ss ~= last_ss then
    sec = ss + 0
    last_ss, last_sec = ss, sec
  end
  local usec = t[2] + 0
  local raw
  if sec < 9007199254 then -- now in microseconds below 2^53
    -- A LOG key's first 256 bytes: its header and up to 22 entries (a whole short log).
    raw = rpcall('GETRANGE', key, '0', decide and '63' or '255')
    local ok, a, rem, retry, reset, value, pxat
    if decide then
      ok, a, rem, retry, reset, value, pxat = decide(raw, p, q, force, sec, usec)
    elseif raw == '' then
      ok, a, rem, retry, reset, value, pxat = log_fast(raw, p, q, sec, usec)
    else
      local R = log_more(key, raw, p, q, peek, sec, usec)
      if R then return R end
    end
    if ok then
      local done
      if value and not peek then
        if not ro then
          if eval_mode then
            done = wcall('SET', key, value, raw == '' and 'NX' or 'XX', 'PXAT', pxat)
          elseif raw == '' then
            done = rcall('SET', key, value, 'NX', 'PXAT', pxat)
          else
            done = rcall('SET', key, value, 'PXAT', pxat)
          end
        end
      else
        done = raw ~= '' or rcall('EXISTS', key) == 0
      end
      if done then
        local R = R5
        R[1], R[2], R[3], R[4], R[5] = a, p.limit, rem, retry, reset
        return R
      end
    end
  end
  pre_sec, pre_usec, pre_key, pre_raw = sec, usec, key, raw
  return run_guarded(general.W, keys, args)
end

-- LEASE on a missing key (the header and the new lease's members, then the key's expiry) or on
-- a key of the same limit (lease_more); ZRANGE key 0 1 reads the header and the lowest slot.
function rl_lease(keys, args, twin)
  ro = twin or false
  if not initialised then init() end
  local key, token = keys[1], args[3]
  local p = fast_specs.E[args[1]]
  if p then p = p[args[2]] end
  if p == nil or key == nil or keys[2] ~= nil or token == nil or #token > 64 or token == '' then
    return run_guarded(general.E, keys, args)
  end
  local q, peek, renew = 1, false, false
  if args[4] ~= nil then
    local force, mw, algo
    q, peek, force, mw, algo, renew = fast_opts(args, 4, #args)
    if q == nil or force or mw or algo or (renew and q == 0) then
      return run_guarded(general.E, keys, args)
    end
  end
  if q > p.limit or q > 2000 then return run_guarded(general.E, keys, args) end
  local t = rcall('TIME')
  local ss = t[1]
  local sec = last_sec
  if ss ~= last_ss then
    sec = ss + 0
    last_ss, last_sec = ss, sec
  end
  local usec = t[2] + 0
  local h
  if sec < 9007199254 then -- now in microseconds below 2^53
    h = rpcall('ZRANGE', key, '0', LEASE_READ_TEXT, 'WITHSCORES')
    if h[1] == LEASE_HEADER then
      local R = lease_more(key, h, p, q, peek, renew, token, sec, usec)
      if R then return R end
    elseif h.err == nil and h[1] == nil and not renew then
      local R = R5
      R[2], R[4] = p.limit, -1
      if q == 0 or peek then
        R[1], R[3], R[5] = 1, p.limit - q, q == 0 and 0 or p.lms
        return R
      end
      if not ro then
        local exp = sec * 1000000 + usec + p.lease_us
        local score = us_text(exp)
        local done
        if q == 1 then
          done = wcall('ZADD', key, p.head, LEASE_HEADER, score, char(#token) .. token)
        elseif q <= 2000 then
          local zargs = {'ZADD', key, p.head, LEASE_HEADER}
          for k = 1, q do
            zargs[2 * k + 3] = score
            zargs[2 * k + 4] = lease_member(token, k)
          end
          done = wcall(tunpack(zargs))
        end
        if done then
          wcall('PEXPIREAT', key, us_to_pxat(exp))
          R[1], R[3], R[5] = 1, p.limit - q, p.lms
          return R
        end
      end
    end
  end
  pre_sec, pre_usec, pre_zkey, pre_zr = sec, usec, key, h
  return run_guarded(general.E, keys, args)
end

-- RL.ALL over GCRA and WINDOW specs (no LEASE), each key decided by its fast decider; the
-- writes only when every limit admits the request. The parsed arguments are kept by their
-- text (args joined), the replies are kept tables, by numkeys.
-- parsed: args text -> the fast form; replies: by numkeys; raws: key -> GETRANGE; vals, pxs:
-- by key index, the values to store and their PXAT texts; kind: the spec words.
local AS = {parsed = {}, parsed_n = 0, replies = {}, raws = {}, vals = {}, pxs = {},
  kind = {GCRA = 1, gcra = 1, Gcra = 1, WINDOW = 2, window = 2, Window = 2}}

-- The fast form of RL.ALL's arguments for `n` keys: {n, q, peek, force, sp1, c1, cost1, ...}
-- (c: 1 GCRA, 5 FIXED, 6 SLIDING, 7 LOG; cost false when none), or false.
local function all_parse(args, n)
  local na = #args
  local out, i, o = {n, 1, false, false}, 1, 4
  local has_log = false
  for _ = 1, n do
    local c, sp = AS.kind[args[i]], nil
    if c == 1 then
      sp = fast_specs.G[args[i + 1]]
      if sp then sp = sp[args[i + 2]] end
      if sp then sp = sp[args[i + 3]] end
      i = i + 4
    elseif c == 2 then
      sp = fast_specs.W[args[i + 1]]
      if sp then sp = sp[args[i + 2]] end
      i = i + 3
      local a = OPT[args[i]]
      if a and a >= 5 and a <= 7 then
        c, i = a, i + 1
      else
        c = 6
      end
      if sp and ((c == 7 and not sp.log) or (c ~= 7 and sp.ws == nil)) then sp = nil end
      if c == 7 then has_log = true end
    end
    if sp == nil then return false end
    local cost = false
    local w = args[i]
    if w == 'COST' or w == 'cost' or w == 'Cost' then
      cost = fast_count(args[i + 1])
      if cost == nil then return false end
      i = i + 2
    end
    out[o + 1], out[o + 2], out[o + 3] = sp, c, cost
    o = o + 3
  end
  if i <= na then
    local q, peek, force, mw, algo, renew = fast_opts(args, i, na)
    if q == nil or mw or algo or renew or (force and (peek or has_log)) then return false end
    out[2], out[3], out[4] = q, peek, force
  end
  return out
end

-- The general code of an RL.ALL whose keys the fast path already read (and forgot after).
local function all_fall(keys, args)
  local r = run_guarded(general.A, keys, args)
  local raws = AS.raws
  for k = 1, #keys do raws[keys[k]] = nil end
  return r
end

function rl_all(keys, args, twin)
  ro = twin or false
  if not initialised then init() end
  local n = #keys
  if n < 1 or n > 8 or n > ALL_MAX_KEYS then return run_guarded(general.A, keys, args) end
  local text = tconcat(args, '\0')
  local P = AS.parsed[text]
  if P == nil or (P[1] == false and P[2] ~= fast_specs.gen) then
    -- Not seen, or not fast when parsed with the parameters then known ({false, gen}).
    P = all_parse(args, n) or {false, fast_specs.gen}
    if AS.parsed_n >= 128 then AS.parsed, AS.parsed_n = {}, 0 end
    AS.parsed[text], AS.parsed_n = P, AS.parsed_n + 1
  end
  if P[1] ~= n then return run_guarded(general.A, keys, args) end
  for k = 2, n do
    local key = keys[k]
    for j = 1, k - 1 do
      if keys[j] == key then return run_guarded(general.A, keys, args) end
    end
  end
  local q, peek, force = P[2], P[3], P[4]
  local t = rcall('TIME')
  local ss = t[1]
  local sec = last_sec
  if ss ~= last_ss then
    sec = ss + 0
    last_ss, last_sec = ss, sec
  end
  local usec = t[2] + 0
  if sec >= 9007199254 then -- now in microseconds near 2^53
    pre_sec, pre_usec = sec, usec
    return run_guarded(general.A, keys, args)
  end
  local raws, vals, pxs = AS.raws, AS.vals, AS.pxs
  local rep = AS.replies[n]
  if rep == nil then
    rep = {{0, 0, 0, 0, 0}, {}}
    for k = 1, n do rep[2][k] = {0, 0, 0, 0, 0} end
    AS.replies[n] = rep
  end
  local per = rep[2]
  -- Each key: read, decide. The combined reply: limits charged 0 only report, unless every
  -- limit is charged 0 (then all do).
  local any_charged, pending, first = false, false, 0
  for k = 1, n do
    local o = 3 * k + 2
    if (P[o + 2] or q) ~= 0 then any_charged = true end
  end
  local b, bkey, retry, reset, all_allowed, never = nil, 0, -1, 0, true, false
  for k = 1, n do
    local o = 3 * k + 2
    local sp, c = P[o], P[o + 1]
    local charge = P[o + 2] or q
    local key = keys[k]
    local raw = rpcall('GETRANGE', key, '0', '63')
    raws[key] = raw
    local ok, a, rem, rt, rs, value, pxat
    if c == 1 then
      ok, a, rem, rt, rs, value, pxat = gcra_fast(raw, sp, charge, force, nil, sec, usec)
    elseif c == 5 then
      ok, a, rem, rt, rs, value, pxat = fixed_fast(raw, sp, charge, force, sec, usec)
    elseif c == 6 then
      ok, a, rem, rt, rs, value, pxat = sliding_fast(raw, sp, charge, force, sec, usec)
    else
      ok, a, rem, rt, rs, value, pxat = log_fast(raw, sp, charge, sec, usec)
    end
    if not ok then
      pre_sec, pre_usec, pre_raws = sec, usec, raws
      return all_fall(keys, args)
    end
    local r = per[k]
    r[1], r[2], r[3], r[4], r[5] = a, c == 1 and sp.burst or sp.limit, rem, rt, rs
    vals[k], pxs[k] = value, pxat
    if value and first == 0 then first = k end
    if charge ~= 0 or not any_charged then
      local key_k = rem
      if charge ~= 0 then key_k = (rem - rem % charge) / charge end
      if b == nil or key_k < bkey or (key_k == bkey and rem < b[3]) then b, bkey = r, key_k end
      if a == 0 then
        all_allowed = false
        if rt == -1 then
          never = true
        elseif rt > retry then
          retry = rt
        end
      end
      if rs > reset then reset = rs end
    end
  end
  local comb = rep[1]
  comb[1], comb[2], comb[3], comb[5] = all_allowed and 1 or 0, b[2], b[3], reset
  comb[4] = (all_allowed or never) and -1 or retry
  local writing = all_allowed and first > 0 and not peek
  -- A key read as '' is missing, or an empty string (WRONGTYPE): the first key written is
  -- told apart by SET NX itself; every other one is asked first, so no write is undone.
  for k = 1, n do
    if (not writing or k ~= first) and raws[keys[k]] == '' and rcall('EXISTS', keys[k]) == 1 then
      pre_sec, pre_usec, pre_raws = sec, usec, raws
      return all_fall(keys, args)
    end
  end
  if writing then
    if ro then
      pre_sec, pre_usec, pre_raws = sec, usec, raws
      return all_fall(keys, args)
    end
    for k = first, n do
      local value = vals[k]
      if value then
        local key = keys[k]
        local done
        if raws[key] == '' then
          done = wcall('SET', key, value, 'NX', 'PXAT', pxs[k])
        else
          done = wcall('SET', key, value, 'PXAT', pxs[k])
        end
        if not done then
          pre_sec, pre_usec, pre_raws = sec, usec, raws
          return all_fall(keys, args)
        end
      end
    end
  end
  for k = 1, n do
    raws[keys[k]] = nil
    vals[k] = nil
  end
  return rep
end

end

---------------------------------------------------------------------------------------------
-- RL.ALL
---------------------------------------------------------------------------------------------

local function all_general(keys, args)
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
    local k = upper(kind)
    if k == 'RENEW' then fail(E.RENEW_IN_ALL) end
    local spec
    if k == 'GCRA' then
      local bw = spec_value('GCRA burst')
      local burst = positive(bw, 'burst')
      local rw = spec_value('GCRA rate')
      local rate = positive(rw, 'rate')
      local pw = spec_value('GCRA period')
      local period = seconds(pw, 'period')
      spec = gcra_params(burst, rate, period)
      fast_gcra(bw, rw, pw, spec)
    elseif k == 'WINDOW' then
      local lw = spec_value('WINDOW limit')
      local limit, digits = positive(lw, 'limit')
      local ww = spec_value('WINDOW window')
      local w = seconds(ww, 'window')
      fast_window(lw, ww, limit, w)
      local algo = 'S'
      local nxt = o.peek()
      if nxt ~= nil and ALGORITHMS[upper(nxt)] then
        algo = ALGORITHMS[upper(nxt)]
        o.next()
      end
      spec = window_spec(limit, w, algo)
      spec.digits = digits
    elseif k == 'LEASE' then
      -- As the module reads a LEASE spec: both words, then each checked, then the token.
      local limit_word = spec_value('LEASE limit')
      local lease_word = spec_value('LEASE lease')
      local limit, digits = positive(limit_word, 'limit')
      local lease = seconds(lease_word, 'lease')
      local token = token_arg(spec_value('LEASE token'))
      spec = {algo = 'E', limit = limit, lease = lease, lease_us = ceil_div(lease, NS_PER_US),
        token = token, digits = digits}
    else
      fail('ERR syntax error: expected GCRA or WINDOW or LEASE for key ' .. i .. ' of ' .. n
        .. ', got \'' .. shown(kind) .. '\'')
    end
    local nxt = o.peek()
    if nxt ~= nil and upper(nxt) == 'COST' then
      o.next()
      spec.cost = non_negative(o.value('COST'), 'COST')
    end
    -- The caps, as the module checks them: after the whole spec, its COST included.
    if spec.algo == 'L' then check_log_limit('L', spec.limit, spec.digits) end
    if spec.algo == 'E' then check_lease_limit(spec.limit, spec.digits) end
    specs[i] = spec
  end
  local req = {quantity = 1}
  for kw in o.next do
    if not take_request_option(req, kw, o, true) then
      if string.upper(kw) == 'RENEW' then fail(E.RENEW_IN_ALL) end
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
      if not (d.verdict == 'allowed' or d.verdict == 'reserved') then
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
  -- Every error before any write: out of memory, then what the fallback cannot reply.
  local pending = false
  if all_allowed and not req.peek then
    for i = 1, n do
      if decisions[i].write then pending = true end
    end
    if pending then check_memory() end
  end
  for _, s in ipairs(specs) do
    if s.algo == 'G' then reply_range(s.burst, 'burst') else reply_range(s.limit, 'limit') end
  end
  local per_key = {}
  for i = 1, n do per_key[i] = five(decisions[i]) end
  local out = {five(combined), per_key}
  if pending then
    for i = 1, n do
      if decisions[i].write then decisions[i].write() end
    end
  end
  return out
end
general.A = all_general

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
      local out = three(refunded, st.limit, 0)
      write('DEL', key)
      return out
    end
    local j = search(k, st.E - 1, function(i)
      local _, c = log_entry(st, i)
      return (c - before) % CUM >= keep
    end)
    local at_us = log_entry(st, j)
    local head, tail = st.head + ENTRY * k, st.head + ENTRY * (j + 1)
    local reset = us_plus_ns_minus_now(at_us, st.W, now.us)
    local out = three(refunded, ssub(st.limit, keep), reset)
    write('SETRANGE', key, tail - 3, pack('<I3', (before + keep) % CUM))
    write('SETRANGE', key, 0, log_header(st.W, st.limit, head, tail, before))
    write('PEXPIREAT', key, expire_at(now, reset))
    return out
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
  -- The reply first: a refund the fallback cannot reply (above 2^53 - 1) writes nothing.
  if after == nil then
    local out = three(refunded, st.algo == 'G' and st.burst or st.limit, 0)
    write('DEL', key)
    return out
  end
  local d = status(key, after, now)
  local out = three(refunded, d.remaining, d.reset)
  write('SET', key, value, 'PXAT', expire_at(now, d.reset))
  return out
end

local function rl_release(keys, args)
  arity('RL.RELEASE', 1 + #keys + #args, 3)
  single_key(keys, 'rl_release')
  local a = argv(keys, args)
  local key = a[1]
  local token = token_arg(a[2])
  local now = clock()
  local now_us = now.us
  local st = load_lease(key)
  if st == nil then return {0, 0, 0} end
  if st.algo ~= 'E' then wrong_algorithm(key, st.algo, 'E') end
  local limit = st.limit
  if st.whole then
    -- The 1.1.0 string layout: the release rewrites the key as a sorted set.
    local scan = lease_scan(st, now_us, token)
    local released = scan.own_n or 0
    if released == 0 then
      return three(0, ssub(limit, scan.held), lease_reset(now_us, scan.all_us, scan.all_rem))
    end
    if #scan.others == 0 then
      local out = three(released, limit, 0)
      write('DEL', key)
      return out
    end
    local last = scan.last_us + ((scan.last_rem > 0) and 1 or 0)
    local out = three(released, ssub(limit, scan.held - released),
      mul(last - now_us, NS_PER_US))
    lease_convert(key, limit, st, scan, token, 0)
    write('PEXPIREAT', key, us_to_pxat(last))
    return out
  end
  local nows = us_text(now_us)
  local own_exp, own_n = lease_own(key, token)
  local held = rcall('ZCOUNT', key, '(' .. nows, '+inf')
  local t = rcall('ZRANGE', key, '-1', '-1', 'WITHSCORES')
  if not own_exp or own_exp <= now_us then
    local top = tonum(t[2])
    return three(0, ssub(limit, held), top > now_us and mul(top - now_us, NS_PER_US) or 0)
  end
  if held == own_n then
    local out = three(own_n, limit, 0)
    write('DEL', key)
    return out
  end
  local last = lease_others_top(key, token, t[1], tonum(t[2]), own_n, now_us)
  local out = three(own_n, ssub(limit, held - own_n), mul(last - now_us, NS_PER_US))
  lease_remove(key, token, 1, own_n)
  lease_drop(key, held - own_n, nows)
  write('PEXPIREAT', key, us_to_pxat(last))
  return out
end

---------------------------------------------------------------------------------------------
-- Registration (FUNCTION LOAD) or dispatch (EVAL / EVALSHA).
---------------------------------------------------------------------------------------------

-- Turns raised errors into error replies: ours as written, the server's (a failed write) as
-- the server sent them, anything else (a bug) as an ERR naming the fallback.
local function guarded(f)
  return function(keys, args)
    ro = false -- not a twin's call (rl_refund, rl_release)
    if not initialised then init() end
    return run_guarded(f, keys, args)
  end
end

do
local function rl_version() return VERSION end

local function rl_config()
  return {'log-max-limit', LOG_MAX_LIMIT, 'lease-max-limit', LEASE_MAX_LIMIT, 'all-max-keys',
    ALL_MAX_KEYS, 'version', VERSION}
end

-- Flags: the writing functions that may grow memory carry none, so the server refuses their
-- FCALL when out of memory (deny-oom, exactly as SET); their twins are no-writes (run by
-- FCALL_RO, under OOM too) and answer the module's OOM error where the call would write;
-- rl_refund and rl_release only free, and keep allow-oom (the module answers them).
local WRITES = {}
local FREES = {'allow-oom'}
local READS = {'no-writes', 'allow-oom', 'allow-stale'}
local TWIN = {'no-writes'}
local function twin(f)
  return function(keys, args)
    if not initialised then init() end
    -- As the writing function on a replica (FCALL_RO would run the twin there): READONLY.
    if find(rcall('INFO', 'replication'), 'role:slave', 1, true) then
      return redis.error_reply(E.READONLY)
    end
    return f(keys, args, true)
  end
end
local FUNCTIONS = {
  {'rl_gcra', rl_gcra, WRITES, true},
  {'rl_window', rl_window, WRITES, true},
  {'rl_all', rl_all, WRITES, true},
  {'rl_refund', rl_refund, FREES},
  {'rl_lease', rl_lease, WRITES, true},
  {'rl_release', rl_release, FREES},
  {'rl_version', rl_version, READS},
  {'rl_config', rl_config, READS},
  {'rl_gcra_ro', twin(rl_gcra), TWIN, true},
  {'rl_window_ro', twin(rl_window), TWIN, true},
  {'rl_all_ro', twin(rl_all), TWIN, true},
  {'rl_lease_ro', twin(rl_lease), TWIN, true},
}

if redis.register_function then
  for i = 1, #FUNCTIONS do
    local f = FUNCTIONS[i]
    local callback = f[4] and f[2] or guarded(f[2])
    redis.register_function{function_name = f[1], callback = callback, flags = f[3]}
  end
else
  eval_mode = true
  init()
  local name = ARGV[1]
  local args = {}
  for i = 2, #ARGV do args[i - 1] = ARGV[i] end
  for _, f in ipairs(FUNCTIONS) do
    if f[1] == name then
      if f[3] == WRITES or f[3] == FREES then
        -- A script cannot carry flags here: refuse on a replica, as FCALL does.
        local role = redis.call('INFO', 'replication')
        if find(role, 'role:slave', 1, true) then return redis.error_reply(E.READONLY) end
      end
      if f[4] then return f[2](KEYS, args) end
      return guarded(f[2])(KEYS, args)
    end
  end
  return redis.error_reply('ERR unknown redis_rl function \'' .. shown(tostring(name)) .. '\'')
end
end
