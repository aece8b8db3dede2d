package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/store"
	"github.com/redis/go-redis/v9"
)

// Store is an [store.Store] kept in Redis, one hash per key. It also
// implements [store.BatchClaimer] and [store.BatchFinisher]. Make one with [Open] or [New]; it is safe
// for concurrent use by many goroutines, and any number of processes may
// share a prefix.
type Store struct {
	client redis.UniversalClient
	own    bool
	cfg    config
	closed atomic.Bool

	// clock, when set (tests only), is an offset in microseconds added to
	// the server's clock in every script.
	clock *atomic.Int64

	idBase string // random; call ids are idBase + a sequence number
	seq    atomic.Uint64
	extra0 any // ARGV[2] without a clock offset, boxed once
}

var (
	_ store.Store         = (*Store)(nil)
	_ store.BatchClaimer  = (*Store)(nil)
	_ store.BatchFinisher = (*Store)(nil)
)

// URL parameters read by [Open] (and removed before the URL is handed to
// go-redis), setting the options of the same names.
const (
	ParamPrefix       = "idem_prefix"        // as WithPrefix
	ParamKeepExpired  = "idem_keep_expired"  // a time.Duration, as WithKeepExpired
	ParamWaitReplicas = "idem_wait_replicas" // an integer, as WithWait's replicas
	ParamWaitTimeout  = "idem_wait_timeout"  // a time.Duration, as WithWait's timeout (default 1s)
)

// Open connects to the Redis server rawURL names, with a client (and a
// connection pool) of its own, checks that the server answers, and loads
// the store's scripts. ctx bounds the opening only.
//
// rawURL is anything redis.ParseURL accepts
// (redis://user:password@host:6379/0?pool_size=64&dial_timeout=3s,
// rediss:// for TLS, unix:///path/redis.sock?db=0), plus the parameters
// [ParamPrefix], [ParamKeepExpired], [ParamWaitReplicas] and
// [ParamWaitTimeout] (e.g. ...?idem_prefix=billing:); options passed to
// Open take precedence over them.
//
// The client Open makes honors the deadlines of the contexts passed to
// the store's calls (go-redis's ContextTimeoutEnabled), and keeps
// go-redis's retries of a command whose connection failed: every write
// carries a call id, so a write that reached Redis twice answers what its
// first run did (see the package doc). For Redis Cluster or Sentinel, make
// the client yourself and use [New]. [Store.Close] closes the client.
func Open(ctx context.Context, rawURL string, opts ...Option) (*Store, error) {
	clean, fromURL, err := splitURL(rawURL)
	if err != nil {
		return nil, err
	}
	ro, err := redis.ParseURL(clean)
	if err != nil {
		return nil, fmt.Errorf("redisstore: %w", err)
	}
	ro.ContextTimeoutEnabled = true
	client := redis.NewClient(ro)
	s := New(client, append(fromURL, opts...)...)
	s.own = true
	if err := s.Ping(ctx); err != nil {
		client.Close()
		return nil, err
	}
	return s, nil
}

// splitURL removes the store's parameters from rawURL and returns them as
// options.
func splitURL(rawURL string) (string, []Option, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", nil, fmt.Errorf("redisstore: %w", err)
	}
	q := u.Query()
	var opts []Option
	if q.Has(ParamPrefix) {
		opts = append(opts, WithPrefix(q.Get(ParamPrefix)))
	}
	if q.Has(ParamKeepExpired) {
		d, err := time.ParseDuration(q.Get(ParamKeepExpired))
		if err != nil || d < 0 {
			return "", nil, fmt.Errorf("redisstore: %s=%q: want a duration such as 24h", ParamKeepExpired, q.Get(ParamKeepExpired))
		}
		opts = append(opts, WithKeepExpired(d))
	}
	if q.Has(ParamWaitReplicas) || q.Has(ParamWaitTimeout) {
		n, err := strconv.Atoi(q.Get(ParamWaitReplicas))
		if err != nil || n < 0 {
			return "", nil, fmt.Errorf("redisstore: %s=%q: want a number of replicas", ParamWaitReplicas, q.Get(ParamWaitReplicas))
		}
		timeout := time.Second
		if v := q.Get(ParamWaitTimeout); v != "" {
			if timeout, err = time.ParseDuration(v); err != nil || timeout <= 0 {
				return "", nil, fmt.Errorf("redisstore: %s=%q: want a duration such as 500ms", ParamWaitTimeout, v)
			}
		}
		opts = append(opts, WithWait(n, timeout))
	}
	for _, p := range []string{ParamPrefix, ParamKeepExpired, ParamWaitReplicas, ParamWaitTimeout} {
		q.Del(p)
	}
	u.RawQuery = q.Encode()
	return u.String(), opts, nil
}

