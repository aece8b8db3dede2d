package httpidem

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"testing"
)

// TestJCSSamples: RFC 8785's samples (testdata/jcs, from the reference
// implementation) canonicalise to the published output, byte for byte.
func TestJCSSamples(t *testing.T) {
	files, err := filepath.Glob("testdata/jcs/input/*.json")
	if err != nil || len(files) != 6 {
		t.Fatalf("samples: %v, %v", files, err)
	}
	for _, in := range files {
		name := filepath.Base(in)
		b, err := os.ReadFile(in)
		if err != nil {
			t.Fatal(err)
		}
		want, err := os.ReadFile(filepath.Join("testdata/jcs/output", name))
		if err != nil {
			t.Fatal(err)
		}
		// values.json has 333333333.33333329, which a double does not
		// hold exactly: jcs refuses it (see jcs); the canonical form of
		// what a double holds is checked here.
		if name == "values.json" {
			b = bytes.Replace(b, []byte("333333333.33333329"), []byte("333333333.3333333"), 1)
			if _, ok := jcs(bytes.Replace(b, []byte("333333333.3333333"), []byte("333333333.33333329"), 1)); ok {
				t.Errorf("jcs accepted 333333333.33333329, which a double does not hold")
			}
		}
		got, ok := jcs(b)
		if !ok || !bytes.Equal(got, want) {
			t.Errorf("%s: jcs = %s, %v; want %s", name, got, ok, want)
		}
	}
}

// TestJCSNumbers: RFC 8785 Appendix B, the doubles (by their IEEE 754 bits)
// and how JCS writes them.
func TestJCSNumbers(t *testing.T) {
	for _, c := range []struct{ bits, want string }{
		{"0000000000000000", "0"},
		{"8000000000000000", "0"},
		{"0000000000000001", "5e-324"},
		{"8000000000000001", "-5e-324"},
		{"7fefffffffffffff", "1.7976931348623157e+308"},
		{"ffefffffffffffff", "-1.7976931348623157e+308"},
		{"4340000000000000", "9007199254740992"},
		{"c340000000000000", "-9007199254740992"},
		{"4430000000000000", "295147905179352830000"},
		{"44b52d02c7e14af5", "9.999999999999997e+22"},
		{"44b52d02c7e14af6", "1e+23"},
		{"44b52d02c7e14af7", "1.0000000000000001e+23"},
		{"444b1ae4d6e2ef4e", "999999999999999700000"},
		{"444b1ae4d6e2ef4f", "999999999999999900000"},
		{"444b1ae4d6e2ef50", "1e+21"},
		{"3eb0c6f7a0b5ed8c", "9.999999999999997e-7"},
		{"3eb0c6f7a0b5ed8d", "0.000001"},
		{"41b3de4355555553", "333333333.3333332"},
		{"41b3de4355555554", "333333333.33333325"},
		{"41b3de4355555555", "333333333.3333333"},
		{"41b3de4355555556", "333333333.3333334"},
		{"41b3de4355555557", "333333333.33333343"},
		{"becbf647612f3696", "-0.0000033333333333333333"},
		{"43143ff3c1cb0959", "1424953923781206.2"},
	} {
		bits, err := strconv.ParseUint(c.bits, 16, 64)
		if err != nil {
			t.Fatal(err)
		}
		f := math.Float64frombits(bits)
		if got := string(appendES6Number(nil, f)); got != c.want {
			t.Errorf("%s: %s, want %s", c.bits, got, c.want)
		}
		// As a JSON number (the shortest form, so a double holds it as
		// written), jcs writes the same.
		in := strconv.FormatFloat(f, 'g', -1, 64)
		if got, ok := jcs([]byte(in)); !ok || string(got) != c.want {
			t.Errorf("jcs(%s) = %s, %v; want %s", in, got, ok, c.want)
		}
	}
	for _, bits := range []string{"7fffffffffffffff", "7ff0000000000000"} { // NaN, Infinity
		b, _ := strconv.ParseUint(bits, 16, 64)
		if _, ok := appendJCS(nil, json.Number(strconv.FormatFloat(math.Float64frombits(b), 'g', -1, 64))); ok {
			t.Errorf("%s: accepted", bits)
		}
	}
}

// TestJCSExactNumbers: a number is canonicalised when a double holds it as
// written (1.0, 1e2, -0, 0.1), and the body is left raw when not, so two
// different numbers never canonicalise alike.
func TestJCSExactNumbers(t *testing.T) {
	in := `[1.0,1e2,1E+2,-0,0.0e5,0.1,10.50,-1.5e-7,1e21,100e-2,123456789012345678e3,-0.000001]`
	want := `[1,100,100,0,0,0.1,10.5,-1.5e-7,1e+21,1,123456789012345680000,-0.000001]`
	if got, ok := jcs([]byte(in)); ok {
		t.Errorf("jcs(%s) = %s; want it refused (123456789012345678e3 is not a double)", in, got)
	}
	in = `[1.0,1e2,1E+2,-0,0.0e5,0.1,10.50,-1.5e-7,1e21,100e-2,123456789012345680e3,-0.000001]`
	if got, ok := jcs([]byte(in)); !ok || string(got) != want {
		t.Errorf("jcs(%s) = %s, %v; want %s", in, got, ok, want)
	}
	for _, in := range []string{`9007199254740993`, `0.30000000000000001`, `1e400`, `-1e400`, `1e-400`, `[1,12345678901234567890]`, `1e99999999999999999999`} {
		if got, ok := jcs([]byte(in)); ok {
			t.Errorf("jcs(%s) = %s; want it refused", in, got)
		}
	}
}

