package atomicfile

import (
	"bufio"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

func TestWriteReplaces(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f.txt")
	if err := WriteBytes(path, []byte("one")); err != nil {
		t.Fatal(err)
	}
	if err := WriteBytes(path, []byte("two")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "two" {
		t.Errorf("content %q, want two", b)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	umask := syscall.Umask(0)
	syscall.Umask(umask)
	if want := os.FileMode(0o644) &^ os.FileMode(umask); st.Mode().Perm() != want {
		t.Errorf("mode %v, want %v", st.Mode().Perm(), want)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("%d entries in the folder, want the file alone", len(entries))
	}
}

// A failing writer leaves the previous file as it was and no temporary file behind.
func TestWriteFailureKeepsOld(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f.txt")
	if err := WriteBytes(path, []byte("old")); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	err := Write(path, func(w io.Writer) error {
		if _, err := io.WriteString(w, "half"); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), path) {
		t.Fatalf("err = %v, want boom naming the path", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "old" {
		t.Errorf("content %q after a failed write, want old", b)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("%d entries in the folder, want the file alone", len(entries))
	}
}

func TestWriteMissingFolder(t *testing.T) {
	if err := WriteBytes(filepath.Join(t.TempDir(), "no", "f.txt"), nil); err == nil {
		t.Error("no error writing into a missing folder")
	}
}

// TestHelperKilledWrite is the child process of TestStaleTempRemoved: it starts a write to the path
// it is given, says so, and blocks until it is killed.
func TestHelperKilledWrite(t *testing.T) {
	path := os.Getenv("DRMAS_TEST_ATOMIC_PATH")
	if path == "" {
		t.Skip("child process of TestStaleTempRemoved")
	}
	_ = Write(path, func(w io.Writer) error {
		os.Stdout.WriteString("writing\n")
		select {}
	})
}

// A write killed by SIGKILL leaves its hidden temporary file; the next write to the same path removes
// it, and leaves alone a live process's temporary file and every other file (before: the 0-byte
// .calls.jsonlNNN stayed for good).
func TestStaleTempRemoved(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "calls.jsonl")
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperKilledWrite$")
	cmd.Env = append(os.Environ(), "DRMAS_TEST_ATOMIC_PATH="+path)
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(stdout).ReadString('\n')
	if line != "writing\n" {
		cmd.Process.Kill()
		t.Fatalf("child said %q", line)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	left, _ := os.ReadDir(dir)
	if len(left) != 1 || !strings.HasPrefix(left[0].Name(), ".calls.jsonl") {
		t.Fatalf("after the kill the folder holds %v, want the killed write's temporary file", left)
	}
	live := filepath.Join(dir, ".calls.jsonl."+strconv.Itoa(os.Getppid())+"-abc"+tmpSuffix) // a live process's write
	other := filepath.Join(dir, ".calls.jsonl.notes")
	for _, p := range []string{live, other} {
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := WriteBytes(path, []byte("new")); err != nil {
		t.Fatal(err)
	}
	var names []string
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		names = append(names, e.Name())
	}
	want := []string{filepath.Base(live), filepath.Base(other), "calls.jsonl"}
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Errorf("folder holds %v, want %v", names, want)
	}
}
