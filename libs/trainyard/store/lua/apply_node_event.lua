-- Fold one NODES-stream event into the node projection, exactly once.
-- KEYS[1] = key prefix.  ARGV[1] = stream seq, ARGV[2] = event type,
-- ARGV[3] = node id, ARGV[4] = event time, ARGV[5..] = per-type fields.
-- Returns 1 if applied, 0 if not (already applied); -1 or -2 if refused (below).
-- Node states: healthy (the only schedulable one), suspect, cordoned,
-- draining, repair, lost.
local p = KEYS[1]
-- Guard (the last two ARGV, taken off before the fold reads the rest): the
-- epoch the projector folds into, and the sequence the projection must hold
-- before this event.  A missing or different epoch (Redis wiped, or rebuilt
-- by another projector) returns -1, a projection that does not end where the
-- projector continues (a gap) returns -2; either changes nothing.  An event
-- type of '' (a message the projector cannot read) only moves last_seq.
local after = tonumber(table.remove(ARGV))
local epoch = table.remove(ARGV)
local proj = redis.call('HMGET', p .. 'proj:nodes', 'epoch', 'last_seq')
if proj[1] ~= epoch then return -1 end
local seq = tonumber(ARGV[1])
local last = tonumber(proj[2] or '0')
if seq <= last then return 0 end
if last ~= after then return -2 end
redis.call('HSET', p .. 'proj:nodes', 'last_seq', seq)
if ARGV[2] == '' then return 0 end

local kind, nid, at = ARGV[2], ARGV[3], ARGV[4]
local nk = p .. 'node:' .. nid
local state = redis.call('HGET', nk, 'state')
local schedulable = {healthy = true}

-- Keep the schedulable-capacity total in step with the node's state.
local function set_state(new, reason)
  local t = redis.call('HGET', nk, 'gpu_type')
  local n = tonumber(redis.call('HGET', nk, 'gpus') or '0')
  if state and schedulable[state] then redis.call('HINCRBY', p .. 'capacity', t, -n) end
  if schedulable[new] then redis.call('HINCRBY', p .. 'capacity', t, n) end
  redis.call('HSET', nk, 'state', new, 'state_reason', reason, 'state_since', at)
  redis.call('HSET', p .. 'nodestate', nid, new)
  state = new
end

if kind == 'NodeRegistered' then
  if state and schedulable[state] then
    local t = redis.call('HGET', nk, 'gpu_type')
    local n = tonumber(redis.call('HGET', nk, 'gpus') or '0')
    redis.call('HINCRBY', p .. 'capacity', t, -n)
    state = 'registering'
  end
  redis.call('HSET', nk, 'info', ARGV[5], 'gpu_type', ARGV[6], 'gpus', ARGV[7],
    'cluster', ARGV[8], 'boot_id', ARGV[9], 'registered_at', at)
  redis.call('SADD', p .. 'nodes', nid)
  redis.call('HSET', p .. 'nodeinfo', nid, ARGV[5])
  -- One character per GPU: '.' free, '#' held (kept by apply_job_event.lua).
  local map = redis.call('HGET', p .. 'gpumap', nid) or ''
  local gpus = tonumber(ARGV[7])
  if #map < gpus then map = map .. string.rep('.', gpus - #map) end
  redis.call('HSET', p .. 'gpumap', nid, map)
  -- A node that comes back keeps an operator's or health's hold on it.
  local held = {cordoned = true, draining = true, repair = true}
  if state and held[state] then return 1 end
  set_state('healthy', 'registered')
elseif kind == 'NodeLost' then
  if not state or state == 'lost' then return 1 end
  if redis.call('HGET', nk, 'boot_id') ~= ARGV[5] then return 1 end
  set_state('lost', ARGV[6])
elseif kind == 'NodeStateChanged' then
  -- ARGV[5] = new state, ARGV[6] = reason, ARGV[7] = by.  Decided by the
  -- health service, which is the only writer of this event.
  if not state then return 1 end
  set_state(ARGV[5], ARGV[6])
  redis.call('HSET', nk, 'state_by', ARGV[7])
end
return 1
