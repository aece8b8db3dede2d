package idem_test

import (
	"errors"
	"fmt"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

type orderID string

func (o orderID) String() string { return string(o) }

func TestKeyEncoding(t *testing.T) {
	cases := []struct {
		parts []any
		want  string
	}{
		{[]any{"receipt", 8891, 7}, "receipt:8891:7"},
		{[]any{"receipt", int64(-1), uint8(3)}, "receipt:-1:3"},
		{[]any{"a:b", "c"}, `a\:b:c`},
		{[]any{"a", "b:c"}, `a:b\:c`},
		{[]any{`a\`, "b"}, `a\\:b`},
		{[]any{"a", `\b`}, `a:\\b`},
		{[]any{"héllo", "日本"}, "héllo:日本"},
		{[]any{"tab\there", "nul\x00"}, `tab\x09here:nul\x00`},
		{[]any{"bad\xffutf8"}, `bad\xffutf8`},
		{[]any{orderID("o-1"), []byte("u")}, "o-1:u"},
	}
	for _, c := range cases {
		k := idem.Key(c.parts...)
		if k.Err() != nil {
			t.Fatalf("Key(%q): %v", c.parts, k.Err())
		}
		if k.String() != c.want {
			t.Errorf("Key(%q) = %q, want %q", c.parts, k.String(), c.want)
		}
	}
}

func TestKeyNoCollisions(t *testing.T) {
	lists := [][]any{
		{"a:b", "c"}, {"a", "b:c"}, {"a", "b", "c"}, {`a\`, "b"}, {`a\:b`}, {"a", `\:b`},
		{`a\\`, "b"}, {"a\\x3a"}, {"a:"}, {"a", ":"},
	}
	seen := map[string][]any{}
	for _, p := range lists {
		k := idem.Key(p...)
		if k.Err() != nil {
			t.Fatalf("Key(%q): %v", p, k.Err())
		}
		if prev, ok := seen[k.String()]; ok {
			t.Fatalf("Key(%q) and Key(%q) collide on %q", prev, p, k.String())
		}
		seen[k.String()] = p
	}
}

func TestKeyInvalid(t *testing.T) {
	cases := map[string]idem.OperationKey{
		"no parts":     idem.Key(),
		"empty part":   idem.Key("receipt", "", 7),
		"empty string": idem.Key(orderID("")),
		"bad type":     idem.Key("receipt", 1.5),
		"too long":     idem.Key(strings.Repeat("x", idem.MaxKeyLen+1)),
		"escapes long": idem.Key(strings.Repeat(":", idem.MaxKeyLen/2+1)),
		"raw empty":    idem.RawKey(""),
		"raw long":     idem.RawKey(strings.Repeat("x", idem.MaxKeyLen+1)),
		"raw not utf8": idem.RawKey("a\xff"),
		"raw nul":      idem.RawKey("a\x00b"),
	}
	for name, k := range cases {
		if !errors.Is(k.Err(), idem.ErrInvalidKey) {
			t.Errorf("%s: err = %v, want ErrInvalidKey", name, k.Err())
		}
		if k.String() != "" {
			t.Errorf("%s: invalid key has string %q", name, k.String())
		}
	}
	if k := idem.Key(strings.Repeat("x", idem.MaxKeyLen)); k.Err() != nil {
		t.Errorf("key of exactly MaxKeyLen bytes: %v", k.Err())
	}
	if k := idem.RawKey(strings.Repeat("é", idem.MaxKeyLen/2)); k.Err() != nil {
		t.Errorf("raw key of exactly MaxKeyLen bytes: %v", k.Err())
	}
}

func FuzzKeyInjective(f *testing.F) {
	f.Add("a:b", "c", "a", "b:c")
	f.Add(`a\`, ":b", `a\:`, "b")
	f.Fuzz(func(t *testing.T, a1, a2, b1, b2 string) {
		ka, kb := idem.Key(a1, a2), idem.Key(b1, b2)
		if ka.Err() != nil || kb.Err() != nil {
			return
		}
		if (a1 != b1 || a2 != b2) && ka.String() == kb.String() {
			t.Fatalf("Key(%q,%q) == Key(%q,%q) == %q", a1, a2, b1, b2, ka.String())
		}
		if idem.RawKey(ka.String()).Err() != nil && len(ka.String()) <= idem.MaxKeyLen {
			t.Fatalf("Key output %q is not a valid RawKey: %v", ka.String(), idem.RawKey(ka.String()).Err())
		}
	})
}

// A nil Stringer is a missing business id, like an empty part: the key is
// invalid. Keys built from one would merge unrelated operations (a nil
// *big.Int prints "<nil>"), or Key would panic in String.
func TestKeyNilStringer(t *testing.T) {
	var missing *big.Int
	var when *time.Time
	var id fmt.Stringer = (*orderPtr)(nil)
	for name, k := range map[string]idem.OperationKey{
		"nil *big.Int":            idem.Key("charge", missing),
		"nil *time.Time":          idem.Key("charge", when),
		"nil pointer in Stringer": idem.Key("charge", id),
		"nil net.IP":              idem.Key("login", net.IP(nil)),
	} {
		if !errors.Is(k.Err(), idem.ErrInvalidKey) {
			t.Errorf("%s: Key = %q, %v; want ErrInvalidKey", name, k.String(), k.Err())
		}
	}
	if k := idem.Key("charge", big.NewInt(0)); k.Err() != nil || k.String() != "charge:0" {
		t.Errorf("Key of a non-nil *big.Int: %q, %v", k.String(), k.Err())
	}
}

type orderPtr struct{ id string }

func (o *orderPtr) String() string {
	if o == nil {
		return "none"
	}
	return o.id
}
