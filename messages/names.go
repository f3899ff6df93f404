package messages

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxNameLen is the longest engine, cluster, region or router name accepted.
const MaxNameLen = 64

// MaxModelIDLen is the longest model id accepted, in bytes: room for a
// Hugging Face repository id (owner and name of up to 96 characters each) or
// an OpenAI fine-tune id with a suffix.
const MaxModelIDLen = 256

// MaxModelTokenLen is the longest token ModelToken returns: every byte of
// the longest id escaped.
const MaxModelTokenLen = 3 * MaxModelIDLen

// ValidName reports whether s can be used as an engine, cluster, region or
// router name: 1 to MaxNameLen characters from [A-Za-z0-9_-], so that it is a
// single NATS subject token and a valid KV key part (no dots, spaces or wildcards).
func ValidName(s string) bool {
	if len(s) == 0 || len(s) > MaxNameLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !nameByte(s[i]) {
			return false
		}
	}
	return true
}

func nameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

// ValidModelName reports whether s can be used as a model id: what OpenAI
// clients and vLLM use as they give it ("meta-llama/Llama-3.1-8B-Instruct",
// "ft:gpt-4o-mini:org::id", "llama3.1:8b", "model@v2"), case kept. It is 1 to
// MaxModelIDLen bytes of valid UTF-8 with no control character and no
// white space; any other character (slashes, dots, colons, "@", wildcards,
// letters outside ASCII) is accepted. Messages carry the id as it is;
// subjects and KV keys carry ModelToken(id).
func ValidModelName(s string) bool { return modelIDProblem(s) == "" }

// modelIDProblem says what is wrong with s as a model id, "" when nothing.
func modelIDProblem(s string) string {
	if len(s) == 0 || len(s) > MaxModelIDLen {
		return fmt.Sprintf("must be 1 to %d bytes", MaxModelIDLen)
	}
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			// The ASCII fast path: every id of the ASCII letters, digits and
			// punctuation is accepted here without decoding.
			if c <= ' ' || c == 0x7f {
				return fmt.Sprintf("has a control or white-space character (%q) at byte %d", c, i)
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n <= 1:
			return fmt.Sprintf("is not valid UTF-8 at byte %d", i)
		case unicode.IsControl(r) || unicode.IsSpace(r):
			return fmt.Sprintf("has a control or white-space character (%U) at byte %d", r, i)
		}
		i += n
	}
	return ""
}

// CheckModelName returns nil when name is a valid model id (see
// ValidModelName), and otherwise an error wrapping ErrInvalid that says why.
func CheckModelName(name string) error {
	if p := modelIDProblem(name); p != "" {
		return fmt.Errorf("%w: model id %q %s (any printable characters but white space)", ErrInvalid, name, p)
	}
	return nil
}

// CheckName returns nil when name is a valid name (see ValidName), and otherwise
// an error wrapping ErrInvalid that names the field and the value.
func CheckName(field, name string) error {
	if ValidName(name) {
		return nil
	}
	return fmt.Errorf("%w: %s %q is not a valid name (1-%d characters of A-Z a-z 0-9 _ -; no dots, spaces or wildcards)", ErrInvalid, field, name, MaxNameLen)
}

// The model token: the one mapping from a model id to a NATS subject token
// and KV key part, used by every subject and key builder (streams). It keeps
// the bytes A-Z a-z 0-9 _ - / and writes every other byte as "=" and two
// upper-case hex digits: "meta-llama/Llama-3.1-8B-Instruct" is
// "meta-llama/Llama-3=2E1-8B-Instruct". "=" and "/" are legal in a NATS
// token and a JetStream KV key, and "=" never occurs in a kept byte, so the
// mapping is reversible (ModelFromToken) and two ids never share a token.
// An id that is already a name (ValidName) is its own token, so the layout
// of such models is unchanged. The words that lead the buckets' other
// records (operator, penalty, rtt) have their first byte escaped
// ("=72tt"), so a model may take them too.

// tokenByte reports whether c stands for itself in a model token.
func tokenByte(c byte) bool { return nameByte(c) || c == '/' }

// reservedToken reports whether s is a word that leads the KV buckets'
// records that are not model-keyed (streams.OperatorPrefix and its kin).
func reservedToken(s string) bool { return s == "operator" || s == "penalty" || s == "rtt" }

const hexDigits = "0123456789ABCDEF"

// ModelToken returns the NATS token and KV key part that stand for the model
// id. It allocates only when the id has a byte to escape. For an invalid id
// (see ValidModelName) the result is still a token, but ModelFromToken will
// not give the id back.
func ModelToken(id string) string {
	esc := 0
	for i := 0; i < len(id); i++ {
		if !tokenByte(id[i]) {
			esc++
		}
	}
	reserved := reservedToken(id)
	if esc == 0 && !reserved {
		return id
	}
	if reserved {
		esc++
	}
	var b strings.Builder
	b.Grow(len(id) + 2*esc)
	for i := 0; i < len(id); i++ {
		c := id[i]
		if tokenByte(c) && !(reserved && i == 0) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('=')
		b.WriteByte(hexDigits[c>>4])
		b.WriteByte(hexDigits[c&0xf])
	}
	return b.String()
}

// ModelFromToken returns the model id a token stands for, and false when tok
// is not ModelToken of a valid model id (a malformed or non-canonical
// escape, or an id ValidModelName refuses).
func ModelFromToken(tok string) (string, bool) {
	if len(tok) == 0 || len(tok) > MaxModelTokenLen {
		return "", false
	}
	if !strings.Contains(tok, "=") {
		if reservedToken(tok) || len(tok) > MaxModelIDLen || !ValidModelToken(tok) {
			return "", false
		}
		return tok, true
	}
	buf := make([]byte, 0, len(tok))
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		if c != '=' {
			if !tokenByte(c) {
				return "", false
			}
			buf = append(buf, c)
			continue
		}
		if i+2 >= len(tok) {
			return "", false
		}
		hi, lo := strings.IndexByte(hexDigits, tok[i+1]), strings.IndexByte(hexDigits, tok[i+2])
		if hi < 0 || lo < 0 {
			return "", false
		}
		buf = append(buf, byte(hi<<4|lo))
		i += 2
	}
	id := string(buf)
	if !ValidModelName(id) || ModelToken(id) != tok {
		return "", false
	}
	return id, true
}

// ValidModelToken reports whether tok has the alphabet and length of a model
// token (A-Z a-z 0-9 _ - / =, 1 to MaxModelTokenLen bytes): what a subject
// parser checks before it decodes the token or compares it with a message's
// ModelToken.
func ValidModelToken(tok string) bool {
	if len(tok) == 0 || len(tok) > MaxModelTokenLen {
		return false
	}
	for i := 0; i < len(tok); i++ {
		if c := tok[i]; !tokenByte(c) && c != '=' {
			return false
		}
	}
	return true
}
