-- Expire one approval if it is still pending and due (one replica wins; it audits).
-- KEYS: approval hash, pending zset   ARGV: approval id, now   -> 1 if this call expired it
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= '"pending"' then
  redis.call('ZREM', KEYS[2], ARGV[1])
  return 0
end
if tonumber(redis.call('HGET', KEYS[1], 'expires_at')) > tonumber(ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], 'status', '"expired"')
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
