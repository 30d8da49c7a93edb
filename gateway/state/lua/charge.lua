-- Add measured CPU-seconds to this minute's bucket.   KEYS: cpu   ARGV: cpu_s
local t = redis.call('TIME')
local minute = math.floor(tonumber(t[1]) / 60)
redis.call('HINCRBYFLOAT', KEYS[1], string.format('%d', minute), ARGV[1])
redis.call('EXPIRE', KEYS[1], 3720)
return 1
