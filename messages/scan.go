package messages

import (
	"encoding/binary"
	"fmt"
)

// MaxNesting is how deeply containers (maps and arrays) may nest in an encoded
// message. The deepest Switchyard message nests five (a demand state's router
// map, a router's entry, its priority map, a priority's window, inside the
// top-level map); sixteen leaves room for the schema to grow while keeping the
// pre-scan's stack a small fixed array.
const MaxNesting = 16

// MaxContainerLen is the most entries a map, or elements an array, may hold
// in an encoded message. A weight snapshot's slots index its engines with
// 16-bit numbers, so no snapshot names more than 65536 engines, and every
// other container of the schema (per-engine outcomes, round trips, routers,
// priorities, transports) holds one entry per engine or fewer. Without the
// bound a 1 MiB snapshot of a million empty engine names would make the
// msgpack library allocate some 85 MiB.
const MaxContainerLen = 1 << 16

// scanMsgpack walks the MessagePack encoding of exactly one value, without
// allocating, and fails with ErrDecode unless the value is complete, nests at
// most MaxNesting containers deep, holds at most MaxContainerLen entries in
// any container, and is followed by no other bytes.
//
// It runs before the msgpack library sees the bytes, because that library
// allocates from the lengths that headers claim before it reads what they
// claim: msgpack v5.4.1 (the newest release) preallocates a slice of every
// length an array header claims, its allocation limit is never applied on that
// path (upstream issue 401, open and unfixed), and even where the limit
// applies it still lets a 5-byte map header preallocate a million entries.
// A decoder setting cannot bound that, and other Go msgpack libraries would
// mean rewriting every wire type's tags; checking the structure once, in one
// pass over the bytes, can. Each element of an array needs at least one byte
// and each entry of a map two, so at every header the values still owed by
// all the containers open around it, this one's included, must fit in the
// bytes that remain; str, bin and ext payloads must fit too. After the scan,
// every length the library sees is one the input actually holds, so what it
// allocates is bounded by a small multiple of the input's size.
func scanMsgpack(data []byte) error { return scanMsgpackLimit(data, MaxContainerLen) }

// scanMsgpackLimit is scanMsgpack with maxLen in place of MaxContainerLen,
// for foreign formats whose containers are legitimately longer (a vLLM
// BlockStored event lists every token id of a long prompt).
func scanMsgpackLimit(data []byte, maxLen int64) error {
	// left[d] is how many values the container open at depth d still holds;
	// depth 0 is the top level, which holds the one value.
	var left [MaxNesting + 1]int64
	left[0] = 1
	depth := 0
	// owed is the sum of left: values still to read, each at least one byte.
	owed := int64(1)
	p := 0
	for owed > 0 {
		for left[depth] == 0 {
			depth--
		}
		if p >= len(data) {
			return fmt.Errorf("%w: truncated at byte %d: %d more values expected", ErrDecode, p, owed)
		}
		at := p
		b := data[p]
		p++
		left[depth]--
		owed--
		// Fast paths for what most of a message is: small integers, nil and
		// booleans, short strings (every key) and float64s.
		switch {
		case b <= 0x7f, b >= 0xe0, b == 0xc0, b == 0xc2, b == 0xc3:
			continue
		case b&0xe0 == 0xa0, b == 0xcb:
			n := int(b & 0x1f)
			if b == 0xcb {
				n = 8
			}
			if n > len(data)-p {
				return fmt.Errorf("%w: value of type 0x%02x at offset %d claims %d bytes, %d remain", ErrDecode, b, at, n, len(data)-p)
			}
			p += n
			continue
		}

		var elems int64   // values inside the container this header opens
		var payload int64 // bytes that follow the header and belong to this value
		container := false
		hdr := 0 // length bytes after the type byte
		switch {
		case b <= 0x7f, b >= 0xe0: // positive and negative fixint
		case b <= 0x8f: // fixmap
			elems, container = 2*int64(b&0x0f), true
		case b <= 0x9f: // fixarray
			elems, container = int64(b&0x0f), true
		case b <= 0xbf: // fixstr
			payload = int64(b & 0x1f)
		default:
			switch b {
			case 0xc0, 0xc2, 0xc3: // nil, false, true
			case 0xc1:
				return fmt.Errorf("%w: byte 0xc1 at offset %d is never used in MessagePack", ErrDecode, at)
			case 0xc4, 0xd9: // bin8, str8
				hdr = 1
			case 0xc5, 0xda: // bin16, str16
				hdr = 2
			case 0xc6, 0xdb: // bin32, str32
				hdr = 4
			case 0xc7: // ext8: length, type
				hdr, payload = 1, 1
			case 0xc8: // ext16
				hdr, payload = 2, 1
			case 0xc9: // ext32
				hdr, payload = 4, 1
			case 0xca, 0xce, 0xd2: // float32, uint32, int32
				payload = 4
			case 0xcb, 0xcf, 0xd3: // float64, uint64, int64
				payload = 8
			case 0xcc, 0xd0: // uint8, int8
				payload = 1
			case 0xcd, 0xd1: // uint16, int16
				payload = 2
			case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8: // fixext 1, 2, 4, 8, 16: type, data
				payload = 1 + int64(1)<<(b-0xd4)
			case 0xdc: // array16
				hdr, container = 2, true
			case 0xdd: // array32
				hdr, container = 4, true
			case 0xde: // map16
				hdr, container = 2, true
			case 0xdf: // map32
				hdr, container = 4, true
			}
		}
		if hdr > 0 {
			if len(data)-p < hdr {
				return fmt.Errorf("%w: truncated length of type 0x%02x at offset %d", ErrDecode, b, at)
			}
			var n int64
			switch hdr {
			case 1:
				n = int64(data[p])
			case 2:
				n = int64(binary.BigEndian.Uint16(data[p:]))
			case 4:
				n = int64(binary.BigEndian.Uint32(data[p:]))
			}
			p += hdr
			switch {
			case b == 0xde || b == 0xdf:
				elems = 2 * n
			case container:
				elems = n
			default:
				payload += n
			}
		}
		if rest := int64(len(data) - p); payload > rest {
			return fmt.Errorf("%w: value of type 0x%02x at offset %d claims %d bytes, %d remain", ErrDecode, b, at, payload, rest)
		}
		p += int(payload)
		if !container || elems == 0 {
			continue
		}
		if per := valuesPerEntry(b); elems > per*maxLen {
			return fmt.Errorf("%w: %s at offset %d claims %d entries (limit %d)", ErrDecode, containerName(b), at, elems/per, maxLen)
		}
		if depth == MaxNesting {
			return fmt.Errorf("%w: containers nested deeper than %d at offset %d", ErrDecode, MaxNesting, at)
		}
		if rest := int64(len(data) - p); owed+elems > rest {
			return fmt.Errorf("%w: %s at offset %d claims %d entries, more than the %d bytes that remain can hold",
				ErrDecode, containerName(b), at, elems/valuesPerEntry(b), rest)
		}
		depth++
		left[depth] = elems
		owed += elems
	}
	if p != len(data) {
		return fmt.Errorf("%w: %d bytes after the message's end at offset %d", ErrDecode, len(data)-p, p)
	}
	return nil
}

func containerName(b byte) string {
	if valuesPerEntry(b) == 2 {
		return "map"
	}
	return "array"
}

// valuesPerEntry is 2 for a map header (a key and a value per entry) and 1
// for an array header.
func valuesPerEntry(b byte) int64 {
	if b <= 0x8f || b >= 0xde {
		return 2
	}
	return 1
}