// TestJCSRefuses: what is not I-JSON is refused.
func TestJCSRefuses(t *testing.T) {
	for _, in := range []string{`{"a":1,"a":2}`, `{"a":1,"\u0061":2}`, `"\udc80"`, `"\ud800x"`, `"\ud800\u0041"`, "\"\xff\"", `{"a":1} x`, `{`, ``} {
		if got, ok := jcs([]byte(in)); ok {
			t.Errorf("jcs(%q) = %s; want it refused", in, got)
		}
	}
	if got, ok := jcs([]byte(`"\ud83d\ude02\ufffd\u2028</>"`)); !ok || string(got) != "\"😂\ufffd\u2028</>\"" {
		t.Errorf("jcs = %q, %v", got, ok)
	}
}

// TestJCSStrings: RFC 8785 §3.2.2.2 escapes.
func TestJCSStrings(t *testing.T) {
	var in []byte
	for c := range 0x80 {
		in = append(in, byte(c))
	}
	got := string(appendJCSString(nil, string(in)))
	want := `"\u0000\u0001\u0002\u0003\u0004\u0005\u0006\u0007\b\t\n\u000b\f\r\u000e\u000f` +
		`\u0010\u0011\u0012\u0013\u0014\u0015\u0016\u0017\u0018\u0019\u001a\u001b\u001c\u001d\u001e\u001f` +
		` !\"#$%&'()*+,-./0123456789:;<=>?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_` + "`abcdefghijklmnopqrstuvwxyz{|}~\x7f\""
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

// TestCompareUTF16: member names sort by UTF-16 code units: U+1F602 (a
// surrogate pair, D83D DE02) before U+FB33, though its UTF-8 sorts after.
func TestCompareUTF16(t *testing.T) {
	names := []string{"\ufb33", "😂", "€", "\u0080", "1", "", "\r", "a", "ab", "\U0001F601", "\U00010000", "\uffff"}
	slices.SortFunc(names, compareUTF16)
	want := []string{"", "\r", "1", "a", "ab", "\u0080", "€", "\U00010000", "\U0001F601", "😂", "\ufb33", "\uffff"}
	if !slices.Equal(names, want) {
		t.Errorf("sorted: %q, want %q", names, want)
	}
}

// TestDecimalOf: the decimal value of JSON numbers.
func TestDecimalOf(t *testing.T) {
	for _, c := range [][2]string{{"1.0", "1"}, {"100", "1e2"}, {"0.001", "1E-3"}, {"-0", "0"}, {"0.0e10", "0"}, {"12.340", "1234e-2"}, {"-5e-324", "-0.5e-323"}} {
		if !sameDecimal(c[0], c[1]) {
			t.Errorf("%s and %s differ", c[0], c[1])
		}
	}
	for _, c := range [][2]string{{"1", "-1"}, {"1", "10"}, {"0.1", "0.01"}, {"9007199254740993", "9007199254740992"}} {
		if sameDecimal(c[0], c[1]) {
			t.Errorf("%s and %s are the same", c[0], c[1])
		}
	}
}

// FuzzJCS: jcs never panics; what it accepts is valid JSON, its output is
// canonical (jcs of it is itself) and means what the input meant
// (encoding/json decodes both alike, numbers as doubles).
func FuzzJCS(f *testing.F) {
	for _, s := range []string{`{"b":1.0,"a":[true,null,"x\u0001\u2028"]}`, `[1e21,1e-7,-0,0.1]`, `{"😂":1,"\ufb33":2}`,
		`9007199254740993`, `{"a":1,"a":2}`, `"\ud83d\ude02"`, `"\ud800"`, "\"\xff\"", `[`, `{"\u0000":"\t"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		out, ok := jcs(b)
		if !ok {
			return
		}
		if !json.Valid(b) || !json.Valid(out) {
			t.Fatalf("jcs(%q) = %q, ok for invalid JSON", b, out)
		}
		again, ok := jcs(out)
		if !ok || !bytes.Equal(again, out) {
			t.Fatalf("jcs(%q) = %q, and jcs of that = %q, %v", b, out, again, ok)
		}
		var vb, vo any
		if json.Unmarshal(b, &vb) != nil || json.Unmarshal(out, &vo) != nil {
			t.Fatalf("jcs(%q) = %q: does not decode", b, out)
		}
		if !reflect.DeepEqual(vb, vo) {
			t.Fatalf("jcs(%q) = %q: decodes to %#v, not %#v", b, out, vo, vb)
		}
	})
}

// BenchmarkCanonicalJSON: the RFC 8785 form and the old one, on a typical
// body.
func BenchmarkCanonicalJSON(b *testing.B) {
	body := []byte(`{"currency":"eur","amount":1000,"customer":{"id":"cus_123","email":"a@example.com"},"items":[{"sku":"x1","qty":2,"price":12.5}],"note":"café"}`)
	for _, c := range []struct {
		name  string
		canon func([]byte) ([]byte, bool)
	}{{"jcs", jcs}, {"legacy", legacyCanonicalJSON}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, ok := c.canon(body); !ok {
					b.Fatal("refused")
				}
			}
		})
	}
}
