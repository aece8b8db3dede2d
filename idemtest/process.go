package idemtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store"
)

// Environment of a child process of the suite. The parent re-executes its
// own test binary with -test.run matching only the top-level test that
// called TestStore; TestStore sees envRole and plays the child's part.
const (
	envRole     = "IDEMTEST_CHILD_ROLE" // the part the child plays: roleRace or roleHold
	envLocator  = "IDEMTEST_LOCATOR"    // the store to open, from Harness.Locator
	envSuite    = "IDEMTEST_SUITE"      // t.Name() of the TestStore call the parent runs
	envDir      = "IDEMTEST_DIR"        // a directory shared by parent and children
	envChild    = "IDEMTEST_CHILD"      // this child's number
	envChildren = "IDEMTEST_CHILDREN"   // how many children race
	envKeys     = "IDEMTEST_KEYS"       // how many keys they race on
	envPolicy   = "IDEMTEST_POLICY"     // the policy of the held key
	envDeadline = "IDEMTEST_DEADLINE"   // the child gives up at this time (RFC 3339), if the parent died
)

const (
	roleRace = "race" // race the other children on the same keys
	roleHold = "hold" // claim a key and block inside fn until killed
)

// The key the hold role claims and the lease it claims it with. Between
// the child's last extension and the parent's claim come the kill, the
// child's exit and a read: 1 s was too short for that on a loaded machine
// (the parent's claim found the lease lapsed, not running).
const (
	holdKey   = "process:hold"
	holdLease = 3 * time.Second
)

// childTimeout bounds a child process, whatever happens to its parent.
// Racing 300 keys took a child more than a minute on dynalite while the
// suite's race tests (and another CI run) shared the emulator; a child
// that works is never waited for this long.
const childTimeout = 5 * time.Minute

