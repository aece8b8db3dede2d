package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store/sqlitestore"
)

// The test binary plays two parts in TestCLIAfterACrash, chosen by
// crashRoleEnv: a worker killed inside its operation, and the idem command
// itself, run as its own process with real exit codes.
const (
	crashRoleEnv = "IDEM_CLI_CRASH_ROLE" // "worker" or "cli"
	crashDBEnv   = "IDEM_CLI_CRASH_DB"   // the worker's SQLite file
	crashArgsEnv = "IDEM_CLI_CRASH_ARGS" // the command's arguments, as JSON
	crashKey     = "receipt:42:7"
	crashLease   = time.Second
)

func TestMain(m *testing.M) {
	if os.Getenv(chaosWorkerEnv) != "" || os.Getenv(chaosRelayEnv) != "" {
		main() // a worker or a relay of idem chaos; exits
	}
	switch os.Getenv(crashRoleEnv) {
	case "worker":
		os.Exit(crashWorker())
	case "cli":
		var args []string
		if err := json.Unmarshal([]byte(os.Getenv(crashArgsEnv)), &args); err != nil {
			fmt.Fprintln(os.Stderr, "bad", crashArgsEnv, err)
			os.Exit(100)
		}
		os.Args = append([]string{"idem"}, args...)
		main() // exits
	}
	os.Exit(m.Run())
}

// crashWorker sends a receipt under AtMostOnce and is killed in the
// middle: it writes a marker once "sent" and then waits for the kill.
func crashWorker() int {
	db := os.Getenv(crashDBEnv)
	s, err := sqlitestore.Open(context.Background(), db)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	l := idem.New(s, idem.WithPolicy(idem.AtMostOnce), idem.WithLease(crashLease), idem.WithOwner("worker-1"),
		idem.WithLogger(slog.New(slog.DiscardHandler)))
	_, err = l.Do(context.Background(), idem.RawKey(crashKey), func(ctx context.Context) ([]byte, error) {
		if err := os.WriteFile(db+".sent", []byte("ses-0042"), 0o600); err != nil {
			return nil, err
		}
		select {} // killed here, after the send, before the record
	})
	fmt.Fprintln(os.Stderr, "the worker was not killed:", err)
	return 1
}

// TestCLIAfterACrash: the receipts worker's "claim-then-send" crash, seen from the
// operator's side, every part a real process on a real SQLite file. A
// worker is SIGKILLed after its send and before its record; once its
// lease passes, the idem command (its own process) lists the key as stuck
// (exit 0), explains it as an attempt that never finished, and resolves
// it as done with the provider's id; the next delivery is then skipped as
// done, with that id, and runs nothing.
func TestCLIAfterACrash(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	db := filepath.Join(t.TempDir(), "idem.db")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	worker := exec.CommandContext(ctx, exe, "-test.run=^$")
	worker.Env = append(os.Environ(), crashRoleEnv+"=worker", crashDBEnv+"="+db)
	var werr bytes.Buffer
	worker.Stderr = &werr
	if err := worker.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(db + ".sent"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			worker.Process.Kill()
			t.Fatalf("the worker never sent: %s", werr.String())
		}
	}
	if err := worker.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := worker.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("worker: %v, want killed", err)
	}
	time.Sleep(crashLease + 200*time.Millisecond) // its lease passes

	idemCmd := func(want int, args ...string) string {
		t.Helper()
		a, _ := json.Marshal(append([]string{"--store", "sqlite:" + db}, args...))
		c := exec.CommandContext(ctx, exe, "-test.run=^$")
		c.Env = append(os.Environ(), crashRoleEnv+"=cli", crashArgsEnv+"="+string(a))
		var out, errb bytes.Buffer
		c.Stdout, c.Stderr = &out, &errb
		err := c.Run()
		code := 0
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			code = exit.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != want {
			t.Fatalf("idem %s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, want, out.String(), errb.String())
		}
		return out.String()
	}

	stuck := idemCmd(0, "ls", "--stuck")
	if !strings.Contains(stuck, crashKey) || !strings.Contains(stuck, "indeterminate") || !strings.Contains(stuck, "worker-1") {
		t.Fatalf("idem ls --stuck does not list the killed worker's key as indeterminate:\n%s", stuck)
	}
	explained := idemCmd(0, "explain", crashKey)
	if !strings.Contains(explained, "worker-1") || !strings.Contains(explained, "attempt 1") {
		t.Fatalf("idem explain does not tell the killed attempt:\n%s", explained)
	}
	resolved := idemCmd(0, "resolve", crashKey, "--done", "--result", "ses-0042", "--reason", "the provider's log shows ses-0042")
	if !strings.Contains(resolved, "resolved "+crashKey+" as done") {
		t.Fatalf("idem resolve:\n%s", resolved)
	}
	if left := idemCmd(0, "ls", "--stuck"); strings.Contains(left, crashKey) {
		t.Fatalf("still stuck after resolve:\n%s", left)
	}

	s, err := sqlitestore.Open(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l := idem.New(s, idem.WithPolicy(idem.AtMostOnce), idem.WithLogger(slog.New(slog.DiscardHandler)))
	res, err := l.Do(ctx, idem.RawKey(crashKey), func(context.Context) ([]byte, error) {
		return nil, errors.New("sent a second receipt")
	})
	if err != nil || !res.Replayed || string(res.Value) != "ses-0042" {
		t.Fatalf("the next delivery after resolve: %+v, %v; want skipped as done with ses-0042", res, err)
	}
}
