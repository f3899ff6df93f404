package tenant

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/switchyard-dev/switchyard/router/protocol"
)

// MaxLabelled bounds the tenant label's values: the first MaxLabelled
// tenant names the gate sees (in file order, over every reload) get their
// own; later ones count under LabelOther.
const MaxLabelled = 100

// Labels of the metric's tenant label that name no tenant.
const (
	// LabelNone counts requests with a missing or unknown key.
	LabelNone = "_none"
	// LabelOther counts the tenants past MaxLabelled.
	LabelOther = "_other"
)

// Results of the metric's result label.
const (
	ResultAdmitted    = "admitted"
	ResultCapped      = "capped" // admitted, at the tenant's ceiling rather than the priority asked
	ResultRateLimited = "rate_limited"
	ResultBadKey      = "invalid_api_key"
)

// Verdict is the gate's decision on an admitted request.
type Verdict struct {
	// Tenant is the tenant's name ("" when the gate is open: no keys).
	Tenant string
	// Priority is the class the request runs at.
	Priority protocol.Priority
	// Capped is true when the request asked above the tenant's ceiling.
	Capped bool
}

// Gate applies a keys file to requests. A nil *Gate is open: every
// request passes at the priority it asked for. Its methods are safe for
// concurrent use.
type Gate struct {
	cur      atomic.Pointer[state]
	requests *prometheus.CounterVec

	mu       sync.Mutex // serialises Set and guards labelled
	labelled map[string]bool
}

// state is one keys file with its tenants' token buckets.
type state struct {
	keys     *Keys
	limiters []*rate.Limiter // per tenant index; nil without a limit
	labels   []string        // per tenant index
}

// NewGate returns a gate applying keys, registering its metric
// (switchyard_router_tenant_requests_total) in reg when reg is set.
func NewGate(keys *Keys, reg prometheus.Registerer) (*Gate, error) {
	if keys == nil {
		return nil, fmt.Errorf("tenant: new gate: %w: no keys", ErrBadKeys)
	}
	g := &Gate{labelled: make(map[string]bool),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_router_tenant_requests_total",
			Help: "Requests the front door decided on, by tenant (" + LabelNone + ": missing or unknown key; " + LabelOther + ": past the first " + strconv.Itoa(MaxLabelled) + " tenants) and result (admitted, capped, rate_limited, invalid_api_key).",
		}, []string{"tenant", "result"})}
	if reg != nil {
		if err := reg.Register(g.requests); err != nil {
			return nil, fmt.Errorf("tenant: new gate: register metrics: %w", err)
		}
	}
	g.Set(keys)
	return g, nil
}

// Set replaces the keys file in force. A tenant whose rate and burst are
// unchanged keeps its token bucket (a reload does not refill it).
func (g *Gate) Set(keys *Keys) {
	g.mu.Lock()
	defer g.mu.Unlock()
	old := g.cur.Load()
	prev := map[string]*rate.Limiter{}
	if old != nil {
		for i, t := range old.keys.tenants {
			if l := old.limiters[i]; l != nil {
				prev[t.Name] = l
			}
		}
	}
	st := &state{keys: keys, limiters: make([]*rate.Limiter, len(keys.tenants)), labels: make([]string, len(keys.tenants))}
	for i, t := range keys.tenants {
		if t.RPS > 0 {
			if l := prev[t.Name]; l != nil && l.Limit() == rate.Limit(t.RPS) && l.Burst() == t.Burst {
				st.limiters[i] = l
			} else {
				st.limiters[i] = rate.NewLimiter(rate.Limit(t.RPS), t.Burst)
			}
		}
		if !g.labelled[t.Name] && len(g.labelled) < MaxLabelled {
			g.labelled[t.Name] = true
		}
		st.labels[i] = LabelOther
		if g.labelled[t.Name] {
			st.labels[i] = t.Name
		}
	}
	g.cur.Store(st)
}

// Keys returns the keys file in force.
func (g *Gate) Keys() *Keys { return g.cur.Load().keys }

// Admit decides on a request at now whose headers get reads (canonical
// names): its tenant by API key (KeyFrom), its priority (asked, the
// priority header's class when present is true, capped to the tenant's
// ceiling; the tenant's default otherwise) and its tenant's rate. It
// returns the verdict, or the error to answer: 401 invalid_api_key for a
// missing or unknown key, 429 rate_limit_exceeded (with the Retry-After
// value, whole seconds) over the rate. A nil gate admits every request at
// the priority asked.
func (g *Gate) Admit(now time.Time, get func(name string) (string, bool), asked protocol.Priority, present bool) (Verdict, *protocol.APIError, string) {
	if g == nil {
		return Verdict{Priority: asked}, nil, ""
	}
	st := g.cur.Load()
	key, ok := KeyFrom(get)
	if !ok {
		g.requests.WithLabelValues(LabelNone, ResultBadKey).Inc()
		return Verdict{}, protocol.NewAPIError(http.StatusUnauthorized, protocol.ErrTypeInvalidRequest, "invalid_api_key", "",
			"You didn't provide an API key. Send it as Authorization: Bearer <key> (or api-key: <key>)."), ""
	}
	i, ok := st.keys.byHash[HashKey(key)]
	if !ok {
		g.requests.WithLabelValues(LabelNone, ResultBadKey).Inc()
		return Verdict{}, protocol.NewAPIError(http.StatusUnauthorized, protocol.ErrTypeInvalidRequest, "invalid_api_key", "",
			"Incorrect API key provided: "+redact(key)+"."), ""
	}
	t := &st.keys.tenants[i]
	v := Verdict{Tenant: t.Name, Priority: t.Default}
	if present {
		v.Priority = asked
		if asked > t.Max {
			v.Priority, v.Capped = t.Max, true
		}
	}
	if l := st.limiters[i]; l != nil && !l.AllowN(now, 1) {
		g.requests.WithLabelValues(st.labels[i], ResultRateLimited).Inc()
		wait := (1 - l.TokensAt(now)) / t.RPS
		return Verdict{}, protocol.NewAPIError(http.StatusTooManyRequests, "requests", "rate_limit_exceeded", "",
				fmt.Sprintf("Rate limit reached for tenant %s: %g requests/s (burst %d). Please try again in %.3gs.", t.Name, t.RPS, t.Burst, wait)),
			strconv.Itoa(max(1, int(math.Ceil(wait))))
	}
	res := ResultAdmitted
	if v.Capped {
		res = ResultCapped
	}
	g.requests.WithLabelValues(st.labels[i], res).Inc()
	return v, nil, ""
}

// redact returns the first characters of a key and asterisks, as
// OpenAI's error quotes a wrong key: enough for its owner to recognise it,
// too little to use it.
func redact(key string) string {
	n := min(len(key)/4, 6)
	return key[:n] + "****"
}
