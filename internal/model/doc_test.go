package model

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestDocumented holds docs/guarantees.md ("The model") to the model:
// every invariant idem.pml asserts and every mutant it defines is in the
// page's tables, and the page names none that the model lacks. It needs
// no spin.
func TestDocumented(t *testing.T) {
	model, err := os.ReadFile("idem.pml")
	if err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile("../../docs/guarantees.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(page), "\n## The model\n")
	if !ok {
		t.Fatal(`docs/guarantees.md has no "## The model" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")

	decl := regexp.MustCompile(`(?s)hidden byte ([^;]*);`).FindSubmatch(model)
	if decl == nil {
		t.Fatal("idem.pml declares no invariants (hidden byte ...;)")
	}
	invariants := strings.FieldsFunc(string(decl[1]), func(r rune) bool { return r == ',' || r == ' ' || r == '\n' || r == '\t' })
	for _, name := range invariants {
		if !strings.Contains(string(model), "assert("+name+")") {
			t.Errorf("idem.pml declares %s but never asserts it", name)
		}
		if !strings.Contains(section, "| `"+name+"` |") {
			t.Errorf("invariant %s is not in the invariants table of docs/guarantees.md", name)
		}
	}
	for _, m := range regexp.MustCompile(`\| `+"`"+`([a-z_]+)`+"`"+` \|`).FindAllStringSubmatch(section, -1) {
		if strings.HasPrefix(m[1], "at_") || m[1] == "reconcile" || strings.HasPrefix(m[1], "reconcile_") || m[1] == "three_workers" {
			continue // a check's name, in the figures table
		}
		if !strings.Contains(string(decl[1]), m[1]) {
			t.Errorf("docs/guarantees.md names invariant %s, which idem.pml does not have", m[1])
		}
	}

	mutants := regexp.MustCompile(`#ifn?def (MUT_[A-Z_]+)`).FindAllStringSubmatch(string(model), -1)
	if len(mutants) == 0 {
		t.Fatal("idem.pml has no mutants")
	}
	for _, m := range mutants {
		if !strings.Contains(section, "| `"+m[1]+"` |") {
			t.Errorf("mutant %s is not in the mutants table of docs/guarantees.md", m[1])
		}
	}
}
