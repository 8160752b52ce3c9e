local current = redis.call('HGET', KEYS[3], ARGV[1]) or ''
if current ~= ARGV[2] then
  return {0, current, redis.call('HGET', KEYS[1], ARGV[1]) or ''}
end
if ARGV[4] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[3], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[4])
  redis.call('HSET', KEYS[3], ARGV[1], ARGV[3])
end
if ARGV[5] == '' then
  redis.call('ZREM', KEYS[2], ARGV[1])
else
  redis.call('ZADD', KEYS[2], ARGV[5], ARGV[1])
end
redis.call('PUBLISH', ARGV[6], cmsgpack.pack({ARGV[7], ARGV[8], ARGV[1], ARGV[4], ARGV[3]}))
return {1}
