// Package pgtext holds the rules for strings that PostgreSQL stores in text
// and jsonb values: valid UTF-8 without NUL bytes. The server refuses any
// other string with an error that fails the whole statement.
package pgtext

import (
	"strings"
	"unicode/utf8"
)

// Valid reports whether PostgreSQL text (and jsonb) can hold s.
func Valid(s string) bool {
	return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0
}

// Storable returns s with every byte that is not UTF-8, and every NUL,
// replaced with U+FFFD; s itself when it is Valid. Use it for text that
// describes (reasons, owners, correlation ids), never for identifiers,
// whose meaning a replacement would change.
func Storable(s string) string {
	if Valid(s) {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}
