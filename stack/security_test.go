package stack_test

import (
	"context"
	"strings"
	"testing"
	"time"
)

func TestSecureStackServes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	h := hostileStart(t, ctx, hostileOptions{secure: true})
	h.requireStaysHealthy("secure", 2*time.Second)
	if v := h.log.violationLines(); len(v) > 0 {
		t.Fatal(strings.Join(v, "\n"))
	}
}
