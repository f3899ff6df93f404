package main

import (
	"errors"
	"time"

	"github.com/switchyard-dev/switchyard/messages"
)

// decodeExpired decodes a signal or report that messages.Decode refused only
// for its age (messages.ErrExpired, which Validate reports only when every
// other field is valid), so that `switchyard decode` shows messages read from
// a stream's history; the services refuse them.
func decodeExpired(data []byte) (messages.Message, error) {
	_, kind, err := messages.Peek(data)
	if err != nil {
		return nil, err
	}
	m, err := messages.New(kind)
	if err != nil {
		return nil, err
	}
	if err := messages.DecodeIntoAt(data, m, time.Now()); err != nil && !errors.Is(err, messages.ErrExpired) {
		return nil, err
	}
	return m, nil
}
