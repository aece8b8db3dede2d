// Package testproc runs a test's child process: the test binary itself,
// started again to play a part that is then killed for real.
package testproc

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
)

// KillAtLine starts the running test binary again, running only the test
// named test (the child recognises its part by env, added to this
// process's environment), reads its output until a line contains marker,
// kills it with SIGKILL and waits for it. It returns the lines read before
// the marker, for the failure message of a test that then finds the wrong
// state. If the child ends without printing marker, they are all its
// output. ctx bounds the child.
func KillAtLine(ctx context.Context, t testing.TB, test string, env []string, marker string) []string {
	t.Helper()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(out)
	var seen []string
	for lines.Scan() && !strings.Contains(lines.Text(), marker) {
		seen = append(seen, lines.Text())
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	return seen
}
