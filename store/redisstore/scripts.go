package redisstore

import "github.com/redis/go-redis/v9"

// The record of a key is one hash. Its fields (short, since every record
// carries them):
//
//	st  status: in_progress, completed, failed, released
//	po  policy: at_least_once, at_most_once
//	f   fence (decimal)
//	a   attempt (decimal)
//	o   owner
//	fp  fingerprint
//	r   result (bytes)
//	rs  reason
//	lu  lease until, unix microseconds on the store's clock
//	ex  expires at (retention), unix microseconds
//	c   created at, unix microseconds
//	u   updated at, unix microseconds
//	j   journal: a JSON array of idem.JournalEntry, with its JSON names
//	    and its times as RFC 3339 strings in UTC (what encoding/json makes
//	    of a time.Time), so json.Unmarshal reads it as it is
//	n   the call id of the last write (see below)
//
// Every script takes the one key it touches as KEYS[1] (Redis Cluster
// routes it; no script touches a second key) and starts its ARGV with:
//
//	ARGV[1]  clock offset in microseconds, added to TIME (0 but in tests)
//	ARGV[2]  microseconds added to an expiry to make the hash's PEXPIREAT:
//	         the keep-expired period minus the clock offset, so that Redis
//	         drops the hash on its own clock that long after ExpiresAt
//
// The mutating scripts take a call id as ARGV[3], unique per call, and
// store it in the field n with their write. A call that reaches Redis
// twice (the client retried it on a new connection after the first
// answer was lost) finds its own id and answers what the first run did,
// instead of reporting the record its first run made as someone else's
// (busy, lease lost).

// prelude holds what every script shares. Lua numbers are doubles: unix
// microseconds (about 2^51 today) are exact, and every number written to
// Redis or formatted goes through string.format('%d'), never tostring
// (which keeps 14 digits).
const prelude = `
local K = KEYS[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2]) + tonumber(ARGV[1])
local extra = tonumber(ARGV[2])

local function d(x) return string.format('%d', x) end

-- fmt formats unix microseconds as encoding/json formats a UTC time.Time
-- (RFC 3339 with the fraction's trailing zeros dropped), by Howard
-- Hinnant's civil_from_days.
local function fmt(us)
  local s = math.floor(us / 1000000)
  local frac = us - s * 1000000
  if frac < 0 then s = s - 1; frac = frac + 1000000 end
  if frac >= 1000000 then s = s + 1; frac = frac - 1000000 end
  local days = math.floor(s / 86400)
  local sod = s - days * 86400
  local z = days + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524) - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local day = doy - math.floor((153 * mp + 2) / 5) + 1
  local mon = mp + 3
  if mon > 12 then mon = mon - 12 end
  local y = yoe + era * 400
  if mon <= 2 then y = y + 1 end
  local hh = math.floor(sod / 3600)
  local mm = math.floor((sod - hh * 3600) / 60)
  local ss = sod - hh * 3600 - mm * 60
  local out = string.format('%04d-%02d-%02dT%02d:%02d:%02d', y, mon, day, hh, mm, ss)
  if frac > 0 then
    out = out .. '.' .. (string.gsub(string.format('%06d', frac), '0+$', ''))
  end
  return out .. 'Z'
end

local function expireat(ex)
  redis.call('PEXPIREAT', K, d(math.floor((ex + extra + 999) / 1000)))
end

local function load()
  local flat = redis.call('HGETALL', K)
  local h = {}
  for i = 1, #flat, 2 do h[flat[i]] = flat[i + 1] end
  return h, flat
end

local statuses = {in_progress = true, completed = true, failed = true, released = true}

-- journal decodes the journal; nil if it is not a JSON array.
local function journal(s)
  if type(s) ~= 'string' or string.sub(s, 1, 1) ~= '[' then return nil end
  local ok, j = pcall(cjson.decode, s)
  if not ok or type(j) ~= 'table' then return nil end
  return j
end

local function encode(j)
  if #j == 0 then return '[]' end
  return cjson.encode(j)
end

local function trim(j)
  while #j > 16 do table.remove(j, 1) end
end

-- entry returns the newest journal entry of fence f.
local function entry(j, f)
  for i = #j, 1, -1 do
    if j[i].f == f then return j[i] end
  end
  return nil
end

local function corrupt(why) return {-1, d(now), why} end
`

