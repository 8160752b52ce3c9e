if KEYS[4] and redis.call('EXISTS', KEYS[4]) == 1 then return 0 end
local fields = {}
for i = 4, #ARGV do fields[#fields + 1] = ARGV[i] end
if #fields == 0 then fields = redis.call('HKEYS', KEYS[1]) end
local changed = 0
for _, field in ipairs(fields) do
  local raw = redis.call('HGET', KEYS[1], field)
  if raw then
    local entry = cjson.decode(raw)
    local kept = {}
    for _, callee in ipairs(entry.callees) do
      if callee[1] ~= ARGV[2] or (ARGV[3] ~= '' and callee[2] ~= ARGV[3]) then
        kept[#kept + 1] = callee
      end
    end
    if #kept < #entry.callees then
      local seq = redis.call('INCR', KEYS[2])
      local value = false
      if #kept == 0 then
        redis.call('HDEL', KEYS[1], field)
      else
        entry.callees = kept
        value = cjson.encode(entry)
        redis.call('HSET', KEYS[1], field, value)
      end
      redis.call('PUBLISH', KEYS[3], cjson.encode({ARGV[1], seq, field, value}))
      changed = changed + 1
    end
  end
end
return changed
