package sqlqueue_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testlog"
	"github.com/idemkit/idem/internal/testproc"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/sqlqueue"
	"github.com/idemkit/idem/store"
)

// The environment of TestConsumerKilledMidHandler's child.
const (
	envCrashDB      = "SQLQUEUE_TEST_CRASH_DB"      // the database the child consumes from
	envCrashEffects = "SQLQUEUE_TEST_CRASH_EFFECTS" // the file each effect appends a line to
	envCrashPolicy  = "SQLQUEUE_TEST_CRASH_POLICY"
)

// crash timings: short, so the redelivery comes soon after the kill.
const (
	crashVisibility = 2 * time.Second
	crashLease      = time.Second
)

// TestConsumerKilledMidHandler kills (SIGKILL) a consumer process right
// after its handler did the effect and before anything was recorded, then
// runs a fresh consumer on the same SQLite file, as a restarted worker
// would. The message comes back when its visibility lapses, and what
// happens is the policy's:
//   - AtLeastOnce: the new worker takes over the lapsed attempt and does the
//     effect again (logged as a takeover), unless a Reconcile hook finds
//     the first effect, in which case it is recorded without repeating.
//   - AtMostOnce: the effect is not repeated; the key is indeterminate
//     (listed by idem ls --stuck) and the message, after its receives run
//     out, is dead-lettered for an operator.
func TestConsumerKilledMidHandler(t *testing.T) {
	if os.Getenv(envCrashDB) != "" {
		crashChild(t)
		return
	}
	for _, tc := range []struct {
		name      string
		policy    idem.Policy
		reconcile bool
		effects   int
	}{
		{"at_least_once", idem.AtLeastOnce, false, 2},
		{"at_least_once_reconciled", idem.AtLeastOnce, true, 1},
		{"at_most_once", idem.AtMostOnce, false, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			path, effects := filepath.Join(dir, "idem.db"), filepath.Join(dir, "effects")
			e := openSQLite(t, path, nil)
			q := e.queue(t, "receipts", sqlqueue.WithVisibility(crashVisibility))
			publish(t, q, queue.Outgoing{Body: []byte("order-42")})

			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			seen := testproc.KillAtLine(ctx, t, "TestConsumerKilledMidHandler",
				[]string{envCrashDB + "=" + path, envCrashEffects + "=" + effects, envCrashPolicy + "=" + tc.policy.String()}, "EFFECT DONE")
			if n := countEffects(t, effects); n != 1 {
				t.Fatalf("after the child: %d effects, want 1; child said:\n%s", n, strings.Join(seen, "\n"))
			}

			// The restarted worker.
			var lg testlog.Buffer
			log := slog.New(slog.NewTextHandler(&lg, nil))
			var opts []idem.CallOption
			if tc.reconcile {
				opts = append(opts, idem.WithReconcile(func(context.Context, idem.Lapsed) ([]byte, bool, error) {
					return []byte("found"), countEffects(t, effects) > 0, nil
				}))
			}
			l := idem.New(e.store, idem.WithPolicy(tc.policy), idem.WithLease(crashLease), idem.WithOwner("restarted"), idem.WithLogger(log))
			c, err := queue.NewConsumer(q, l, queue.MessageIDKey("receipts"), effectHandler(effects, nil),
				queue.WithHandlerTimeout(crashVisibility), queue.WithMaxReceives(3), queue.WithLogger(log),
				queue.WithBackoff(100*time.Millisecond, 200*time.Millisecond),
				queue.WithCallOptions(func(queue.Message) []idem.CallOption { return opts }))
			if err != nil {
				t.Fatal(err)
			}
			runCtx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- c.Run(runCtx) }()
			for {
				st, err := q.Stats(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if st.Ready+st.InFlight+st.Delayed == 0 {
					break
				}
				if ctx.Err() != nil {
					t.Fatalf("the message was never settled after the crash: %+v\nlog:\n%s", st, lg.String())
				}
				time.Sleep(20 * time.Millisecond)
			}
			stop()
			if err := <-done; err != nil {
				t.Fatal(err)
			}

			if n := countEffects(t, effects); n != tc.effects {
				t.Fatalf("%s: %d effects after the restart, want %d; log:\n%s", tc.name, n, tc.effects, lg.String())
			}
			st, _ := q.Stats(context.Background())
			stuck, err := e.store.List(context.Background(), store.ListQuery{Stuck: true})
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case tc.policy == idem.AtMostOnce:
				if len(stuck) != 1 || st.DeadLettered != 1 {
					t.Fatalf("at_most_once: %d stuck keys and %d dead letters, want 1 and 1; log:\n%s", len(stuck), st.DeadLettered, lg.String())
				}
			case tc.reconcile:
				if !strings.Contains(lg.String(), "outcome=reconciled") || len(stuck) != 0 {
					t.Fatalf("reconciled: the log does not say so (or %d keys stuck):\n%s", len(stuck), lg.String())
				}
			default:
				if !strings.Contains(lg.String(), "outcome=takeover") || len(stuck) != 0 {
					t.Fatalf("at_least_once: no takeover logged (or %d keys stuck):\n%s", len(stuck), lg.String())
				}
			}
		})
	}
}

// crashChild consumes the queue with a handler that does the effect, says
// so on stdout, and waits to be killed.
func crashChild(t *testing.T) {
	e := openSQLite(t, os.Getenv(envCrashDB), nil)
	q := e.queue(t, "receipts", sqlqueue.WithVisibility(crashVisibility))
	policy := idem.AtLeastOnce
	if os.Getenv(envCrashPolicy) == idem.AtMostOnce.String() {
		policy = idem.AtMostOnce
	}
	l := idem.New(e.store, idem.WithPolicy(policy), idem.WithLease(crashLease), idem.WithOwner("doomed"), idem.WithLogger(discard))
	c, err := queue.NewConsumer(q, l, queue.MessageIDKey("receipts"), effectHandler(os.Getenv(envCrashEffects), func() {
		fmt.Println("EFFECT DONE")
		select {} // killed here, between the effect and its record
	}), queue.WithHandlerTimeout(crashVisibility), queue.WithLogger(discard))
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Run(context.Background())
}

// effectHandler appends a line to the effects file, then calls after.
func effectHandler(path string, after func()) queue.Handler {
	return func(_ context.Context, m queue.Message) ([]byte, error) {
		f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return nil, err
		}
		_, err = fmt.Fprintln(f, m.ID)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err == nil && after != nil {
			after()
		}
		return []byte("sent"), err
	}
}

func countEffects(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return len(strings.Fields(string(b)))
}
