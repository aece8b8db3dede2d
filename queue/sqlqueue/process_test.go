package sqlqueue_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/sqlqueue"
)

// The environment of TestSQLiteTwoProcesses's children.
const (
	envChildDB      = "SQLQUEUE_TEST_CHILD_DB"      // the database both processes open
	envChildEffects = "SQLQUEUE_TEST_CHILD_EFFECTS" // the file each handled message appends a line to
)

const processMessages = 300

// TestSQLiteTwoProcesses runs two OS processes (this test binary again)
// that consume one queue in one SQLite file, each with the ledger in the
// same file, through queue.Consumer. Every handler run appends the
// message's id to a shared file (O_APPEND): each message must be handled
// exactly once and the queue left empty, with nothing failing on
// SQLITE_BUSY.
func TestSQLiteTwoProcesses(t *testing.T) {
	if os.Getenv(envChildDB) != "" {
		processChild(t)
		return
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "shared.db")
	effects := filepath.Join(dir, "effects")
	e := openSQLite(t, path, nil)
	q := e.queue(t, "work")
	var batch []queue.Outgoing
	for i := range processMessages {
		batch = append(batch, queue.Outgoing{Body: fmt.Appendf(nil, "m%d", i)})
	}
	if _, err := q.PublishBatch(context.Background(), batch); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var cmds []*exec.Cmd
	var outs []*strings.Builder
	for range 2 {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestSQLiteTwoProcesses$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), envChildDB+"="+path, envChildEffects+"="+effects)
		out := new(strings.Builder)
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
		outs = append(outs, out)
	}
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("child %d: %v\n%s", i, err, outs[i])
		}
	}
	b, err := os.ReadFile(effects)
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for _, line := range strings.Fields(string(b)) {
		count[line]++
	}
	if len(count) != processMessages {
		t.Fatalf("%d distinct messages handled, want %d\nchild 0:\n%s\nchild 1:\n%s", len(count), processMessages, outs[0], outs[1])
	}
	for id, n := range count {
		if n != 1 {
			t.Fatalf("message %s handled %d times", id, n)
		}
	}
	if st, err := q.Stats(context.Background()); err != nil || st != (sqlqueue.Stats{Queue: "work"}) {
		t.Fatalf("stats after both children = %+v, %v; want an empty queue", st, err)
	}
}

// processChild consumes the queue until it has been empty for a while.
func processChild(t *testing.T) {
	e := openSQLite(t, os.Getenv(envChildDB), nil, sqlqueue.WithPollInterval(20*time.Millisecond))
	q := e.queue(t, "work", sqlqueue.WithVisibility(time.Minute))
	f, err := os.OpenFile(os.Getenv(envChildEffects), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c, err := queue.NewConsumer(q, idem.New(e.store, idem.WithLogger(discard)), queue.MessageIDKey("work"),
		func(_ context.Context, m queue.Message) ([]byte, error) {
			_, err := fmt.Fprintln(f, m.ID)
			return nil, err
		}, queue.WithConcurrency(8), queue.WithLogger(discard))
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	// Stop once the queue has stayed empty (nothing ready or in flight).
	empty := 0
	for empty < 10 {
		time.Sleep(50 * time.Millisecond)
		st, err := q.Stats(context.Background())
		if err != nil {
			t.Error(err)
			break
		}
		if st.Ready+st.InFlight+st.Delayed == 0 {
			empty++
		} else {
			empty = 0
		}
	}
	stop()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}
