package protocol

import "bytes"

// BytesPerToken is how many bytes of prompt text the router counts as one
// token when a request gives text: OpenAI's rule of thumb for English
// (about four characters a token), which the router can apply without the
// model's tokenizer.
const BytesPerToken = 4

// PromptTokens estimates req's prompt tokens at admission, for the mix its
// router reports: the ids of a token-id prompt (counted exactly), else its
// prompt content's JSON bytes (Context and Instructions) over
// BytesPerToken, at least 1 for a request with any content. It does not
// allocate.
func PromptTokens(req *Request) int64 {
	if req == nil {
		return 0
	}
	if len(req.PromptTokens) > 0 {
		return int64(bytes.Count(req.PromptTokens, []byte{','})) + 1
	}
	n := int64(len(req.Context) + len(req.Instructions))
	if n == 0 {
		return 0
	}
	return max(n/BytesPerToken, 1)
}
