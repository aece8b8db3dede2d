// Package problemdoc reads docs/problems.md, the page the problem type
// URIs of idem point into (problem.TypeBase), for the tests that keep it
// equal to the types each HTTP surface answers.
package problemdoc

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// entry is a heading of docs/problems.md (the type's anchor) and the first
// line of its paragraph: `STATUS, "TITLE"`.
var entry = regexp.MustCompile(`(?m)^### ([a-z0-9-]+)\n\n[0-9]{3}, "([^"]+)"`)

// Titles returns the types docs/problems.md documents whose anchors begin
// with prefix ("serve-"), each kind (the anchor after prefix) with the title
// its entry gives. It fails t if the file cannot be found or read.
func Titles(t testing.TB, prefix string) map[string]string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("problemdoc: no go.mod above the working directory")
		}
		dir = parent
	}
	b, err := os.ReadFile(filepath.Join(dir, "docs", "problems.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	if n, m := strings.Count(text, "\n### "), len(entry.FindAllString(text, -1)); n != m {
		t.Errorf("docs/problems.md: %d headings, %d of them followed by `STATUS, \"TITLE\"`", n, m)
	}
	titles := map[string]string{}
	for _, m := range entry.FindAllStringSubmatch(text, -1) {
		if kind, ok := strings.CutPrefix(m[1], prefix); ok {
			if _, dup := titles[kind]; dup {
				t.Errorf("docs/problems.md: %s twice", m[1])
			}
			titles[kind] = m[2]
		}
	}
	return titles
}

// Check fails t unless docs/problems.md documents, under prefix, exactly
// the kinds of want, each with its title.
func Check(t testing.TB, prefix string, want map[string]string) {
	t.Helper()
	got := Titles(t, prefix)
	for kind, title := range want {
		switch g, ok := got[kind]; {
		case !ok:
			t.Errorf("docs/problems.md lacks ### %s%s", prefix, kind)
		case g != title:
			t.Errorf("docs/problems.md: %s%s has title %q, want %q", prefix, kind, g, title)
		}
	}
	for kind := range got {
		if _, ok := want[kind]; !ok {
			t.Errorf("docs/problems.md documents %s%s, which is never answered", prefix, kind)
		}
	}
}
