package control

import (
	"testing"
)

func TestStatusResult(t *testing.T) {
	for _, tc := range []struct {
		status int
		want   Result
		blames bool
	}{
		{200, ResultOK, false},
		{204, ResultOK, false},
		{301, ResultOK, false},
		{400, ResultClient, false}, // invalid parameters, context too long (vLLM BadRequestError)
		{401, ResultClient, false}, // the client's own key, passed through
		{403, ResultClient, false},
		{404, ResultClient, false}, // unknown model (NotFoundError)
		{405, ResultClient, false},
		{409, ResultClient, false},
		{411, ResultClient, false},
		{413, ResultClient, false}, // body too large
		{414, ResultClient, false},
		{415, ResultClient, false},
		{422, ResultClient, false}, // validation error (TGI, FastAPI)
		{431, ResultClient, false},
		{408, ResultTimeout, true}, // the engine timed the request out
		{429, Result429, false},    // the engine's own load
		{402, ResultOther, true},
		{410, ResultOther, true},
		{418, ResultOther, true},
		{499, ResultOther, true},
		{500, Result5xx, true},
		{502, Result5xx, true},
		{503, Result5xx, true},
		{599, Result5xx, true},
	} {
		got := StatusResult(tc.status)
		if got != tc.want || got.Blames() != tc.blames {
			t.Errorf("StatusResult(%d) = %v (blames %v), want %v (blames %v)", tc.status, got, got.Blames(), tc.want, tc.blames)
		}
	}
	if ResultClient.Class() != ClassClient || ClassClient != "client" {
		t.Errorf("client class %q", ResultClient.Class())
	}
	for _, r := range []Result{ResultConnect, ResultTimeout, Result5xx, ResultOther} {
		if !r.Blames() {
			t.Errorf("%v does not blame the engine", r)
		}
	}
	for _, r := range []Result{ResultOK, ResultCanceled, Result429, ResultClient} {
		if r.Blames() {
			t.Errorf("%v blames the engine", r)
		}
	}
}
