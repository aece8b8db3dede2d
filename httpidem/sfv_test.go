package httpidem

import (
	"errors"
	"strings"
	"testing"
)

// TestParseKey: sf-strings with escapes and parameters parse to their
// unescaped value; everything RFC 9651 refuses is refused with
// ErrKeyInvalid; bare keys only when allowed.
func TestParseKey(t *testing.T) {
	ok := []struct {
		in, want string
		bare     bool
	}{
		{`"abc"`, "abc", false},
		{`  "abc"  `, "abc", false},
		{`"a b"`, "a b", false},
		{`"q\"q\\q"`, `q"q\q`, false},
		{`"k";a=1;b=-1.5;c="x";d=tok;e=:AQI=:;f=?0;g;h=@-12;i=%"%e2%82%ac"`, "k", false},
		{`"k"; a=1`, "k", false},
		{`8e03978e-40d5-43e8-bc93-6894a57f9324`, "8e03978e-40d5-43e8-bc93-6894a57f9324", true},
		{`abc+/=`, "abc+/=", true},
		{` abc `, "abc", true},
	}
	for _, c := range ok {
		got, err := ParseKey(c.in, c.bare)
		if err != nil || got != c.want {
			t.Errorf("ParseKey(%q, %v) = %q, %v; want %q", c.in, c.bare, got, err, c.want)
		}
	}
	bad := []struct {
		in   string
		bare bool
	}{
		{``, true}, {` `, true}, {`""`, true}, {`"abc`, true}, {`"a"b`, true}, {`"a" , "b"`, true},
		{`"\a"`, true}, {"\"a\tb\"", true}, {"\"\x7f\"", true}, {"\"é\"", true},
		{`"a";`, true}, {`"a";1=2`, true}, {`"a";a=`, true}, {`"a";a==1`, true},
		{`"a";a=1.`, true}, {`"a";a=1.2345`, true}, {`"a";a=1234567890123.1`, true}, {`"a";a=-`, true},
		{`"a";a=:abc`, true}, {`"a";a=?`, true}, {`"a";a=@1.5`, true}, {`"a";a=@x`, true},
		{`"a";a=%"%C3"`, true}, {`"a";a=%"%ff"`, true}, {`"a";a=%x`, true}, {`"a";a=%"abc`, true},
		{`"a";a="b`, true}, {`"a";a=(1)`, true}, {`"a";;`, true},
		{`abc`, false}, {`a,b`, true}, {`a;b`, true}, {`a b`, true}, {"a\x00", true}, {"\xff", true},
	}
	for _, c := range bad {
		got, err := ParseKey(c.in, c.bare)
		if !errors.Is(err, ErrKeyInvalid) {
			t.Errorf("ParseKey(%q, %v) = %q, %v; want ErrKeyInvalid", c.in, c.bare, got, err)
		}
	}
}

// quote serialises s as an sf-string (RFC 9651 §4.1.6).
func quote(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}

// FuzzParseKey: the parser never panics; what it accepts is a non-empty key
// of printable ASCII that survives serialising as an sf-string and parsing
// again; and a strict parse only accepts what starts with a quote.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{
		`"8e03978e-40d5-43e8-bc93-6894a57f9324"`, `"a\"b\\c"`, `"k";a=1;b=?1;c=:AQI=:;d=%"%c3%a9";e=@1`,
		`abc`, `"a", "b"`, `"`, `"\`, `"a";a=1.234`, "\"\xff\"", `;`, `%"`, `"";x`,
	} {
		f.Add(s, true)
		f.Add(s, false)
	}
	f.Fuzz(func(t *testing.T, in string, bare bool) {
		key, err := ParseKey(in, bare)
		if err != nil {
			if !errors.Is(err, ErrKeyInvalid) {
				t.Fatalf("error %v does not wrap ErrKeyInvalid", err)
			}
			if len(in) > 3 && strings.Contains(err.Error(), in) {
				t.Fatalf("error %q repeats the input", err)
			}
			return
		}
		if key == "" || len(key) > len(in) {
			t.Fatalf("ParseKey(%q) = %q", in, key)
		}
		for i := 0; i < len(key); i++ {
			if key[i] < 0x20 || key[i] > 0x7e {
				t.Fatalf("ParseKey(%q) = %q: byte %d not printable ASCII", in, key, i)
			}
		}
		if strings.TrimLeft(in, " \t")[0] != '"' && !bare {
			t.Fatalf("strict ParseKey accepted %q", in)
		}
		again, err := ParseKey(quote(key), false)
		if err != nil || again != key {
			t.Fatalf("round trip of %q: %q, %v", key, again, err)
		}
	})
}

// FuzzDecodeResponse: a stored result that is not one the middleware wrote
// is an error, never a panic; one it wrote decodes to what it wrote.
func FuzzDecodeResponse(f *testing.F) {
	f.Add((&response{status: 201, headers: []string{"Location", "/x"}, body: []byte("hi")}).encode())
	f.Add((&response{status: 200, flags: flagBodyOmitted}).encode())
	f.Add([]byte{1, 0, 0xff})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeResponse(b)
		if err != nil {
			return
		}
		back := r.encode()
		r2, err := decodeResponse(back)
		if err != nil || r2.status != r.status || r2.flags != r.flags || string(r2.body) != string(r.body) || strings.Join(r2.headers, "\n") != strings.Join(r.headers, "\n") {
			t.Fatalf("re-encoding %x changed it: %+v vs %+v (%v)", b, r, r2, err)
		}
	})
}
