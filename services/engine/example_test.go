package engine_test

import (
	"encoding/hex"
	"fmt"
	"time"

	"github.com/switchyard-dev/switchyard/messages"
)

// The worked example of docs/engine-integration.md: a signal, its JSON
// rendering, and its MessagePack bytes. The Output block keeps the document honest.
func Example_signalWireFormat() {
	s := messages.EngineSignal{
		Model: "llama", Engine: "engine-b", Region: "r2",
		Time: 1767225600000, Seq: 42,
		TTFTMs: 85.5, TBTMs: 21.25, Queue: 3, Running: 30, KVUse: 0.625,
		CapacityRPS: 100, LoadRPS: 92.5, OutputTokens: 128, Replicas: 1, Health: 1,
		Transports: []messages.Transport{
			{Kind: messages.TransportHTTP, Address: "http://10.0.2.7:8000"},
			{Kind: messages.TransportNATS, Address: "sy.infer.llama.engine-b"},
		},
	}
	// Validated as of the signal's own time: a real engine stamps it now,
	// and messages older than messages.MaxMessageAge are refused.
	data, err := messages.EncodeAt(&s, time.UnixMilli(s.Time))
	if err != nil {
		panic(err)
	}
	js, _ := messages.JSON(&s)
	fmt.Printf("%s\n%d bytes\n%s", js, len(data), hex.Dump(data))
	// Output:
	// {
	//   "v": 1,
	//   "k": "signal",
	//   "model": "llama",
	//   "engine": "engine-b",
	//   "region": "r2",
	//   "time_ms": 1767225600000,
	//   "seq": 42,
	//   "ttft_ms": 85.5,
	//   "tbt_ms": 21.25,
	//   "queue": 3,
	//   "running": 30,
	//   "kv_use": 0.625,
	//   "capacity_rps": 100,
	//   "load_rps": 92.5,
	//   "output_tokens": 128,
	//   "replicas": 1,
	//   "health": 1,
	//   "transports": [
	//     {
	//       "kind": "http",
	//       "address": "http://10.0.2.7:8000"
	//     },
	//     {
	//       "kind": "nats",
	//       "address": "sy.infer.llama.engine-b"
	//     }
	//   ]
	// }
	// 225 bytes
	// 00000000  de 00 12 a1 76 01 a1 6b  a6 73 69 67 6e 61 6c a1  |....v..k.signal.|
	// 00000010  6d a5 6c 6c 61 6d 61 a1  65 a8 65 6e 67 69 6e 65  |m.llama.e.engine|
	// 00000020  2d 62 a1 72 a2 72 32 a1  74 cf 00 00 01 9b 76 da  |-b.r.r2.t.....v.|
	// 00000030  a8 00 a1 6e 2a a4 74 74  66 74 cb 40 55 60 00 00  |...n*.ttft.@U`..|
	// 00000040  00 00 00 a3 74 62 74 cb  40 35 40 00 00 00 00 00  |....tbt.@5@.....|
	// 00000050  a1 71 03 a3 72 75 6e 1e  a2 6b 76 cb 3f e4 00 00  |.q..run..kv.?...|
	// 00000060  00 00 00 00 a3 63 61 70  cb 40 59 00 00 00 00 00  |.....cap.@Y.....|
	// 00000070  00 a3 72 70 73 cb 40 57  20 00 00 00 00 00 a4 6f  |..rps.@W ......o|
	// 00000080  74 6f 6b cb 40 60 00 00  00 00 00 00 a3 72 65 70  |tok.@`.......rep|
	// 00000090  01 a1 68 cb 3f f0 00 00  00 00 00 00 a2 74 78 92  |..h.?........tx.|
	// 000000a0  82 a1 6b a4 68 74 74 70  a1 61 b4 68 74 74 70 3a  |..k.http.a.http:|
	// 000000b0  2f 2f 31 30 2e 30 2e 32  2e 37 3a 38 30 30 30 82  |//10.0.2.7:8000.|
	// 000000c0  a1 6b a4 6e 61 74 73 a1  61 b7 73 79 2e 69 6e 66  |.k.nats.a.sy.inf|
	// 000000d0  65 72 2e 6c 6c 61 6d 61  2e 65 6e 67 69 6e 65 2d  |er.llama.engine-|
	// 000000e0  62                                                |b|
}