// New returns a store on client, the caller's: a *redis.Client (also from
// redis.NewFailoverClient, for Sentinel), a *redis.ClusterClient or a
// *redis.Ring. New does not contact the server; see [Store.Ping]. Closing
// the store does not close client.
//
// Set ContextTimeoutEnabled in the client's options, so that the deadlines
// of the contexts passed to the store bound its calls. The client's
// retries are safe (see the package doc).
//
// [WithWait] does not work on a *redis.Ring: New panics when given both
// (see [ErrWaitOnRing]), as it does with a nil client.
func New(client redis.UniversalClient, opts ...Option) *Store {
	if client == nil {
		panic("redisstore: New: nil client")
	}
	cfg := defaultConfig()
	for _, o := range opts {
		o(&cfg)
	}
	if _, ring := client.(*redis.Ring); ring && cfg.waitReplicas > 0 {
		panic(ErrWaitOnRing)
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	return &Store{client: client, cfg: cfg, idBase: hex.EncodeToString(b[:]) + ":", extra0: cfg.keepExpired.Microseconds()}
}

// ErrWaitOnRing is what [New] panics with when given a *redis.Ring and
// [WithWait]. WAIT has no key: it must follow the write on the connection
// that made it, and a Ring routes a command without a key to a shard of
// its own choosing, so the WAIT would count the replicas of another shard
// than the one that holds the record. A Ring also moves keys to other
// shards when one is down, which loses records whatever WAIT confirmed.
// For replicated writes, use one server (with its replicas, or Sentinel)
// through a *redis.Client, or Redis Cluster.
var ErrWaitOnRing = errors.New("redisstore: WithWait does not work on a *redis.Ring: WAIT would reach another shard than the write's; use a *redis.Client or a *redis.ClusterClient")

// Client returns the store's Redis client.
func (s *Store) Client() redis.UniversalClient { return s.client }

// Prefix returns the prefix of the store's Redis keys: the hash of the
// operation key k is named Prefix()+k.
func (s *Store) Prefix() string { return s.cfg.prefix }

// Ping checks that the server answers and loads the store's scripts into
// its script cache (on every master of a cluster, on every live shard of a
// Ring), so that the first calls do not send them.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	ping := func(ctx context.Context, c redis.UniversalClient) error {
		if err := c.Ping(ctx).Err(); err != nil {
			return err
		}
		for _, sc := range allScripts {
			if err := sc.Load(ctx, c).Err(); err != nil {
				return err
			}
		}
		return nil
	}
	var err error
	if r, ok := s.client.(*redis.Ring); ok {
		// The Ring sends a command without a key (PING, SCRIPT LOAD) to a
		// shard of its choosing.
		err = r.ForEachShard(ctx, func(ctx context.Context, c *redis.Client) error { return ping(ctx, c) })
	} else {
		err = ping(ctx, s.client)
	}
	return s.wrap("ping", "", err)
}

// load loads sc into the script cache of the servers c reaches: a Ring's
// SCRIPT LOAD, having no key, would reach one shard of go-redis's
// choosing, so on a Ring sc is loaded on every live shard (a ClusterClient
// loads it on every master itself).
func load(ctx context.Context, c scripter, sc *redis.Script) error {
	if r, ok := c.(*redis.Ring); ok {
		return r.ForEachShard(ctx, func(ctx context.Context, shard *redis.Client) error {
			return sc.Load(ctx, shard).Err()
		})
	}
	return sc.Load(ctx, c).Err()
}

// Close marks the store closed: later calls return an error wrapping
// [store.ErrClosed]. A store from [Open] also closes its client. Close is
// idempotent.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	if s.own {
		return s.client.Close()
	}
	return nil
}

var errClosed = fmt.Errorf("redisstore: %w", store.ErrClosed)

// check returns the error a call must return before reaching Redis.
func (s *Store) check(ctx context.Context) error {
	if s.closed.Load() {
		return errClosed
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("redisstore: %w", err)
	}
	return nil
}

// wrap turns a client error into the store's error for op on key.
func (s *Store) wrap(op, key string, err error) error {
	if err == nil {
		return nil
	}
	if s.closed.Load() || errors.Is(err, redis.ErrClosed) {
		return errClosed
	}
	if key == "" {
		return fmt.Errorf("redisstore: %s: %w", op, err)
	}
	return fmt.Errorf("redisstore: %s %q: %w", op, key, err)
}

