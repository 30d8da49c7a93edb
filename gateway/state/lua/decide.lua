-- Decide a pending approval once, whichever replica's decider gets there first.
-- Fields hold JSON values. KEYS: approval hash, pending zset
-- ARGV: target status, approver, reason, approval id (all but the id JSON-encoded)
-- -> {"changed"} | {"same"} | {"not_found"} | {"expired"} | {"conflict", status}
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
if redis.call('EXISTS', KEYS[1]) == 0 then return {'not_found'} end
local status = redis.call('HGET', KEYS[1], 'status')
local expires = tonumber(redis.call('HGET', KEYS[1], 'expires_at'))
if status == '"pending"' and now >= expires then
  redis.call('HSET', KEYS[1], 'status', '"expired"')
  redis.call('ZREM', KEYS[2], ARGV[4])
  status = '"expired"'
end
if status == '"expired"' then return {'expired'} end
if status ~= '"pending"' then
  local done = status
  if status == '"executed"' then done = '"approved"' end
  if done == ARGV[1] then return {'same'} end
  return {'conflict', status}
end
redis.call('HSET', KEYS[1], 'status', ARGV[1], 'decided_at', string.format('%.6f', now),
  'approver', ARGV[2], 'decision_reason', ARGV[3])
redis.call('ZREM', KEYS[2], ARGV[4])
return {'changed'}
