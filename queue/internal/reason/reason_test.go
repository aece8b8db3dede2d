package reason

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestBound(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int // length of the result
	}{
		{"", 0},
		{"short", 5},
		{strings.Repeat("x", MaxLen), MaxLen},
		{strings.Repeat("x", MaxLen+1), MaxLen},
		{strings.Repeat("é", MaxLen), MaxLen},            // 2-byte runes: MaxLen is even, a boundary
		{"x" + strings.Repeat("é", MaxLen), MaxLen - 1},  // the rune across MaxLen is dropped whole
		{strings.Repeat("日", MaxLen), MaxLen - MaxLen%3}, // 3-byte runes
		{strings.Repeat("\xff", 10), len("\uFFFD")},      // a run of bad bytes: one U+FFFD
	} {
		got := Bound(tc.in)
		if len(got) != tc.want || !utf8.ValidString(got) || !strings.HasPrefix(strings.ToValidUTF8(tc.in, "\uFFFD"), got) {
			t.Errorf("Bound(%.20q...) = %d bytes (valid %v), want a %d-byte prefix", tc.in, len(got), utf8.ValidString(got), tc.want)
		}
	}
}
