// Package testserver runs the real aaa server binary for tests: on a free
// port of 127.0.0.1, with its data in a temporary directory, stopped when the
// test ends.
//
// The binary is env AAA_BIN (a relative path is taken from clients/go), by
// default ../../target/debug/aaa from clients/go: run `cargo build` in the
// repository root first.
package testserver

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// startTimeout bounds the wait for the "serving on" line.
const startTimeout = 30 * time.Second

// stopTimeout is how long a SIGTERM gets before the process is killed.
const stopTimeout = 15 * time.Second

var servingRE = regexp.MustCompile(`serving on (\S+:\d+)`)

// Server is a running server process.
type Server struct {
	// Addr is the address the server listens on, "127.0.0.1:PORT".
	Addr string
	// DataDir is the server's database directory.
	DataDir string

	t      testing.TB
	bin    string
	args   []string
	cmd    *exec.Cmd
	exited chan struct{}
	log    *lockedBuffer
}

// Binary returns the path of the server binary, failing the test with a
// clear message when it is missing.
func Binary(t testing.TB) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..") // clients/go
	bin := os.Getenv("AAA_BIN")
	if bin == "" {
		bin = filepath.Join("..", "..", "target", "debug", "aaa")
	}
	if !filepath.IsAbs(bin) {
		bin = filepath.Join(root, bin)
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("aaa server binary not found at %s (%v): run `cargo build` in the repository root, or set AAA_BIN", bin, err)
	}
	return bin
}

// Start runs a server with a fresh data directory and stops it when the test
// ends.
func Start(t testing.TB) *Server {
	t.Helper()
	s := &Server{t: t, bin: Binary(t), DataDir: t.TempDir(), Addr: "127.0.0.1:0"}
	s.start()
	t.Cleanup(s.Stop)
	return s
}

// StartWith is Start with extra flags for `aaa serve` (e.g. --auth-config;
// --store replaces the store of AAA_TEST_STORE).
func StartWith(t testing.TB, args ...string) *Server {
	t.Helper()
	s := &Server{t: t, bin: Binary(t), DataDir: t.TempDir(), Addr: "127.0.0.1:0", args: args}
	s.start()
	t.Cleanup(s.Stop)
	return s
}

// StartSharing is StartWith for a server on the store of other: with
// AAA_TEST_STORE=postgres, the same schema (a cluster: e.g. args --standby).
// Its data directory is its own.
func StartSharing(t testing.TB, other *Server, args ...string) *Server {
	t.Helper()
	s := &Server{t: t, bin: Binary(t), DataDir: t.TempDir(), Addr: "127.0.0.1:0", args: args}
	if url, err := os.ReadFile(other.DataDir + ".store-url"); err == nil {
		if err := os.WriteFile(s.DataDir+".store-url", url, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s.start()
	t.Cleanup(s.Stop)
	return s
}

// storeArgs is `--store URL` when the suite runs on PostgreSQL
// (AAA_TEST_STORE=postgres): a fresh schema of AAA_TEST_POSTGRES per data
// dir, remembered beside it so a restart finds the same data.
func storeArgs(t testing.TB, dataDir string) []string {
	if os.Getenv("AAA_TEST_STORE") != "postgres" {
		return nil
	}
	remembered := dataDir + ".store-url"
	url, err := os.ReadFile(remembered)
	if err != nil {
		base := os.Getenv("AAA_TEST_POSTGRES")
		separator := "?"
		if strings.Contains(base, "?") {
			separator = "&"
		}
		var random [16]byte
		if _, err := rand.Read(random[:]); err != nil {
			t.Fatal(err)
		}
		url = []byte(fmt.Sprintf("%s%soptions=-csearch_path%%3Daaa_test_%x", base, separator, random))
		if err := os.WriteFile(remembered, url, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return []string{"--store=" + string(url)}
}

// start launches the process on s.Addr and waits for its "serving on" line.
func (s *Server) start() {
	s.t.Helper()
	stdoutR, stdoutW, err := os.Pipe()
	if err != nil {
		s.t.Fatal(err)
	}
	s.log = &lockedBuffer{}
	args := []string{"serve", "--listen", s.Addr, "--data-dir", s.DataDir}
	if !slices.ContainsFunc(s.args, func(arg string) bool { return arg == "--store" || strings.HasPrefix(arg, "--store=") }) {
		args = append(args, storeArgs(s.t, s.DataDir)...) // a --store of the test's replaces the suite's
	}
	args = append(args, s.args...)
	cmd := exec.Command(s.bin, args...)
	cmd.Stdout = stdoutW
	cmd.Stderr = s.log
	cmd.Env = append(os.Environ(), "NO_COLOR=1")
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("start %s: %v", s.bin, err)
	}
	stdoutW.Close()
	s.cmd = cmd
	s.exited = make(chan struct{})
	go func() { _ = cmd.Wait(); close(s.exited) }()

	addr := make(chan string, 1)
	go func() {
		defer stdoutR.Close()
		scanner := bufio.NewScanner(stdoutR)
		for scanner.Scan() {
			if m := servingRE.FindStringSubmatch(scanner.Text()); m != nil {
				select {
				case addr <- m[1]:
				default:
				}
			}
		}
	}()
	select {
	case a := <-addr:
		s.Addr = a
	case <-s.exited:
		s.t.Fatalf("the aaa server exited before serving (%v)\n%s", cmd.ProcessState, s.Log())
	case <-time.After(startTimeout):
		s.kill()
		s.t.Fatalf("the aaa server printed no 'serving on' line in %s\n%s", startTimeout, s.Log())
	}
}

// Stop stops the server: SIGTERM, then SIGKILL if it has not exited in time.
// Stopping a stopped server does nothing.
func (s *Server) Stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(stopTimeout):
		s.t.Errorf("the aaa server did not stop within %s of SIGTERM; killing it", stopTimeout)
		s.kill()
	}
	s.cmd = nil
}

// Kill kills the server at once (SIGKILL), as a crash would.
func (s *Server) Kill() {
	if s.cmd != nil {
		s.kill()
		s.cmd = nil
	}
}

func (s *Server) kill() {
	_ = s.cmd.Process.Kill()
	<-s.exited
}

// Restart stops the server and starts it again on the same address with the
// same data.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	s.start()
}

// Log returns what the server wrote to stderr (of its current process).
func (s *Server) Log() string {
	if s.log == nil {
		return ""
	}
	return s.log.String()
}

// Env returns os.Environ() with AAA_SERVER set to the server's address, for
// subprocesses.
func (s *Server) Env() []string {
	env := []string{}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "AAA_SERVER=") {
			env = append(env, kv)
		}
	}
	return append(env, "AAA_SERVER="+s.Addr)
}

// lockedBuffer is a bytes.Buffer safe for a writer and readers at once.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p to the buffer.
func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
