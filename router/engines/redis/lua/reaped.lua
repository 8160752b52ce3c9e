if redis.call('EXISTS', KEYS[1]) == 0 then redis.call('SREM', KEYS[3], ARGV[1]) end
redis.call('DEL', KEYS[2])
return 0
