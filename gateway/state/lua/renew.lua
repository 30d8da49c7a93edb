-- Extend leases this replica still holds (never revive an expired one).
-- KEYS: pairs of (tenant leases, slots)   ARGV: ttl_s, then per pair: lease, slot member
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local until_ = string.format('%.6f', now + tonumber(ARGV[1]))
for i = 1, #KEYS, 2 do
  local j = i + 1
  redis.call('ZADD', KEYS[i], 'XX', 'GT', until_, ARGV[j])
  redis.call('EXPIRE', KEYS[i], math.ceil(tonumber(ARGV[1])) + 60)
  redis.call('ZADD', KEYS[j], 'XX', 'GT', until_, ARGV[j + 1])
end
return 1
