-- One global slot, shared fairly: granted when one is free and no *other* waiting
-- tenant holds fewer slots than this one (so freed slots go to the least-served
-- tenant: max-min fairness). A refused caller is recorded as waiting for wait_ttl.
-- Members are "tenant|lease".
-- KEYS: slots, waiting   ARGV: tenant, lease, cap, ttl_s, wait_ttl_s   -> 1 | 0
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local floor = string.format('%.6f', now)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', floor)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', floor)
local me, member = ARGV[1], ARGV[1] .. '|' .. ARGV[2]
local cap, ttl, wait_ttl = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])

local holders = redis.call('ZRANGE', KEYS[1], 0, -1)
local held = {}
for _, m in ipairs(holders) do
  local owner = string.match(m, '^(.*)|[^|]*$')
  held[owner] = (held[owner] or 0) + 1
end
local mine = held[me] or 0
local ok = #holders < cap
if ok then
  for _, w in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
    local owner = string.match(w, '^(.*)|[^|]*$')
    if owner ~= me and (held[owner] or 0) < mine then
      ok = false
      break
    end
  end
end
if ok then
  redis.call('ZADD', KEYS[1], string.format('%.6f', now + ttl), member)
  redis.call('ZREM', KEYS[2], member)
  return 1
end
redis.call('ZADD', KEYS[2], string.format('%.6f', now + wait_ttl), member)
return 0
