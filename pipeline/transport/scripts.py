"""Lua scripts: every write that must be atomic or fenced happens here.

Each script touches keys of one hash slot only (see :mod:`.keys`).
"""

#: Appending one partition's entries with dense offsets, shared by PRODUCE and
#: PRODUCE_MANY: ``append(stream, counter, token, i)`` reads ARGV from ``i``: n,
#: then per message: ts, flags (bit0 key present, bit1 value present), key, value,
#: nheaders, name1, value1, ...; returns the first offset and the index after them.
#: Fenced (changelog) entries carry the writer's token in field ``o`` for audit.
#: The common entry (key and value, no headers) is written with one XADD of fixed
#: fields, without building a field table for ``unpack``: the same entry, Redis's
#: time per entry 1.1-1.7x lower (6-8 µs against 9-10 µs, of which XADD itself is
#: ~2 µs; bench/produce_script.py).
_APPEND = """
local function append(stream, counter, token, i)
  local fenced = token ~= ''
  local n = tonumber(ARGV[i])
  local base = redis.call('INCRBY', counter, n) - n
  i = i + 1
  for m = 0, n - 1 do
    local id = (base + m) .. '-1'
    if ARGV[i + 1] == '3' and ARGV[i + 4] == '0' then
      -- the common entry: key and value, no headers
      if fenced then
        redis.call('XADD', stream, id, 't', ARGV[i], 'o', token, 'k', ARGV[i + 2], 'v', ARGV[i + 3])
      else
        redis.call('XADD', stream, id, 't', ARGV[i], 'k', ARGV[i + 2], 'v', ARGV[i + 3])
      end
      i = i + 5
    else
      local fields = {'t', ARGV[i]}
      if fenced then fields[3] = 'o'; fields[4] = token end
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
      redis.call('XADD', stream, id, unpack(fields))
    end
  end
  return base, i
end
"""

#: Append a batch to one partition with dense offsets.
#: KEYS: stream, counter, fence.  ARGV: token ('' = unfenced), then what
#: ``append`` reads (n, the messages).
#: Returns the first offset of the batch, or error FENCED.
PRODUCE = _APPEND + """
local token = ARGV[1]
if token ~= '' then
  local cur = redis.call('GET', KEYS[3])
  if cur ~= token then return redis.error_reply('FENCED ' .. tostring(cur)) end
end
local base = append(KEYS[1], KEYS[2], token, 2)
return base
"""

#: PRODUCE for several partitions of one server in one call (a producer's flush:
#: pipeline/transport/produce.py): KEYS: stream, counter, fence of each partition;
#: ARGV: each partition's PRODUCE ARGV, one after the other. Returns one answer per
#: partition, in order: its first offset, or the text of the error that partition
#: alone met ('FENCED <token>', or a command's error), its entries then not written
#: (a command's error may leave some: as PRODUCE's would). A Redis Cluster keeps
#: one PRODUCE per partition: its keys are in one slot, the partitions' are not.
PRODUCE_MANY = _APPEND + """
local function skip(i)
  local n = tonumber(ARGV[i])
  i = i + 1
  for m = 1, n do i = i + 5 + 2 * tonumber(ARGV[i + 4]) end
  return i
end
local out = {}
local i = 1
for p = 0, #KEYS / 3 - 1 do
  local token = ARGV[i]
  local cur = token
  if token ~= '' then cur = redis.call('GET', KEYS[p * 3 + 3]) end
  if cur ~= token then
    out[p + 1] = 'FENCED ' .. tostring(cur)
    i = skip(i + 1)
  else
    local ok, base, after = pcall(append, KEYS[p * 3 + 1], KEYS[p * 3 + 2], token, i + 1)
    if ok then
      out[p + 1] = base
      i = after
    else
      out[p + 1] = type(base) == 'table' and (base.err or 'ERR') or tostring(base)
      i = skip(i + 1)
    end
  end
end
return out
"""

