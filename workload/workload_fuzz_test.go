package workload

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzReadTrace feeds trace files to the Azure (CSV) and Mooncake (JSON
// lines) readers behind `switchyard load --trace`: whatever they return is
// an ErrTrace error or requests in arrival order with at least one output
// token each.
func FuzzReadTrace(f *testing.F) {
	f.Add([]byte("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n"), true)
	f.Add([]byte("\ufeffTIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,1,0\n"), true)
	f.Add([]byte("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,1\n"), true)
	f.Add([]byte(`{"timestamp":0,"input_length":600,"output_length":10,"hash_ids":[1,2]}`+"\n"+`{"timestamp":5,"input_length":0,"output_length":0,"hash_ids":[]}`), false)
	f.Add([]byte(`{"timestamp":1e300,"input_length":1,"output_length":1,"hash_ids":[1]}`), false)
	f.Add([]byte(`{"timestamp":0,"input_length":1,"output_length":1,"hash_ids":[1],"x":1}`), false)
	f.Fuzz(func(t *testing.T, data []byte, azure bool) {
		read := ReadMooncake
		if azure {
			read = ReadAzure
		}
		reqs, err := read("fuzz", bytes.NewReader(data))
		if err != nil {
			if !errors.Is(err, ErrTrace) {
				t.Fatalf("error %v does not wrap ErrTrace", err)
			}
			return
		}
		if len(reqs) == 0 {
			t.Fatal("no requests and no error")
		}
		for i, r := range reqs {
			if r.OutputTokens < 1 || r.PromptTokens < 0 || r.At < 0 {
				t.Fatalf("request %d: %+v", i, r)
			}
			if i > 0 && r.At < reqs[i-1].At {
				t.Fatalf("request %d arrives at %v, before %v", i, r.At, reqs[i-1].At)
			}
		}
	})
}
