if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local testaments = redis.call('HGETALL', KEYS[2])
local wills = redis.call('HGETALL', KEYS[3])
redis.call('DEL', KEYS[2], KEYS[3])
local prefix = ARGV[1] .. ':'
local left = {}
for _, key in ipairs({KEYS[4], KEYS[5]}) do
  local found = redis.call('HGETALL', key)
  for i = 1, #found, 2 do
    if string.sub(found[i], 1, #prefix) == prefix then
      redis.call('HDEL', key, found[i])
      if key == KEYS[4] then
        left[#left + 1] = found[i]
        left[#left + 1] = found[i + 1]
      end
    end
  end
end
redis.call('SET', ARGV[5], ARGV[2], 'PX', ARGV[6])
local inherited = redis.call('HGET', KEYS[6], ARGV[1])
if inherited then
  local merged = cmsgpack.unpack(redis.call('HGET', KEYS[6], ARGV[2]) or '\144')
  for _, pattern in ipairs(cmsgpack.unpack(inherited)) do
    merged[#merged + 1] = pattern
  end
  redis.call('HSET', KEYS[6], ARGV[2], cmsgpack.pack(merged))
  redis.call('HDEL', KEYS[6], ARGV[1])
end
local adopted = {}
for k = 7, #KEYS do
  local ids = {}
  local owners = redis.call('HGETALL', KEYS[k])
  for i = 1, #owners, 2 do
    if owners[i + 1] == ARGV[1] then
      redis.call('HSET', KEYS[k], owners[i], ARGV[2])
      ids[#ids + 1] = owners[i]
    end
  end
  adopted[#adopted + 1] = ids
end
redis.call('PUBLISH', ARGV[4], cmsgpack.pack({ARGV[3], ARGV[1], left, ARGV[2]}))
return {testaments, wills, adopted}
