package httpidem

import (
	"bytes"
	"encoding/json"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/idemkit/idem/internal/jsontext"
)

// jcs canonicalises the JSON value b per RFC 8785 (JSON Canonicalization
// Scheme): no insignificant whitespace, object members sorted by the UTF-16
// code units of their names, strings escaped as RFC 8785 §3.2.2.2 says
// (only '"', '\', and the controls below U+0020, with \b \t \n \f \r
// where they exist and \u00xx otherwise), numbers written as ECMAScript
// writes a double. So a body canonicalised by another language's JCS
// library hashes the same.
//
// RFC 8785 applies to I-JSON (RFC 7493); jcs refuses (ok false, and the
// body is fingerprinted raw) what is not: bytes that are not UTF-8, an
// escaped lone surrogate, an object whose member names repeat, a number
// outside the range of a double. It refuses one more thing RFC 8785 would
// canonicalise: a number that a double does not hold exactly as written
// (9007199254740993, 0.30000000000000001), which RFC 8785 rounds. Two
// different requests must never share a fingerprint: {"id":9007199254740993}
// and {"id":9007199254740992} would, and the second would be answered with
// the first's response. 1.0, 1e2 and 0.1 are held exactly (as the decimal
// the double prints as) and are canonicalised: 1, 100, 0.1.
func jcs(b []byte) ([]byte, bool) {
	if !utf8.Valid(b) || jsontext.LoneSurrogate(b) || duplicateNames(b) {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, false
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, false // trailing data
	}
	return appendJCS(make([]byte, 0, len(b)), v)
}

func appendJCS(out []byte, v any) ([]byte, bool) {
	switch v := v.(type) {
	case nil:
		return append(out, "null"...), true
	case bool:
		return strconv.AppendBool(out, v), true
	case json.Number:
		return appendJCSNumber(out, string(v))
	case string:
		return appendJCSString(out, v), true
	case []any:
		out = append(out, '[')
		for i, e := range v {
			if i > 0 {
				out = append(out, ',')
			}
			var ok bool
			if out, ok = appendJCS(out, e); !ok {
				return nil, false
			}
		}
		return append(out, ']'), true
	case map[string]any:
		names := make([]string, 0, len(v))
		for k := range v {
			names = append(names, k)
		}
		slices.SortFunc(names, compareUTF16)
		out = append(out, '{')
		for i, k := range names {
			if i > 0 {
				out = append(out, ',')
			}
			out = appendJCSString(out, k)
			out = append(out, ':')
			var ok bool
			if out, ok = appendJCS(out, v[k]); !ok {
				return nil, false
			}
		}
		return append(out, '}'), true
	}
	return nil, false
}

// appendJCSNumber appends the JSON number n as RFC 8785 §3.2.2.3 writes it
// (ECMAScript's Number.prototype.toString of the double n denotes), if that
// double holds n exactly (see jcs).
func appendJCSNumber(out []byte, n string) ([]byte, bool) {
	f, err := strconv.ParseFloat(n, 64)
	if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
		return nil, false
	}
	start := len(out)
	out = appendES6Number(out, f)
	if !sameDecimal(n, string(out[start:])) {
		return nil, false
	}
	return out, true
}

// appendES6Number appends f as ECMAScript's Number.prototype.toString does
// (ECMA-262 Number::toString): the shortest digits that round-trip; without
// an exponent from 1e-6 up to but excluding 1e21, else as d.ddde±x; -0 as 0.
func appendES6Number(out []byte, f float64) []byte {
	if f == 0 {
		return append(out, '0') // 0 and -0
	}
	format := byte('f')
	if abs := math.Abs(f); abs < 1e-6 || abs >= 1e21 {
		format = 'e'
	}
	start := len(out)
	out = strconv.AppendFloat(out, f, format, -1, 64)
	if format == 'e' {
		// Go writes at least two exponent digits (1e-07); ECMAScript as few
		// as needed (1e-7).
		if e := bytes.IndexByte(out[start:], 'e'); e >= 0 && out[start+e+2] == '0' {
			i := start + e + 2
			out = append(out[:i], out[i+1:]...)
		}
	}
	return out
}

// sameDecimal reports whether the JSON numbers a and b denote the same
// decimal value.
func sameDecimal(a, b string) bool {
	na, da, ea, oka := decimalOf(a)
	nb, db, eb, okb := decimalOf(b)
	return oka && okb && na == nb && da == db && ea == eb
}

// decimalOf returns the JSON number s as its sign, significant digits (no
// leading or trailing zeros) and exponent: s = ±digits × 10^exp. Zero is
// (false, "", 0), whatever its sign. ok is false for an exponent too large
// to work with.
func decimalOf(s string) (neg bool, digits string, exp int64, ok bool) {
	if strings.HasPrefix(s, "-") {
		neg, s = true, s[1:]
	}
	mant, e := s, ""
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		mant, e = s[:i], s[i+1:]
	}
	if e != "" {
		var err error
		if exp, err = strconv.ParseInt(e, 10, 64); err != nil || exp > 1<<40 || exp < -1<<40 {
			return false, "", 0, false
		}
	}
	intPart, frac, _ := strings.Cut(mant, ".")
	exp -= int64(len(frac))
	digits = strings.TrimLeft(intPart, "0")
	if digits == "" {
		digits = strings.TrimLeft(frac, "0")
	} else {
		digits += frac
	}
	trimmed := strings.TrimRight(digits, "0")
	exp += int64(len(digits) - len(trimmed))
	if trimmed == "" {
		return false, "", 0, true
	}
	return neg, trimmed, exp, true
}

// appendJCSString appends s as an RFC 8785 string (§3.2.2.2).
func appendJCSString(out []byte, s string) []byte {
	const hex = "0123456789abcdef"
	out = append(out, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			out = append(out, '\\', c)
		case c >= 0x20:
			out = append(out, c)
		case c == '\b':
			out = append(out, '\\', 'b')
		case c == '\t':
			out = append(out, '\\', 't')
		case c == '\n':
			out = append(out, '\\', 'n')
		case c == '\f':
			out = append(out, '\\', 'f')
		case c == '\r':
			out = append(out, '\\', 'r')
		default:
			out = append(out, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
	}
	return append(out, '"')
}

// compareUTF16 orders strings by their UTF-16 code units (RFC 8785
// §3.2.3), where a character above U+FFFF (a surrogate pair, 0xD800-0xDBFF
// first) sorts before U+E000-U+FFFF, unlike in UTF-8 byte order.
func compareUTF16(a, b string) int {
	for a != "" && b != "" {
		ra, na := utf8.DecodeRuneInString(a)
		rb, nb := utf8.DecodeRuneInString(b)
		if ra != rb {
			return utf16Order(ra) - utf16Order(rb)
		}
		a, b = a[na:], b[nb:]
	}
	return len(a) - len(b)
}

// utf16Order maps r to an int ordered as r's UTF-16 code units are.
func utf16Order(r rune) int {
	if r < 0x10000 {
		return int(r) << 16
	}
	r -= 0x10000
	return (0xd800+int(r>>10))<<16 | (0xdc00 + int(r&0x3ff))
}
