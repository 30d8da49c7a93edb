-- One tenant's admission, atomically: GCRA rate, CPU-seconds in the rolling hour
-- (per-minute buckets), executions this UTC day, concurrency leases. Nothing is
-- spent unless every check passes. The clock is Redis's own, shared by replicas.
-- KEYS: tat, day, cpu, leases   ARGV: rate_per_s, burst, max_concurrent,
--       cpu_s_per_hour, executions_per_day, lease, ttl_s
-- -> {"ok"|limit, retry_s}
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local max_conc, cpu_limit, day_limit = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local lease, ttl = ARGV[6], tonumber(ARGV[7])

local interval = 1 / rate
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
local allow_at = tat - (burst - 1) * interval
if now < allow_at then return {'rate', string.format('%.6f', allow_at - now)} end

local minute = math.floor(now / 60)
local used, oldest = 0, nil
local buckets = redis.call('HGETALL', KEYS[3])
for i = 1, #buckets, 2 do
  local m = tonumber(buckets[i])
  if m <= minute - 60 then
    redis.call('HDEL', KEYS[3], buckets[i])
  else
    used = used + tonumber(buckets[i + 1])
    if oldest == nil or m < oldest then oldest = m end
  end
end
if used >= cpu_limit then
  return {'cpu', string.format('%.6f', (oldest + 60) * 60 - now)}
end

local day = math.floor(now / 86400)
local count = 0
if tonumber(redis.call('HGET', KEYS[2], 'd') or '-1') == day then
  count = tonumber(redis.call('HGET', KEYS[2], 'n') or '0')
end
if count >= day_limit then return {'day', string.format('%.6f', (day + 1) * 86400 - now)} end

redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
if redis.call('ZCARD', KEYS[4]) >= max_conc then return {'concurrency', '1'} end

local new_tat = tat + interval
redis.call('SET', KEYS[1], string.format('%.6f', new_tat), 'PX',
  math.ceil((new_tat - now) * 1000) + 1000)
redis.call('HSET', KEYS[2], 'd', string.format('%d', day), 'n', string.format('%d', count + 1))
redis.call('EXPIRE', KEYS[2], 172800)
redis.call('ZADD', KEYS[4], string.format('%.6f', now + ttl), lease)
redis.call('EXPIRE', KEYS[4], math.ceil(ttl) + 60)
return {'ok', '0'}
