package httpidem

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"

	"github.com/dunglas/httpsfv"
)

// unpaddedBinary reports whether httpsfv refused in as a byte sequence whose
// base64 is not padded (or badly padded): the one known difference between
// httpsfv and refParseKey. RFC 9651 §4.2.7 says parsers SHOULD NOT fail on
// missing padding, which refParseKey followed; httpsfv decodes with
// base64.StdEncoding and fails. It only matters for a key sent with a
// byte-sequence parameter, which the draft defines none of.
func unpaddedBinary(in string) bool {
	_, err := httpsfv.UnmarshalItem([]string{strings.Trim(in, " \t")})
	var corrupt base64.CorruptInputError
	return errors.As(err, &corrupt)
}

// FuzzParseKeyHTTPSFV compares ParseKey (httpsfv) with refParseKey, the
// parser httpidem had before: on every input they accept and refuse alike
// and return the same key, except that httpsfv refuses byte sequences
// without base64 padding (see unpaddedBinary).
func FuzzParseKeyHTTPSFV(f *testing.F) {
	for _, s := range []string{
		`"8e03978e-40d5-43e8-bc93-6894a57f9324"`, `"a\"b\\c"`, `"k";a=1;b=?1;c=:AQI=:;d=%"%c3%a9";e=@1`,
		`abc`, `"a", "b"`, `"`, `"\`, `"a";a=1.234`, "\"\xff\"", `;`, `%"`, `"";x`,
		`"k";a=:AQI:`, `"k";a=:AQ=:`, `"k";a=123456789012.123`, `"k";a=1234567890123456`, `"k";a=-999999999999999`,
		`"k";a=@-1;b=*tok/x:y;*c=%"%ff%fe"`, `"k";a=?2`, `"k" ;a`, `"k";a;a=2`, "\"k\"\t", `"k";A=1`,
		`"k";a=%"%C3%A9"`, `"k";a=%"` + "\x7f" + `"`, `"k";a=1.5e3`, `"k";a=-`, `"k";a=--1`,
	} {
		f.Add(s, true)
		f.Add(s, false)
	}
	f.Fuzz(func(t *testing.T, in string, bare bool) {
		got, err := ParseKey(in, bare)
		want, refErr := refParseKey(in, bare)
		switch {
		case err == nil && refErr == nil:
			if got != want {
				t.Fatalf("ParseKey(%q, %v) = %q; the reference parser returns %q", in, bare, got, want)
			}
		case err != nil && refErr != nil:
			if !errors.Is(err, ErrKeyInvalid) {
				t.Fatalf("ParseKey(%q): error %v does not wrap ErrKeyInvalid", in, err)
			}
		case err != nil:
			if !unpaddedBinary(in) {
				t.Fatalf("ParseKey(%q, %v) refused it (%v); the reference parser accepts %q", in, bare, err, want)
			}
		default:
			t.Fatalf("ParseKey(%q, %v) = %q; the reference parser refuses it (%v)", in, bare, got, refErr)
		}
	})
}

// BenchmarkParseKey: ParseKey (httpsfv) and the reference parser on a
// typical key.
func BenchmarkParseKey(b *testing.B) {
	const in = `"8e03978e-40d5-43e8-bc93-6894a57f9324"`
	for _, p := range []struct {
		name  string
		parse func(string, bool) (string, error)
	}{{"httpsfv", ParseKey}, {"reference", refParseKey}} {
		b.Run(p.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := p.parse(in, true); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
