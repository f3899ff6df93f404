package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// child is a server process started by the benchmark.
type child struct {
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	fields []string // the ready line's fields after "ready"
	done   chan error
}

// startChild re-executes this binary with -role and waits for its ready line.
func startChild(ctx context.Context, logDir, role string, args ...string) (*child, error) {
	return startNamedChild(ctx, "", logDir, role, role, args...)
}

// startNamedChild is startChild with the log file named after name, running
// exe (a build of this benchmark; empty: this binary).
func startNamedChild(ctx context.Context, exe, logDir, name, role string, args ...string) (*child, error) {
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return nil, err
		}
	}
	cmd := exec.Command(exe, append([]string{"-role", role}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	logf, err := os.Create(filepath.Join(logDir, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd.Stderr = logf
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", role, err)
	}
	c := &child{name: name, cmd: cmd, stdin: stdin, done: make(chan error, 1)}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default:
			}
		}
	}()
	go func() {
		c.done <- cmd.Wait()
		_ = logf.Close()
	}()
	select {
	case l := <-lines:
		f := strings.Fields(l)
		if len(f) < 1 || f[0] != "ready" {
			c.stop()
			return nil, fmt.Errorf("%s: unexpected first line %q", role, l)
		}
		c.fields = f[1:]
		return c, nil
	case err := <-c.done:
		return nil, fmt.Errorf("%s exited before ready (%v); see %s", role, err, logf.Name())
	case <-time.After(20 * time.Second):
		c.stop()
		return nil, fmt.Errorf("%s not ready within 20 s; see %s", role, logf.Name())
	case <-ctx.Done():
		c.stop()
		return nil, ctx.Err()
	}
}

func (c *child) pid() int { return c.cmd.Process.Pid }

// stop asks the child to end (SIGTERM) and waits up to 5 s, then kills it.
func (c *child) stop() {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	_ = c.stdin.Close()
	select {
	case <-c.done:
	case <-time.After(5 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

// nginx is an nginx master process (daemon off) with its workers.
type nginx struct {
	cmd  *exec.Cmd
	dir  string
	url  string
	done chan error
}

// nginxConf is a reverse proxy to one upstream with keep-alive on both
// sides, no access log, and every path inside dir.
const nginxConf = `worker_processes %d;
daemon off;
master_process on;
pid %[2]s/nginx.pid;
error_log %[2]s/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path %[2]s/client_body;
    proxy_temp_path %[2]s/proxy;
    fastcgi_temp_path %[2]s/fastcgi;
    uwsgi_temp_path %[2]s/uwsgi;
    scgi_temp_path %[2]s/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 75s;
    upstream engine {
        server %[3]s;
        keepalive 256;
        keepalive_requests 1000000;
        keepalive_timeout 75s;
    }
    server {
        listen %[4]s;
        location / {
            proxy_pass http://engine;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
`

func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// startNginx writes a config into a temp dir under logDir and starts nginx
// on a free port, proxying to engineAddr (host:port).
func startNginx(bin, logDir, engineAddr string, workers int) (*nginx, error) {
	dir, err := os.MkdirTemp(logDir, "nginx-")
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	addr, err := freePort()
	if err != nil {
		return nil, err
	}
	conf := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(conf, fmt.Appendf(nil, nginxConf, workers, dir, engineAddr, addr), 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "-p", dir, "-c", conf, "-e", filepath.Join(dir, "error.log"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := os.Create(filepath.Join(dir, "stderr.log"))
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start nginx: %w", err)
	}
	n := &nginx{cmd: cmd, dir: dir, url: "http://" + addr, done: make(chan error, 1)}
	go func() {
		n.done <- cmd.Wait()
		_ = out.Close()
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
			return n, nil
		}
		select {
		case err := <-n.done:
			b, _ := os.ReadFile(filepath.Join(dir, "stderr.log"))
			e, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			return nil, fmt.Errorf("nginx exited (%v): %s%s", err, b, e)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			n.stop()
			return nil, errors.New("nginx not listening within 10 s")
		}
	}
}

func (n *nginx) pid() int { return n.cmd.Process.Pid }

// stop ends nginx (SIGTERM: fast shutdown) and waits for it.
func (n *nginx) stop() {
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.done:
	case <-time.After(5 * time.Second):
		_ = n.cmd.Process.Kill()
		<-n.done
	}
}

// clockTick is USER_HZ, the unit of /proc/<pid>/stat CPU times (100 on
// every Linux the benchmark targets).
const clockTick = 100

// cpuTime returns the CPU time (user+system) used so far by pid and, when
// withChildren, by its live child processes (nginx's workers).
func cpuTime(pid int, withChildren bool) time.Duration {
	return sumProc(pid, withChildren, procCPU)
}

// sumProc returns f(pid) plus, when withChildren, f of each live child
// process of pid.
func sumProc[T time.Duration | int64](pid int, withChildren bool, f func(int) T) T {
	total := f(pid)
	if !withChildren {
		return total
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil || p == pid {
			continue
		}
		if ppid, ok := procPPID(p); ok && ppid == pid {
			total += f(p)
		}
	}
	return total
}

// procStat returns the fields of /proc/<pid>/stat after the command name.
func procStat(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(s[i+1:])
}

func procPPID(pid int) (int, bool) {
	f := procStat(pid)
	if len(f) < 2 {
		return 0, false
	}
	p, err := strconv.Atoi(f[1])
	return p, err == nil
}

func procCPU(pid int) time.Duration {
	f := procStat(pid) // f[0] is state: utime is field 14 of stat, f[11] here
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+s) * time.Second / clockTick
}

// ctxSwitches returns the context switches (voluntary and not) of all the
// threads of pid so far and, when withChildren, of its child processes'.
func ctxSwitches(pid int, withChildren bool) int64 {
	return sumProc(pid, withChildren, procCtxSwitches)
}

func procCtxSwitches(pid int) int64 {
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	var total int64
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/status", pid, t.Name()))
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(b)) {
			k, v, ok := strings.Cut(line, ":")
			if ok && (k == "voluntary_ctxt_switches" || k == "nonvoluntary_ctxt_switches") {
				n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				total += n
			}
		}
	}
	return total
}