// rkey is the Redis key of the record of key.
func (s *Store) rkey(key string) string { return s.cfg.prefix + key }

// offset is the test clock's offset in microseconds (0 but in tests).
func (s *Store) offset() int64 {
	if s.clock == nil {
		return 0
	}
	return s.clock.Load()
}

// args returns the arguments every script starts with (see scripts.go),
// then a fresh call id, then more.
func (s *Store) args(more ...any) []any {
	return append(s.argsCap(len(more)), more...)
}

// argsCap is args with room for n more, for callers that append them.
func (s *Store) argsCap(n int) []any {
	a := make([]any, 3, 3+n)
	a[0], a[1] = s.clockArgs()
	a[2] = s.callID()
	return a
}

// readArgs returns the arguments of a script that does not write.
func (s *Store) readArgs() []any {
	off, extra := s.clockArgs()
	return []any{off, extra}
}

// clockArgs returns ARGV[1] and ARGV[2] of every script.
func (s *Store) clockArgs() (off, extra any) {
	o := s.offset()
	if o == 0 {
		return argZero, s.extra0
	}
	return o, s.cfg.keepExpired.Microseconds() - o
}

// Arguments boxed once.
var (
	argZero   any = int64(0)
	argFlag       = [2]any{"0", "1"} // false, true
	argPolicy     = [2]any{store.AtLeastOnce.String(), store.AtMostOnce.String()}
)

// callID returns an id no other call of any store makes.
func (s *Store) callID() string {
	return s.idBase + strconv.FormatUint(s.seq.Add(1), 36)
}

// NotReplicatedError is returned (wrapped) by a write that Redis applied
// but fewer replicas than [WithWait] asks for acknowledged in time: the
// write may be lost if the primary fails now. It is a store error, never an
// outcome.
type NotReplicatedError struct {
	Want, Got int
	Err       error // WAIT's own error, if it failed
}

// Error describes the shortfall.
func (e *NotReplicatedError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("redisstore: WAIT for %d replicas failed: %v", e.Want, e.Err)
	}
	return fmt.Sprintf("redisstore: the write reached %d of the %d replicas WAIT asks for", e.Got, e.Want)
}

// Unwrap returns WAIT's own error, if it failed.
func (e *NotReplicatedError) Unwrap() error { return e.Err }

// eval runs script on key. With WithWait, it sends WAIT after the script
// on the same connection, in the same round trip; when too few replicas
// acknowledge, it returns the script's answer and a *NotReplicatedError.
func (s *Store) eval(ctx context.Context, sc *redis.Script, key string, args []any) (any, error) {
	keys := []string{s.rkey(key)}
	if s.cfg.waitReplicas == 0 {
		return sc.Run(ctx, s.client, keys, args...).Result()
	}
	c, err := s.nodeFor(ctx, keys[0])
	if err != nil {
		return nil, err
	}
	for range 2 {
		pipe := c.Pipeline()
		ev := sc.EvalSha(ctx, pipe, keys, args...)
		w := pipe.Do(ctx, "wait", s.cfg.waitReplicas, s.cfg.waitTimeout.Milliseconds())
		_, _ = pipe.Exec(ctx)
		if isNoScript(ev.Err()) {
			if err := load(ctx, c, sc); err != nil {
				return nil, err
			}
			continue
		}
		v, err := ev.Result()
		if err != nil {
			return nil, err
		}
		return v, s.replicated(w)
	}
	return nil, errors.New("redisstore: the server keeps forgetting the store's scripts")
}

// replicated checks the answer of a WAIT.
func (s *Store) replicated(w *redis.Cmd) error {
	n, err := w.Int64()
	if err != nil {
		return &NotReplicatedError{Want: s.cfg.waitReplicas, Err: err}
	}
	if int(n) < s.cfg.waitReplicas {
		return &NotReplicatedError{Want: s.cfg.waitReplicas, Got: int(n)}
	}
	return nil
}

// scripter is a client that pipelines and loads scripts.
type scripter interface {
	redis.Scripter
	Pipeline() redis.Pipeliner
}

// nodeFor returns the client of the node that holds key: the client
// itself, or the key's master on a cluster (WAIT must follow the write on
// its connection). The client is never a *redis.Ring: New refuses one
// with WithWait.
func (s *Store) nodeFor(ctx context.Context, key string) (scripter, error) {
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		return cc.MasterForKey(ctx, key)
	}
	return s.client, nil
}

func isNoScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || strings.HasPrefix(err.Error(), "NOSCRIPT"))
}

// micros converts a duration to whole microseconds, the scripts' unit.
func micros(d time.Duration) int64 { return d.Microseconds() }
