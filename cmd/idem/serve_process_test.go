package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestServeProcess runs `idem serve` as a process of its own on a SQLite
// file, with a token: a worker claims over HTTP and never finishes (no
// process is killed: the lease just lapses); then the next claim is a
// takeover under at_least_once and indeterminate under at_most_once. 50
// concurrent claims of one key acquire it once. SIGTERM stops the server
// with exit 0.
func TestServeProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("tok-123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	args, _ := json.Marshal([]string{"--store", "sqlite:" + filepath.Join(dir, "idem.db"), "serve", "--listen", "127.0.0.1:0", "--token-file", tokenFile})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), crashRoleEnv+"=cli", crashArgsEnv+"="+string(args))
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()

	// The server logs the address it listens on.
	lines := make(chan string, 1000)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var logged strings.Builder
	addrRE := regexp.MustCompile(`addr=(127\.0\.0\.1:\d+)`)
	var addr string
	for addr == "" {
		select {
		case ln, ok := <-lines:
			if !ok {
				t.Fatalf("the server ended before listening:\n%s", logged.String())
			}
			logged.WriteString(ln + "\n")
			if m := addrRE.FindStringSubmatch(ln); m != nil {
				addr = m[1]
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("the server did not listen:\n%s", logged.String())
		}
	}
	c := &api{t: t, base: "http://" + addr, token: "tok-123"}
	c.do("GET", "/healthz", "").expect(t, 200, "")

	first := c.post("/v1/claim", obj{"key": "receipt:1:7", "owner": "py-1", "lease": "1s"}).expect(t, 200, "acquired")
	f2 := c.post("/v1/claim", obj{"key": "receipt:2:7", "owner": "py-1", "lease": "1s", "policy": "at_most_once"}).expect(t, 200, "acquired").num("fence")
	c.post("/v1/claim", obj{"key": "receipt:1:7", "owner": "py-2"}).expect(t, 409, "busy")
	time.Sleep(1300 * time.Millisecond) // py-1 never finishes: its leases lapse
	tk := c.post("/v1/claim", obj{"key": "receipt:1:7", "owner": "py-2"}).expect(t, 200, "takeover")
	if tk.num("fence") != first.num("fence")+1 || tk.num("attempt") != 2 {
		t.Fatalf("takeover: %s, first claim %s", tk, first)
	}
	c.post("/v1/complete", obj{"key": "receipt:1:7", "fence": first.num("fence"), "attempt_id": first.str("attempt_id"), "result": b64("late")}).expect(t, 409, "lease-lost")
	c.post("/v1/complete", obj{"key": "receipt:1:7", "fence": tk.num("fence"), "attempt_id": tk.str("attempt_id"), "result": b64("ses-2")}).expect(t, 200, "completed")
	ind := c.post("/v1/claim", obj{"key": "receipt:2:7", "owner": "py-2", "policy": "at_most_once"}).expect(t, 409, "indeterminate")
	if ind.str("owner") != "py-1" || ind.num("fence") != f2 {
		t.Fatalf("indeterminate: %s", ind)
	}

	acquired, busy := concurrentClaims(t, c.base, c.token, "race:1", 50)
	if acquired != 1 || busy != 49 {
		t.Fatalf("%d acquired, %d busy; want 1 and 49", acquired, busy)
	}
	c.token = "wrong"
	c.do("GET", "/healthz", "").expect(t, 401, "unauthorized")

	// A call under way (its body never ends) holds up a graceful stop; a
	// second SIGTERM stops the server at once.
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/claim HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer tok-123\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"key\":", addr)
	time.Sleep(200 * time.Millisecond) // the call is under way
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for !strings.Contains(logged.String(), "idem serve: shutting down") {
		select {
		case ln := <-lines:
			logged.WriteString(ln + "\n")
		case <-time.After(30 * time.Second):
			t.Fatalf("no shutdown logged:\n%s", logged.String())
		}
	}
	time.Sleep(200 * time.Millisecond)
	second := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for ln := range lines {
		logged.WriteString(ln + "\n")
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("after SIGTERM: %v, want exit 0\n%s", err, logged.String())
	}
	if took := time.Since(second); took > 5*time.Second {
		t.Errorf("a second SIGTERM took %v to stop the server (the graceful stop waits %v)", took, shutdownTimeout)
	}
	out := logged.String()
	for _, want := range []string{"idem serve: stopped", "outcome=takeover", "outcome=indeterminate", "key=receipt:1:7", "remote_addr=127.0.0.1:"} {
		if !strings.Contains(out, want) {
			t.Errorf("the server's log lacks %q:\n%s", want, out)
		}
	}
}
