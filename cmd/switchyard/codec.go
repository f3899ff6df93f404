package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/switchyard-dev/switchyard/messages"
)

func decodeCommand() command {
	return command{
		name:    "decode",
		summary: "read one Switchyard message (raw MessagePack) on stdin and print it as JSON",
		usage:   "< message.bin",
		setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
			compact := fs.Bool("compact", false, "print JSON on one line")
			slots := fs.Bool("slots", false, "print a weight snapshot's slot table in full (base64) instead of a count per engine")
			return func(_ context.Context, args []string) error {
				if len(args) > 0 {
					return usagef("decode takes no arguments; pipe the message on stdin, e.g. nats kv get sy_engines llama.engine-b --raw | switchyard decode")
				}
				data, err := io.ReadAll(io.LimitReader(e.stdin, messages.MaxSnapshotSize+1))
				if err != nil {
					return fmt.Errorf("read stdin: %w", err)
				}
				if len(data) == 0 {
					return usagef("no input on stdin")
				}
				m, err := messages.Decode(data)
				if errors.Is(err, messages.ErrExpired) {
					m, err = decodeExpired(data) // from a stream's history: shown, though services refuse it
				}
				if err != nil {
					return fmt.Errorf("%d bytes on stdin: %w", len(data), err)
				}
				var v any = m
				if snap, ok := m.(*messages.WeightSnapshot); ok && !*slots && len(snap.Slots) > 0 {
					v = summariseSlots(snap)
				}
				var out []byte
				if *compact {
					out, err = json.Marshal(v)
				} else {
					out, err = json.MarshalIndent(v, "", "  ")
				}
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(e.stdout, "%s\n", out)
				return err
			}
		},
	}
}

func encodeCommand() command {
	return command{
		name:    "encode",
		summary: "read a message as JSON on stdin and write its wire format (MessagePack) to stdout",
		usage:   "signal|report|engine_state|demand_state|rtt_state|weights < message.json",
		setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
			return func(_ context.Context, args []string) error {
				if len(args) != 1 {
					return usagef("encode takes the message kind, e.g. switchyard encode signal < signal.json")
				}
				kind, err := messages.KindByName(args[0])
				if err != nil {
					return usageError{err}
				}
				data, err := io.ReadAll(io.LimitReader(e.stdin, messages.MaxSnapshotSize+1))
				if err != nil {
					return fmt.Errorf("read stdin: %w", err)
				}
				data, err = defaultTime(data, time.Now())
				if err != nil {
					return usageError{err}
				}
				m, err := messages.FromJSON(kind, data, time.Now())
				if err != nil {
					return usageError{err}
				}
				out, err := messages.Encode(m)
				if err != nil {
					return usageError{err}
				}
				_, err = e.stdout.Write(out)
				return err
			}
		},
	}
}

// defaultTime sets "time_ms" to now when the JSON object leaves it out, so a
// hand-written signal needs no timestamp.
func defaultTime(data []byte, now time.Time) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var obj map[string]any
	if err := dec.Decode(&obj); err != nil {
		return nil, fmt.Errorf("stdin is not a JSON object: %w", err)
	}
	if _, ok := obj["time_ms"]; ok {
		return data, nil
	}
	obj["time_ms"] = now.UnixMilli()
	return json.Marshal(obj)
}

// summariseSlots renders a snapshot with its slot table replaced by the
// number of slots per engine, which is what people want to read.
func summariseSlots(snap *messages.WeightSnapshot) any {
	counts := make(map[string]int, len(snap.SlotEngines))
	for i := 0; i+1 < len(snap.Slots); i += 2 {
		idx := int(snap.Slots[i]) | int(snap.Slots[i+1])<<8
		if idx < len(snap.SlotEngines) {
			counts[snap.SlotEngines[idx]]++
		}
	}
	c := *snap
	c.Slots = nil
	return struct {
		*messages.WeightSnapshot
		SlotCounts map[string]int `json:"slot_counts"`
	}{&c, counts}
}
