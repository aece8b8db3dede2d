package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestDemoNextCommands runs the demo as the built binary, in a directory of
// its own, then runs the commands it printed at the end, exactly as
// printed, on the database it left: ls --stuck lists the key it left
// indeterminate, explain explains it, the printed resolve resolves it, and
// ls --stuck is empty after. A second run in the same directory starts
// clean and says so.
func TestDemoNextCommands(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the command and runs the demo")
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("no go command to build idem with: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "idem")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, gobin, "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	wd := t.TempDir()
	// exe runs a command line in wd with IDEM_STORE pointing elsewhere:
	// the printed commands must name their store themselves.
	exe := func(args ...string) result {
		t.Helper()
		cmd := exec.CommandContext(ctx, args[0], args[1:]...)
		cmd.Dir = wd
		cmd.Env = append(os.Environ(), "IDEM_STORE=sqlite:"+filepath.Join(t.TempDir(), "elsewhere.db"))
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		code := 0
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		return result{code, out.String(), errb.String()}
	}

	demo := func() (string, []string) {
		t.Helper()
		r := exe(bin, "demo", "--lease", testDemoLease)
		r.expect(t, 0, "database: idem-demo.db in "+wd+", kept when the demo ends")
		m := regexp.MustCompile(`refused: (receipt:\d+:\d+) may have been sent`).FindStringSubmatch(r.stdout)
		if m == nil {
			t.Fatalf("no key left indeterminate:\n%s", r.stdout)
		}
		_, next, ok := strings.Cut(r.stdout, "\nNext, in this directory:\n")
		if !ok {
			t.Fatalf("no next commands:\n%s", r.stdout)
		}
		var cmds []string
		for ln := range strings.Lines(next) {
			if !strings.HasPrefix(ln, "  ") {
				break
			}
			cmds = append(cmds, strings.TrimSpace(ln))
		}
		if len(cmds) != 4 {
			t.Fatalf("%d next commands, want ls --stuck, explain, resolve, ls --stuck:\n%s", len(cmds), r.stdout)
		}
		if _, err := os.Stat(filepath.Join(wd, "idem-demo.db")); err != nil {
			t.Fatalf("the demo left no database: %v", err)
		}
		return m[1], cmds
	}
	key, cmds := demo()
	words := make([][]string, len(cmds))
	for i, c := range cmds {
		w, err := shellWords(c)
		if err != nil {
			t.Fatalf("%q: %v", c, err)
		}
		// The binary as it was run, then the store the demo used.
		if len(w) < 4 || w[0] != bin || w[1] != "--store" || w[2] != "sqlite:idem-demo.db" {
			t.Fatalf("next command %q does not start %q --store sqlite:idem-demo.db", c, bin)
		}
		words[i] = w
	}
	want := []string{"ls --stuck", "explain " + key, "resolve " + key + " --done --result ses-", "ls --stuck"}
	for i, w := range want {
		if got := strings.Join(words[i][3:], " "); !strings.HasPrefix(got, w) {
			t.Errorf("next command %d is %q, want %q...", i+1, got, w)
		}
	}

	r := exe(words[0]...)
	r.expect(t, 0, key+"  indeterminate")
	if n := strings.Count(r.stdout, "\n"); n != 2 {
		t.Errorf("ls --stuck lists %d lines, want the header and %s:\n%s", n, key, r.stdout)
	}
	exe(words[1]...).expect(t, 0, key+": indeterminate (at_most_once)", "waiting for `idem resolve "+key)
	exe(words[2]...).expect(t, 0, "resolved "+key+" as done (was indeterminate", `duplicates now get the result "ses-`)
	r = exe(words[3]...)
	r.expect(t, 0, "no records match")
	if strings.Contains(r.stdout, "receipt:") {
		t.Errorf("ls --stuck after the resolve still lists a key:\n%s", r.stdout)
	}
	// explain now tells the operator's decision.
	exe(words[1]...).expect(t, 0, key+": completed (at_most_once)", "resolved as done by", "provider log shows ses-")

	// Run twice in a row: the second run starts clean and says so, and
	// leaves its own indeterminate key.
	r = exe(bin, "demo", "--lease", testDemoLease)
	r.expect(t, 0, "(the idem-demo.db an earlier run left was deleted: each run starts clean)")
	r = exe(words[0]...)
	r.expect(t, 0, key+"  indeterminate")
}

// shellWords splits a command line the demo printed as a POSIX shell
// would: words apart at spaces, a single-quoted part taken as it is.
func shellWords(s string) ([]string, error) {
	var (
		words []string
		cur   strings.Builder
		inW   bool
	)
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == ' ':
			if inW {
				words = append(words, cur.String())
				cur.Reset()
				inW = false
			}
		case c == '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				return nil, errors.New("unterminated quote")
			}
			cur.WriteString(s[i+1 : i+1+j])
			i += j + 1
			inW = true
		case strings.IndexByte("\"\\$`&|;<>()*?[#~", c) >= 0:
			return nil, errors.New("a character the demo should have quoted: " + string(c))
		default:
			cur.WriteByte(c)
			inW = true
		}
	}
	if inW {
		words = append(words, cur.String())
	}
	return words, nil
}
