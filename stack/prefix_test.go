package stack_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/stack"
)

// prefixStack is three equal engines in one region behind one router.
const prefixStack = `
model: llama
network: {intra_region_ms: 1, inter_region_ms: 5}
sim: {output_tokens: 16, prompt_tokens: 256, base_tbt_ms: 10, tbt_growth_ms: 0.05, prefill_ms_per_token: 0.02}
clusters:
  - {name: A, region: r1, demand_rps: 30, router: "127.0.0.1:0"}
engines:
  - {name: e1, region: r1, capacity_rps: 20}
  - {name: e2, region: r1, capacity_rps: 20}
  - {name: e3, region: r1, capacity_rps: 20}
`

// TestPrefixConversationsStayAndSpread: conversations that share a 3 KB
// system prompt and send no session id or user — the case where a hash of
// the prompt's first 2 KiB made them all one key — keep their engine for
// their first three turns (>= 90% of them), and no engine takes more than
// 60% of them. 45 conversations, 9 at a time, each turn repeating the
// previous ones as a chat client does.
func TestPrefixConversationsStayAndSpread(t *testing.T) {
	relSkipUnderRace(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f, err := stack.Parse("prefix.yaml", []byte(prefixStack))
	if err != nil {
		t.Fatal(err)
	}
	s, err := stack.Start(ctx, stack.Options{File: f, DataDir: t.TempDir(), NATSPort: -1, RouterAddr: "127.0.0.1:0", Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	// The optimizer's first snapshot plans the engines whose states it
	// has, on a loaded machine one of the three: the nine conversations
	// sent first would all start on that engine, whose batch runs four, and
	// the five queued behind its full batch move at their next turn, by
	// design (a full batch sends a conversation on). The workload starts
	// on a plan of all three.
	waitWeighted(t, s, f.Model, "e1", "e2", "e3")
	url := "http://" + s.Routers()[0].Addr() + "/v1/chat/completions"
	system := strings.Repeat("You are Switchyard's support assistant; answer briefly and cite the docs. ", 42)[:3072]
	client := &http.Client{Timeout: 10 * time.Second}
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	send := func(msgs []msg) (string, error) {
		body, _ := json.Marshal(map[string]any{"model": f.Model, "messages": msgs, "max_tokens": 16})
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != http.StatusOK {
			return "", fmt.Errorf("status %d", resp.StatusCode)
		}
		return resp.Header.Get(messages.HeaderEngine), nil
	}
	const conversations, workers, turns = 45, 9, 3
	engines := make([][turns]string, conversations)
	errs := make(chan error, conversations)
	var wg sync.WaitGroup
	next := make(chan int, conversations)
	for c := range conversations {
		next <- c
	}
	close(next)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := range next {
				msgs := []msg{{"system", system}}
				for turn := range turns {
					msgs = append(msgs, msg{"user", fmt.Sprintf("Conversation %d, question %d: how do I drain engine %d?", c, turn, c%7)})
					e, err := send(msgs)
					if err != nil {
						errs <- fmt.Errorf("conversation %d turn %d: %w", c, turn, err)
						return
					}
					engines[c][turn] = e
					msgs = append(msgs, msg{"assistant", fmt.Sprintf("Answer %d to conversation %d.", turn, c)})
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	kept, share := 0, map[string]int{}
	for _, e := range engines {
		share[e[0]]++
		if e[0] == e[1] && e[1] == e[2] {
			kept++
		}
	}
	t.Logf("%d of %d conversations kept one engine for %d turns; conversations by first engine %v", kept, conversations, turns, share)
	if kept*10 < conversations*9 {
		t.Errorf("%d of %d conversations kept their engine, want >= 90%%", kept, conversations)
	}
	for e, n := range share {
		if n*10 > conversations*6 {
			t.Errorf("engine %s took %d of %d conversations, want <= 60%%", e, n, conversations)
		}
	}
}
