package storeurl

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
)

func TestOpenSQLiteErrors(t *testing.T) {
	for raw, want := range map[string]string{
		"sqlite:":                      "no database file",
		"sqlite:/nonexistent/dir/x.db": "no database file /nonexistent/dir/x.db",
	} {
		s, err := New().Open(context.Background(), raw, Options{MustExist: true})
		if err == nil {
			s.Close()
			t.Errorf("Open(%q) succeeded", raw)
		} else if !strings.Contains(err.Error(), want) {
			t.Errorf("Open(%q) = %v, want it to mention %q", raw, err, want)
		}
	}
}

func TestOpenSQLite(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	o := New()
	for _, raw := range []string{
		"sqlite:" + filepath.Join(dir, "a.db"),
		"sqlite://" + filepath.Join(dir, "b.db"), // absolute: sqlite:///tmp/...
		"SQLite:" + filepath.Join(dir, "c.db"),
	} {
		s, err := o.Open(ctx, raw, Options{})
		if err != nil {
			t.Fatalf("Open(%q): %v", raw, err)
		}
		if _, err := s.Now(ctx); err != nil {
			t.Errorf("%q: Now: %v", raw, err)
		}
		s.Close()
		// Now it exists, MustExist opens it.
		s, err = o.Open(ctx, raw, Options{MustExist: true})
		if err != nil {
			t.Fatalf("Open(%q, MustExist): %v", raw, err)
		}
		s.Close()
	}
	if got := SQLitePath("//rel/x.db"); got != "rel/x.db" {
		t.Errorf("SQLitePath(//rel/x.db) = %q", got)
	}
	if got := SQLitePath("///abs/x.db"); got != "/abs/x.db" {
		t.Errorf("SQLitePath(///abs/x.db) = %q", got)
	}
}
