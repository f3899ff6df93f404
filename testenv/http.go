package testenv

import (
	"io"
	"net/http"
	"strings"
)

// ChatStatus posts a minimal chat completion request for model to the
// OpenAI API at baseURL (http://host:port) and returns the response's
// status code, or 0 when no response came.
func ChatStatus(baseURL, model string) int {
	body := `{"model":"` + model + `","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`
	resp, err := http.Post(baseURL+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}
