package redisstore

import (
	"fmt"
	"strings"

	"github.com/idemkit/idem/store"
	"github.com/redis/go-redis/v9"
)

// The record of a key is one hash. Its fields (short, since every record
// carries them):
//
//	st  status: in_progress, completed, failed, released
//	po  policy: at_least_once, at_most_once
//	f   fence (decimal)
//	a   attempt (decimal)
//	i   attempt id: the latest claim's; "" once that attempt is abandoned
//	    (absent in a hash written before attempt ids: read as "")
//	o   owner
//	fp  fingerprint
//	r   result (bytes)
//	rs  reason
//	lu  lease until, unix microseconds on the store's clock
//	ex  expires at (retention), unix microseconds
//	c   created at, unix microseconds
//	u   updated at, unix microseconds
//	n   the call id of the last write (see below)
//	j   journal: a JSON array of store.JournalEntry, with its wire names
//	    (store.Wire*) and its times as RFC 3339 strings in UTC (what
//	    encoding/json makes of a time.Time), so store.UnmarshalJournal
//	    reads it as it is
//
// A record whose whole history is one attempt of a fresh key (claimed,
// heartbeated, finished: the common life) has no j: its journal is the
// one entry that the other fields already say, with up to three more
// fields:
//
//	cr  the claim's correlation id
//	jx  the entry's outcome where the status does not say it: abandoned
//	    (an in_progress record whose attempt ended)
//	ji  the entry's attempt id where the record no longer says it: the
//	    abandoned attempt's (the record's i is then "")
//
// That entry is Attempt a, Fence f, AttemptID ji or else i, Owner o,
// Correlation cr, Started c, LeaseUntil lu, Policy po and, once it has an
// outcome x (jx if set, else the status unless in_progress), Outcome x,
// Ended u and Reason rs unless x is completed. Every write keeps those
// equalities or writes j instead (the first claim over an existing
// record, a heartbeat after an abandon, a resolution), so the scripts on
// the hot path neither format times nor touch JSON, and the hash of such a
// record stays small enough for Redis's compact (listpack) encoding. The
// store builds the entry when it reads the record (record.go); the
// scripts build it (implicit, below) before they edit the journal.
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
//
// Each script is laid out fast path first: the header (the clock) and the
// common case, written inline; the helper functions below are defined
// (Lua makes a closure per local function on every run) only on the paths
// that need them.
//
// Lua numbers are doubles: unix microseconds (about 2^51 today), and so
// fences, which start at the clock in microseconds, are exact up to 2^53
// (the year 2255). Numbers are handed to redis.call as numbers, which
// Redis formats as integers ("%.17g" in 7.0, fpconv in 7.2+: plain digits
// below 10^21), and returned as integer replies; tostring and cjson, which
// write 14 significant digits (1.7e+15 for a fence), are never used on
// them: the journal's JSON is written by encode (below), which formats
// integers with '%.0f'.

// header starts every script: the key and the store's clock.
const header = `
local K = KEYS[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2]) + tonumber(ARGV[1])
local extra = tonumber(ARGV[2])
-- sn is now as a decimal string, made without formatting a number when
-- the clock has no offset (Redis formats numbers it is given with
-- snprintf, which costs more than these concatenations).
local sn
if ARGV[1] == '0' then
  sn = t[1] .. string.sub('00000' .. t[2], -6)
else
  sn = string.format('%d', now)
end
`

// wireNames are the Lua names of the journal's wire names (the JSON
// members of a store.JournalEntry), in the order of the type's fields,
// which is the order encode writes them in.
var wireNames = []struct{ lua, wire string }{
	{"wAttempt", store.WireAttempt},
	{"wFence", store.WireFence},
	{"wAttemptID", store.WireAttemptID},
	{"wOwner", store.WireOwner},
	{"wCorrelation", store.WireCorrelation},
	{"wStarted", store.WireStarted},
	{"wLease", store.WireLeaseUntil},
	{"wEnded", store.WireEnded},
	{"wOutcome", store.WireOutcome},
	{"wReason", store.WireReason},
	{"wTakeover", store.WireTakeover},
	{"wAfterExpiry", store.WireAfterExpiry},
	{"wPolicy", store.WirePolicy},
	{"wLateFinish", store.WireLateFinish},
	{"wResolvedBy", store.WireResolvedBy},
	{"wDecision", store.WireDecision},
}