// testProcess holds concurrency and crashes across OS processes sharing
// one store: children racing on the same keys, and a child killed with
// SIGKILL while inside fn.
func testProcess(t *testing.T, h Harness, suite string) {
	if h.Locator == nil || h.Open == nil {
		t.Skip("Harness.Locator and Harness.Open are not set: the store cannot be shared between processes, so the multi-process tests are skipped")
	}

	t.Run("two_processes_race_300_keys", func(t *testing.T) {
		t.Parallel()
		const children, keys = 2, 300
		loc := h.Locator(t)
		dir := t.TempDir()
		ctx, cancel := context.WithTimeout(context.Background(), childTimeout)
		defer cancel()
		cmds := make([]*child, children)
		for i := range children {
			cmds[i] = startChild(ctx, t, suite, roleRace, loc, dir,
				envChild+"="+strconv.Itoa(i), envChildren+"="+strconv.Itoa(children), envKeys+"="+strconv.Itoa(keys))
		}
		for _, c := range cmds {
			c.wait(t, true)
		}
		b, err := os.ReadFile(filepath.Join(dir, "effects"))
		noErr(t, "reading the effects file", err)
		seen := map[string]int{}
		for line := range strings.SplitSeq(strings.TrimSuffix(string(b), "\n"), "\n") {
			seen[line]++
		}
		for i := range keys {
			k := raceKey(i)
			if seen[k] != 1 {
				t.Errorf("key %q: fn ran %d times across the processes, want exactly 1", k, seen[k])
			}
			delete(seen, k)
		}
		for k, n := range seen {
			t.Errorf("unexpected effect line %q (%d times)", k, n)
		}
		s, err := h.Open(loc)
		noErr(t, "Open", err)
		defer s.Close()
		owners := map[string]int{}
		for i := range keys {
			rec := get(t, s, raceKey(i))
			if rec.Status != idem.StatusCompleted || rec.Attempt != 1 || len(rec.Journal) != 1 || rec.Journal[0].Fence != rec.Fence {
				t.Fatalf("key %q after the race: {%s, fence %d, attempt %d, journal %+v}, want {completed, its one attempt's fence, 1} (claimed once)",
					raceKey(i), rec.Status, rec.Fence, rec.Attempt, rec.Journal)
			}
			owners[rec.Owner]++
		}
		t.Logf("executions per process: %v", owners)
	})

	for _, p := range []idem.Policy{idem.AtLeastOnce, idem.AtMostOnce} {
		t.Run("sigkill_inside_fn/"+p.String(), func(t *testing.T) {
			t.Parallel()
			loc := h.Locator(t)
			dir := t.TempDir()
			s, err := h.Open(loc)
			noErr(t, "Open", err)
			defer s.Close()
			ctx, cancel := context.WithTimeout(context.Background(), childTimeout)
			defer cancel()
			started := now(t, s)
			c := startChild(ctx, t, suite, roleHold, loc, dir, envPolicy+"="+p.String())
			inside := filepath.Join(dir, "inside")
			for {
				if b, _ := os.ReadFile(inside); string(b) == "inside\n" {
					break
				}
				select {
				case <-c.done:
					t.Fatalf("the child exited before reaching fn: %v\n%s", c.err, c.out.String())
				case <-ctx.Done():
					t.Fatalf("the child did not reach fn in time\n%s", c.out.String())
				case <-time.After(5 * time.Millisecond):
				}
			}
			noErr(t, "killing the child", c.cmd.Process.Kill())
			c.wait(t, false)

			rec := get(t, s, holdKey)
			if rec.Status != idem.StatusInProgress || rec.Attempt != 1 || rec.AttemptID == "" || !strings.HasPrefix(rec.Owner, "child-") {
				t.Fatalf("after the kill: {%s, attempt %d, attempt id %q, owner %q}, want the child's in_progress claim (attempt 1, with its attempt id)",
					rec.Status, rec.Attempt, rec.AttemptID, rec.Owner)
			}
			wantFirstFence(t, "the killed child's claim", rec.Fence, started)
			var cnt counter
			l := idem.New(s, idem.WithLogger(discard), idem.WithOwner("parent"), idem.WithLease(holdLease), idem.WithPolicy(p))
			_, err = l.Do(context.Background(), idem.RawKey(holdKey), cnt.fn(nil))
			wantErr(t, "Do while the killed child's lease runs", err, idem.ErrInProgress)
			waitStoreClock(t, s, rec.LeaseUntil)

			switch p {
			case idem.AtLeastOnce:
				res := do(t, l, idem.RawKey(holdKey), cnt.fn([]byte("second")))
				if !res.Takeover || res.Attempt != 2 || res.Fence != rec.Fence+1 || res.Replayed {
					t.Fatalf("Do after the killed child's lease passed: Takeover %v, Attempt %d, Fence %d, Replayed %v; want true, 2, %d (the child's + 1), false",
						res.Takeover, res.Attempt, res.Fence, res.Replayed, rec.Fence+1)
				}
				cnt.want(t, 1)
				if rec := get(t, s, holdKey); rec.Journal[0].Outcome != store.OutcomeLapsed {
					t.Fatalf("the killed attempt's journal entry %+v, want outcome lapsed", rec.Journal[0])
				}
			case idem.AtMostOnce:
				_, err := l.Do(context.Background(), idem.RawKey(holdKey), cnt.fn(nil))
				wantIndeterminate(t, err, rec)
				cnt.want(t, 0)
				stuck, err := s.List(context.Background(), store.ListQuery{Stuck: true})
				noErr(t, "List(Stuck)", err)
				if !slices.Contains(keysOf(stuck), holdKey) {
					t.Fatalf("List(Stuck) = %q, want it to show %q (idem ls --stuck)", keysOf(stuck), holdKey)
				}
			}
		})
	}
}

