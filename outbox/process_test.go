package outbox_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testlog"
	"github.com/idemkit/idem/internal/testproc"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/sqlqueue"
)

// The environment of TestRelayKilled's child.
const (
	envKillApp    = "OUTBOX_TEST_KILL_APP"    // the application's database (the outbox)
	envKillTarget = "OUTBOX_TEST_KILL_TARGET" // the target's database
)

const (
	killOrders     = 60
	killAfter      = 20 // the child's publish after which it stops, published and not acked
	killVisibility = time.Second
)

// TestRelayKilled runs a relay in a child process (this test binary again)
// and kills it (SIGKILL) right after a publish the target confirmed and
// before its ack, with other publishes under way. A relay restarted on the
// same files publishes what was left, the message caught between publish
// and ack again with the same dedup id (the target reports a duplicate):
// every order's message is at the target exactly once, the consumer's
// ledger runs each effect once, and nothing is left in the outbox.
func TestRelayKilled(t *testing.T) {
	if os.Getenv(envKillApp) != "" {
		killChild(t)
		return
	}
	dir := t.TempDir()
	appPath, targetPath := filepath.Join(dir, "app.db"), filepath.Join(dir, "broker.db")
	a := openApp(t, appPath, killVisibility)
	tg := openTarget(t, targetPath)
	for i := range killOrders {
		a.placeOrder(t, fmt.Sprint("o", i), true)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	seen := testproc.KillAtLine(ctx, t, "TestRelayKilled",
		[]string{envKillApp + "=" + appPath, envKillTarget + "=" + targetPath}, "PUBLISHED, NOT ACKED")
	if st := stats(t, tg.q); st.Ready < killAfter {
		t.Fatalf("target after the kill: %+v, want at least %d; child said:\n%s", st, killAfter, strings.Join(seen, "\n"))
	}
	if st := stats(t, a.outbox); st.Ready+st.InFlight == 0 {
		t.Fatalf("outbox after the kill: %+v, want messages left", st)
	}

	var log testlog.Buffer
	r, err := outbox.NewRelay(a.outbox, tg.q, outbox.WithPublishTimeout(killVisibility/2), outbox.WithLogger(debugLog(&log)))
	if err != nil {
		t.Fatal(err)
	}
	drainUntilEmpty(t, r, a.outbox)
	if !strings.Contains(log.String(), "duplicate=true") {
		t.Fatalf("the restarted relay found no duplicate; the message caught between publish and ack was not republished:\n%s", log.String())
	}
	if st := stats(t, a.outbox); st != (sqlqueue.Stats{Queue: "outbox"}) {
		t.Fatalf("outbox after the restart: %+v, want empty", st)
	}
	if st := stats(t, tg.q); st.Ready != killOrders {
		t.Fatalf("target after the restart: %+v, want %d ready (one copy each)", st, killOrders)
	}
	effects := tg.consume(t)
	if len(effects) != killOrders {
		t.Fatalf("%d effects, want %d", len(effects), killOrders)
	}
	for i := range killOrders {
		if k := idem.Key("order-placed", fmt.Sprint("o", i)).String(); effects[k] != 1 {
			t.Fatalf("effect of %s ran %d times, want 1", k, effects[k])
		}
	}
}

// killChild relays with 4 publishes at once, and after its killAfter-th
// confirmed publish says so on stdout and waits to be killed, before the
// ack.
func killChild(t *testing.T) {
	a := openApp(t, os.Getenv(envKillApp), killVisibility)
	tg := openTarget(t, os.Getenv(envKillTarget))
	var n atomic.Int64
	pub := publisherFunc(func(ctx context.Context, m queue.Outgoing) (queue.Published, error) {
		p, err := tg.q.Publish(ctx, m)
		if err == nil && n.Add(1) == killAfter {
			fmt.Println("PUBLISHED, NOT ACKED", m.DedupID)
			select {} // killed here, between the publish and the ack
		}
		return p, err
	})
	r, err := outbox.NewRelay(a.outbox, pub, outbox.WithConcurrency(4), outbox.WithBatchSize(4),
		outbox.WithPublishTimeout(killVisibility/2), outbox.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	_ = r.Run(context.Background())
}