// wireLocals declares wireNames as Lua locals, and members as their list:
// the scripts spell the journal's member names only through them, so the
// names are written once, in package store.
var wireLocals = func() string {
	lua := make([]string, len(wireNames))
	wire := make([]string, len(wireNames))
	for i, n := range wireNames {
		if strings.Trim(n.wire, "abcdefghijklmnopqrstuvwxyz") != "" || n.wire == "" {
			panic(fmt.Sprintf("redisstore: journal wire name %q is not lower-case letters", n.wire))
		}
		lua[i], wire[i] = n.lua, "'"+n.wire+"'"
	}
	names := strings.Join(lua, ", ")
	return "\nlocal " + names + " = " + strings.Join(wire, ", ") + "\nlocal members = {" + names + "}\n"
}()

// helpers is what the slow paths share.
var helpers = wireLocals + `
local floor = math.floor

local function expireat(ex)
  redis.call('PEXPIREAT', K, floor((ex + extra + 999) / 1000))
end

-- fmt formats unix microseconds as encoding/json formats a UTC time.Time:
-- RFC 3339, the fraction's trailing zeros dropped (Howard Hinnant's
-- civil_from_days, in exact integer arithmetic on doubles).
local cdays, cdate
local function fmt(us)
  local frac = us % 1000000
  local s = (us - frac) / 1000000
  local sod = s % 86400
  local days = (s - sod) / 86400
  if days ~= cdays then
    local z = days + 719468
    local doe = z % 146097
    local era = (z - doe) / 146097
    local a = doe - (doe - doe % 1460) / 1460 + (doe - doe % 36524) / 36524 - (doe - doe % 146096) / 146096
    local yoe = (a - a % 365) / 365
    local doy = doe - (365 * yoe + (yoe - yoe % 4) / 4 - (yoe - yoe % 100) / 100)
    local b = 5 * doy + 2
    local mp = (b - b % 153) / 153
    local c = 153 * mp + 2
    local day = doy - (c - c % 5) / 5 + 1
    local mon, y = mp + 3, yoe + era * 400
    if mon > 12 then mon = mon - 12; y = y + 1 end
    cdays, cdate = days, string.format('%04d-%02d-%02dT', y, mon, day)
  end
  local ss = sod % 60
  local m = (sod - ss) / 60
  local mm = m % 60
  local hh = (m - mm) / 60
  if frac == 0 then return string.format('%s%02d:%02d:%02dZ', cdate, hh, mm, ss) end
  local w = 6
  while frac % 10 == 0 do frac = frac / 10; w = w - 1 end
  if w == 6 then return string.format('%s%02d:%02d:%02d.%06dZ', cdate, hh, mm, ss, frac) end
  return string.format('%s%02d:%02d:%02d.%0' .. w .. 'dZ', cdate, hh, mm, ss, frac)
end

-- num reads a stored integer strictly (Lua's tonumber also takes 1e5,
-- 0x10 and 1.5, which the store would not read back).
local function num(s)
  if type(s) == 'string' and string.find(s, '^%-?%d+$') then return tonumber(s) end
  return nil
end

local function load()
  local flat = redis.call('HGETALL', K)
  local h = {}
  for i = 1, #flat, 2 do h[flat[i]] = flat[i + 1] end
  return h, flat
end

local statuses = {in_progress = true, completed = true, failed = true, released = true}

local function corrupt(why) return {-1, now, why} end

-- journal decodes an explicit journal; nil if it is not a JSON array.
-- (cjson reads integers up to 2^53 exactly.)
local function journal(s)
  if string.sub(s, 1, 1) ~= '[' then return nil end
  local ok, j = pcall(cjson.decode, s)
  if not ok or type(j) ~= 'table' then return nil end
  return j
end

-- implicit builds the journal of a record without j (see above); nil if
-- its fields cannot be read.
local function implicit(h)
  local a, f, c, lu, u = num(h.a), num(h.f), num(h.c), num(h.lu), num(h.u)
  if not (a and f and c and lu and u) then return nil end
  local e = {[wAttempt] = a, [wFence] = f, [wStarted] = fmt(c), [wLease] = fmt(lu), [wPolicy] = h.po}
  local aid = h.ji
  if not aid or aid == '' then aid = h.i end
  if aid and aid ~= '' then e[wAttemptID] = aid end
  if h.o and h.o ~= '' then e[wOwner] = h.o end
  if h.cr and h.cr ~= '' then e[wCorrelation] = h.cr end
  local x = h.jx
  if (not x or x == '') and h.st ~= 'in_progress' then x = h.st end
  if x and x ~= '' then
    e[wOutcome], e[wEnded] = x, fmt(u)
    if x ~= 'completed' and h.rs and h.rs ~= '' then e[wReason] = h.rs end
  end
  return {e}
end

-- journalOf returns the record's journal, explicit or implicit.
local function journalOf(h)
  if h.j then return journal(h.j) end
  return implicit(h)
end

-- value is the JSON of a member's value, or nil to leave the member out
-- (as encoding/json's omitempty does): integers in plain digits, strings
-- escaped by cjson.
local function value(v)
  local ty = type(v)
  if ty == 'number' then
    if v == floor(v) and v > -9007199254740992 and v < 9007199254740992 then return string.format('%.0f', v) end
    return string.format('%.17g', v)
  elseif ty == 'string' then
    if v ~= '' then return cjson.encode(v) end
  elseif ty == 'boolean' then
    if v then return 'true' end
  elseif ty == 'table' then
    return cjson.encode(v)
  end
  return nil
end

local known = {}
for _, k in ipairs(members) do known[k] = true end

-- encode writes a journal as JSON, its members in the order Go writes
-- them, then any it does not know (a newer version's), kept as they came.
local function encode(j)
  local out = {}
  for n = 1, #j do
    local e, m = j[n], {}
    for _, k in ipairs(members) do
      local v = value(e[k])
      if v then m[#m + 1] = '"' .. k .. '":' .. v end
    end
    for k, v in pairs(e) do
      if type(k) == 'string' and not known[k] then
        v = value(v)
        if v then m[#m + 1] = cjson.encode(k) .. ':' .. v end
      end
    end
    out[n] = '{' .. table.concat(m, ',') .. '}'
  end
  return '[' .. table.concat(out, ',') .. ']'
end

-- setJournal writes j and drops the fields of the implicit journal.
local function setJournal(h, j)
  redis.call('HSET', K, 'j', encode(j))
  if not h.j then redis.call('HDEL', K, 'cr', 'jx', 'ji') end
end

local function trim(j)
  while #j > 16 do table.remove(j, 1) end
end

-- entry returns the newest journal entry of fence f.
local function entry(j, f)
  for i = #j, 1, -1 do
    if j[i][wFence] == f then return j[i] end
  end
  return nil
end

-- late marks the open entry of a stale attempt (fence f, attempt id aid)
-- that tried to write after its lease was taken: it was still running.
local function late(h, f, aid)
  if not h.j then return end -- the one implicit entry is the record's own attempt
  local j = journal(h.j)
  if not j then return end
  for i = 1, #j do
    local e = j[i]
    if e[wFence] == f and e[wAttemptID] == aid and e[wEnded] == nil and e[wLateFinish] == nil then
      e[wLateFinish] = fmt(now)
      redis.call('HSET', K, 'j', encode(j))
      return
    end
  end
end
`

