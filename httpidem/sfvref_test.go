package httpidem

import (
	"encoding/base64"
	"fmt"
	"strings"
	"unicode/utf8"
)

// refParseKey is httpidem's own parser from before it used
// github.com/dunglas/httpsfv, kept as the reference FuzzParseKeyHTTPSFV
// compares ParseKey to. It parses the value of one Idempotency-Key field line, as the IETF
// draft defines it: an RFC 9651 Structured Field Item whose bare item is a
// String (`"8e03978e-40d5-43e8-bc93-6894a57f9324"`). Parameters are parsed
// (so a malformed one is an error) and ignored, as RFC 9651 says unknown
// parameters must be. An sf-string holds printable ASCII only (0x20–0x7E),
// with `\"` and `\\` as its only escapes; ParseKey returns it unescaped.
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
func refParseKey(value string, allowBare bool) (string, error) {
	// HTTP removes the field value's surrounding whitespace (OWS: spaces
	// and tabs); so does ParseKey, for values that did not come through a
	// server.
	value = strings.Trim(value, " \t")
	if value == "" {
		return "", invalid("empty field value")
	}
	p := refParser{s: value}
	if p.peek() != '"' {
		if !allowBare {
			return "", invalid("not a Structured Field string (the key must be quoted)")
		}
		s := value
		for i := 0; i < len(s); i++ {
			c := s[i]
			if c < 0x21 || c > 0x7e || c == '"' || c == '\\' || c == ',' || c == ';' {
				return "", invalid(fmt.Sprintf("unquoted key has a character not allowed in a bare key at byte %d", i))
			}
		}
		return s, nil
	}
	key, err := p.parseString()
	if err != nil {
		return "", err
	}
	if err := p.parseParameters(); err != nil {
		return "", err
	}
	p.skipSP()
	if !p.eof() {
		return "", invalid(fmt.Sprintf("unexpected character at byte %d after the item (several keys, or a list?)", p.i))
	}
	if key == "" {
		return "", invalid("empty string")
	}
	return key, nil
}

// refParser parses the parts of RFC 9651 (Structured Field Values) that an
// Item needs: bare items of every type, and parameters.
type refParser struct {
	s string
	i int
}

func (p *refParser) eof() bool  { return p.i >= len(p.s) }
func (p *refParser) peek() byte { return p.s[p.i] }

func (p *refParser) skipSP() {
	for !p.eof() && p.s[p.i] == ' ' {
		p.i++
	}
}

// parseString parses an sf-string starting at '"' (RFC 9651 §4.2.5).
func (p *refParser) parseString() (string, error) {
	p.i++ // opening quote
	var b strings.Builder
	for !p.eof() {
		c := p.s[p.i]
		p.i++
		switch {
		case c == '\\':
			if p.eof() {
				return "", invalid("string ends inside an escape")
			}
			n := p.s[p.i]
			if n != '"' && n != '\\' {
				return "", invalid(fmt.Sprintf("invalid escape at byte %d (only \\\" and \\\\ are allowed)", p.i))
			}
			p.i++
			b.WriteByte(n)
		case c == '"':
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", invalid(fmt.Sprintf("byte %d is not printable ASCII (strings hold 0x20-0x7E only)", p.i-1))
		default:
			b.WriteByte(c)
		}
	}
	return "", invalid("string has no closing quote")
}

// parseParameters parses ';'-separated parameters (RFC 9651 §4.2.3.2) and
// discards them.
func (p *refParser) parseParameters() error {
	for !p.eof() && p.peek() == ';' {
		p.i++
		p.skipSP()
		if err := p.parseKey(); err != nil {
			return err
		}
		if !p.eof() && p.peek() == '=' {
			p.i++
			if err := p.parseBareItem(); err != nil {
				return err
			}
		}
	}
	return nil
}

// parseKey parses a parameter key (RFC 9651 §4.2.3.3).
func (p *refParser) parseKey() error {
	if p.eof() || !(isLCAlpha(p.peek()) || p.peek() == '*') {
		return invalid(fmt.Sprintf("parameter key expected at byte %d", p.i))
	}
	for !p.eof() {
		c := p.peek()
		if !(isLCAlpha(c) || isDigit(c) || c == '_' || c == '-' || c == '.' || c == '*') {
			break
		}
		p.i++
	}
	return nil
}

// parseBareItem parses (and validates) a bare item of any type.
func (p *refParser) parseBareItem() error {
	if p.eof() {
		return invalid("parameter value expected at the end")
	}
	c := p.peek()
	switch {
	case c == '-' || isDigit(c):
		return p.parseNumber()
	case c == '"':
		_, err := p.parseString()
		return err
	case c == '*' || isAlpha(c):
		return p.parseToken()
	case c == ':':
		return p.parseByteSequence()
	case c == '?':
		return p.parseBoolean()
	case c == '@':
		p.i++
		if p.eof() || !(p.peek() == '-' || isDigit(p.peek())) {
			return invalid(fmt.Sprintf("date expected at byte %d", p.i))
		}
		return p.parseInteger()
	case c == '%':
		return p.parseDisplayString()
	}
	return invalid(fmt.Sprintf("unexpected character at byte %d", p.i))
}

