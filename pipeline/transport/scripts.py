"""Lua scripts: every write that must be atomic or fenced happens here.

Each script touches keys of one hash slot only (see :mod:`.keys`).
"""

#: Append a batch to one partition with dense offsets.
#: KEYS: stream, counter, fence.  ARGV: token ('' = unfenced), n, then per
#: message: ts, flags (bit0 key present, bit1 value present), key, value,
#: nheaders, name1, value1, ...
#: Fenced (changelog) entries carry the writer's token in field ``o`` for audit.
#: Returns the first offset of the batch, or error FENCED.
PRODUCE = """
local token = ARGV[1]
if token ~= '' then
  local cur = redis.call('GET', KEYS[3])
  if cur ~= token then return redis.error_reply('FENCED ' .. tostring(cur)) end
end
local n = tonumber(ARGV[2])
local base = redis.call('INCRBY', KEYS[2], n) - n
local i = 3
for m = 0, n - 1 do
  local fields = {'t', ARGV[i]}
  if token ~= '' then fields[3] = 'o'; fields[4] = token end
  local flags = tonumber(ARGV[i + 1])
  if flags % 2 == 1 then fields[#fields + 1] = 'k'; fields[#fields + 1] = ARGV[i + 2] end
  if flags >= 2 then fields[#fields + 1] = 'v'; fields[#fields + 1] = ARGV[i + 3] end
  local nh = tonumber(ARGV[i + 4])
  i = i + 5
  for h = 1, nh do
    fields[#fields + 1] = 'h:' .. ARGV[i]
    fields[#fields + 1] = ARGV[i + 1]
    i = i + 2
  end
  redis.call('XADD', KEYS[1], (base + m) .. '-1', unpack(fields))
end
return base
"""

#: Commit offsets, fenced by slot ownership; never moves an offset backwards.
#: KEYS: offsets hash, group fence hash.  ARGV: n, then per tp: field, offset, slot, token.
#: Also records the committing token in field ``<tp>@`` (audit).
#: Returns the number of fields written, or error FENCED <slot>.
COMMIT = """
local n = tonumber(ARGV[1])
for j = 0, n - 1 do
  local slot, token = ARGV[2 + j * 4 + 2], ARGV[2 + j * 4 + 3]
  if redis.call('HGET', KEYS[2], slot) ~= token then
    return redis.error_reply('FENCED ' .. slot)
  end
end
local written = 0
for j = 0, n - 1 do
  local field, off = ARGV[2 + j * 4], tonumber(ARGV[2 + j * 4 + 1])
  local cur = tonumber(redis.call('HGET', KEYS[1], field) or '-1')
  if off > cur then
    redis.call('HSET', KEYS[1], field, off, field .. '@', ARGV[2 + j * 4 + 3])
    written = written + 1
  end
end
return written
"""

#: Take a slot whose lease is free. KEYS: lease, group fence, gens.
#: ARGV: worker id, slot, lease ms. Returns the new token or false.
ACQUIRE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local gen = redis.call('HINCRBY', KEYS[3], ARGV[2], 1)
local token = ARGV[1] .. ':' .. gen
redis.call('SET', KEYS[1], token, 'PX', ARGV[3])
redis.call('HSET', KEYS[2], ARGV[2], token)
return token
"""

#: Renew a lease. KEYS: lease, group fence. ARGV: token, slot, lease ms.
#: 1 renewed; 2 re-taken (lease had expired, nobody took the slot); 0 lost.
RENEW = """
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[3]); return 1 end
if not cur and redis.call('HGET', KEYS[2], ARGV[2]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3]); return 2
end
return 0
"""

#: Give a slot up (clean shutdown). KEYS: lease. ARGV: token.
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

#: Declare a topic. KEYS: topics hash. ARGV: topic, partitions.
#: Returns the partition count stored (the existing one if already declared).
DECLARE = """
redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
return tonumber(redis.call('HGET', KEYS[1], ARGV[1]))
"""

#: Compaction step for one partition: delete the given ids, but never the
#: tail entry. KEYS: stream. ARGV: ids...  Returns number deleted.
DELETE_EXCEPT_TAIL = """
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
if #last == 0 then return 0 end
local tail = last[1][1]
local ids = {}
for i = 1, #ARGV do if ARGV[i] ~= tail then ids[#ids + 1] = ARGV[i] end end
if #ids == 0 then return 0 end
return redis.call('XDEL', KEYS[1], unpack(ids))
"""

#: Point a partition's changelog fence at a new owner, never backwards.
#: KEYS: fence. ARGV: token ("<worker>:<gen>"), gen. Returns 1 set, 0 refused.
SET_FENCE = """
local cur = redis.call('GET', KEYS[1])
if cur then
  local g = tonumber(string.match(cur, ':(%d+)$') or '0')
  if g > tonumber(ARGV[2]) then return 0 end
end
redis.call('SET', KEYS[1], ARGV[1])
return 1
"""
