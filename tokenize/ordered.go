package tokenize

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/ardanlabs/jinja"
)

// object is a JSON object with its keys in the order the request gave them:
// transformers hands the template Python dicts, which keep that order, and a
// template's tojson (tools, tool-call arguments) prints them in it.
type object struct {
	keys []string
	m    map[string]any
}

// get returns the value under k (nil if absent).
func (o *object) get(k string) any { return o.m[k] }

// set replaces the value under k, or appends k.
func (o *object) set(k string, v any) {
	if _, ok := o.m[k]; !ok {
		o.keys = append(o.keys, k)
	}
	o.m[k] = v
}

// maxJSONDepth bounds the nesting of a request's JSON values, as
// encoding/json's own limit bounds a decode into interfaces.
const maxJSONDepth = 1000

// decodeOrdered decodes one JSON value: objects as *object, arrays as
// []any, numbers as json.Number, strings, booleans and nil.
func decodeOrdered(raw []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	v, err := decodeValue(dec, 0)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err == nil {
		return nil, fmt.Errorf("more than one JSON value")
	}
	return v, nil
}

func decodeValue(dec *json.Decoder, depth int) (any, error) {
	if depth > maxJSONDepth {
		return nil, fmt.Errorf("nested deeper than %d", maxJSONDepth)
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			o := &object{m: map[string]any{}}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				k, _ := kt.(string)
				v, err := decodeValue(dec, depth+1)
				if err != nil {
					return nil, err
				}
				o.set(k, v) // a repeated key keeps its first place, the last value, as Python's json
			}
			_, err := dec.Token()
			return o, err
		case '[':
			list := []any{}
			for dec.More() {
				v, err := decodeValue(dec, depth+1)
				if err != nil {
					return nil, err
				}
				list = append(list, v)
			}
			_, err := dec.Token()
			return list, err
		}
		return nil, fmt.Errorf("unexpected %v", t)
	default:
		return t, nil // string, json.Number, bool, nil
	}
}

// toValue turns a decoded value into the template engine's, objects in
// their order, integers as integers (Python's json keeps int and float
// apart, and tojson prints them so).
func toValue(v any) jinja.Value {
	switch t := v.(type) {
	case *object:
		d := jinja.NewDict()
		dict := d.AsDict()
		for _, k := range t.keys {
			dict.Set(k, toValue(t.m[k]))
		}
		return d
	case []any:
		items := make([]jinja.Value, len(t))
		for i, x := range t {
			items[i] = toValue(x)
		}
		return jinja.NewList(items)
	case json.Number:
		s := string(t)
		if !strings.ContainsAny(s, ".eE") {
			if i, err := t.Int64(); err == nil {
				return jinja.NewInt(i)
			}
		}
		if f, err := t.Float64(); err == nil {
			return jinja.NewFloat(f)
		}
		return jinja.NewString(s)
	case string:
		return jinja.NewString(t)
	case bool:
		return jinja.NewBool(t)
	case nil:
		return jinja.None()
	}
	return jinja.FromGoValue(v)
}