#: Commit offsets into the group's one hash (the layout before ADR 0004; the
#: consumer commits with COMMIT_PART), fenced by slot ownership; never moves an offset backwards.
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

#: Commit offsets of one partition index (docs/adr/0004-group-state-by-partition.md),
#: fenced by the copy of the fence tokens kept next to them; never moves an offset
#: backwards. KEYS: the partition index's offsets hash, its fence copy (one slot).
#: ARGV: n, then per tp: field, offset, fence field, token, the token's generation.
#: A token is refused when the copy holds another whose generation is not lower
#: (the new owner wrote its copy before it read the offsets); a newer one replaces
#: the copy. Records the committing token in ``<tp>@``. Returns the number of
#: fields written, or error FENCED <fence field>.
COMMIT_PART = """
local n = tonumber(ARGV[1])
for j = 0, n - 1 do
  local b = 2 + j * 5
  local cur = redis.call('HGET', KEYS[2], ARGV[b + 2])
  if cur and cur ~= ARGV[b + 3] then
    local g = tonumber(string.match(cur, ':(%d+)$') or '0')
    if g >= tonumber(ARGV[b + 4]) then return redis.error_reply('FENCED ' .. ARGV[b + 2]) end
  end
end
local written = 0
for j = 0, n - 1 do
  local b = 2 + j * 5
  local field, off, token = ARGV[b], tonumber(ARGV[b + 1]), ARGV[b + 3]
  if redis.call('HGET', KEYS[2], ARGV[b + 2]) ~= token then redis.call('HSET', KEYS[2], ARGV[b + 2], token) end
  local cur = tonumber(redis.call('HGET', KEYS[1], field) or '-1')
  if off > cur then
    redis.call('HSET', KEYS[1], field, off, field .. '@', token)
    written = written + 1
  end
end
return written
"""

#: Copy a fence token next to the commits of one partition index: the new owner,
#: before it reads the committed offsets. Never backwards. KEYS: the fence copy.
#: ARGV: fence field, token, its generation. 1 set (or held already), 0 a token of
#: a generation not lower holds it.
SET_COMMIT_FENCE = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur and cur ~= ARGV[2] then
  local g = tonumber(string.match(cur, ':(%d+)$') or '0')
  if g >= tonumber(ARGV[3]) then return 0 end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
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

# -- dynamic group membership (see membership.py) ----------------------------
# Every script takes the same KEYS: live (zset member → lease deadline), info
# (member → subscription JSON), acks (member → generation revoked for), state
# (gen, changed_at, sync_deadline, rebalances), assign (one assignment per
# generation), group fence (field → token).  Time is the server's (TIME), so
# members' clocks do not matter.
_MEMBERSHIP_LIB = """
local live, info, acks, state, assign, fence = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function bump(now, sync_ms)
  local gen = redis.call('HINCRBY', state, 'gen', 1)
  redis.call('HSET', state, 'changed_at', now, 'sync_deadline', now + sync_ms)
  return gen
end
local function drop(m)
  redis.call('ZREM', live, m)
  redis.call('HDEL', info, m)
  redis.call('HDEL', acks, m)
  local f = redis.call('HGETALL', fence)
  local prefix = m .. ':'
  for i = 1, #f, 2 do
    if string.sub(f[i + 1], 1, #prefix) == prefix then redis.call('HDEL', fence, f[i]) end
  end
end
-- expel members whose lease ran out, and, once the sync deadline of a generation
-- without an assignment passed, the members that did not revoke for it
local function expire(now, sync_ms)
  local n = 0
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', live, '-inf', now)) do drop(m); n = n + 1 end
  local gen = redis.call('HGET', state, 'gen')
  local deadline = tonumber(redis.call('HGET', state, 'sync_deadline') or '0')
  if gen and redis.call('HGET', assign, 'gen') ~= gen and deadline > 0 and now > deadline then
    for _, m in ipairs(redis.call('ZRANGE', live, 0, -1)) do
      if redis.call('HGET', acks, m) ~= gen then drop(m); n = n + 1 end
    end
  end
  if n > 0 then
    redis.call('HINCRBY', state, 'expelled', n)
    bump(now, sync_ms)
  end
  return n
end
"""

