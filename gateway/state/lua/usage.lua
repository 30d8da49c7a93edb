-- One tenant's usage (read-only apart from dropping what expired).
-- KEYS: tat, day, cpu, leases   ARGV: rate_per_s, burst
-- -> {concurrent, cpu_s, executions_today, rate_remaining}
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local interval = 1 / rate
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
local remaining = math.max(math.floor((now - (tat - burst * interval)) / interval), 0)

local minute = math.floor(now / 60)
local used = 0
local buckets = redis.call('HGETALL', KEYS[3])
for i = 1, #buckets, 2 do
  if tonumber(buckets[i]) > minute - 60 then used = used + tonumber(buckets[i + 1]) end
end
local count = 0
if tonumber(redis.call('HGET', KEYS[2], 'd') or '-1') == math.floor(now / 86400) then
  count = tonumber(redis.call('HGET', KEYS[2], 'n') or '0')
end
local live = redis.call('ZCOUNT', KEYS[4], '(' .. string.format('%.6f', now), '+inf')
return {live, string.format('%.6f', used), count, remaining}
