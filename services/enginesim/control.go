package enginesim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-dev/switchyard/messages"
	"github.com/switchyard-dev/switchyard/streams"
)

// ControlSubject is the NATS subject an engine simulator takes failure
// injection on at run time: <prefix>.ctl.engine.<engine>. A request's body
// is the JSON of POST /admin/failure (merged into the failure in force; an
// empty body only reads it); the reply is the resulting Failure as JSON with
// messages.HeaderStatus 200, or an OpenAI-shaped error with status 400.
func ControlSubject(names streams.Names, engineName string) (string, error) {
	if names == (streams.Names{}) {
		names = streams.DefaultNames()
	}
	if err := messages.CheckName("engine", engineName); err != nil {
		return "", err
	}
	return names.Prefix + ".ctl.engine." + engineName, nil
}

// subscribeControlLocked subscribes to the control subject; e.ctl is held.
func (e *Engine) subscribeControlLocked() error {
	subj, err := ControlSubject(e.opts.Names, e.opts.Name)
	if err != nil {
		return fmt.Errorf("enginesim: control subject: %w", err)
	}
	sub, err := e.opts.Conn.Subscribe(subj, e.serveControl)
	if err == nil {
		err = e.opts.Conn.Flush()
	}
	if err != nil {
		return fmt.Errorf("enginesim: engine %s: subscribe to %s: %w", e.opts.Name, subj, err)
	}
	e.ctlSub = sub
	return nil
}

// serveControl answers one control request (see ControlSubject).
func (e *Engine) serveControl(m *nats.Msg) {
	if m.Reply == "" {
		return
	}
	reply := func(status int, body []byte) {
		out := nats.NewMsg(m.Reply)
		out.Header.Set(messages.HeaderStatus, strconv.Itoa(status))
		out.Header.Set(messages.NATSHeaderEngine, e.opts.Name)
		out.Data = body
		_ = e.opts.Conn.PublishMsg(out)
	}
	fail := func(msg string) {
		a := &apiError{Status: 400, Type: "invalid_request_error", Code: "invalid_failure", Message: msg}
		reply(a.Status, a.body())
	}
	defer e.poison.Recover("control", m.Subject, func() {
		a := &apiError{Status: 500, Type: "server_error", Code: "internal_error", Message: "the engine failed applying this request"}
		reply(a.Status, a.body())
	})
	if len(m.Data) > 64<<10 {
		fail("failure JSON larger than 64 KiB")
		return
	}
	if len(bytes.TrimSpace(m.Data)) > 0 {
		f := e.Failure()
		dec := json.NewDecoder(bytes.NewReader(m.Data))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&f); err != nil {
			fail("failure JSON: " + err.Error())
			return
		}
		if err := e.SetFailure(f); err != nil {
			fail(err.Error())
			return
		}
	}
	b, _ := json.Marshal(e.Failure())
	reply(200, b)
}