// claimScript claims KEYS[1].
//
//	ARGV[3] call id, [4] owner, [5] correlation, [6] policy, [7] lease µs,
//	[8] retention µs, [9] fingerprint, [10] "1" to take a lapsed
//	AtMostOnce attempt
//
// Returns {1, now} when it made a new record (the caller knows it whole),
// {2, now, hash} when it acquired an existing record, {3, now, hash} when
// that was a takeover, {0, now, hash} when not acquired (the record as
// found), {-1, now, why} for a record it cannot read (left alone).
const claimScript = prelude + `
local id, owner, corr, policy = ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local lease, ret = tonumber(ARGV[7]), tonumber(ARGV[8])
local lu = now + lease
local ex = now + math.max(lease, ret)

if redis.call('EXISTS', K) == 0 then
  local j = '[{"a":1,"f":1'
  if owner ~= '' then j = j .. ',"o":' .. cjson.encode(owner) end
  if corr ~= '' then j = j .. ',"c":' .. cjson.encode(corr) end
  j = j .. ',"s":"' .. fmt(now) .. '","l":"' .. fmt(lu) .. '","p":"' .. policy .. '"}]'
  local sn = d(now)
  redis.call('HSET', K, 'st', 'in_progress', 'po', policy, 'f', '1', 'a', '1', 'o', owner,
    'fp', ARGV[9], 'lu', d(lu), 'ex', d(ex), 'c', sn, 'u', sn, 'j', j, 'n', id)
  expireat(ex)
  return {1, sn}
end

local h, flat = load()
if h.n == id then
  -- This call ran before and acquired the key; its answer was lost.
  local j = journal(h.j)
  local code = 2
  if j and #j > 0 and j[#j].t then code = 3 end
  return {code, d(now), flat}
end
local rex = tonumber(h.ex)
if not rex then return corrupt('expiry is not a number') end
local expired = now >= rex
local takeover = false
if not expired then
  local st = h.st
  if st == 'completed' or st == 'failed' then return {0, d(now), flat} end
  if st == 'in_progress' then
    local rlu = tonumber(h.lu)
    if not rlu then return corrupt('lease is not a number') end
    if now < rlu or (h.po ~= 'at_least_once' and ARGV[10] ~= '1') then return {0, d(now), flat} end
    takeover = true
  elseif st ~= 'released' then
    return corrupt('unknown status')
  end
end
local f, a = tonumber(h.f), tonumber(h.a)
if not f or not a then return corrupt('fence or attempt is not a number') end
local j = journal(h.j)
if not j then return corrupt('journal is not a JSON array') end
local created = now
if not expired then
  created = tonumber(h.c)
  if not created then return corrupt('creation time is not a number') end
end
if takeover and #j > 0 then
  local last = j[#j]
  if last.f == f and (last.x == nil or last.x == '') then last.x = 'lapsed' end
end
f, a = f + 1, a + 1
local e = {a = a, f = f, s = fmt(now), l = fmt(lu), p = policy}
if owner ~= '' then e.o = owner end
if corr ~= '' then e.c = corr end
if takeover then e.t = true end
if expired then e.ae = true end
j[#j + 1] = e
trim(j)
local sn = d(now)
redis.call('HSET', K, 'st', 'in_progress', 'po', policy, 'f', d(f), 'a', d(a), 'o', owner,
  'fp', ARGV[9], 'r', '', 'lu', d(lu), 'ex', d(ex), 'c', d(created), 'u', sn, 'j', encode(j), 'n', id)
expireat(ex)
local code = 2
if takeover then code = 3 end
return {code, sn, redis.call('HGETALL', K)}
`

