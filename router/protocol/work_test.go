package protocol

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestPromptTokens(t *testing.T) {
	long := strings.Repeat("x", 4000)
	for _, tc := range []struct {
		name string
		req  *Request
		want int64
	}{
		{"nil", nil, 0},
		{"no content", &Request{}, 0},
		{"token ids", &Request{PromptTokens: json.RawMessage(`[1, 2, 3, 4, 5]`)}, 5},
		{"one token id", &Request{PromptTokens: json.RawMessage(`[7]`)}, 1},
		{"short text", &Request{Context: json.RawMessage(`"hi"`)}, 1},
		{"long text", &Request{Context: json.RawMessage(`"` + long + `"`)}, 4002 / BytesPerToken},
		{"instructions count", &Request{Context: json.RawMessage(`"` + long + `"`), Instructions: json.RawMessage(`"` + long + `"`)}, 8004 / BytesPerToken},
	} {
		if got := PromptTokens(tc.req); got != tc.want {
			t.Errorf("%s: PromptTokens = %d, want %d", tc.name, got, tc.want)
		}
	}
}
