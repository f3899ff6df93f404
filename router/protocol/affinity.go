package protocol

import "github.com/switchyard-dev/switchyard/router/selection"

// MaxPrefixBytes bounds how much leading prompt content the affinity key
// hashes.
const MaxPrefixBytes = 2048

// KeySource says where a request's affinity key came from.
type KeySource uint8

// Affinity key sources, in order of precedence.
const (
	// KeyNone: the request has no affinity; it is spread by weight.
	KeyNone KeySource = iota
	// KeySession: the x-session-id header.
	KeySession
	// KeyUser: the OpenAI user field.
	KeyUser
	// KeyPrefix: a hash of the leading prompt content.
	KeyPrefix
)

// String returns the source's name, for logs and metric labels.
func (s KeySource) String() string {
	switch s {
	case KeySession:
		return "session"
	case KeyUser:
		return "user"
	case KeyPrefix:
		return "prefix"
	default:
		return "none"
	}
}

// Seeds separate the key spaces of the sources.
const (
	seedSession = 0x5e55_10e1_d0d0_0001
	seedUser    = 0x05e2_0000_d0d0_0002
	seedPrefix  = 0x9e3f_1c00_d0d0_0003
)

// SessionKey is the affinity key of a session id (the x-session-id header,
// a prompt_cache_key, a Responses API conversation or response id): the
// key AffinityKey gives a request naming it. The router remembers where
// each Responses API answer was made under SessionKey of its id, so that a
// request continuing it (previous_response_id) goes to the engine that
// holds it.
func SessionKey(id string) uint64 {
	h := selection.NewHasher(seedSession, len(id))
	h.WriteString(id)
	return h.Sum()
}

// AffinityKey returns the selection key of a request and its source: the
// x-session-id header value when non-empty, else the prompt_cache_key,
// else (Responses API) the conversation id, else the previous_response_id
// (the same key space as the session id), else the OpenAI user
// field when non-empty, else a hash of the first MaxPrefixBytes bytes of
// the leading prompt content — the first system (or developer) message and
// the first other message for chat and responses (whose instructions are
// the system message), the first prompt for completions and a string
// input of responses. It returns KeyNone when there is nothing to hash,
// and always for embeddings: an embedding reuses no cached context, so it
// is spread by weight. It does not allocate.
func AffinityKey(sessionID string, req *Request) (uint64, KeySource) {
	if req != nil && req.Endpoint == EndpointEmbeddings {
		return 0, KeyNone
	}
	if sessionID == "" && req != nil {
		for _, id := range [...]string{req.PromptCacheKey, req.Conversation, req.PreviousResponseID} {
			if id != "" {
				sessionID = id
				break
			}
		}
	}
	if sessionID != "" {
		return SessionKey(sessionID), KeySession
	}
	if req == nil {
		return 0, KeyNone
	}
	if req.User != "" {
		h := selection.NewHasher(seedUser, len(req.User))
		h.WriteString(req.User)
		return h.Sum(), KeyUser
	}
	h := selection.NewHasher(seedPrefix, MaxPrefixBytes)
	wrote := false
	switch req.Endpoint {
	case EndpointResponses:
		if len(req.Prompts) > 0 && len(req.Messages) == 0 {
			h.WriteString(req.Prompts[0])
			wrote = req.Prompts[0] != ""
			break
		}
		fallthrough
	case EndpointChat:
		sys, first := -1, -1
		for i := range req.Messages {
			r := req.Messages[i].Role
			if r == "system" || r == "developer" {
				if sys < 0 {
					sys = i
				}
			} else if first < 0 {
				first = i
			}
			if sys >= 0 && first >= 0 {
				break
			}
		}
		for _, i := range [2]int{sys, first} {
			if i < 0 {
				continue
			}
			for _, s := range req.Messages[i].Text {
				h.WriteString(s)
				wrote = wrote || s != ""
			}
			h.WriteSep()
		}
		if req.Endpoint == EndpointResponses && len(req.Prompts) > 0 { // instructions, then a string input
			h.WriteString(req.Prompts[0])
			wrote = wrote || req.Prompts[0] != ""
		}
	case EndpointCompletions:
		switch {
		case len(req.Prompts) > 0:
			h.WriteString(req.Prompts[0])
			wrote = req.Prompts[0] != ""
		case len(req.PromptTokens) > 0:
			h.WriteBytes(req.PromptTokens)
			wrote = true
		}
	}
	if !wrote {
		return 0, KeyNone
	}
	return h.Sum(), KeyPrefix
}