// checkHeld is shared by the scripts that end or extend the attempt
// holding fence ARGV[4]: it reads the record and returns it with its
// journal when the attempt still holds it, or the answer to return:
// {0} lease lost (after marking the stale attempt's late finish when the
// record is another attempt's), {-1, now, why} corrupt, {2, ...} when
// this very call ran before (see the call id).
const checkHeld = `
local id, fence = ARGV[3], tonumber(ARGV[4])
local function held()
  local v = redis.call('HMGET', K, 'st', 'f', 'ex', 'j', 'n', 'lu')
  local st, rf, rex, rj, rn, rlu = v[1], v[2], v[3], v[4], v[5], v[6]
  if not st and not rf and not rex and not rj then
    if redis.call('EXISTS', K) == 0 then return nil, {0} end
  end
  if rn == id then return nil, {2, rlu} end
  rex = tonumber(rex)
  if not rex then return nil, corrupt('expiry is not a number') end
  if now >= rex then return nil, {0} end
  rf = tonumber(rf)
  if not rf then return nil, corrupt('fence is not a number') end
  if not statuses[st] then return nil, corrupt('unknown status') end
  local j = journal(rj)
  if not j then return nil, corrupt('journal is not a JSON array') end
  if rf ~= fence or st ~= 'in_progress' then
    for i = 1, #j do
      local e = j[i]
      if e.f == fence and e.e == nil and e.lf == nil then
        e.lf = fmt(now)
        redis.call('HSET', K, 'j', encode(j))
        break
      end
    end
    return nil, {0}
  end
  return {ex = rex, j = j}, nil
end
`

// finishScript ends the attempt holding the fence.
//
//	ARGV[3] call id, [4] fence, [5] status to write (completed, failed,
//	released, or in_progress to abandon), [6] result (completed) or
//	reason, [7] retention µs (completed, failed)
//
// Returns {1} done, {2} done by an earlier run of this call, {0} lease
// lost, {-1, now, why} corrupt.
const finishScript = prelude + checkHeld + `
local rec, answer = held()
if not rec then return answer end
local status, payload = ARGV[5], ARGV[6]
local sn = d(now)
local e = entry(rec.j, fence)
local outcome, reason = nil, payload
if status == 'completed' then
  outcome, reason = 'completed', ''
  local ex = now + tonumber(ARGV[7])
  redis.call('HSET', K, 'st', status, 'r', payload, 'ex', d(ex))
  expireat(ex)
elseif status == 'failed' then
  outcome = 'failed'
  local ex = now + tonumber(ARGV[7])
  redis.call('HSET', K, 'st', status, 'rs', payload, 'ex', d(ex))
  expireat(ex)
elseif status == 'released' then
  outcome = 'released'
  redis.call('HSET', K, 'st', status, 'rs', payload)
else
  outcome = 'abandoned'
  redis.call('HSET', K, 'rs', payload)
end
if e then
  local ts = fmt(now)
  e.e, e.l, e.x = ts, ts, outcome
  if reason ~= '' then e.r = reason else e.r = nil end
end
redis.call('HSET', K, 'lu', sn, 'u', sn, 'j', encode(rec.j), 'n', id)
return {1}
`

// extendScript renews the lease of the attempt holding the fence.
//
//	ARGV[3] call id, [4] fence, [5] lease µs
//
// Returns {1, lease until}, {2, lease until} when an earlier run of this
// call did it, {0} lease lost, {-1, now, why} corrupt.
const extendScript = prelude + checkHeld + `
local rec, answer = held()
if not rec then return answer end
local lu = now + tonumber(ARGV[5])
local e = entry(rec.j, fence)
if e then e.l = fmt(lu) end
if rec.ex < lu then
  redis.call('HSET', K, 'ex', d(lu))
  expireat(lu)
end
redis.call('HSET', K, 'lu', d(lu), 'u', d(now), 'j', encode(rec.j), 'n', id)
return {1, d(lu)}
`

