// Package redisstore keeps idem's ledger in Redis 7 (go-redis v9): one
// hash per key, every call one Lua script (one round trip), leases and
// retention on the server's clock. Use it when the program already has
// Redis and wants the cheapest round trip of the network stores; mind
// what Redis does with acknowledged writes when it crashes (below).
//
//	s, err := redisstore.Open(ctx, "redis://127.0.0.1:6379/0?idem_prefix=billing:")
//	if err != nil {
//		return err
//	}
//	defer s.Close()
//	ledger := idem.New(s)
//
// The package's example shows the same with a check of the server's
// durability. [Open] makes a client of its own from a URL; [New] takes
// the caller's redis.UniversalClient (for Redis Cluster or Sentinel). Each
// script touches one key, so the store works on Redis Cluster as it is.
//
// # Guarantees
//
// Every write reads the record, decides and writes in one script, which
// Redis runs alone: of two claims of a free key exactly one succeeds, and
// an attempt's Finish or Extend applies only while its fence and attempt
// id still hold the key (otherwise [store.ErrLeaseLost]). The clock is
// Redis TIME, so workers with skewed clocks agree on leases. An expired
// record behaves as absent whether or not Redis has dropped it yet.
//
// go-redis retries a command whose connection failed; every write carries
// a call id, so a script that ran twice answers what its first run did,
// and retries are safe. A call whose context ends, or whose retries run
// out, returns an error: a store error, never an outcome, and the key is
// left to its lease and policy.
//
// # When Redis loses acknowledged writes
//
// Redis answers a write before it is on disk or on a replica. With
// persistence off, with appendonly no (snapshots only), or with
// appendfsync everysec (the common setting: up to a second of writes lost
// in a crash), and on a failover to an asynchronous replica, writes that
// callers were told about are lost. A lost completion makes the key
// in_progress again (AtLeastOnce later runs fn again; AtMostOnce reports
// it indeterminate); a lost claim lets a second attempt run beside the
// first, under either policy. A lost write never makes a key look
// completed when it was not: a duplicate is only ever given a result that
// fn returned. docs/stores.md goes through every kind of lost write.
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
// # Options and defaults
//
//   - [WithPrefix] (URL parameter idem_prefix): the prefix of every hash's
//     name, default "idem:" ([DefaultPrefix]); ledgers on one server need
//     prefixes of their own.
//   - [WithKeepExpired]: how long Redis keeps a hash past its expiry, so
//     that a later claim continues the key's fences; default 24 hours
//     ([DefaultKeepExpired]).
//   - [WithWait]: off (0 replicas) by default, because a server without
//     replicas would refuse every write with it.
//   - Connections: each call takes one connection from the client's pool
//     for one round trip; [Store.ClaimBatch] takes one from go-redis's
//     pipeline pool. Size the pools for the number of concurrent callers:
//     go-redis's defaults are 10 connections per CPU (pool_size) and 10
//     pipeline connections (pipeline_pool_size), both URL parameters of
//     [Open].
//
// Durability is the server's configuration, which the store reports but
// does not change. List and Sweep scan every key under the prefix: they
// are for operators, not for a hot path; [Store.Sweep] deletes expired
// records before Redis does.
//
// docs/stores.md in the repository explains the hash layout, the scripts,
// fences, expiry, call ids, the upgrade from a version without attempt ids
// (do not run both on one prefix at once) and the costs:
// https://github.com/idemkit/idem/blob/main/docs/stores.md#redisstore-redis
package redisstore
