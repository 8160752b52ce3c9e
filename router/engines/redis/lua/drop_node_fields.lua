local n = 0
for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
  if string.sub(field, 1, #ARGV[1]) == ARGV[1] then
    redis.call('HDEL', KEYS[1], field)
    n = n + 1
  end
end
return n
