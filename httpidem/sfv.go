package httpidem

import (
	"errors"
	"fmt"
	"strings"

	"github.com/dunglas/httpsfv"
)

// ErrKeyInvalid is wrapped by every error [ParseKey] returns: the
// Idempotency-Key field is not a key this middleware accepts. The middleware
// answers it with 400 and problem type "key-invalid", before the store is
// touched.
var ErrKeyInvalid = errors.New("httpidem: invalid Idempotency-Key")

// ParseKey parses the value of one Idempotency-Key field line, as the IETF
// draft defines it: an RFC 9651 Structured Field Item whose bare item is a
// String (`"8e03978e-40d5-43e8-bc93-6894a57f9324"`). Parameters are parsed
// (so a malformed one is an error) and ignored, as RFC 9651 says unknown
// parameters must be. An sf-string holds printable ASCII only (0x20–0x7E),
// with `\"` and `\\` as its only escapes; ParseKey returns it unescaped.
// The Item is parsed by github.com/dunglas/httpsfv (see the package
// documentation).
//
// When allowBare is true, a value that does not start with a double quote is
// accepted as it is (a "bare" key, as many clients send: Stripe's SDKs, curl
// examples), provided it is made only of visible ASCII (0x21–0x7E) other than
// '"', '\', ',' and ';' — the characters that would make it look like a
// malformed Structured Field (a list, parameters, a broken string). A value
// that starts with '"' is always parsed strictly.
//
// Errors wrap [ErrKeyInvalid] and say what is wrong without repeating the
// value. An empty key ("" or an empty field) is an error. ParseKey does not
// check the key's length; the middleware does.
func ParseKey(value string, allowBare bool) (string, error) {
	// HTTP removes the field value's surrounding whitespace (OWS: spaces
	// and tabs); so does ParseKey, for values that did not come through a
	// server.
	value = strings.Trim(value, " \t")
	if value == "" {
		return "", invalid("empty field value")
	}
	if value[0] != '"' {
		if !allowBare {
			return "", invalid("not a Structured Field string (the key must be quoted)")
		}
		for i := 0; i < len(value); i++ {
			c := value[i]
			if c < 0x21 || c > 0x7e || c == '"' || c == '\\' || c == ',' || c == ';' {
				return "", invalid(fmt.Sprintf("unquoted key has a character not allowed in a bare key at byte %d", i))
			}
		}
		return value, nil
	}
	item, err := httpsfv.UnmarshalItem([]string{value})
	if err != nil {
		// httpsfv's errors name the problem and its offset, never the
		// value ("invalid string format: character 5").
		return "", invalid("not an RFC 9651 Item: " + err.Error())
	}
	key, ok := item.Value.(string)
	if !ok {
		return "", invalid("not a Structured Field string") // cannot happen: value starts with '"'
	}
	if key == "" {
		return "", invalid("empty string")
	}
	return key, nil
}

func invalid(why string) error { return fmt.Errorf("%w: %s", ErrKeyInvalid, why) }
