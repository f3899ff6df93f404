package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/switchyard-dev/switchyard/messages"
)

// TestDecodeShowsExpiredReports: a report older than messages.MaxMessageAge,
// as read from SY_REPORTS' history, is shown by `switchyard decode`; one that
// is also invalid otherwise is refused.
func TestDecodeShowsExpiredReports(t *testing.T) {
	at := time.Now().Add(-2 * messages.MaxMessageAge)
	rep := &messages.RouterReport{Model: "llama", Cluster: "A", Router: "r1", Time: at.UnixMilli(), Seq: 4, IntervalS: 1, Requests: 20}
	data, err := messages.EncodeAt(rep, at)
	if err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if code := run(t.Context(), []string{"decode", "--compact"}, bytes.NewReader(data), &out, &errOut); code != 0 {
		t.Fatalf("decode of an expired report exited %d: %s", code, errOut.String())
	}
	if !strings.Contains(out.String(), `"requests":20`) {
		t.Fatalf("decode printed %s", out.String())
	}
	bad := *rep
	bad.IntervalS = 5e-324
	bad.Version, bad.Kind = messages.SchemaVersion, messages.KindReport
	if data, err = msgpack.Marshal(&bad); err != nil { // unvalidated, as a careless writer could
		t.Fatal(err)
	}
	out.Reset()
	errOut.Reset()
	if code := run(t.Context(), []string{"decode"}, bytes.NewReader(data), &out, &errOut); code == 0 || !strings.Contains(errOut.String(), "interval_s") {
		t.Fatalf("decode of an expired, invalid report exited %d: %s %s", code, out.String(), errOut.String())
	}
}
