-- Fold one JOBS-stream event into the job projection, exactly once.
-- The rules are trainyard.core.lifecycle.apply's, field for field (a property
-- test holds the two equal); job_event_args in projector.py builds ARGV.
-- KEYS[1] = key prefix.  ARGV[1] = stream seq, ARGV[2] = event type,
-- ARGV[3] = job id, ARGV[4] = event time, ARGV[5..] = per-type fields.
-- Returns 1 if applied, 0 if not (already applied: seq not beyond last_seq,
-- or fenced by the job's status or current run); -1 or -2 if refused (below).
local p = KEYS[1]
-- Guard (the last two ARGV, taken off before the fold reads the rest): the
-- epoch the projector folds into, and the sequence the projection must hold
-- before this event.  A missing or different epoch (Redis wiped, or rebuilt
-- by another projector) returns -1, a projection that does not end where the
-- projector continues (a gap) returns -2; either changes nothing.  An event
-- type of '' (a message the projector cannot read) only moves last_seq.
local after = tonumber(table.remove(ARGV))
local epoch = table.remove(ARGV)
local proj = redis.call('HMGET', p .. 'proj:jobs', 'epoch', 'last_seq')
if proj[1] ~= epoch then return -1 end
local seq = tonumber(ARGV[1])
local last = tonumber(proj[2] or '0')
if seq <= last then return 0 end
if last ~= after then return -2 end
redis.call('HSET', p .. 'proj:jobs', 'last_seq', seq)
if ARGV[2] == '' then return 0 end

local kind, jid, at = ARGV[2], ARGV[3], ARGV[4]
local jk = p .. 'job:' .. jid
local status = redis.call('HGET', jk, 'status')
local active = {admitted = true, placed = true, running = true}

-- A number as Redis should store it: every digit of the double, so a reader
-- gets back exactly the value the Python fold computes.
local function exact(x)
  return string.format('%.17g', x)
end

-- The pending index, overall and per queue (pendingq:<tenant>/<queue>, with the
-- set pendingqueues naming the queues that have pending jobs), so a cycle can
-- read the oldest jobs of every queue however deep one queue's backlog is.
local function queue_of()
  local h = redis.call('HMGET', jk, 'tenant', 'queue')
  return (h[1] or '') .. '/' .. (h[2] or '')
end
local function add_pending(order)
  redis.call('ZADD', p .. 'pending', order, jid)
  local q = queue_of()
  redis.call('ZADD', p .. 'pendingq:' .. q, order, jid)
  redis.call('SADD', p .. 'pendingqueues', q)
end
local function remove_pending()
  redis.call('ZREM', p .. 'pending', jid)
  local q = queue_of()
  redis.call('ZREM', p .. 'pendingq:' .. q, jid)
  if redis.call('ZCARD', p .. 'pendingq:' .. q) == 0 then redis.call('SREM', p .. 'pendingqueues', q) end
end

-- A new status; why the job waited (admission's word on a pending job,
-- placement's on an admitted one, kept beside the job hash) no longer holds.
-- The status indexes keep the job under its status, overall (bystatus:<status>)
-- and per tenant (tbystatus:<tenant>:<status>), scored like the jobs index, so
-- a filtered list finds every match whatever its age.  A job that finishes
-- joins the index finished, scored by when it finished: what the retention
-- sweep (trainyard.store.retention) reads to forget it once its time is up.
local terminal = {succeeded = true, failed = true, cancelled = true, rejected = true}
local function set_status(new)
  local h = redis.call('HMGET', jk, 'tenant', 'order')
  local score = redis.call('ZSCORE', p .. 'jobs', jid) or h[2]
  local tenant = h[1] or ''
  if status then
    redis.call('HINCRBY', p .. 'counts', status, -1)
    redis.call('ZREM', p .. 'bystatus:' .. status, jid)
    redis.call('ZREM', p .. 'tbystatus:' .. tenant .. ':' .. status, jid)
  end
  redis.call('HINCRBY', p .. 'counts', new, 1)
  redis.call('ZADD', p .. 'bystatus:' .. new, score, jid)
  redis.call('ZADD', p .. 'tbystatus:' .. tenant .. ':' .. new, score, jid)
  redis.call('HSET', jk, 'status', new)
  if terminal[new] then redis.call('ZADD', p .. 'finished', at, jid) end
  redis.call('HDEL', p .. 'why:pending', jid)
  redis.call('HDEL', p .. 'why:admitted', jid)
  status = new
end

-- Mark GPU g (0-based) of a node held ('#') or free ('.') in the GPU map.
local function mark(node, g, ch)
  local map = redis.call('HGET', p .. 'gpumap', node) or ''
  g = tonumber(g)
  if #map <= g then map = map .. string.rep('.', g + 1 - #map) end
  redis.call('HSET', p .. 'gpumap', node, map:sub(1, g) .. ch .. map:sub(g + 2))
end

-- Give back everything the current run holds: capacity and GPUs, once.
local function release()
  if not active[status] then return end
  local by_type = cjson.decode(redis.call('HGET', jk, 'gpus_by_type'))
  for t, n in pairs(by_type) do redis.call('HINCRBY', p .. 'inuse', t, -n) end
  local run = redis.call('HGET', jk, 'run_id')
  local placement = redis.call('HGET', jk, 'placement')
  if placement and placement ~= '' then
    for _, r in ipairs(cjson.decode(placement)) do
      local ak = p .. 'alloc:' .. r['node_id']
      for _, g in ipairs(r['gpus']) do
        if redis.call('HGET', ak, g) == run then
          redis.call('HDEL', ak, g)
          mark(r['node_id'], g, '.')
        end
      end
      redis.call('SREM', p .. 'noderuns:' .. r['node_id'], jid)
    end
  end
  redis.call('ZREM', p .. 'admitted', jid)
  redis.call('ZREM', p .. 'active', jid)
end

-- Every event on the job's subject moves the subject's last sequence.
if status then redis.call('HSET', jk, 'last_seq', seq) end

if kind == 'JobAccepted' then
  if status then return 0 end
  local order = ARGV[7]
  redis.call('HSET', jk, 'tenant', ARGV[5], 'queue', ARGV[6], 'order', order,
    'gpus_by_type', ARGV[8], 'spec', ARGV[9], 'submitted_at', ARGV[10],
    'priority_class', ARGV[11], 'name', ARGV[12], 'gpus', ARGV[13], 'max_retries', ARGV[14],
    'accepted_at', at, 'attempt', 0, 'requeues', 0, 'failures', 0, 'timeouts', 0, 'last_seq', seq)
  set_status('pending')
  add_pending(order)
  redis.call('ZADD', p .. 'jobs', order, jid)
  redis.call('ZADD', p .. 'tenant:' .. ARGV[5], order, jid)
elseif kind == 'JobRejected' then
  if status then return 0 end
  local order = ARGV[7]
  redis.call('HSET', jk, 'tenant', ARGV[5], 'errors', ARGV[6], 'order', order,
    'finished_at', at, 'last_seq', seq, 'gpus', 0)
  set_status('rejected')
  redis.call('ZADD', p .. 'jobs', order, jid)
  redis.call('ZADD', p .. 'tenant:' .. ARGV[5], order, jid)
elseif kind == 'JobAdmitted' then
  if status ~= 'pending' then return 0 end
  local by_type = cjson.decode(redis.call('HGET', jk, 'gpus_by_type'))
  for t, n in pairs(by_type) do redis.call('HINCRBY', p .. 'inuse', t, n) end
  redis.call('HSET', jk, 'run_id', ARGV[5], 'attempt', ARGV[6], 'admitted_at', at, 'placement', '')
  redis.call('HDEL', jk, 'reason', 'started_at', 'placed_at', 'not_before')
  set_status('admitted')
  local order = redis.call('HGET', jk, 'order')
  remove_pending()
  redis.call('ZADD', p .. 'admitted', order, jid)
  redis.call('ZADD', p .. 'active', order, jid)
elseif kind == 'JobPlaced' then
  if status ~= 'admitted' or redis.call('HGET', jk, 'run_id') ~= ARGV[5] then return 0 end
  local run = ARGV[5]
  for _, r in ipairs(cjson.decode(ARGV[6])) do
    local ak = p .. 'alloc:' .. r['node_id']
    for _, g in ipairs(r['gpus']) do
      local holder = redis.call('HGET', ak, g)
      if holder and holder ~= run then
        redis.call('RPUSH', p .. 'violations',
          'seq ' .. seq .. ': GPU ' .. r['node_id'] .. '/' .. g .. ' given to ' .. run .. ' while held by ' .. holder)
      end
      redis.call('HSET', ak, g, run)
      mark(r['node_id'], g, '#')
    end
    redis.call('SADD', p .. 'noderuns:' .. r['node_id'], jid)
  end
  redis.call('HSET', jk, 'placement', ARGV[6], 'cluster', ARGV[7], 'placed_at', at)
  redis.call('ZREM', p .. 'admitted', jid)
  set_status('placed')
elseif kind == 'RunStarted' then
  if status ~= 'placed' or redis.call('HGET', jk, 'run_id') ~= ARGV[5] then return 0 end
  redis.call('HSET', jk, 'started_at', at)
  set_status('running')
elseif kind == 'RunSucceeded' then
  if not active[status] or redis.call('HGET', jk, 'run_id') ~= ARGV[5] then return 0 end
  release()
  redis.call('HSET', jk, 'finished_at', at)
  set_status('succeeded')
elseif kind == 'RunFailed' then
  if not active[status] or redis.call('HGET', jk, 'run_id') ~= ARGV[5] then return 0 end
  release()
  redis.call('HSET', jk, 'reason', ARGV[6], 'message', ARGV[7], 'placement', '')
  redis.call('HDEL', jk, 'notice_at', 'preempt_deadline', 'preemptor', 'preempt_reason')
  -- GPU-seconds the run held while running: least-attained-service order
  local started = redis.call('HGET', jk, 'started_at')
  if started and tonumber(at) > tonumber(started) then
    local before = tonumber(redis.call('HGET', jk, 'attained_gpu_s') or '0')
    local gpus = tonumber(redis.call('HGET', jk, 'gpus') or '0')
    redis.call('HSET', jk, 'attained_gpu_s', exact(before + (tonumber(at) - tonumber(started)) * gpus))
  end
  -- ARGV[8]: head (node failure: back to the head of the queue), keep (keep
  -- its place), timeout (keep its place after a backoff), own (the job's own
  -- failure: retried after a backoff up to max_retries).  ARGV[9], ARGV[10]:
  -- backoff base and cap in seconds.  ARGV[11]: HEAD_OF_QUEUE_OFFSET.
  local category = ARGV[8]
  local order = tonumber(redis.call('HGET', jk, 'order'))
  local function backoff(n)
    return math.min(tonumber(ARGV[9]) * 2 ^ (n - 1), tonumber(ARGV[10]))
  end
  local function requeue(not_before)
    if not_before then redis.call('HSET', jk, 'not_before', exact(not_before)) end
    set_status('pending')
    add_pending(order)
  end
  if category == 'head' then
    if order >= 0 then order = order - tonumber(ARGV[11]) end  -- ahead of every job never run
    redis.call('HSET', jk, 'order', string.format('%d', order))
    redis.call('HINCRBY', jk, 'requeues', 1)
    requeue(nil)
  elseif category == 'keep' then
    redis.call('HINCRBY', jk, 'requeues', 1)
    requeue(nil)
  elseif category == 'timeout' then
    requeue(tonumber(at) + backoff(redis.call('HINCRBY', jk, 'timeouts', 1)))
  else
    local n = redis.call('HINCRBY', jk, 'failures', 1)
    if n <= tonumber(redis.call('HGET', jk, 'max_retries') or '0') then
      requeue(tonumber(at) + backoff(n))
    else
      redis.call('HSET', jk, 'finished_at', at)
      set_status('failed')
    end
  end
elseif kind == 'PreemptionNotice' then
  if not active[status] or redis.call('HGET', jk, 'run_id') ~= ARGV[5] then return 0 end
  redis.call('HSET', jk, 'notice_at', at, 'preempt_deadline', ARGV[6], 'preemptor', ARGV[7], 'preempt_reason', ARGV[8])
elseif kind == 'CheckpointSaved' then
  if not active[status] or redis.call('HGET', jk, 'run_id') ~= ARGV[5] then return 0 end
  redis.call('HSET', jk, 'last_checkpoint_at', at, 'last_checkpoint_step', ARGV[6])
elseif kind == 'JobCancelled' then
  if not status or status == 'succeeded' or status == 'failed' or status == 'cancelled' or status == 'rejected' then
    return 0
  end
  release()
  remove_pending()
  redis.call('HSET', jk, 'finished_at', at, 'reason', ARGV[6])
  set_status('cancelled')
end
return 1
