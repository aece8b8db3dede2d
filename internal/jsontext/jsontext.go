// Package jsontext holds checks on JSON text that encoding/json does not
// make, shared by httpidem and idem serve.
package jsontext

import "strconv"

// LoneSurrogate reports whether b, a JSON text in UTF-8, escapes a UTF-16
// surrogate that is not half of a pair: a high one (\uD800-\uDBFF) not
// followed at once by an escaped low one (\uDC00-\uDFFF), or a low one
// alone. encoding/json decodes each to U+FFFD, so "a\udc80" and "a\udcff"
// would decode alike (one key, one fingerprint); RFC 8785 (I-JSON) refuses
// them. A backslash only stands in a string in valid JSON; any other escape
// is skipped by its one character.
func LoneSurrogate(b []byte) bool {
	escape := func(i int) (rune, bool) { // the \uXXXX at b[i:], if any
		if i+6 > len(b) || b[i] != '\\' || b[i+1] != 'u' {
			return 0, false
		}
		n, err := strconv.ParseUint(string(b[i+2:i+6]), 16, 16)
		return rune(n), err == nil
	}
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' {
			continue
		}
		r, ok := escape(i)
		switch {
		case !ok:
			i++ // another escape: skip its character
		case r >= 0xd800 && r < 0xdc00:
			if lo, ok := escape(i + 6); !ok || lo < 0xdc00 || lo > 0xdfff {
				return true
			}
			i += 11
		case r >= 0xdc00 && r <= 0xdfff:
			return true
		default:
			i += 5
		}
	}
	return false
}
