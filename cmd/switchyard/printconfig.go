package main

import (
	"bytes"
	"encoding"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"time"
)

// modulePath is the import path prefix of this project's packages: only
// their struct types are walked by printConfig (others, such as a NATS
// connection or a logger, are handles, not configuration).
const modulePath = "github.com/switchyard-dev/switchyard"

// redacted replaces the value of a secret in printed configuration.
const redacted = "REDACTED"

// A field holds a secret, which printConfig never shows, when its name
// (lower case) is one of secretNames or ends with one of secretSuffixes, or
// its tag is `config:"secret"`: a Token or an APIKey field is one,
// PrefillMsPerToken is not.
var (
	secretNames    = []string{"token", "nkey", "creds", "credentials", "passwd"}
	secretSuffixes = []string{"password", "secret", "authtoken", "apikey", "apitoken", "bearertoken", "privatekey", "nkeyseed", "credsfile"}
)

// secret reports whether a field of this name holds a secret.
func secret(name string) bool {
	lower := strings.ToLower(name)
	if slices.Contains(secretNames, lower) {
		return true
	}
	for _, s := range secretSuffixes {
		if strings.HasSuffix(lower, s) {
			return true
		}
	}
	return false
}

// section is one named part of a command's effective configuration.
type section struct {
	name  string
	value any
}

// configurable is an Options type of the project's convention.
type configurable[T any] interface {
	WithDefaults() T
	Validate() error
}

// effective returns o with its defaults filled, or the error of its Validate
// (which names the bad field).
func effective[T configurable[T]](o T) (T, error) {
	o = o.WithDefaults()
	if err := o.Validate(); err != nil {
		return o, usageError{err}
	}
	return o, nil
}

// printConfig writes sections to w as one JSON object: one key per section
// in the order given, each struct's exported fields in declaration order
// (under their YAML names where they have one, as a stack file's do),
// durations as strings ("1.5s"), secrets and URL passwords redacted, and
// handles (connections, loggers, clients, functions, channels) left out.
func printConfig(w io.Writer, sections ...section) error {
	var obj object
	for _, s := range sections {
		obj = append(obj, member{s.name, configValue(reflect.ValueOf(s.value), "")})
	}
	b, err := json.MarshalIndent(obj, "", "  ")
	if err != nil {
		return fmt.Errorf("print config: %w", err)
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// member is one key of an object.
type member struct {
	key   string
	value any
}

// object is a JSON object whose keys keep their order.
type object []member

// MarshalJSON writes the members in order.
func (o object) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, m := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		k, err := json.Marshal(m.key)
		if err != nil {
			return nil, err
		}
		v, err := json.Marshal(m.value)
		if err != nil {
			return nil, err
		}
		b.Write(k)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// skip is what configValue returns for a value that is not configuration.
type skip struct{}

var (
	durationType      = reflect.TypeFor[time.Duration]()
	objectType        = reflect.TypeFor[object]()
	textMarshalerType = reflect.TypeFor[encoding.TextMarshaler]()
)

// configValue turns v into what printConfig shows: name is the field's name
// (for redaction), "" for elements and sections.
func configValue(v reflect.Value, name string) any {
	if !v.IsValid() {
		return nil
	}
	if name != "" && secret(name) {
		if v.IsZero() {
			return ""
		}
		return redacted
	}
	t := v.Type()
	if t == objectType {
		return v.Interface() // already printed form
	}
	if t == durationType {
		return time.Duration(v.Int()).String()
	}
	switch t.Kind() {
	case reflect.Func, reflect.Chan, reflect.UnsafePointer:
		return skip{}
	case reflect.Interface:
		if v.IsNil() {
			return skip{}
		}
		return configValue(v.Elem(), name)
	case reflect.Pointer:
		if t.Elem().Kind() != reflect.Struct || !ours(t.Elem()) {
			return skip{}
		}
		if v.IsNil() {
			return nil
		}
		return configValue(v.Elem(), name)
	case reflect.Struct:
		if !ours(t) {
			if t.Implements(textMarshalerType) {
				text, err := v.Interface().(encoding.TextMarshaler).MarshalText()
				if err == nil {
					return string(text)
				}
			}
			return skip{}
		}
		var obj object
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			name := f.Name
			if f.Tag.Get("config") == "secret" {
				name = "Secret"
			}
			fv := configValue(v.Field(i), name)
			if _, ok := fv.(skip); ok {
				continue
			}
			key := f.Name
			if tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ","); tag != "" && tag != "-" {
				key = tag // a file's field (the stack file) prints under the name it is written with
			}
			obj = append(obj, member{key, fv})
		}
		return obj
	case reflect.Slice, reflect.Array:
		if v.Kind() == reflect.Slice && v.IsNil() {
			return []any{}
		}
		out := make([]any, 0, v.Len())
		for i := range v.Len() {
			ev := configValue(v.Index(i), "")
			if _, isSkip := ev.(skip); !isSkip {
				out = append(out, ev)
			}
		}
		return out
	case reflect.Map:
		keys := v.MapKeys()
		slices.SortFunc(keys, func(a, b reflect.Value) int { return strings.Compare(fmt.Sprint(a), fmt.Sprint(b)) })
		var obj object
		for _, k := range keys {
			key := fmt.Sprint(k)
			mv := configValue(v.MapIndex(k), "")
			if _, ok := mv.(skip); ok {
				continue
			}
			obj = append(obj, member{key, mv})
		}
		if obj == nil {
			return object{}
		}
		return obj
	case reflect.String:
		return redactURL(v.String())
	case reflect.Float32, reflect.Float64:
		if f := v.Float(); f != f || f > 1e308 || f < -1e308 {
			return fmt.Sprint(f) // NaN and infinities, which JSON has no number for
		}
		return v.Interface()
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return v.Interface()
	}
	return skip{}
}

// ours reports whether t is declared in one of this project's packages.
func ours(t reflect.Type) bool {
	return t.PkgPath() == modulePath || strings.HasPrefix(t.PkgPath(), modulePath+"/")
}

// redactURL hides the password of every URL in s (a list may be
// comma-separated), as url.URL.Redacted does.
func redactURL(s string) string {
	if !strings.Contains(s, "@") {
		return s
	}
	parts := strings.Split(s, ",")
	for i, p := range parts {
		u, err := url.Parse(strings.TrimSpace(p))
		if err != nil || u.User == nil {
			continue
		}
		if _, has := u.User.Password(); has {
			parts[i] = u.Redacted()
		} else if u.User.Username() != "" {
			u.User = url.User(redacted) // a bare user in a NATS URL is a token
			parts[i] = u.String()
		}
	}
	return strings.Join(parts, ",")
}