// claimScript claims KEYS[1].
//
//	ARGV[3] call id, [4] attempt id, [5] owner, [6] correlation,
//	[7] policy, [8] lease µs, [9] retention µs, [10] fingerprint,
//	[11] "1" to take a lapsed AtMostOnce attempt
//
// A lapsed attempt is taken over only when its fingerprint or [10] is
// empty, or they are equal (store.ApplyClaim). A new record's fence is
// the clock in microseconds (store.FirstFence with no floor), so that a
// key deleted, swept or dropped by Redis and claimed anew starts above
// the fences it had; every other claim adds one.
//
// Returns {1, now} when it made a new record (the caller knows it whole),
// {2, now, hash} when it acquired an existing record, {3, now, hash} when
// that was a takeover, {0, now, hash} when not acquired (the record as
// found), {-1, now, why} for a record it cannot read (left alone).
var claimScript = header + `
local id, aid, owner, corr, policy = ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local lease, ret = tonumber(ARGV[8]), tonumber(ARGV[9])
local lu = now + lease
local ex = now + math.max(lease, ret)

if redis.call('EXISTS', K) == 0 then
  redis.call('HSET', K, 'st', 'in_progress', 'po', policy, 'f', sn, 'a', '1', 'i', aid, 'o', owner, 'cr', corr,
    'fp', ARGV[10], 'lu', lu, 'ex', ex, 'c', sn, 'u', sn, 'n', id)
  redis.call('PEXPIREAT', K, math.floor((ex + extra + 999) / 1000))
  return {1, now}
end
` + helpers + `
local h, flat = load()
if h.n == id then
  -- This call ran before and acquired the key; its answer was lost.
  local code = 2
  if h.j then
    local j = journal(h.j)
    if j and #j > 0 and j[#j][wTakeover] then code = 3 end
  end
  return {code, now, flat}
end
local rex = num(h.ex)
if not rex then return corrupt('expiry is not a number') end
local expired = now >= rex
local takeover = false
if not expired then
  local st = h.st
  if st == 'completed' or st == 'failed' then return {0, now, flat} end
  if st == 'in_progress' then
    local rlu = num(h.lu)
    if not rlu then return corrupt('lease is not a number') end
    if now < rlu or (h.po ~= 'at_least_once' and ARGV[11] ~= '1') then return {0, now, flat} end
    -- A lapsed attempt of another request (both fingerprints set, unequal)
    -- is not taken over: it may have done its request's effect.
    local rfp = h.fp or ''
    if rfp ~= '' and ARGV[10] ~= '' and rfp ~= ARGV[10] then return {0, now, flat} end
    takeover = true
  elseif st ~= 'released' then
    return corrupt('unknown status')
  end
end
local f, a = num(h.f), num(h.a)
if not f or not a then return corrupt('fence or attempt is not a number') end
local j = journalOf(h)
if not j then return corrupt('journal is not a JSON array') end
local created = now
if not expired then
  created = num(h.c)
  if not created then return corrupt('creation time is not a number') end
end
if takeover and #j > 0 then
  local last = j[#j]
  if last[wFence] == f and (last[wOutcome] == nil or last[wOutcome] == '') then last[wOutcome] = 'lapsed' end
end
f, a = f + 1, a + 1
local e = {[wAttempt] = a, [wFence] = f, [wAttemptID] = aid, [wStarted] = fmt(now), [wLease] = fmt(lu), [wPolicy] = policy}
if owner ~= '' then e[wOwner] = owner end
if corr ~= '' then e[wCorrelation] = corr end
if takeover then e[wTakeover] = true end
if expired then e[wAfterExpiry] = true end
j[#j + 1] = e
trim(j)
redis.call('HSET', K, 'st', 'in_progress', 'po', policy, 'f', f, 'a', a, 'i', aid, 'o', owner,
  'fp', ARGV[10], 'r', '', 'lu', lu, 'ex', ex, 'c', created, 'u', now, 'n', id)
setJournal(h, j)
expireat(ex)
local code = 2
if takeover then code = 3 end
return {code, now, redis.call('HGETALL', K)}
`