#: Join or update the subscription. ARGV: member, info JSON, lease ms, sync ms.
#: Bumps the generation if the member is new or its subscription changed.
#: Returns the current generation.
MEMBER_JOIN = _MEMBERSHIP_LIB + """
local m, js, lease, sync = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()
expire(now, sync)
local known = redis.call('ZSCORE', live, m)
redis.call('ZADD', live, now + lease, m)
local old = redis.call('HGET', info, m)
redis.call('HSET', info, m, js)
if (not known) or old ~= js then return bump(now, sync) end
return tonumber(redis.call('HGET', state, 'gen'))
"""

#: Renew the member's lease and expel the dead. ARGV: member, lease ms, sync ms.
#: Returns {1 | -1 (not a member: expelled), generation, generation of the
#: assignment written}.
MEMBER_HEARTBEAT = _MEMBERSHIP_LIB + """
local m, lease, sync = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms()
local status = -1
if redis.call('ZSCORE', live, m) then
  redis.call('ZADD', live, 'XX', now + lease, m)
  status = 1
end
expire(now, sync)
if not redis.call('ZSCORE', live, m) then status = -1 end
return {status, tonumber(redis.call('HGET', state, 'gen') or '0'), tonumber(redis.call('HGET', assign, 'gen') or '0')}
"""

#: The member revoked everything for a generation. ARGV: member, gen.
#: Returns 1, 0 (generation moved on) or -1 (not a member).
MEMBER_ACK = _MEMBERSHIP_LIB + """
if not redis.call('ZSCORE', live, ARGV[1]) then return -1 end
if redis.call('HGET', state, 'gen') ~= ARGV[2] then return 0 end
redis.call('HSET', acks, ARGV[1], ARGV[2])
return 1
"""

#: Write the assignment of a generation, once, with the fence entries of every
#: active topic-partition. ARGV: gen, leader, n, member1..n, json1..n, nf,
#: field1, token1, ...  Refused (0) unless gen is current, no assignment was
#: written for it, the live members are exactly member1..n and all revoked.
MEMBER_ASSIGN = _MEMBERSHIP_LIB + """
local gen = ARGV[1]
if redis.call('HGET', state, 'gen') ~= gen then return 0 end
if redis.call('HGET', assign, 'gen') == gen then return 0 end
local n = tonumber(ARGV[3])
if redis.call('ZCARD', live) ~= n then return 0 end
for i = 1, n do
  local m = ARGV[3 + i]
  if not redis.call('ZSCORE', live, m) or redis.call('HGET', acks, m) ~= gen then return 0 end
end
local now = now_ms()
local f = redis.call('HGETALL', fence)
for i = 1, #f, 2 do
  if string.find(f[i], '|', 1, true) then redis.call('HDEL', fence, f[i]) end
end
local j = 4 + 2 * n
local nf = tonumber(ARGV[j])
for i = 0, nf - 1 do redis.call('HSET', fence, ARGV[j + 1 + 2 * i], ARGV[j + 2 + 2 * i]) end
redis.call('DEL', assign)
local changed = tonumber(redis.call('HGET', state, 'changed_at') or now)
redis.call('HSET', assign, 'gen', gen, 'leader', ARGV[2], 'at', now, 'duration_ms', now - changed)
for i = 1, n do redis.call('HSET', assign, ARGV[3 + i], ARGV[3 + n + i]) end
redis.call('HINCRBY', state, 'rebalances', 1)
return 1
"""

#: Leave the group (clean shutdown). ARGV: member, sync ms. Returns the new gen.
MEMBER_LEAVE = _MEMBERSHIP_LIB + """
if not redis.call('ZSCORE', live, ARGV[1]) then return 0 end
drop(ARGV[1])
return bump(now_ms(), tonumber(ARGV[2]))
"""
