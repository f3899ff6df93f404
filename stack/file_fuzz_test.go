package stack

import (
	"errors"
	"testing"
)

// FuzzParse feeds stack files to Parse, what `switchyard up --stack` and
// `switchyard optimizer --stack` run on a user's file: whatever it returns is
// an ErrStack error or a file that validates and whose network table every
// cluster and engine can be looked up in.
func FuzzParse(f *testing.F) {
	f.Add(DefaultFileBytes())
	f.Add([]byte("model: m\n"))
	f.Add([]byte("a: &a [1,1,1,1,1,1,1,1,1]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"))
	f.Add([]byte("model: m\nclusters: [{name: A, region: r, demand_rps: 1e309}]\n"))
	f.Add([]byte("\xdd\x7f\xff\xff\xff"))
	f.Add([]byte(urlStack))
	f.Add([]byte("model: m\nclusters: [{name: A, region: r}]\nengines: [{name: e, region: r, url: \"https://h:1/x\", metrics: sglang, kv_events: \"tcp://h:5557\"}]\n"))
	f.Add([]byte("model: m\nclusters: [{name: A, region: r}]\nengines: [{name: e, region: r, url: \"ftp://h\", metrics: tgi, max_running: -3}, {name: s, region: r, capacity_rps: 1}]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := Parse("fuzz.yaml", data)
		if err != nil {
			if !errors.Is(err, ErrStack) {
				t.Fatalf("error %v does not wrap ErrStack", err)
			}
			return
		}
		if err := file.Validate(); err != nil {
			t.Fatalf("parsed file does not validate: %v", err)
		}
		table := file.NetworkTable()
		for _, c := range file.Clusters {
			if _, ok := table[c.Name]; !ok {
				t.Fatalf("cluster %q missing from the network table", c.Name)
			}
		}
	})
}