// heldHeader is shared by the scripts that end or extend the attempt with
// fence ARGV[4] and attempt id ARGV[5]. It reads what they decide on and
// answers at once when this very call ran before ({2, lease until}), when
// the key is absent or expired ({0}), or when the record cannot be read.
// After it, held says whether the attempt still holds the key (the record
// is in_progress with its fence and attempt id), and implicit_open
// whether the record's journal is the implicit one with its entry open
// (see above).
const heldHeader = header + `
local id, fence, aid = ARGV[3], tonumber(ARGV[4]), ARGV[5]
local v = redis.call('HMGET', K, 'st', 'f', 'ex', 'j', 'n', 'jx', 'i')
local st, rf, rex, rj, rjx = v[1], v[2], v[3], v[4], v[6]
if v[5] == id then return {2, tonumber(redis.call('HGET', K, 'lu'))} end
if not st and not rf and not rex then
  if redis.call('EXISTS', K) == 0 then return {0} end
end
rex = tonumber(rex)
if not rex then return {-1, now, 'expiry is not a number'} end
if now >= rex then return {0} end
rf = tonumber(rf)
if not rf then return {-1, now, 'fence is not a number'} end
if st ~= 'in_progress' and st ~= 'completed' and st ~= 'failed' and st ~= 'released' then
  return {-1, now, 'unknown status'}
end
-- A hash without i (written before attempt ids) is held by no attempt.
local held = rf == fence and st == 'in_progress' and v[7] == aid
local implicit_open = not rj and (not rjx or rjx == '')
-- A refused call finds the implicit journal's one entry, the record's own
-- attempt, or closed: nothing to mark late.
if not held and not rj then return {0} end
`

