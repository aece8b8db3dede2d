package main

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

var versionCmd = &command{
	name:     "version",
	synopsis: "[--json]",
	summary:  "print the version of idem and the revision it was built from",
	help: `
Version prints the module version this binary was built from, the Go
version that built it and, when the build recorded them, the VCS revision
(its first 7 characters) and whether the checkout had uncommitted changes:

  idem v0.3.1 (go1.26.0)
  idem (devel) (go1.26.0, rev abc1234, modified)

"(devel)" is a build from a checkout (go build, go run); a release
installed with go install github.com/idemkit/idem/cmd/idem@VERSION names
its version. It never opens the store. --json prints
{"version":V,"go":G,"revision":R,"time":T,"modified":B} on one line, the
revision in full; revision and time are omitted when the build did not
record them.`,
	exits: `  0    ok
  2    usage error`,
	run: runVersion,
}

// buildVersion is what `idem version` reports.
type buildVersion struct {
	Version  string `json:"version"`
	Go       string `json:"go"`
	Revision string `json:"revision,omitempty"`
	Time     string `json:"time,omitempty"`
	Modified bool   `json:"modified"`
}

func runVersion(ctx context.Context, a *app, args []string) error {
	fs := a.cmd.flagSet(a)
	asJSON := fs.Bool("json", false, "print the version as JSON")
	pos, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if err := noArgs(pos); err != nil {
		return err
	}
	bi, _ := debug.ReadBuildInfo()
	v := versionOf(bi)
	if *asJSON {
		return writeJSON(a.stdout, v)
	}
	_, err = fmt.Fprintln(a.stdout, v)
	return err
}

// versionOf reads the version from the binary's build information (nil
// when the binary has none).
func versionOf(bi *debug.BuildInfo) buildVersion {
	v := buildVersion{Version: "(devel)", Go: runtime.Version()}
	if bi == nil {
		return v
	}
	if bi.GoVersion != "" {
		v.Go = bi.GoVersion
	}
	if bi.Main.Version != "" {
		v.Version = bi.Main.Version
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Revision = s.Value
		case "vcs.time":
			v.Time = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v
}

// String is the line `idem version` prints: "idem v0.3.1 (go1.26.0)", or
// "idem (devel) (go1.26.0, rev abc1234, modified)".
func (v buildVersion) String() string {
	details := []string{v.Go}
	if v.Revision != "" {
		details = append(details, "rev "+v.Revision[:min(7, len(v.Revision))])
	}
	if v.Modified {
		details = append(details, "modified")
	}
	return fmt.Sprintf("idem %s (%s)", v.Version, strings.Join(details, ", "))
}
