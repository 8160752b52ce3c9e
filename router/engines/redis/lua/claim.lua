local holder = redis.call('HGET', KEYS[2], ARGV[1])
if holder and holder ~= ARGV[5] then
  return false
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[5])
local old = redis.call('HGET', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if old and old ~= ARGV[2] then
  redis.call('PUBLISH', ARGV[3] .. old, ARGV[4])
  return old
end
return ''