// finishScript ends the attempt that holds the key.
//
//	ARGV[3] call id, [4] fence, [5] attempt id, [6] outcome (completed,
//	failed, released, abandoned), [7] result (completed), [8] reason,
//	[9] retention µs (completed, failed), [10] "1" when the reason says
//	the attempt never ran (store.NotRunReason): a refused call then marks
//	nothing late
//
// Returns {1} done, {2, ...} done by an earlier run of this call, {0}
// lease lost, {-1, now, why} corrupt.
var finishScript = heldHeader + `
local outcome, reason = ARGV[6], ARGV[8]
local nex
if outcome == 'completed' or outcome == 'failed' then nex = now + tonumber(ARGV[9]) end

-- The implicit journal stays implicit: its entry ends now (Ended = u,
-- LeaseUntil = lu), with the status as its outcome, or jx where the
-- status does not say it. (A completion with a reason keeps it in its
-- entry only: the journal is written.)
if held and implicit_open and (outcome ~= 'completed' or reason == '') then
  if outcome == 'completed' then
    redis.call('HSET', K, 'st', outcome, 'r', ARGV[7], 'ex', nex, 'lu', sn, 'u', sn, 'n', id)
  elseif outcome == 'abandoned' then
    -- The record gives up the attempt id (it cannot end twice); ji keeps
    -- it for the entry.
    redis.call('HSET', K, 'rs', reason, 'lu', sn, 'u', sn, 'jx', outcome, 'i', '', 'ji', aid, 'n', id)
  elseif nex then
    redis.call('HSET', K, 'st', outcome, 'rs', reason, 'ex', nex, 'lu', sn, 'u', sn, 'n', id)
  else
    redis.call('HSET', K, 'st', outcome, 'rs', reason, 'lu', sn, 'u', sn, 'n', id)
  end
  if nex then redis.call('PEXPIREAT', K, math.floor((nex + extra + 999) / 1000)) end
  return {1}
end
` + helpers + `
local h = load()
if not held then
  -- A claim that never ran leaves no trace of a late finish.
  if ARGV[10] ~= '1' then late(h, fence, aid) end
  return {0}
end
local j = journalOf(h)
if not j then return corrupt('journal is not a JSON array') end
local e = entry(j, fence)
if e then
  local ts = fmt(now)
  e[wEnded], e[wLease], e[wOutcome] = ts, ts, outcome
  if reason ~= '' then e[wReason] = reason else e[wReason] = nil end
end
if outcome == 'completed' then
  redis.call('HSET', K, 'st', outcome, 'r', ARGV[7], 'ex', nex)
elseif outcome == 'abandoned' then
  redis.call('HSET', K, 'rs', reason, 'i', '')
elseif nex then
  redis.call('HSET', K, 'st', outcome, 'rs', reason, 'ex', nex)
else
  redis.call('HSET', K, 'st', outcome, 'rs', reason)
end
redis.call('HSET', K, 'lu', now, 'u', now, 'n', id)
setJournal(h, j)
if nex then expireat(nex) end
return {1}
`

// extendScript renews the lease of the attempt that holds the key.
//
//	ARGV[3] call id, [4] fence, [5] attempt id, [6] lease µs
//
// Returns {1, lease until}, {2, lease until} when an earlier run of this
// call did it, {0} lease lost, {-1, now, why} corrupt.
var extendScript = heldHeader + `
local lu = now + tonumber(ARGV[6])
if held and implicit_open then
  -- The implicit journal stays implicit: its entry's lease is lu.
  if rex < lu then
    redis.call('HSET', K, 'ex', lu, 'lu', lu, 'u', sn, 'n', id)
    redis.call('PEXPIREAT', K, math.floor((lu + extra + 999) / 1000))
  else
    redis.call('HSET', K, 'lu', lu, 'u', sn, 'n', id)
  end
  return {1, lu}
end
` + helpers + `
local h = load()
if not held then
  late(h, fence, aid)
  return {0}
end
local j = journalOf(h)
if not j then return corrupt('journal is not a JSON array') end
local e = entry(j, fence)
if e then e[wLease] = fmt(lu) end
if rex < lu then
  redis.call('HSET', K, 'ex', lu)
  expireat(lu)
end
redis.call('HSET', K, 'lu', lu, 'u', now, 'n', id)
setJournal(h, j)
return {1, lu}
`

