package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"github.com/idemkit/idem/internal/testenv"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// envURL names the service the tests use; without it they are skipped.
const envURL = testenv.Redis

// testURL returns the test service's URL, or skips t.
func testURL(t testing.TB) string {
	t.Helper()
	return testenv.Require(t, envURL, "the Redis suite")
}

var shared struct {
	once   sync.Once
	client *redis.Client
	err    error
}

// testClient returns a client shared by the tests (closed by TestMain).
func testClient(t testing.TB) *redis.Client {
	t.Helper()
	u := testURL(t)
	shared.once.Do(func() {
		o, err := redis.ParseURL(u)
		if err != nil {
			shared.err = err
			return
		}
		o.PoolSize = 128
		o.ContextTimeoutEnabled = true
		shared.client = redis.NewClient(o)
		shared.err = shared.client.Ping(context.Background()).Err()
	})
	if shared.err != nil {
		t.Fatalf("connecting to %s: %v", envURL, shared.err)
	}
	return shared.client
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.client != nil {
		shared.client.Close()
	}
	os.Exit(code)
}

// newPrefix returns a key prefix of t's own; the keys under it are deleted
// when t ends.
func newPrefix(t testing.TB) string {
	t.Helper()
	c := testClient(t)
	var b [6]byte
	_, _ = rand.Read(b[:])
	p := "idemtest:" + hex.EncodeToString(b[:]) + ":"
	t.Cleanup(func() { dropPrefix(t, c, p) })
	return p
}

// dropPrefix deletes every key under prefix.
func dropPrefix(t testing.TB, c *redis.Client, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	iter := c.Scan(ctx, 0, globEscape(prefix)+"*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Errorf("scanning %s*: %v", prefix, err)
		return
	}
	for len(keys) > 0 {
		n := min(len(keys), 500)
		if err := c.Unlink(ctx, keys[:n]...).Err(); err != nil {
			t.Errorf("deleting %s*: %v", prefix, err)
			return
		}
		keys = keys[n:]
	}
}

// withPrefixURL returns the test URL naming prefix.
func withPrefixURL(t testing.TB, prefix string) string {
	t.Helper()
	u, err := url.Parse(testURL(t))
	if err != nil {
		t.Fatalf("%s is not a URL: %v", envURL, err)
	}
	q := u.Query()
	q.Set(ParamPrefix, prefix)
	u.RawQuery = q.Encode()
	return u.String()
}

// testClocks gives each test one clock offset, shared by the stores the
// test makes, so that Advance moves them all.
type testClocks struct {
	mu sync.Mutex
	m  map[testing.TB]*atomic.Int64
}

// get returns t's clock offset (microseconds), making it on first use.
func (c *testClocks) get(t testing.TB) *atomic.Int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[testing.TB]*atomic.Int64{}
	}
	if k, ok := c.m[t]; ok {
		return k
	}
	k := new(atomic.Int64)
	c.m[t] = k
	t.Cleanup(func() {
		c.mu.Lock()
		delete(c.m, t)
		c.mu.Unlock()
	})
	return k
}

// advance moves t's clock forward by d (rounded up to a microsecond).
func (c *testClocks) advance(t testing.TB, d time.Duration) {
	c.get(t).Add(int64((d + time.Microsecond - 1) / time.Microsecond))
}

// newTestStore returns a store under a fresh prefix on the shared client,
// closed when t ends. With clocks, its clock is t's, which the test can
// advance.
func newTestStore(t testing.TB, clocks *testClocks, opts ...Option) *Store {
	t.Helper()
	s := New(testClient(t), append([]Option{WithPrefix(newPrefix(t))}, opts...)...)
	if clocks != nil {
		s.clock = clocks.get(t)
	}
	t.Cleanup(func() { s.Close() })
	return s
}
