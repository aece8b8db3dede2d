package idem

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MaxKeyLen is the longest key, in bytes, that a Ledger accepts. Stores index
// keys, and a longer key is almost always a body or a list pasted by mistake.
const MaxKeyLen = 1024

// OperationKey is the identity of an operation: the same on every retry of the
// same operation, different for different operations. Build one with [Key]
// from business identifiers, or with [RawKey] from a string that already is a
// key. A key that could not be built carries its error, which every Ledger
// method reports as [ErrInvalidKey] without touching the store.
type OperationKey struct {
	s   string
	err error
}

// String returns the encoded key as the store keeps it ("" if invalid).
func (k OperationKey) String() string { return k.s }

// Err reports why the key is invalid, or nil. The error wraps [ErrInvalidKey].
// The zero OperationKey is invalid: it was never built.
func (k OperationKey) Err() error {
	if k.err == nil && k.s == "" {
		return errZeroKey
	}
	return k.err
}

var errZeroKey = invalidKey("zero OperationKey (build keys with Key or RawKey)")

// Key builds a key from parts, usually a name for the kind of operation and
// the business identifiers it is about:
//
//	idem.Key("receipt", orderID, userID) // "receipt:8891:7"
//
// Parts are joined with ':'. Inside a part, ':' and '\' are escaped with a
// backslash, and control characters and bytes that are not UTF-8 are written
// as \xNN, so two different lists of parts never give the same key.
//
// A part may be a string, a []byte, any integer type, or a [fmt.Stringer].
// An empty part (or an empty or nil Stringer) makes the key invalid: it almost
// always means a business id is missing, and a key built without it would
// merge unrelated operations. So does a part of any other type, and an
// encoded key longer than [MaxKeyLen].
func Key(parts ...any) OperationKey {
	if len(parts) == 0 {
		return OperationKey{err: invalidKey("no parts")}
	}
	var b strings.Builder
	for i, p := range parts {
		if i > 0 {
			b.WriteByte(':')
		}
		var s string
		switch v := p.(type) {
		case string:
			s = v
		case []byte:
			s = string(v)
		case int:
			s = strconv.FormatInt(int64(v), 10)
		case int8:
			s = strconv.FormatInt(int64(v), 10)
		case int16:
			s = strconv.FormatInt(int64(v), 10)
		case int32:
			s = strconv.FormatInt(int64(v), 10)
		case int64:
			s = strconv.FormatInt(v, 10)
		case uint:
			s = strconv.FormatUint(uint64(v), 10)
		case uint8:
			s = strconv.FormatUint(uint64(v), 10)
		case uint16:
			s = strconv.FormatUint(uint64(v), 10)
		case uint32:
			s = strconv.FormatUint(uint64(v), 10)
		case uint64:
			s = strconv.FormatUint(v, 10)
		case fmt.Stringer:
			if isNil(v) {
				return OperationKey{err: invalidKey(fmt.Sprintf("part %d is a nil %T (a missing business id?)", i, p))}
			}
			s = v.String()
		default:
			return OperationKey{err: invalidKey(fmt.Sprintf("part %d has unsupported type %T", i, p))}
		}
		if s == "" {
			return OperationKey{err: invalidKey(fmt.Sprintf("part %d is empty (a missing business id?)", i))}
		}
		escapePart(&b, s)
		if b.Len() > MaxKeyLen {
			return OperationKey{err: invalidKey(fmt.Sprintf("longer than %d bytes", MaxKeyLen))}
		}
	}
	return OperationKey{s: b.String()}
}

// isNil reports whether v holds a nil pointer (or other nil reference): a
// missing id, whose String would panic or print a placeholder such as
// "<nil>" that every missing id shares.
func isNil(v any) bool {
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan, reflect.Interface, reflect.UnsafePointer:
		return rv.IsNil()
	}
	return false
}

func escapePart(b *strings.Builder, s string) {
	const hex = "0123456789abcdef"
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == ':' || c == '\\':
				b.WriteByte('\\')
				b.WriteByte(c)
			case c < 0x20 || c == 0x7f:
				b.WriteString(`\x`)
				b.WriteByte(hex[c>>4])
				b.WriteByte(hex[c&0xf])
			default:
				b.WriteByte(c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b.WriteString(`\x`)
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&0xf])
		} else {
			b.WriteString(s[i : i+size])
		}
		i += size
	}
}

// RawKey uses s as the key as it is: for keys read back from a store, typed
// by an operator, or received from a client (an Idempotency-Key header). It
// must be non-empty, valid UTF-8 without NUL bytes (every store can index
// it), and at most [MaxKeyLen] bytes.
func RawKey(s string) OperationKey {
	switch {
	case s == "":
		return OperationKey{err: invalidKey("empty")}
	case len(s) > MaxKeyLen:
		return OperationKey{err: invalidKey(fmt.Sprintf("longer than %d bytes", MaxKeyLen))}
	case !utf8.ValidString(s):
		return OperationKey{err: invalidKey("not valid UTF-8")}
	case strings.IndexByte(s, 0) >= 0:
		return OperationKey{err: invalidKey("contains a NUL byte")}
	}
	return OperationKey{s: s}
}

func invalidKey(why string) error { return fmt.Errorf("%w: %s", ErrInvalidKey, why) }
