#!lua name=rl_floor
-- The least any exact, epoch-aligned FIXED window can cost as a Redis Function
-- (bench/cost.py measures it next to the fallback): read the clock (TIME), store one value with
-- an absolute expiry (SET ... NX PXAT), reply five integers. No argument is parsed and nothing
-- is decided: a floor, not a limiter.
local reply = {1, 100, 99, -1, 1000}
redis.register_function{function_name = 'rl_floor', flags = {'allow-oom'},
  callback = function(keys)
    local t = redis.call('TIME')
    redis.call('SET', keys[1], '\255rlF' .. t[2], 'NX', 'PXAT', t[1] .. '000')
    return reply
  end}
