package storeurl

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store/memstore"
)

func TestOpenErrors(t *testing.T) {
	ctx := context.Background()
	for raw, want := range map[string]string{
		"idem.db":                     "no scheme; name a store as sqlite:PATH (e.g. sqlite:idem.db)",
		"ftp://x":                     `unknown store scheme "ftp"`,
		"postgres://u:secret@db/idem": "not built into this idem yet",
	} {
		s, err := Open(ctx, raw, Options{MustExist: true})
		if err == nil {
			s.Close()
			t.Errorf("Open(%q) succeeded", raw)
			continue
		}
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Open(%q) = %v, want it to mention %q", raw, err, want)
		}
		if strings.Contains(err.Error(), "secret") {
			t.Errorf("Open(%q) leaks the password: %v", raw, err)
		}
	}
	if _, err := Open(ctx, "nope:x", Options{}); !errors.Is(err, ErrUnknownScheme) {
		t.Errorf("unknown scheme error %v does not wrap ErrUnknownScheme", err)
	}
}

func TestOpenMem(t *testing.T) {
	ctx := context.Background()
	a, err := Open(ctx, "mem:", Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, ok := a.(*memstore.Store); !ok {
		t.Errorf("mem: opened %T", a)
	}

	ms := memstore.New()
	SetMem("storeurl-test", ms)
	b, err := Open(ctx, "mem:storeurl-test", Options{MustExist: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ms.Claim(ctx, idem.ClaimRequest{Key: "k", Owner: "o", Lease: 1e9, Retention: 1e9}); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	// Closing what Open returned leaves the shared store open.
	c, _ := Open(ctx, "mem:storeurl-test", Options{})
	if _, err := c.Get(ctx, "k"); err != nil {
		t.Errorf("shared mem store lost its record: %v", err)
	}
}

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://u:pw@h:5432/db?x=1": "postgres://u:xxxxx@h:5432/db?x=1",
		"redis://h:6379/0":              "redis://h:6379/0",
		"sqlite:idem.db":                "sqlite:idem.db",
	} {
		if got := Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}
