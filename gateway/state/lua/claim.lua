-- Claim a key once (webhook ids of decision callbacks).   KEYS: key   ARGV: value, ttl_ms
-- Returns false for the first claim (the key then holds value for ttl_ms), else the
-- value the first claim stored. (SET NX GET would do it in one command on Redis >= 7.)
local held = redis.call('GET', KEYS[1])
if held then
  return held
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2], 'NX')
return false
