local lost = redis.call('EXISTS', KEYS[2]) == 0
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
redis.call('SADD', KEYS[1], ARGV[1])
local dead = {}
for _, node in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if node ~= ARGV[1] and redis.call('EXISTS', ARGV[5] .. node) == 0
      and redis.call('SET', ARGV[6] .. node, ARGV[1], 'NX', 'PX', ARGV[4]) then
    dead[#dead + 1] = node
  end
end
return {lost and 1 or 0, dead}
