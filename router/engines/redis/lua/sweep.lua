local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1])
for _, topic in ipairs(due) do
  redis.call('HDEL', KEYS[1], topic)
  redis.call('HDEL', KEYS[3], topic)
  redis.call('ZREM', KEYS[2], topic)
  redis.call('PUBLISH', ARGV[4], cmsgpack.pack({ARGV[2], ARGV[3], topic, '', ''}))
end
return #due
