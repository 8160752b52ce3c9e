local rules = #KEYS - 1
local first = 2 * rules + 1
local events = (#ARGV - 2 * rules) / 2
local sequence = redis.call('INCRBY', KEYS[1], events) - events
local touched = {}
for i = first, #ARGV, 2 do
  sequence = sequence + 1
  local entry = string.format('%d ', sequence) .. ARGV[i + 1]
  for rule in string.gmatch(ARGV[i], '%d+') do
    local r = tonumber(rule) + 1
    redis.call('LPUSH', KEYS[r + 1], entry)
    touched[r] = true
  end
end
for r in pairs(touched) do
  redis.call('LTRIM', KEYS[r + 1], 0, tonumber(ARGV[r]) - 1)
  local age = tonumber(ARGV[rules + r])
  if age > 0 then redis.call('PEXPIRE', KEYS[r + 1], age) end
end
return events
