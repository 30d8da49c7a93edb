-- The GCRA rate check of admit.lua alone, on the same key: a request that runs no
-- code (a proxy pass-through) spends one unit of the tenant's rate and nothing else.
-- KEYS: tat   ARGV: rate_per_s, burst   -> {"ok"|"rate", retry_s}
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local interval = 1 / rate
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
local allow_at = tat - (burst - 1) * interval
if now < allow_at then return {'rate', string.format('%.6f', allow_at - now)} end
local new_tat = tat + interval
redis.call('SET', KEYS[1], string.format('%.6f', new_tat), 'PX',
  math.ceil((new_tat - now) * 1000) + 1000)
return {'ok', '0'}
