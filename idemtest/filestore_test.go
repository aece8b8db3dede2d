//go:build unix

package idemtest_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/store"
)

// fileStore is a small store.Store kept in a directory, one file per key,
// each read and written under an flock of its own, so that several
// processes can share it. It exists to run the suite's multi-process and
// corrupt-record tests (and its sleeping path, on the real clock) inside
// idemtest itself; it is not a product. A file is never removed (another
// process may be waiting on its lock): an empty file is an absent record.
type fileStore struct {
	dir    string
	mu     sync.Mutex // flock does not exclude goroutines of one process
	closed atomic.Bool
}

func openFileStore(dir string) (*fileStore, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	return &fileStore{dir: dir}, nil
}

func (s *fileStore) file(key string) string {
	sum := sha256.Sum256([]byte(key))
	return filepath.Join(s.dir, hex.EncodeToString(sum[:16])+".rec")
}

// with runs f on key's record under its file's lock and writes back the
// record f returns when it says the record changed (nil: absent).
func (s *fileStore) with(ctx context.Context, key string, f func(raw []byte, now time.Time) (next []byte, changed bool, err error)) error {
	if s.closed.Load() {
		return idem.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.withFile(s.file(key), f)
}

func (s *fileStore) withFile(path string, f func(raw []byte, now time.Time) ([]byte, bool, error)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	fd, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer fd.Close()
	if err := syscall.Flock(int(fd.Fd()), syscall.LOCK_EX); err != nil {
		return err
	}
	raw, err := io.ReadAll(fd)
	if err != nil {
		return err
	}
	next, changed, err := f(raw, time.Now())
	if changed {
		if werr := fd.Truncate(0); werr != nil {
			return werr
		}
		if _, werr := fd.WriteAt(next, 0); werr != nil {
			return werr
		}
	}
	return err
}

func decode(key string, raw []byte) (*idem.Record, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	var r idem.Record
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, &idem.CorruptError{Key: key, Detail: err.Error()}
	}
	return &r, nil
}

func encode(r *idem.Record) []byte {
	b, _ := json.Marshal(r)
	return b
}

// all reads every record (for List and Sweep).
func (s *fileStore) all(ctx context.Context, f func(rec *idem.Record, now time.Time) (del bool)) error {
	if s.closed.Load() {
		return idem.ErrClosed
	}
	paths, err := filepath.Glob(filepath.Join(s.dir, "*.rec"))
	if err != nil {
		return err
	}
	for _, p := range paths {
		err := s.withFile(p, func(raw []byte, now time.Time) ([]byte, bool, error) {
			rec, err := decode(p, raw)
			if err != nil || rec == nil {
				return nil, false, err
			}
			return nil, f(rec, now), nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

func (s *fileStore) Claim(ctx context.Context, req store.ClaimRequest) (res store.ClaimResult, err error) {
	if err := req.Check(); err != nil {
		return res, err
	}
	err = s.with(ctx, req.Key, func(raw []byte, now time.Time) ([]byte, bool, error) {
		rec, err := decode(req.Key, raw)
		if err != nil {
			return nil, false, err
		}
		next, r := store.ApplyClaim(rec, req, now, 0)
		res = r
		if next == nil {
			return nil, false, nil
		}
		return encode(next), true, nil
	})
	return res, err
}

func (s *fileStore) Finish(ctx context.Context, req store.FinishRequest) error {
	if err := req.Check(); err != nil {
		return err
	}
	return s.with(ctx, req.Key, func(raw []byte, now time.Time) ([]byte, bool, error) {
		rec, err := decode(req.Key, raw)
		if err != nil {
			return nil, false, err
		}
		next, err := store.ApplyFinish(rec, req, now)
		if next == nil {
			return nil, false, err
		}
		return encode(next), true, err
	})
}

func (s *fileStore) Extend(ctx context.Context, req store.ExtendRequest) (until time.Time, err error) {
	if err := req.Check(); err != nil {
		return until, err
	}
	err = s.with(ctx, req.Key, func(raw []byte, now time.Time) ([]byte, bool, error) {
		rec, err := decode(req.Key, raw)
		if err != nil {
			return nil, false, err
		}
		next, err := store.ApplyExtend(rec, req, now)
		if next == nil {
			return nil, false, err
		}
		if err == nil {
			until = next.LeaseUntil
		}
		return encode(next), true, err
	})
	return until, err
}

func (s *fileStore) Get(ctx context.Context, key string) (rec idem.Record, err error) {
	err = s.with(ctx, key, func(raw []byte, now time.Time) ([]byte, bool, error) {
		r, err := decode(key, raw)
		if err != nil {
			return nil, false, err
		}
		if r == nil || r.Expired(now) {
			return nil, false, store.ErrNotFound
		}
		rec = *r
		return nil, false, nil
	})
	return rec, err
}

func (s *fileStore) List(ctx context.Context, q store.ListQuery) ([]idem.Record, error) {
	if err := q.Check(); err != nil {
		return nil, err
	}
	limit := q.PageSize()
	var out []idem.Record
	err := s.all(ctx, func(r *idem.Record, now time.Time) bool {
		if !q.Matches(r, now) {
			return false
		}
		out = append(out, *r)
		return false
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	if len(out) > limit {
		out = out[:limit]
	}
	return out, err
}

func (s *fileStore) Resolve(ctx context.Context, res store.ResolveRequest) (rec idem.Record, err error) {
	err = s.with(ctx, res.Key, func(raw []byte, now time.Time) ([]byte, bool, error) {
		r, err := decode(res.Key, raw)
		if err != nil {
			return nil, false, err
		}
		next, err := store.ApplyResolve(r, res, now)
		if err != nil {
			return nil, false, err
		}
		rec = *next
		return encode(next), true, nil
	})
	return rec, err
}

func (s *fileStore) Delete(ctx context.Context, key string) error {
	return s.with(ctx, key, func(raw []byte, now time.Time) ([]byte, bool, error) {
		r, err := decode(key, raw)
		if err == nil && (r == nil || r.Expired(now)) {
			return nil, false, store.ErrNotFound
		}
		return nil, true, nil
	})
}

func (s *fileStore) Sweep(ctx context.Context, limit int) (int, error) {
	n := 0
	err := s.all(ctx, func(r *idem.Record, now time.Time) bool {
		if n < limit && r.Expired(now) {
			n++
			return true
		}
		return false
	})
	return n, err
}

func (s *fileStore) Now(context.Context) (time.Time, error) {
	if s.closed.Load() {
		return time.Time{}, idem.ErrClosed
	}
	return time.Now(), nil
}

func (s *fileStore) Close() error {
	s.closed.Store(true)
	return nil
}

// TestFileStore runs the suite on fileStore: real clock, separate
// processes, corrupt records.
func TestFileStore(t *testing.T) {
	if testing.Short() {
		t.Skip("sleeps through leases; skipped with -short")
	}
	open := func(loc string) (store.Store, error) { return openFileStore(loc) }
	idemtest.TestStore(t, idemtest.Harness{
		New: func(t testing.TB) store.Store {
			s, err := openFileStore(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		Locator:        func(t testing.TB) string { return t.TempDir() },
		Open:           open,
		HeartbeatLease: time.Second, // the default 300 ms lapsed behind a late timer under CI's load (memstore)
		Corrupt: func(t testing.TB, s store.Store, key string) {
			fs := s.(*fileStore)
			err := fs.with(context.Background(), key, func([]byte, time.Time) ([]byte, bool, error) {
				return []byte("{not json"), true, nil
			})
			if err != nil {
				t.Fatal(err)
			}
		},
	})
}