// parseNumber parses an sf-integer or sf-decimal (RFC 9651 §4.2.4).
func (p *refParser) parseNumber() error {
	if p.peek() == '-' {
		p.i++
	}
	if p.eof() || !isDigit(p.peek()) {
		return invalid(fmt.Sprintf("digit expected at byte %d", p.i))
	}
	digits, frac, decimal := 0, 0, false
	for !p.eof() {
		c := p.peek()
		switch {
		case isDigit(c):
			if decimal {
				frac++
			} else {
				digits++
			}
		case c == '.' && !decimal:
			if digits > 12 {
				return invalid("decimal has more than 12 integer digits")
			}
			decimal = true
		default:
			goto done
		}
		p.i++
		if !decimal && digits > 15 {
			return invalid("integer has more than 15 digits")
		}
		if decimal && frac > 3 {
			return invalid("decimal has more than 3 fractional digits")
		}
	}
done:
	if decimal && frac == 0 {
		return invalid("decimal ends with '.'")
	}
	return nil
}

func (p *refParser) parseInteger() error {
	start := p.i
	if err := p.parseNumber(); err != nil {
		return err
	}
	if strings.IndexByte(p.s[start:p.i], '.') >= 0 {
		return invalid("date must be an integer")
	}
	return nil
}

// parseToken parses an sf-token (RFC 9651 §4.2.6).
func (p *refParser) parseToken() error {
	p.i++
	for !p.eof() {
		c := p.peek()
		if !(isTChar(c) || c == ':' || c == '/') {
			break
		}
		p.i++
	}
	return nil
}

// parseByteSequence parses an sf-binary (RFC 9651 §4.2.7).
func (p *refParser) parseByteSequence() error {
	p.i++
	end := strings.IndexByte(p.s[p.i:], ':')
	if end < 0 {
		return invalid("byte sequence has no closing ':'")
	}
	b64 := p.s[p.i : p.i+end]
	for i := 0; i < len(b64); i++ {
		c := b64[i]
		if !(isAlpha(c) || isDigit(c) || c == '+' || c == '/' || c == '=') {
			return invalid(fmt.Sprintf("byte %d is not base64", p.i+i))
		}
	}
	p.i += end + 1
	if _, err := base64.StdEncoding.DecodeString(b64); err != nil {
		if _, err2 := base64.RawStdEncoding.DecodeString(strings.TrimRight(b64, "=")); err2 != nil {
			return invalid("byte sequence is not valid base64")
		}
	}
	return nil
}

// parseBoolean parses an sf-boolean (RFC 9651 §4.2.8).
func (p *refParser) parseBoolean() error {
	p.i++
	if p.eof() || (p.peek() != '0' && p.peek() != '1') {
		return invalid(fmt.Sprintf("boolean must be ?0 or ?1 at byte %d", p.i))
	}
	p.i++
	return nil
}

// parseDisplayString parses an sf-displaystring (RFC 9651 §4.2.10).
func (p *refParser) parseDisplayString() error {
	p.i++
	if p.eof() || p.peek() != '"' {
		return invalid(fmt.Sprintf("display string expected at byte %d", p.i))
	}
	p.i++
	var buf []byte
	for !p.eof() {
		c := p.s[p.i]
		p.i++
		switch {
		case c < 0x20 || c > 0x7e:
			return invalid(fmt.Sprintf("byte %d is not printable ASCII", p.i-1))
		case c == '%':
			if p.i+2 > len(p.s) || !isLCHex(p.s[p.i]) || !isLCHex(p.s[p.i+1]) {
				return invalid(fmt.Sprintf("bad percent escape at byte %d", p.i-1))
			}
			buf = append(buf, unhex(p.s[p.i])<<4|unhex(p.s[p.i+1]))
			p.i += 2
		case c == '"':
			if !utf8.Valid(buf) {
				return invalid("display string is not UTF-8")
			}
			return nil
		default:
			buf = append(buf, c)
		}
	}
	return invalid("display string has no closing quote")
}

func isDigit(c byte) bool   { return c >= '0' && c <= '9' }
func isLCAlpha(c byte) bool { return c >= 'a' && c <= 'z' }
func isAlpha(c byte) bool   { return isLCAlpha(c) || (c >= 'A' && c <= 'Z') }
func isLCHex(c byte) bool   { return isDigit(c) || (c >= 'a' && c <= 'f') }

func unhex(c byte) byte {
	if isDigit(c) {
		return c - '0'
	}
	return c - 'a' + 10
}

// isTChar reports whether c is an RFC 9110 tchar.
func isTChar(c byte) bool {
	if isAlpha(c) || isDigit(c) {
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}