// waitStoreClock waits until the store's clock reaches until.
func waitStoreClock(t *testing.T, s store.Store, until time.Time) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for now(t, s).Before(until) {
		if time.Now().After(deadline) {
			t.Fatalf("the store's clock did not reach %v (stores from Harness.Open must use the real clock)", until)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func raceKey(i int) string { return "process:race:" + strconv.Itoa(i) }

// child is a running child process.
type child struct {
	cmd  *exec.Cmd
	out  *bytes.Buffer
	done chan struct{}
	err  error
}

// startChild starts the test binary as a child playing role.
func startChild(ctx context.Context, t *testing.T, suite, role, loc, dir string, env ...string) *child {
	t.Helper()
	top, _, _ := strings.Cut(suite, "/")
	cmd := exec.CommandContext(ctx, os.Args[0],
		"-test.run=^"+regexp.QuoteMeta(top)+"$",
		"-test.count=1",
		"-test.v",
		"-test.timeout="+childTimeout.String())
	cmd.Env = append(os.Environ(),
		envRole+"="+role,
		envLocator+"="+loc,
		envSuite+"="+suite,
		envDir+"="+dir,
		envDeadline+"="+time.Now().Add(childTimeout).Format(time.RFC3339Nano))
	cmd.Env = append(cmd.Env, env...)
	c := &child{cmd: cmd, out: new(bytes.Buffer), done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = c.out, c.out
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting a child process: %v", err)
	}
	go func() {
		c.err = cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-c.done
	})
	return c
}

// wait waits for the child to exit; ok says whether it must have succeeded.
func (c *child) wait(t *testing.T, ok bool) {
	t.Helper()
	<-c.done
	if ok && c.err != nil {
		t.Fatalf("child process failed: %v\n%s", c.err, c.out.String())
	}
	if !ok && c.err == nil {
		t.Fatalf("child process exited normally, want it killed\n%s", c.out.String())
	}
}

// runChild plays the part of a child process named by the environment.
func runChild(t *testing.T, h Harness) {
	if got, want := t.Name(), os.Getenv(envSuite); got != want {
		t.Skipf("idemtest child for %q: not running the suite %q", want, got)
	}
	if h.Open == nil {
		t.Fatal("idemtest child: Harness.Open is not set")
	}
	deadline, err := time.Parse(time.RFC3339Nano, os.Getenv(envDeadline))
	if err != nil {
		t.Fatalf("idemtest child: bad %s: %v", envDeadline, err)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	s, err := h.Open(os.Getenv(envLocator))
	if err != nil {
		t.Fatalf("idemtest child: Open(%q): %v", os.Getenv(envLocator), err)
	}
	defer s.Close()
	dir := os.Getenv(envDir)
	id := os.Getenv(envChild)
	switch role := os.Getenv(envRole); role {
	case roleRace:
		childRace(ctx, t, s, dir, id)
	case roleHold:
		childHold(ctx, t, s, dir)
	default:
		t.Fatalf("idemtest child: unknown role %q", role)
	}
}

// childRace runs every key once through Do, racing the other children: each
// execution appends "key\n" to the shared effects file with one write.
func childRace(ctx context.Context, t *testing.T, s store.Store, dir, id string) {
	children, _ := strconv.Atoi(os.Getenv(envChildren))
	keys, _ := strconv.Atoi(os.Getenv(envKeys))
	f, err := os.OpenFile(filepath.Join(dir, "effects"), os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatalf("opening the effects file: %v", err)
	}
	defer f.Close()
	l := idem.New(s, idem.WithLogger(discard), idem.WithOwner("child-"+id))

	// Start together: each child says it is ready and waits for the others.
	noErr(t, "ready file", os.WriteFile(filepath.Join(dir, "ready-"+id), nil, 0o644))
	for {
		m, _ := filepath.Glob(filepath.Join(dir, "ready-*"))
		if len(m) >= children {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the other children never got ready")
		}
		time.Sleep(time.Millisecond)
	}

	executed := 0
	for _, i := range rand.Perm(keys) {
		key := raceKey(i)
		for {
			res, err := l.Do(ctx, idem.RawKey(key), func(context.Context) ([]byte, error) {
				if _, err := f.Write([]byte(key + "\n")); err != nil {
					return nil, idem.Permanent(err)
				}
				return []byte(key), nil
			})
			if errors.Is(err, idem.ErrInProgress) {
				var ip *idem.InProgressError
				errors.As(err, &ip)
				time.Sleep(min(ip.RetryAfter, time.Millisecond+rand.N(5*time.Millisecond)))
				continue
			}
			if err != nil {
				t.Fatalf("Do(%q): %v", key, err)
			}
			if string(res.Value) != key {
				t.Fatalf("Do(%q) returned %q", key, res.Value)
			}
			if !res.Replayed {
				executed++
			}
			break
		}
	}
	fmt.Printf("child %s executed %d of %d keys\n", id, executed, keys)
}

// childHold claims holdKey under the policy in the environment and blocks
// inside fn, with heartbeats keeping the lease, until it is killed.
func childHold(ctx context.Context, t *testing.T, s store.Store, dir string) {
	p, err := idem.ParsePolicy(os.Getenv(envPolicy))
	if err != nil {
		t.Fatalf("idemtest child: %v", err)
	}
	l := idem.New(s, idem.WithLogger(discard), idem.WithOwner("child-"+strconv.Itoa(os.Getpid())), idem.WithLease(holdLease), idem.WithPolicy(p))
	_, err = l.Do(ctx, idem.RawKey(holdKey), func(ctx context.Context) ([]byte, error) {
		if err := os.WriteFile(filepath.Join(dir, "inside.tmp"), []byte("inside\n"), 0o644); err != nil {
			return nil, err
		}
		if err := os.Rename(filepath.Join(dir, "inside.tmp"), filepath.Join(dir, "inside")); err != nil {
			return nil, err
		}
		<-ctx.Done() // until killed, or the deadline if the parent died
		return nil, ctx.Err()
	})
	t.Fatalf("the hold child was not killed before its deadline: Do returned %v", err)
}