// resolveScript applies an operator's (or a reconciler's) decision.
//
//	ARGV[3] call id, [4] fence (0: any), [5] attempt id ("": any; else
//	the record must be in_progress with it), [6] "1" done, [7] result,
//	[8] reason, [9] retention µs (done), [10] by, [11] "1" in progress
//	only (the status must be in_progress, whatever the lease), [12] "1"
//	lapsed only (in_progress with its lease passed)
//
// Returns {1, now, hash} resolved, {0} not found, {2} lease lost (a
// condition failed), {-1, now, why} corrupt.
var resolveScript = header + helpers + `
local id, fence, aid = ARGV[3], tonumber(ARGV[4]), ARGV[5]
local h, flat = load()
if h.n == id then return {1, now, flat} end
if #flat == 0 then return {0} end
local rex = num(h.ex)
if not rex then return corrupt('expiry is not a number') end
if now >= rex then return {0} end
local f, a, rlu = num(h.f), num(h.a), num(h.lu)
if not f or not a or not rlu then return corrupt('fence, attempt or lease is not a number') end
if not statuses[h.st] then return corrupt('unknown status') end
local j = journalOf(h)
if not j then return corrupt('journal is not a JSON array') end
local inProgress = h.st == 'in_progress'
if (fence ~= 0 and f ~= fence) or (aid ~= '' and (h.i ~= aid or not inProgress)) or
  (ARGV[11] == '1' and not inProgress) or (ARGV[12] == '1' and not (inProgress and now >= rlu)) then
  return {2}
end
local done, reason, by = ARGV[6] == '1', ARGV[8], ARGV[10]
local outcome = 'resolved-not-done'
if done then
  outcome = 'resolved-done'
  local ex = now + tonumber(ARGV[9])
  redis.call('HSET', K, 'st', 'completed', 'r', ARGV[7], 'ex', ex)
  expireat(ex)
else
  redis.call('HSET', K, 'st', 'released', 'r', '')
end
local ts = fmt(now)
local e = entry(j, f)
if e and (e[wOutcome] == nil or e[wOutcome] == '') then
  e[wEnded], e[wOutcome] = ts, outcome
  if reason ~= '' then e[wReason] = reason else e[wReason] = nil end
  if by ~= '' then e[wResolvedBy] = by else e[wResolvedBy] = nil end
  -- The open entry of the record's fence carries the record's lease.
  if rlu > now then e[wLease] = ts end
else
  local n = {[wAttempt] = a, [wFence] = f + 1, [wStarted] = ts, [wLease] = ts, [wEnded] = ts, [wOutcome] = outcome, [wDecision] = true}
  if by ~= '' then n[wOwner] = by; n[wResolvedBy] = by end
  if reason ~= '' then n[wReason] = reason end
  j[#j + 1] = n
  trim(j)
end
redis.call('HSET', K, 'f', f + 1, 'u', now, 'lu', now, 'rs', reason, 'n', id)
setJournal(h, j)
return {1, now, redis.call('HGETALL', K)}
`

// getScript reads the record with the store's clock: {now, hash}.
const getScript = header + `
return {now, redis.call('HGETALL', K)}
`

// deleteScript deletes a record that has not expired: 1 deleted, 0 absent
// or expired. A record whose expiry cannot be read is deleted (deleting
// is how an operator gets rid of a corrupt record).
const deleteScript = header + `
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
const sweepScript = header + `
local ex = tonumber(redis.call('HGET', K, 'ex'))
if ex and now >= ex then
  redis.call('DEL', K)
  return 1
end
return 0
`

// The scripts, by their SHA1: a server that lacks one (a new version's
// script, a restarted server) loads it on its first NOSCRIPT (Script.Run,
// eval and pipeline do).
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