// resolveScript applies an operator's (or a reconciler's) decision.
//
//	ARGV[3] call id, [4] fence (0: any), [5] "1" done, [6] result,
//	[7] reason, [8] retention µs (done), [9] by
//
// Returns {1, now, hash} resolved, {0} not found, {2} lease lost (another
// fence), {-1, now, why} corrupt.
const resolveScript = prelude + `
local id, fence = ARGV[3], tonumber(ARGV[4])
local h, flat = load()
if h.n == id then return {1, d(now), flat} end
if #flat == 0 then return {0} end
local rex = tonumber(h.ex)
if not rex then return corrupt('expiry is not a number') end
if now >= rex then return {0} end
local f, a, rlu = tonumber(h.f), tonumber(h.a), tonumber(h.lu)
if not f or not a or not rlu then return corrupt('fence, attempt or lease is not a number') end
if not statuses[h.st] then return corrupt('unknown status') end
local j = journal(h.j)
if not j then return corrupt('journal is not a JSON array') end
if fence ~= 0 and f ~= fence then return {2} end
local done, reason, by = ARGV[5] == '1', ARGV[7], ARGV[9]
local sn = d(now)
local outcome = 'resolved-not-done'
if done then
  outcome = 'resolved-done'
  local ex = now + tonumber(ARGV[8])
  redis.call('HSET', K, 'st', 'completed', 'r', ARGV[6], 'ex', d(ex))
  expireat(ex)
else
  redis.call('HSET', K, 'st', 'released', 'r', '')
end
local ts = fmt(now)
local e = entry(j, f)
if e and (e.x == nil or e.x == '') then
  e.e, e.x = ts, outcome
  if reason ~= '' then e.r = reason else e.r = nil end
  if by ~= '' then e.rb = by else e.rb = nil end
  -- The open entry of the record's fence carries the record's lease.
  if rlu > now then e.l = ts end
else
  local n = {a = a, f = f + 1, s = ts, l = ts, e = ts, x = outcome, d = true}
  if by ~= '' then n.o = by; n.rb = by end
  if reason ~= '' then n.r = reason end
  j[#j + 1] = n
  trim(j)
end
redis.call('HSET', K, 'f', d(f + 1), 'u', sn, 'lu', sn, 'rs', reason, 'j', encode(j), 'n', id)
return {1, sn, redis.call('HGETALL', K)}
`

// getScript reads the record with the store's clock: {now, hash}.
const getScript = prelude + `
return {d(now), redis.call('HGETALL', K)}
`

// deleteScript deletes a record that has not expired: 1 deleted, 0 absent
// or expired. A record whose expiry cannot be read is deleted (deleting
// is how an operator gets rid of a corrupt record).
const deleteScript = prelude + `
local ex = redis.call('HGET', K, 'ex')
if not ex then
  if redis.call('EXISTS', K) == 0 then return 0 end
else
  ex = tonumber(ex)
  if ex and now >= ex then return 0 end
end
redis.call('DEL', K)
return 1
`

// sweepScript deletes a record whose retention has passed: 1 deleted, 0
// not (absent, live, or without a readable expiry).
const sweepScript = prelude + `
local ex = tonumber(redis.call('HGET', K, 'ex'))
if ex and now >= ex then
  redis.call('DEL', K)
  return 1
end
return 0
`

var (
	scriptClaim   = redis.NewScript(claimScript)
	scriptFinish  = redis.NewScript(finishScript)
	scriptExtend  = redis.NewScript(extendScript)
	scriptResolve = redis.NewScript(resolveScript)
	scriptGet     = redis.NewScript(getScript)
	scriptDelete  = redis.NewScript(deleteScript)
	scriptSweep   = redis.NewScript(sweepScript)
	allScripts    = []*redis.Script{scriptClaim, scriptFinish, scriptExtend, scriptResolve, scriptGet, scriptDelete, scriptSweep}
)
