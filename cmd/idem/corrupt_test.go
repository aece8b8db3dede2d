package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/sqlitestore"
)

// corruptStore makes a SQLite store with at_most_once keys whose leases
// have lapsed (indeterminate) and corrupts the journal of each key in bad.
// It returns the --store URL.
func corruptStore(t *testing.T, keys []string, bad ...string) string {
	t.Helper()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "idem.db")
	s, err := sqlitestore.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, k := range keys {
		if _, err := s.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: k, Owner: "w1", Policy: idem.AtMostOnce, Lease: time.Millisecond, Retention: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range bad {
		if _, err := s.DB().Exec(`UPDATE idem_records SET journal = '{bad' WHERE key = ?`, k); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(5 * time.Millisecond) // the leases lapse
	return "sqlite:" + path
}

// lsKeys returns the KEY and STATE columns of ls's table.
func lsKeys(out string) []string {
	var rows []string
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 && f[0] != "KEY" && !strings.HasPrefix(l, "(") {
			rows = append(rows, f[0]+"="+f[1])
		}
	}
	return rows
}

// TestLsCorruptRecord: a corrupt record does not hide the others. ls and
// ls --stuck list it as CORRUPT in its place, go on past it (also when it
// is the first, the last, or one of a run, and across pages), and exit 1
// at the end naming it.
func TestLsCorruptRecord(t *testing.T) {
	ctx := context.Background()
	url := corruptStore(t, []string{"a", "b", "c"}, "b")
	for _, args := range [][]string{{"ls"}, {"ls", "--stuck"}, {"ls", "--status", "indeterminate"}} {
		r := idemRun(ctx, append([]string{"--store", url}, args...)...)
		if got := strings.Join(lsKeys(r.stdout), " "); got != "a=indeterminate b=CORRUPT c=indeterminate" {
			t.Errorf("%v: rows %s\n%s", args, got, r)
		}
		r.expectErr(t, 1, "1 record is corrupt (listed as CORRUPT)", `corrupt record for "b"`, "idem delete KEY --force")
	}

	// Many records, corrupt ones at the start, in a run, at a page's edge
	// and at the end: every good record is listed once, in order.
	var keys []string
	for i := range 40 {
		keys = append(keys, fmt.Sprintf("k%02d", i))
	}
	bad := []string{"k00", "k07", "k08", "k09", "k15", "k16", "k39"}
	url = corruptStore(t, keys, bad...)
	var want []string
	for _, k := range keys {
		st := "indeterminate"
		if strings.Contains(strings.Join(bad, " "), k) {
			st = "CORRUPT"
		}
		want = append(want, k+"="+st)
	}
	for _, limit := range []string{"0", "100"} {
		r := idemRun(ctx, "--store", url, "ls", "--stuck", "--limit", limit)
		if got := lsKeys(r.stdout); strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("--limit %s: rows\n%v\nwant\n%v", limit, got, want)
		}
		r.expectErr(t, 1, "7 records are corrupt")
	}
	// --limit pages through the store 8 at a time (and --after continues).
	var got []string
	after := ""
	for range 10 {
		args := []string{"--store", url, "ls", "--limit", "8"}
		if after != "" {
			args = append(args, "--after", after)
		}
		r := idemRun(ctx, args...)
		got = append(got, lsKeys(r.stdout)...)
		m := regexp.MustCompile(`--after "([^"]+)"`).FindStringSubmatch(r.stdout)
		if m == nil {
			break
		}
		after = m[1]
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("--limit 8 pages: rows\n%v\nwant\n%v", got, want)
	}

	// JSON: a row with state "corrupt" and the error.
	r := idemRun(ctx, "--store", url, "ls", "--json", "--limit", "3")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	var j struct{ Key, State, Error string }
	if len(lines) != 3 || json.Unmarshal([]byte(lines[0]), &j) != nil || j.Key != "k00" || j.State != "corrupt" || !strings.Contains(j.Error, "corrupt record") {
		t.Errorf("ls --json: %+v\n%s", j, r)
	}
	r.expectErr(t, 1, `corrupt record for "k00"`)
}

// TestDelete: delete removes a record; it refuses a live lease (exit 4), a
// completed key and a corrupt record (exit 1) unless --force.
func TestDelete(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		e.run("delete", "running").expectErr(t, 4, "live lease", "--force")
		e.run("delete", "done").expectErr(t, 1, "is completed", "--force")
		e.run("delete", "nope").expectErr(t, 3, `no record for "nope"`)
		e.run("delete").expectErr(t, 2, "missing KEY")

		e.run("delete", "indet").expect(t, 0, fmt.Sprintf("deleted indet (was indeterminate: attempt 1, owner w1, fence %d)", fenceAt(t0)), "runs it as a new operation")
		e.run("inspect", "indet").expectErr(t, 3, "no record")
		e.run("delete", "done", "--force").expect(t, 0, "deleted done (was completed")
		r := e.run("delete", "running", "--force")
		r.expect(t, 0, "deleted running (was in_progress", "may still be running")
		e.run("ls").expect(t, 0)
		if r := e.run("ls"); strings.Contains(r.stdout, "running") || strings.Contains(r.stdout, "done ") {
			t.Errorf("deleted keys listed:\n%s", r)
		}
	})

	// A corrupt record: refused without --force, deleted with it; then ls
	// is whole again and the key can be claimed.
	ctx := context.Background()
	url := corruptStore(t, []string{"a", "b", "c"}, "b")
	idemRun(ctx, "--store", url, "delete", "b").expectErr(t, 1, `corrupt record for "b"`, "lease cannot be read", "--force")
	idemRun(ctx, "--store", url, "delete", "b", "--force").expect(t, 0, "deleted b (its record was corrupt")
	r := idemRun(ctx, "--store", url, "ls", "--stuck")
	r.expect(t, 0)
	if got := strings.Join(lsKeys(r.stdout), " "); got != "a=indeterminate c=indeterminate" {
		t.Errorf("ls --stuck after deleting the corrupt record: %s\n%s", got, r)
	}
}
