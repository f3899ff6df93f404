package httpfront

import (
	"net"
	"sync"
	"syscall"
	"time"
)

// goneWatcher notices clients that go away while the fasthttp front works
// on their request — queued for an engine, waiting for the first byte, or
// between two events of a stream — and cancels the request, as net/http's
// background read does for the std front, so that an engine does not go on
// generating for nobody. fasthttp reads nothing while its handler runs, so
// every period the watcher peeks (MSG_PEEK, never blocking, consuming
// nothing) at the connections of the requests in flight for longer than a
// period: end of stream or a reset means the client closed its side. A
// request shorter than a period costs a map entry and no system call.
type goneWatcher struct {
	period time.Duration
	mu     sync.Mutex
	reqs   map[*goneEntry]struct{}
	gen    uint64 // entries watched so far
	quit   chan struct{}
	done   chan struct{}
	stop   sync.Once
}

// canceler ends a request's work (a request's Context: no closure to
// allocate).
type canceler interface{ Cancel() }

// goneEntry is one request in flight on conn.
type goneEntry struct {
	conn   net.Conn
	cancel canceler
	since  time.Time
	gen    uint64 // tells a reused entry from the request it held
}

// goneWatchPeriod is how often the connections of long requests are checked,
// and how long a request runs before its connection is.
const goneWatchPeriod = 100 * time.Millisecond

func newGoneWatcher(period time.Duration) *goneWatcher {
	w := &goneWatcher{period: period, reqs: map[*goneEntry]struct{}{}, quit: make(chan struct{}), done: make(chan struct{})}
	go w.run()
	return w
}

// watch starts watching conn, in entry e, for a request whose work cancel
// stops; pass e to unwatch when the request is done.
// The caller owns e (e.g. inside a pooled per-request struct) and may
// reuse it once unwatch returned: the watcher tells a reused entry from the
// request it checked by its generation.
func (w *goneWatcher) watch(e *goneEntry, conn net.Conn, cancel canceler) {
	since := time.Now()
	w.mu.Lock()
	w.gen++
	*e = goneEntry{conn: conn, cancel: cancel, since: since, gen: w.gen}
	w.reqs[e] = struct{}{}
	w.mu.Unlock()
}

// unwatch stops watching e.
func (w *goneWatcher) unwatch(e *goneEntry) {
	w.mu.Lock()
	delete(w.reqs, e)
	w.mu.Unlock()
}

// forget stops watching every request on conn (closed).
func (w *goneWatcher) forget(conn net.Conn) {
	w.mu.Lock()
	for e := range w.reqs {
		if e.conn == conn {
			delete(w.reqs, e)
		}
	}
	w.mu.Unlock()
}

// close stops the watcher.
func (w *goneWatcher) close() {
	w.stop.Do(func() { close(w.quit) })
	<-w.done
}

func (w *goneWatcher) run() {
	defer close(w.done)
	tick := time.NewTicker(w.period)
	defer tick.Stop()
	type dueEntry struct {
		e     *goneEntry
		entry goneEntry // its contents when found due
	}
	var due []dueEntry
	for {
		select {
		case <-w.quit:
			return
		case now := <-tick.C:
			due = due[:0]
			w.mu.Lock()
			for e := range w.reqs {
				if now.Sub(e.since) >= w.period {
					due = append(due, dueEntry{e: e, entry: *e})
				}
			}
			w.mu.Unlock()
			for _, d := range due {
				if !peerClosed(d.entry.conn) {
					continue
				}
				w.mu.Lock()
				_, still := w.reqs[d.e]
				still = still && d.e.gen == d.entry.gen
				if still {
					delete(w.reqs, d.e)
				}
				w.mu.Unlock()
				if still {
					d.entry.cancel.Cancel()
				}
			}
			clear(due)
		}
	}
}

// peerClosed reports whether the peer of conn has closed or reset it, by a
// non-blocking peek at the socket: nothing to read means it is open, bytes
// mean the client is there (a pipelined request), end of stream or an error
// other than "try again" mean it is gone. A connection that is not a socket
// (or is already closed here) is never reported.
func peerClosed(conn net.Conn) bool {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	gone := false
	// Control holds the descriptor for the call, so a connection closed
	// meanwhile is an error here, never another socket that reuses its number.
	_ = raw.Control(func(fd uintptr) { gone = peekGone(fd) })
	return gone
}
