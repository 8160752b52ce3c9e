local raw = redis.call('HGET', KEYS[1], ARGV[1])
local entry = {policy = ARGV[2], callees = {}}
if raw then
  entry = cjson.decode(raw)
  if entry.policy ~= ARGV[2] then
    return {'wamp.error.procedure_exists_with_different_invocation_policy',
            'registered with policy ' .. entry.policy}
  end
  if ARGV[2] == 'single' then
    return {'wamp.error.procedure_already_exists', 'registered on node ' .. entry.callees[1][1]}
  end
  for _, callee in ipairs(entry.callees) do
    if callee[1] == ARGV[3] and callee[2] == ARGV[4] then
      return {'wamp.error.procedure_already_exists', 'this session registered it already'}
    end
  end
end
local seq = redis.call('INCR', KEYS[2])
entry.callees[#entry.callees + 1] = {ARGV[3], ARGV[4], ARGV[5], seq, ARGV[6]}
local value = cjson.encode(entry)
redis.call('HSET', KEYS[1], ARGV[1], value)
redis.call('PUBLISH', KEYS[3], cjson.encode({ARGV[7], seq, ARGV[1], value}))
return {'', seq}
