package sqlitestore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/store"
)

// The environment of TestTwoProcesses's children.
const (
	envChildDB      = "SQLITESTORE_TEST_CHILD_DB"      // the database both processes open
	envChildEffects = "SQLITESTORE_TEST_CHILD_EFFECTS" // the file each execution appends a line to
	envChildName    = "SQLITESTORE_TEST_CHILD_NAME"
)

const processKeys = 200

// TestTwoProcesses runs two OS processes (this test binary again) that open
// the same fresh database file at once and claim the same keys, in
// different orders. Every claim that is acquired appends a line to a shared
// file opened with O_APPEND, then completes the key; a busy key is tried
// again until it is done. Each key must have been executed exactly once.
func TestTwoProcesses(t *testing.T) {
	if os.Getenv(envChildDB) != "" {
		processChild(t)
		return
	}
	dir := t.TempDir()
	db := filepath.Join(dir, "shared.db")
	effects := filepath.Join(dir, "effects")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var cmds []*exec.Cmd
	var outs []*strings.Builder
	for i := range 2 {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestTwoProcesses$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), envChildDB+"="+db, envChildEffects+"="+effects, envChildName+"="+fmt.Sprint("p", i))
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
	runs := map[string]int{}
	by := map[string]int{}
	for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		key, who, _ := strings.Cut(line, " ")
		runs[key]++
		by[who]++
	}
	for i := range processKeys {
		if n := runs[processKey(i)]; n != 1 {
			t.Errorf("%s executed %d times, want 1", processKey(i), n)
		}
	}
	if len(runs) != processKeys {
		t.Errorf("%d keys executed, want %d", len(runs), processKeys)
	}
	t.Logf("executions per process: %v", by)

	s, err := Open(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := range processKeys {
		rec, err := s.Get(ctx, processKey(i))
		// One claim only: the one that completed it.
		if err != nil || rec.Status != store.StatusCompleted || rec.Attempt != 1 || len(rec.Journal) != 1 ||
			rec.AttemptID == "" || rec.Journal[0].AttemptID != rec.AttemptID {
			t.Fatalf("%s: %+v %v", processKey(i), rec, err)
		}
	}
}

func processKey(i int) string { return "proc:" + strconv.Itoa(i) }

func processChild(t *testing.T) {
	ctx := context.Background()
	name := os.Getenv(envChildName)
	s, err := Open(ctx, os.Getenv(envChildDB))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	f, err := os.OpenFile(os.Getenv(envChildEffects), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// Start together: wait until both processes have opened the store.
	dir := filepath.Dir(os.Getenv(envChildEffects))
	if err := os.WriteFile(filepath.Join(dir, "ready-"+name), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for start := time.Now(); ; time.Sleep(time.Millisecond) {
		if m, _ := filepath.Glob(filepath.Join(dir, "ready-*")); len(m) == 2 {
			break
		}
		if time.Since(start) > 20*time.Second {
			t.Fatal("the other process did not start")
		}
	}
	order := rand.Perm(processKeys)
	deadline := time.Now().Add(30 * time.Second)
	for len(order) > 0 {
		var busy []int
		for _, i := range order {
			key := processKey(i)
			res, err := s.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(),
				Key: key, Owner: name, Policy: store.AtLeastOnce,
				Lease: 20 * time.Second, Retention: time.Hour,
			})
			switch {
			case err != nil:
				t.Fatalf("claim %s: %v", key, err)
			case res.Acquired:
				if _, err := f.WriteString(key + " " + name + "\n"); err != nil {
					t.Fatal(err)
				}
				if err := s.Finish(ctx, store.FinishRequest{Key: key, Fence: res.Record.Fence, AttemptID: res.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte(name), Retention: time.Hour}); err != nil {
					t.Fatalf("complete %s: %v", key, err)
				}
			case res.Record.Status == store.StatusInProgress:
				busy = append(busy, i) // the other process holds it: ask again
			}
		}
		order = busy
		if time.Now().After(deadline) {
			t.Fatalf("%d keys still busy", len(order))
		}
	}
}
