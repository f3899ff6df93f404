package protocol

import (
	"bytes"
	"encoding/json"
	"strconv"
	"unicode/utf8"
)

// A scanner over JSON text already checked by json.Valid: it walks objects
// and arrays, handing out the raw bytes of members and elements, and skips
// values without decoding them. On valid input it cannot fail; it never
// reads out of bounds on any input.

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the index just past the string starting at b[i] ('"').
func stringEnd(b []byte, i int) int {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return len(b)
}

// valueEnd returns the index just past the value starting at b[i].
func valueEnd(b []byte, i int) int {
	if i >= len(b) {
		return len(b)
	}
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				j = stringEnd(b, j) - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return len(b)
	default: // number, true, false, null
		j := i
		for j < len(b) {
			switch b[j] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				return j
			}
			j++
		}
		return j
	}
}

// members iterates over the members of the object b ("{...}").
type members struct {
	b []byte
	i int // 0 before the first member
}

// next returns the next member's raw key (with its quotes) and raw value.
func (m *members) next() (key, val []byte, ok bool) {
	if m.i == 0 {
		m.i = 1
	}
	i := skipWS(m.b, m.i)
	if i < len(m.b) && m.b[i] == ',' {
		i = skipWS(m.b, i+1)
	}
	if i >= len(m.b) || m.b[i] != '"' {
		m.i = len(m.b)
		return nil, nil, false
	}
	ke := stringEnd(m.b, i)
	key = m.b[i:ke]
	j := skipWS(m.b, ke)
	if j >= len(m.b) || m.b[j] != ':' {
		m.i = len(m.b)
		return nil, nil, false
	}
	j = skipWS(m.b, j+1)
	ve := valueEnd(m.b, j)
	if j >= ve {
		m.i = len(m.b)
		return nil, nil, false
	}
	m.i = ve
	return key, m.b[j:ve], true
}

// elements iterates over the elements of the array b ("[...]").
type elements struct {
	b []byte
	i int // 0 before the first element
}

// next returns the next element's raw value.
func (e *elements) next() ([]byte, bool) {
	if e.i == 0 {
		e.i = 1
	}
	i := skipWS(e.b, e.i)
	if i < len(e.b) && e.b[i] == ',' {
		i = skipWS(e.b, i+1)
	}
	if i >= len(e.b) || e.b[i] == ']' {
		e.i = len(e.b)
		return nil, false
	}
	ve := valueEnd(e.b, i)
	if i >= ve {
		e.i = len(e.b)
		return nil, false
	}
	e.i = ve
	return e.b[i:ve], true
}

// keyIs reports whether the raw key (with its quotes) is name.
func keyIs(key []byte, name string) bool {
	if len(key) < 2 {
		return false
	}
	inner := key[1 : len(key)-1]
	if bytes.IndexByte(inner, '\\') < 0 {
		return string(inner) == name
	}
	s, ok := decodeString(key)
	return ok && s == name
}

// decodeString returns the string value of the raw JSON string raw, and
// false when raw is not a string.
func decodeString(raw []byte) (string, bool) {
	if len(raw) < 2 || raw[0] != '"' {
		return "", false
	}
	inner := raw[1 : len(raw)-1]
	if bytes.IndexByte(inner, '\\') < 0 && utf8.Valid(inner) {
		return string(inner), true
	}
	var s string // escapes, or invalid UTF-8 (replaced by U+FFFD, as encoding/json does)
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", false
	}
	return s, true
}

// textPrefix returns the first max bytes (at most) of the decoded value of
// the raw JSON string raw, and false when raw is not a string. It decodes
// no more of raw than those bytes need: a string of any length costs at
// most about max bytes.
func textPrefix(raw []byte, max int) (string, bool) {
	if len(raw) < 2 || raw[0] != '"' {
		return "", false
	}
	inner := raw[1 : len(raw)-1]
	if bytes.IndexByte(inner, '\\') < 0 && utf8.Valid(inner) {
		if len(inner) > max {
			inner = inner[:max]
		}
		return string(inner), true
	}
	// Every raw byte decodes to at least one byte (an escape of up to 6
	// bytes to at least one, an invalid byte to U+FFFD's three), so a raw
	// prefix of 6·max bytes, cut after a whole escape, decodes to at least
	// max bytes; a surrogate pair split by the cut changes only what
	// follows them.
	if limit := 6*max + 12; len(inner) > limit {
		j := 0
		for j < limit {
			if inner[j] == '\\' && j+1 < len(inner) && inner[j+1] == 'u' {
				j += 6
			} else if inner[j] == '\\' {
				j += 2
			} else {
				j++
			}
		}
		j = min(j, len(inner))
		cut := make([]byte, 0, j+2)
		cut = append(append(append(cut, '"'), inner[:j]...), '"')
		raw = cut
	}
	s, ok := decodeString(raw)
	if len(s) > max {
		s = s[:max]
	}
	return s, ok
}

// isTokenArray reports whether raw is a non-empty array of integers that
// fit in an int64.
func isTokenArray(raw []byte) bool {
	if len(raw) == 0 || raw[0] != '[' {
		return false
	}
	n := 0
	for e := (elements{b: raw}); ; n++ {
		v, ok := e.next()
		if !ok {
			return n > 0
		}
		if !isInt64(v) {
			return false
		}
	}
}

// isInt64 reports whether the raw JSON number v is an integer (no fraction
// or exponent) that fits in an int64.
func isInt64(v []byte) bool {
	d := v
	if len(d) > 0 && d[0] == '-' {
		d = d[1:]
	}
	if len(d) == 0 {
		return false
	}
	for _, c := range d {
		if c < '0' || c > '9' {
			return false
		}
	}
	if len(d) < 19 {
		return true
	}
	_, err := strconv.ParseInt(string(v), 10, 64)
	return err == nil
}

// Clip shortens b for an error message.
func Clip(b []byte) string {
	if len(b) > 64 {
		return string(b[:64]) + "..."
	}
	return string(b)
}
