// Package reason bounds the dead-letter reasons that the broker adapters
// put on a dead-lettered copy (a header, a message attribute).
package reason

import (
	"strings"
	"unicode/utf8"
)

// MaxLen is the most bytes of a reason kept. A reason is often an error's
// text, which may quote a whole response or message; a broker refuses a
// header past its limits (RabbitMQ closes the channel on a header larger
// than its frame, NATS refuses a message over its max payload), and the
// message, never dead-lettered, would come back for ever.
const MaxLen = 4096

// Bound returns s as valid UTF-8 (U+FFFD for bytes that are not), cut at
// a rune boundary to at most MaxLen bytes.
func Bound(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= MaxLen {
		return s
	}
	cut := MaxLen
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}
