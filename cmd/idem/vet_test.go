package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The findings in testdata/vetmod, as idem vet prints them.
var vetmodFindings = []string{
	"vetmod.go:16:2: the error is only logged, and the handler then answers 2xx (line 19)",
	"vetmod.go:28:36: the Idempotency-Key header is derived from time.Now (line 28)",
	"vetmod.go:29:2: //idem:allow nondetkey silences nothing on this line or the next: delete it [unusedallow]",
}

func TestVet(t *testing.T) {
	if testing.Short() {
		t.Skip("loads packages with go list")
	}
	t.Chdir(filepath.Join("testdata", "vetmod"))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	r := idemRun(ctx, "vet", "./...")
	r.expect(t, 1, vetmodFindings...)
	if n := strings.Count(r.stdout, "\n"); n != len(vetmodFindings) {
		t.Errorf("want %d findings, got:\n%s", len(vetmodFindings), r.stdout)
	}
	for _, check := range []string{"[swallowed]", "[nondetkey]"} {
		if !strings.Contains(r.stdout, check) {
			t.Errorf("no %s finding in:\n%s", check, r.stdout)
		}
	}

	r = idemRun(ctx, "vet", "--json")
	if r.code != 1 {
		t.Fatalf("--json: want exit 1, got %s", r)
	}
	var got []vetFinding
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("--json: %v in %q", err, r.stdout)
	}
	if len(got) != 3 || got[0].File != "vetmod.go" || got[0].Line != 16 || got[0].Check != "swallowed" ||
		len(got[0].Fixes) != 1 || got[0].Fixes[0] != "answer 500 and return" {
		t.Errorf("--json: got %+v", got)
	}

	// With the two checks off, the allow comment still silences nothing.
	idemRun(ctx, "vet", "--swallowed=false", "--nondetkey=false").expect(t, 1, vetmodFindings[2])
	idemRun(ctx, "vet", "--swallowed=false", "--nondetkey=false", "--unusedallow=false").expect(t, 0)
	idemRun(ctx, "vet", "./nosuchdir").expectErr(t, 1, "packages that do not load")
}

// TestGoVetVetTool runs the real go vet with this test binary as its
// -vettool on testdata/vetmod.
func TestGoVetVetTool(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go vet")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// The idem command as a user builds it: go vet runs the tool once per
	// package, the standard library's included (for facts), which this
	// test binary under -race made take minutes.
	exe := filepath.Join(t.TempDir(), "idem")
	build := exec.CommandContext(ctx, goBin, "build", "-o", exe, ".")
	build.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	goVet := func(args ...string) (string, int) {
		cmd := exec.CommandContext(ctx, goBin, append([]string{"vet", "-vettool=" + exe}, args...)...)
		cmd.Dir = filepath.Join("testdata", "vetmod")
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=")
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatalf("go vet: %v", err)
		}
		return string(out), cmd.ProcessState.ExitCode()
	}
	out, code := goVet("./...")
	if code == 0 {
		t.Fatalf("go vet found nothing:\n%s", out)
	}
	for _, want := range []string{
		"vetmod.go:16:2: the error is only logged",
		"vetmod.go:28:36: the Idempotency-Key header is derived from time.Now",
		"vetmod.go:29:2: //idem:allow nondetkey silences nothing",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("go vet's output lacks %q:\n%s", want, out)
		}
	}
	// Checks turn off by name, as go vet's own do.
	out, code = goVet("-swallowed=false", "-nondetkey=false", "-unusedallow=false", "./...")
	if code != 0 {
		t.Errorf("with every finding's check off, go vet exits %d:\n%s", code, out)
	}
}
