package main

import (
	"context"
	"encoding/json"
	"regexp"
	"runtime"
	"runtime/debug"
	"testing"
)

func TestVersion(t *testing.T) {
	ctx := context.Background()
	// A test binary records no module version and no VCS revision: the
	// line says "(devel)" and the Go version that built it.
	r := idemRun(ctx, "version")
	r.expect(t, 0, "idem ", "("+runtime.Version())
	if !regexp.MustCompile(`^idem \S+ \(go[^)]*\)\n$`).MatchString(r.stdout) {
		t.Errorf("version line: %q", r.stdout)
	}
	if r.stderr != "" {
		t.Errorf("stderr: %q", r.stderr)
	}
	// It never opens the store, not even one that cannot be opened.
	idemRun(ctx, "--store", "sqlite:/nonexistent/dir/idem.db", "version").expect(t, 0, "idem ")

	r = idemRun(ctx, "version", "--json")
	r.expect(t, 0, `"version":`, `"go":`, `"modified":`)
	var v buildVersion
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
		t.Fatalf("version --json: %v\n%s", err, r)
	}
	if v.Version == "" || v.Go != runtime.Version() {
		t.Errorf("version --json: %+v", v)
	}

	idemRun(ctx, "version", "extra").expectErr(t, 2, "takes no arguments")
	idemRun(ctx, "version", "--bogus").expectErr(t, 2, "flag provided but not defined")
}

func TestVersionOf(t *testing.T) {
	for _, tc := range []struct {
		name string
		bi   *debug.BuildInfo
		line string
		want buildVersion
	}{
		{"no build info", nil, "idem (devel) (" + runtime.Version() + ")",
			buildVersion{Version: "(devel)", Go: runtime.Version()}},
		{"go install @version", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: "github.com/idemkit/idem", Version: "v0.3.1"}},
			"idem v0.3.1 (go1.26.0)",
			buildVersion{Version: "v0.3.1", Go: "go1.26.0"}},
		{"checkout, modified", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: "github.com/idemkit/idem", Version: "(devel)"},
			Settings: []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: "abc1234def5678"}, {Key: "vcs.time", Value: "2026-12-01T10:00:00Z"}, {Key: "vcs.modified", Value: "true"}}},
			"idem (devel) (go1.26.0, rev abc1234, modified)",
			buildVersion{Version: "(devel)", Go: "go1.26.0", Revision: "abc1234def5678", Time: "2026-12-01T10:00:00Z", Modified: true}},
		{"clean checkout, pseudo-version", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v0.3.2-0.20261201100000-abc1234def56"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc1234def5678"}, {Key: "vcs.modified", Value: "false"}}},
			"idem v0.3.2-0.20261201100000-abc1234def56 (go1.26.0, rev abc1234)",
			buildVersion{Version: "v0.3.2-0.20261201100000-abc1234def56", Go: "go1.26.0", Revision: "abc1234def5678"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := versionOf(tc.bi)
			if v != tc.want {
				t.Errorf("versionOf: got %+v, want %+v", v, tc.want)
			}
			if got := v.String(); got != tc.line {
				t.Errorf("line: got %q, want %q", got, tc.line)
			}
		})
	}
}
