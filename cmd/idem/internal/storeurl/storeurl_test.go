package storeurl

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memstore"
)

func TestOpenErrors(t *testing.T) {
	ctx := context.Background()
	o := New()
	for raw, want := range map[string]string{
		"idem.db":     "no scheme; name a store as sqlite:PATH (e.g. sqlite:idem.db) or one of the schemes: dynamodb, mem, postgres, postgresql, redis, rediss, sqlite",
		"ftp://x":     `unknown store scheme "ftp" (available: dynamodb, mem, postgres, postgresql, redis, rediss, sqlite)`,
		"redis:cache": "not a URL; write redis://USER:PASSWORD@HOST:PORT/DB",
		"redis://u:secret@127.0.0.1:1/0?dial_timeout=1s": `store "redis://u:xxxxx@127.0.0.1:1/0?dial_timeout=1s": `,
		"redis://u:secret@h/0?idem_keep_expired=soon":    `idem_keep_expired="soon"`,
		// An unencoded '/' or '#' in the password: the parser's message
		// would quote a piece of it.
		"redis://u:sec/ret@127.0.0.1:1/0":             `store "redis://u:xxxxx@127.0.0.1:1/0": not a valid URL; percent-encode`,
		"redis://u:sec#ret@127.0.0.1:1/0":             `store "redis://u:xxxxx@127.0.0.1:1/0": not a valid URL; percent-encode`,
		"postgres://u:sec/ret@h/db":                   `store "postgres://u:xxxxx@h/db": `,
		"postgres:u:secret@h/db":                      `store "postgres:u:xxxxx@h/db": not a URL`,
		"postgres:db":                                 "not a URL; write postgres://USER:PASSWORD@HOST:PORT/DATABASE",
		"postgres://u:secret@h:port/db":               `store "postgres://u:xxxxx@h:port/db": pgstore: cannot parse`,
		"postgres://u:secret@h/db?idem_migrate=maybe": `idem_migrate="maybe": want true or false`,
		// Nothing listens on port 1: the MustExist check fails to connect.
		"postgres://u:secret@127.0.0.1:1/db?connect_timeout=5":          `store "postgres://u:xxxxx@127.0.0.1:1/db?connect_timeout=5": `,
		"postgresql://u@127.0.0.1:1/db?password=secret&sslmode=disable": `store "postgresql://u@127.0.0.1:1/db?password=xxxxx&sslmode=disable": `,
	} {
		s, err := o.Open(ctx, raw, Options{MustExist: true})
		if err == nil {
			s.Close()
			t.Errorf("Open(%q) succeeded", raw)
			continue
		}
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Open(%q) = %v, want it to mention %q", raw, err, want)
		}
		if strings.Contains(err.Error(), "sec") {
			t.Errorf("Open(%q) leaks the password: %v", raw, err)
		}
	}
	if _, err := o.Open(ctx, "nope:x", Options{}); !errors.Is(err, ErrUnknownScheme) {
		t.Errorf("unknown scheme error %v does not wrap ErrUnknownScheme", err)
	}
	if _, err := o.Open(ctx, "x.db", Options{}); !errors.Is(err, ErrNoScheme) {
		t.Errorf("no scheme error %v does not wrap ErrNoScheme", err)
	}
}

func TestSchemes(t *testing.T) {
	o := New()
	if got := strings.Join(o.Schemes(), " "); got != "dynamodb mem postgres postgresql redis rediss sqlite" {
		t.Errorf("Schemes() = %s", got)
	}
	if !o.Has("postgresql") || !o.Has("redis") || !o.Has("dynamodb") || o.Has("nope") || o.Has("") {
		t.Error("Has is wrong")
	}
}

func TestOpenMem(t *testing.T) {
	ctx := context.Background()
	o := New()
	a, err := o.Open(ctx, "mem:", Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, ok := a.(*memstore.Store); !ok {
		t.Errorf("mem: opened %T", a)
	}

	ms := memstore.New()
	o.SetMem("storeurl-test", ms)
	b, err := o.Open(ctx, "mem:storeurl-test", Options{MustExist: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ms.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "k", Owner: "o", Lease: 1e9, Retention: 1e9}); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	// Closing what Open returned leaves the shared store open.
	c, _ := o.Open(ctx, "mem:storeurl-test", Options{})
	if _, err := c.Get(ctx, "k"); err != nil {
		t.Errorf("shared mem store lost its record: %v", err)
	}
	// A name not set yet is a new store, the same for every Open.
	d, _ := o.Open(ctx, "mem:other", Options{})
	if _, err := d.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "k2", Owner: "o", Lease: 1e9, Retention: 1e9}); err != nil {
		t.Fatal(err)
	}
	e, _ := o.Open(ctx, "mem:other", Options{})
	if _, err := e.Get(ctx, "k2"); err != nil {
		t.Errorf("mem:other forgot its record: %v", err)
	}
	// Named stores belong to their Openers.
	f, _ := New().Open(ctx, "mem:storeurl-test", Options{})
	if _, err := f.Get(ctx, "k"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("another Openers shares mem:storeurl-test: %v", err)
	}
}

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://u:pw@h:5432/db?x=1":                     "postgres://u:xxxxx@h:5432/db?x=1",
		"redis://h:6379/0":                                  "redis://h:6379/0",
		"sqlite:idem.db":                                    "sqlite:idem.db",
		"postgres://u@h/db?sslmode=disable&password=pw&x=1": "postgres://u@h/db?sslmode=disable&password=xxxxx&x=1",
		"postgres://u:p@ss@h/db?PassWord=pw":                "postgres://u:xxxxx@h/db?PassWord=xxxxx",
		"postgres://h?password=pw":                          "postgres://h?password=xxxxx",
		"postgres://u:pw@h":                                 "postgres://u:xxxxx@h",
		"postgres://":                                       "postgres://",
		// A password with an unencoded '/', '?', '#' or '@': the user info
		// runs to the last '@'.
		"postgres://u:pa/ss@h/db":                     "postgres://u:xxxxx@h/db",
		"postgres://u:pa?ss@h/db?connect_timeout=2":   "postgres://u:xxxxx@h/db?connect_timeout=2",
		"redis://u:pa#ss@h:6379/0":                    "redis://u:xxxxx@h:6379/0",
		"postgres://u:p/a?s#s@w@h/db?password=pw":     "postgres://u:xxxxx@h/db?password=xxxxx",
		"postgres://h/db?password=pw&application=a@b": "postgres://h/db?password=xxxxx&application=a@b",
		// "//" forgotten, or the scheme.
		"postgres:alice:s3cret@db.internal/billing": "postgres:alice:xxxxx@db.internal/billing",
		"postgres:alice@db.internal/billing":        "postgres:alice@db.internal/billing",
		"alice:s3cret@db.internal/billing":          "alice:xxxxx@db.internal/billing",
		"ftp://u:pw@h/x":                            "ftp://u:xxxxx@h/x",
		"sqlite:/var/lib/idem@2/idem.db":            "sqlite:/var/lib/idem@2/idem.db",
	} {
		if got := Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}
