package pgtext

import "testing"

func TestStorable(t *testing.T) {
	for in, want := range map[string]string{
		"":              "",
		"plain":         "plain",
		"é日本":           "é日本",
		"bad \xff byte": "bad \uFFFD byte",
		"nul \x00 byte": "nul \uFFFD byte",
		"\xff\xfe\x00":  "\uFFFD\uFFFD",
	} {
		if got := Storable(in); got != want {
			t.Errorf("Storable(%q) = %q, want %q", in, got, want)
		}
		if !Valid(Storable(in)) {
			t.Errorf("Storable(%q) is not Valid", in)
		}
	}
	for s, want := range map[string]bool{"ok": true, "é": true, "a\x00": false, "\xc3": false} {
		if Valid(s) != want {
			t.Errorf("Valid(%q) = %v", s, !want)
		}
	}
}
