package idemtest

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store"
)

// testKeys holds key handling end to end: keys the store must keep exactly
// as given (unicode, escapes, case, trailing spaces, the longest key), and
// keys the Ledger refuses without touching the store.
func testKeys(t *testing.T, h Harness) {
	valid := []struct {
		name string
		key  idem.OperationKey
	}{
		{"unicode", idem.Key("récépissé", "用户", "🙂", "Ωmega")},
		{"separators_escaped", idem.Key("a:b", `c\d`)},
		{"control_bytes", idem.Key("tab\there", "nl\nthere")},
		{"non_utf8_part", idem.Key([]byte{0xff, 0xfe, 'x'})},
		{"max_ascii", idem.RawKey(strings.Repeat("k", idem.MaxKeyLen))},
		{"max_multibyte", idem.RawKey(strings.Repeat("é", idem.MaxKeyLen/2))},
		{"max_built", idem.Key("receipt", strings.Repeat("x", idem.MaxKeyLen-len("receipt:")))},
		{"quotes_and_sql", idem.RawKey(`o'brien"; DROP TABLE records; --`)},
		{"percent_and_wildcards", idem.RawKey(`100%_off*?[a]`)},
		{"leading_space", idem.RawKey(" k")},
	}
	for _, tc := range valid {
		t.Run("valid/"+tc.name, func(t *testing.T) {
			t.Parallel()
			if err := tc.key.Err(); err != nil {
				t.Fatalf("key: %v", err)
			}
			if len(tc.key.String()) > idem.MaxKeyLen {
				t.Fatalf("key is %d bytes, longer than MaxKeyLen", len(tc.key.String()))
			}
			s := newStore(t, h)
			l := ledger(h, s)
			var c counter
			do(t, l, tc.key, c.fn([]byte("v")))
			res := do(t, l, tc.key, c.fn(nil))
			wantResult(t, res, []byte("v"), true, 1)
			c.want(t, 1)
			rec := get(t, s, tc.key.String())
			if rec.Key != tc.key.String() {
				t.Fatalf("stored key %q, want %q", rec.Key, tc.key.String())
			}
			recs, err := s.List(context.Background(), store.ListQuery{})
			noErr(t, "List", err)
			if len(recs) != 1 || recs[0].Key != tc.key.String() {
				t.Fatalf("List = %q, want exactly [%q]", keysOf(recs), tc.key.String())
			}
		})
	}

	t.Run("distinct", func(t *testing.T) {
		// Keys that a careless store could merge: escaped separators, case,
		// trailing spaces (SQL padding), prefixes, unicode normalization.
		t.Parallel()
		keys := []idem.OperationKey{
			idem.Key("a:b", "c"), idem.Key("a", "b:c"), idem.Key("a", "b", "c"),
			idem.RawKey("K"), idem.RawKey("k"), idem.RawKey("k "), idem.RawKey("k  "), idem.RawKey("k\t"),
			idem.RawKey("kk"), idem.RawKey("é"), idem.RawKey("e\u0301"), idem.RawKey("ß"), idem.RawKey("ss"),
		}
		seen := map[string]bool{}
		for _, k := range keys {
			noErr(t, "key", k.Err())
			if seen[k.String()] {
				t.Fatalf("two different keys encode to %q", k.String())
			}
			seen[k.String()] = true
		}
		s := newStore(t, h)
		l := ledger(h, s)
		var c counter
		for i, k := range keys {
			res := do(t, l, k, c.fn([]byte{byte(i)}))
			if res.Replayed {
				t.Fatalf("Do(%q) replayed another key's result %v: the store merged two keys", k, res.Value)
			}
		}
		c.want(t, len(keys))
		for i, k := range keys {
			res := do(t, l, k, c.fn(nil))
			wantResult(t, res, []byte{byte(i)}, true, 1)
		}
	})

	t.Run("list_in_byte_order", func(t *testing.T) {
		// List's order and its After cursor compare keys byte by byte, as
		// Go compares strings (a SQL store needs a binary collation).
		t.Parallel()
		s := newStore(t, h)
		keys := []string{"z", "a", "B", "é", "A", "b", "a:b", `a\:b`, "aa", "Z", "~", "用"}
		for _, k := range keys {
			acquire(t, s, req(h, k))
		}
		want := slices.Clone(keys)
		slices.Sort(want)
		recs, err := s.List(context.Background(), store.ListQuery{})
		noErr(t, "List", err)
		if got := keysOf(recs); !slices.Equal(got, want) {
			t.Fatalf("List order %q, want byte order %q", got, want)
		}
		recs, err = s.List(context.Background(), store.ListQuery{After: "Z"})
		noErr(t, "List", err)
		if got := keysOf(recs); !slices.Equal(got, want[slices.Index(want, "Z")+1:]) {
			t.Fatalf("List(After Z) = %q, want %q", got, want[slices.Index(want, "Z")+1:])
		}
	})

	invalid := []struct {
		name string
		key  idem.OperationKey
	}{
		{"too_long_raw", idem.RawKey(strings.Repeat("k", idem.MaxKeyLen+1))},
		{"too_long_built", idem.Key("receipt", strings.Repeat("x", idem.MaxKeyLen-len("receipt:")+1))},
		{"too_long_by_escaping", idem.Key(strings.Repeat(":", idem.MaxKeyLen/2+1))},
		{"empty_part", idem.Key("receipt", "", 7)},
		{"no_parts", idem.Key()},
		{"unsupported_part", idem.Key("receipt", 1.5)},
		{"empty_raw", idem.RawKey("")},
		{"non_utf8_raw", idem.RawKey("bad\xffkey")},
		{"nul_raw", idem.RawKey("a\x00b")},
		{"zero_value", idem.OperationKey{}},
	}
	for _, tc := range invalid {
		t.Run("invalid/"+tc.name, func(t *testing.T) {
			t.Parallel()
			fs := NewFaultStore(newStore(t, h))
			l := ledger(h, fs)
			var c counter
			_, err := l.Do(context.Background(), tc.key, c.fn(nil))
			if tc.name == "zero_value" && err == nil {
				t.Fatal("Do with the zero OperationKey succeeded")
			}
			if tc.name != "zero_value" {
				wantErr(t, "Do", err, idem.ErrInvalidKey)
				wantErr(t, "key.Err()", tc.key.Err(), idem.ErrInvalidKey)
			}
			_, _, err = idem.Run(context.Background(), l, tc.key, func(context.Context) (int, error) { return 1, nil })
			if err == nil {
				t.Fatal("Run with an invalid key succeeded")
			}
			c.want(t, 0)
			if n := fs.TotalCalls(); n != 0 {
				t.Fatalf("an invalid key made %d store calls, want 0", n)
			}
		})
	}
}
