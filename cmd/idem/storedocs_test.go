package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemkit/idem/cmd/idem/internal/storeurl"
)

var updateDocs = flag.Bool("update", false, "rewrite the store lists of doc.go and docs/cli.md from storeurl.Backends")

// storeDocs are the files that list the store URLs, each with the text that
// begins its list, what ends the list, and the list they must hold, made
// from storeurl.Backends.
var storeDocs = []struct {
	path       string
	start, end string
	want       func() string
}{{
	path:  "doc.go",
	start: "// IDEM_STORE environment variable, else sqlite:idem.db:\n//\n",
	end:   "//\n",
	want: func() string {
		return "//\t" + strings.ReplaceAll(strings.TrimSuffix(storesText(""), "\n"), "\n", "\n//\t")
	},
}, {
	path:  filepath.Join("..", "..", "docs", "cli.md"),
	start: "| URL | store | package |\n|---|---|---|\n",
	end:   "\n",
	want: func() string {
		var b strings.Builder
		for _, be := range storeurl.Backends() {
			forms := make([]string, len(be.Forms))
			for i, f := range be.Forms {
				forms[i] = "`" + f + "`"
			}
			fmt.Fprintf(&b, "| %s | %s | %s |\n", strings.Join(forms, ", "), be.Store, be.Package)
		}
		return b.String()
	},
}}

// TestStoreDocs checks that doc.go and docs/cli.md list the stores of
// storeurl.Backends, no more and no fewer, as the help does. After
// changing Backends, run
//
//	go test ./cmd/idem -run TestStoreDocs -update
//
// to rewrite both lists.
func TestStoreDocs(t *testing.T) {
	for _, d := range storeDocs {
		b, err := os.ReadFile(d.path)
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		before, rest, ok := strings.Cut(text, d.start)
		if !ok {
			t.Errorf("%s: no store list: %q not found", d.path, d.start)
			continue
		}
		// The list runs to the first line that is d.end.
		n := 0
		for n < len(rest) && !strings.HasPrefix(rest[n:], d.end) {
			i := strings.IndexByte(rest[n:], '\n')
			if i < 0 {
				n = len(rest)
				break
			}
			n += i + 1
		}
		got, after := rest[:n], rest[n:]
		want := d.want()
		if !strings.HasSuffix(want, "\n") {
			want += "\n"
		}
		if got == want {
			continue
		}
		if *updateDocs {
			if err := os.WriteFile(d.path, []byte(before+d.start+want+after), 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: store list rewritten", d.path)
			continue
		}
		t.Errorf("%s: the store list differs from storeurl.Backends; run go test ./cmd/idem -run TestStoreDocs -update\ngot:\n%s\nwant:\n%s", d.path, got, want)
	}
}

// TestStoreHelp checks that the help lists every scheme storeurl opens, and
// every --store flag names each backend.
func TestStoreHelp(t *testing.T) {
	top := new(strings.Builder)
	(&app{}).topHelp(top)
	schemes := map[string]bool{}
	for _, be := range storeurl.Backends() {
		for _, s := range be.Schemes {
			schemes[s] = true
			found := false
			for _, f := range be.Forms {
				found = found || strings.HasPrefix(f, s+":")
			}
			if !found {
				t.Errorf("backend %s: no form begins with the scheme %s:", be.Package, s)
			}
		}
		for _, f := range be.Forms {
			if !strings.Contains(top.String(), f) {
				t.Errorf("idem --help lacks %s", f)
			}
		}
		if !strings.Contains(storeFlagHelp, be.Short) {
			t.Errorf("the --store flag's help lacks %s", be.Short)
		}
	}
	for _, s := range storeurl.New().Schemes() {
		if !schemes[s] {
			t.Errorf("storeurl opens %s:, which no backend documents", s)
		}
	}
}
