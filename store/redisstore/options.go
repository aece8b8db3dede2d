package redisstore

import (
	"time"
)

// DefaultPrefix is the prefix of the store's Redis keys unless
// [WithPrefix] says otherwise.
const DefaultPrefix = "idem:"

// DefaultKeepExpired is how long Redis keeps a record after its retention
// has passed, unless [WithKeepExpired] says otherwise.
const DefaultKeepExpired = 24 * time.Hour

// Option configures a [Store]; see [Open] and [New].
type Option func(*config)

type config struct {
	prefix       string
	keepExpired  time.Duration
	waitReplicas int
	waitTimeout  time.Duration
}

func defaultConfig() config {
	return config{prefix: DefaultPrefix, keepExpired: DefaultKeepExpired}
}

// WithPrefix sets the prefix of the store's Redis keys (default
// [DefaultPrefix]): the record of key k is the hash named prefix+k.
// Stores that share a server and a database must have prefixes of which
// none is a prefix of another ("idem:" and "idem:billing:" would see each
// other's records in List and Sweep; "idem:orders:" and "idem:billing:"
// are fine).
//
// On Redis Cluster the prefix may hold a hash tag ("{idem}:") only if all
// records should live in one slot; without one they spread over the
// cluster, which is what the store's single-key scripts allow.
func WithPrefix(prefix string) Option {
	return func(c *config) { c.prefix = prefix }
}

// WithKeepExpired sets how long Redis keeps a record after its retention
// (ExpiresAt) has passed (default [DefaultKeepExpired]). The store reads
// such a record as absent, exactly as if Redis had dropped it, but it
// remembers the key's fence and attempt numbers: a claim after the expiry
// continues them (and the journal). Once Redis drops the hash, the
// attempt numbers of the key start again at 1, and its fences at the
// server's clock in microseconds, above the old ones (see the package
// doc's Fences), so a holder from before the expiry (a process that
// stalled for longer than the retention) is refused either way. Zero lets
// Redis drop a record at its ExpiresAt. [Store.Sweep] deletes expired
// records earlier.
//
// The cost is memory: every record stays that much longer (with the
// Ledger's default retention of 7 days, the default keeps about 14% more
// records).
func WithKeepExpired(d time.Duration) Option {
	return func(c *config) { c.keepExpired = max(d, 0) }
}

// WithWait makes every write wait until at least replicas replicas have
// acknowledged it (Redis WAIT, sent after the script on the same
// connection, in the same round trip), or until timeout. A write that
// too few replicas acknowledged returns an error wrapping a
// [*NotReplicatedError]: a store error, never an outcome. A claim that
// was acquired but not acknowledged is undone (best effort) before the
// error is returned, so that no attempt is left holding a key that nobody
// runs: a claim of a free key is released; a takeover of a lapsed attempt
// is abandoned (left lapsed at once, as if its caller had crashed), so
// that the next claim is again a takeover (and, under AtMostOnce without
// TakeLapsed, finds the key indeterminate): the lapsed attempt may have
// done the effect. Either way the undone attempt's reason is made by
// [store.NotRunReason], so a Reconcile hook is asked about the attempt
// before it.
//
// WAIT makes a write survive the failover of the primary to an
// acknowledging replica; it does not make it durable on disk (see the
// package doc). replicas 0 (the default) sends no WAIT. With WAIT, a
// primary whose replicas are down refuses to confirm any write. timeout
// (default 1s when not positive) must be shorter than the client's read
// timeout and than the deadlines of the callers' contexts.
//
// WithWait needs a *redis.Client (also from redis.NewFailoverClient) or a
// *redis.ClusterClient, where the store sends WAIT to the node that holds
// each key; [New] panics with [ErrWaitOnRing] when given it with a
// *redis.Ring.
func WithWait(replicas int, timeout time.Duration) Option {
	return func(c *config) {
		c.waitReplicas = max(replicas, 0)
		c.waitTimeout = timeout
		if c.waitTimeout <= 0 {
			c.waitTimeout = time.Second
		}
	}
}
