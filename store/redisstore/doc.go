// Package redisstore is an store.Store kept in Redis 7 (go-redis v9): one
// hash per key, every call one Lua script (one round trip), leases and
// retention on the server's clock.
//
//	s, err := redisstore.Open(ctx, "redis://127.0.0.1:6379/0?idem_prefix=billing:")
//	l := idem.New(s)
//
// # Layout
//
// The record of key k is the hash named prefix+k ([WithPrefix], default
// "idem:"), with one field per [store.Record] field (the attempt id among
// them); times are unix microseconds of the server's clock. The journal
// is a JSON array in one field, with the wire names of
// [store.JournalEntry] (the store.Wire* constants, from which the scripts
// are generated) and its times as RFC 3339 strings in UTC, exactly as
// encoding/json writes a time.Time, so [store.UnmarshalJournal] reads it
// as it is (the scripts format them; the tests check the round trip). A
// record whose history is a single attempt of a fresh key (claimed,
// extended, finished: the common life) has no journal field yet: its one
// entry is what its other fields say, plus the claim's correlation id and,
// after an abandon, the entry's outcome and attempt id, in small fields,
// and the store builds it when it reads the record. The scripts on the hot path
// therefore neither format times nor parse JSON, and such a record stays
// in Redis's compact hash encoding (listpack; about 300 bytes with a short
// result). The first write that needs more (a second attempt, a takeover,
// a resolution) writes the journal field. The field names are listed in
// scripts.go.
//
// # Scripts
//
// Every call that writes is one Lua script, run with EVALSHA (loaded once
// per server; go-redis falls back to EVAL if the server forgot it). A
// script reads the hash, decides by the same rules as the other stores
// (the store package), and writes in the same atomic step: Redis runs
// one script at a time, so no other write can slip between the read and
// the write. The clock is Redis TIME, read inside the script (Redis 7
// replicates scripts by their effects), so workers with skewed clocks
// agree on leases. Each script touches one key, passed as KEYS[1], so the
// store works on Redis Cluster as it is.
//
// A claim of a new key is the cheap path: EXISTS, then one HSET and a
// PEXPIREAT; the script answers with the server's time only, and the store
// builds the record it wrote. [Store.ClaimBatch] pipelines one script per
// key in one round trip.
//
// The scripts that end or extend an attempt ([Store.Finish],
// [Store.Extend]) apply only while the record is in_progress with the
// attempt's fence and attempt id, in the same script that writes; an
// abandon clears the record's attempt id, so an attempt ends once.
//
// # Fences
//
// A new record's first fence is the server's clock (Redis TIME) in
// microseconds, read by the claim script ([store.FirstFence] with no floor
// of the store's own); every later claim of the record, and every
// resolution, adds one. So a key deleted, swept or dropped by Redis and
// claimed anew starts above every fence it had, unless the server's clock
// (after a restart, or on the replica a failover promoted) is behind by
// more than the time between the old record's last claim and its removal.
// Lua numbers are doubles, exact up to 2^53: fences stay exact until the
// year 2255. The scripts never let Lua's tostring or cjson format a fence
// (both write 14 significant digits: 1.7e+15); the journal's JSON is
// written by the scripts' own encoder.
//
// # Expiry
//
// Every script checks the record's ExpiresAt against the server's clock:
// an expired record behaves as absent whether or not Redis has dropped
// the hash yet. Redis drops it by itself (PEXPIREAT) [WithKeepExpired]
// after ExpiresAt (default 24 hours). Until then the store remembers the
// key's fence and attempt numbers, so that a claim after the expiry
// continues them (and its journal); after that, a claim makes a new
// record, whose fence the clock makes higher (see Fences). A holder from
// before the expiry is refused either way. [Store.Sweep] deletes expired
// records before Redis does.
//
// # Retries and call ids
//
// go-redis retries a command whose connection failed (by default 3 times,
// on a new connection). For a script that writes, the failure may have hit
// after Redis ran it: the retry would then find the record its own first
// run made, and report the key busy, or the lease lost. So every write
// carries a call id, unique per call, that the script stores with its
// write; a script that finds its own call id answers what its first run
// did. Retries are therefore safe, and [Open] keeps them. (One case
// remains: if another client writes the key between the first run and the
// retry, which a Release or an Abandon allows at once and a claim's lease
// only once it has passed, the retry answers by the record it finds: an
// [store.ErrLeaseLost] for a release that happened, a busy key for a claim
// whose lease ran out meanwhile.) A call whose context
// ends, or whose retries run out, returns an error: a store error, never
// an outcome, and the key is left to its lease and policy.
//
// # When Redis loses acknowledged writes
//
// Redis answers a write before it is on disk or on a replica. With
// persistence off, with appendonly no (snapshots only), or with
// appendfsync everysec (the common setting: up to a second of writes lost
// in a crash), and on a failover to an asynchronous replica (the writes it
// had not received yet), writes that callers were told about are lost.
// What that means for idem, by the write that is lost:
//
//   - A lost completion (or failure, or release): the key is in_progress
//     again, with the lease of the attempt that finished. When the lease
//     passes, AtLeastOnce takes it over and runs fn again: the effect is
//     repeated (a duplicate, logged as a takeover). AtMostOnce reports
//     the key indeterminate until an operator (or a Reconcile hook)
//     resolves it: nothing is repeated, nothing is lost silently.
//   - A lost claim (the record is absent again, or as it was before the
//     claim): the next delivery claims the key while the first holder is
//     still running, so two attempts run, and when the record was there
//     before, the second gets the same fence number as the first (its
//     attempt id differs, so the first's writes are still refused). Under
//     both policies the effect may happen twice: AtMostOnce's guarantee
//     does not survive the loss of a claim.
//   - A lost heartbeat (Extend): the lease ends earlier than the holder
//     thinks; under AtLeastOnce another attempt may take over while it
//     runs. The holder's next heartbeat or completion is refused.
//   - A lost resolution or deletion: the decision is undone; the key is
//     indeterminate (or present) again.
//
// A lost write never makes a key look completed when it was not: a
// duplicate is only ever given a result that fn returned.
//
// So: AtLeastOnce (the Ledger's default) on a Redis that loses writes
// degrades to more duplicates, which AtLeastOnce users accept anyway. For
// AtMostOnce where a second effect is not acceptable (payments, emails that
// must not be sent twice), the claim must be durable before fn runs:
// run Redis with appendonly yes and appendfsync always (Redis then writes
// and fsyncs the AOF before it answers), and with replicas use [WithWait]
// so that a write is acknowledged only once the replicas have it (WAIT
// narrows the failover window; Redis does not promise that a failover
// keeps every write WAIT confirmed). WithWait is refused on a *redis.Ring
// (see [ErrWaitOnRing]). [Store.Durability] reports what the server is
// configured to do, so that a program can refuse to start on a server that
// loses writes.
//
// # Defaults
//
// The defaults are the safe ones where a choice is safe everywhere: expiry
// checked in every script, fences kept for 24 hours past expiry, retries
// made safe by call ids, context deadlines honored by the clients Open
// makes. WAIT is off by default, because a server without replicas would
// refuse every write with it; durability is the server's configuration,
// which the store reports but does not change.
//
// # Upgrading from a version without attempt ids
//
// A hash written by an earlier version has no attempt id field: the store
// reads its attempt id as "", so no attempt can finish or extend it (its
// holder's Finish and Extend get [store.ErrLeaseLost]). It lapses as
// usual: AtLeastOnce takes it over, AtMostOnce reports it indeterminate
// until a Reconcile hook or an operator resolves it. Its journal entries
// have no attempt ids; fences continue from where it was. The new scripts
// have new SHA1s: each server loads them on its first NOSCRIPT.
//
// Do not run the two versions on the same prefix at once: the earlier
// version's scripts write the journal with cjson, which turns the 16-digit
// fences of new records into 1.7e+15, and both versions then read such a
// record as corrupt. Stop the old writers, then start the new (or move to
// a new prefix).
//
// # Connections
//
// Each call takes one connection from the client's pool for one round
// trip; [Store.ClaimBatch] takes one from go-redis's pipeline pool. Size
// the pools for the number of concurrent callers: go-redis's defaults are
// 10 connections per CPU (pool_size) and 10 pipeline connections
// (pipeline_pool_size), both URL parameters of [Open].
//
// # Costs
//
// Claim, Finish, Extend, Get, Resolve and Delete are each one script on
// one key: O(1), plus the journal (at most [store.MaxJournal] entries) for
// the scripts that edit it. A claim of a new key costs Redis TIME, EXISTS,
// one HSET of 13 fields and a PEXPIREAT; a completion TIME, one HMGET, one
// HSET and a PEXPIREAT. List and Sweep SCAN the keys under the prefix (see
// [Store.List]): their cost grows with the number of records, so they are
// for operators, not for a hot path.
//
// [Store.ClaimBatch] and [Store.FinishBatch] pipeline their scripts in
// one round trip; a Ledger made with [idem.WithCoalescing] uses them for
// the claims and completions of concurrent calls. On a loaded 2-core
// machine that doubled Do's rate at 50 callers (see docs/benchmarks.md).
package redisstore
