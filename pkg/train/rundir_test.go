package train

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/drmas/drmas/pkg/config"
	"github.com/drmas/drmas/pkg/rundir"
)

func writeFile(t *testing.T, path, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

func mustExist(t *testing.T, paths ...string) {
	t.Helper()
	for _, p := range paths {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s is gone: %v", p, err)
		}
	}
}

// A folder drmas did not make, holding other files, is refused by a fresh start, --force and
// --resume alike, and nothing in it is touched (before: --resume and --force deleted it all).
func TestForeignDirRefused(t *testing.T) {
	for _, opt := range []Options{{}, {Force: true}, {Resume: true}} {
		dir := t.TempDir()
		writeFile(t, filepath.Join(dir, "notes.txt"), "mine")
		writeFile(t, filepath.Join(dir, "runA", "metrics.jsonl"), "{}\n")
		_, err := New(context.Background(), tinyConfig(t, dir), opt)
		if !errors.Is(err, rundir.ErrForeignDir) || !strings.Contains(err.Error(), "notes.txt") || !strings.Contains(err.Error(), "runA") {
			t.Errorf("%+v: err = %v, want rundir.ErrForeignDir naming notes.txt and runA", opt, err)
		}
		mustExist(t, filepath.Join(dir, "notes.txt"), filepath.Join(dir, "runA", "metrics.jsonl"))
		if _, err := os.Stat(filepath.Join(dir, rundir.MarkerFile)); err == nil {
			t.Errorf("%+v: marked a foreign folder as drmas's", opt)
		}
	}
}

// An unmarked folder holding only names drmas also writes, but no run (a user's config.yaml or
// weights/), is refused, not adopted and cleared (before: --resume and --force deleted them); one
// whose only content is an atomic write cut short (the marker's) is taken as empty.
func TestUnmarkedFolderWithoutRunRefused(t *testing.T) {
	for _, opt := range []Options{{Resume: true}, {Force: true}} {
		dir := t.TempDir()
		writeFile(t, filepath.Join(dir, "config.yaml"), "mine: 1\n")
		writeFile(t, filepath.Join(dir, "weights", "w.bin"), "mine")
		_, err := New(context.Background(), tinyConfig(t, dir), opt)
		if !errors.Is(err, rundir.ErrForeignDir) || !strings.Contains(err.Error(), "config.yaml") {
			t.Errorf("%+v: err = %v, want rundir.ErrForeignDir naming config.yaml", opt, err)
		}
		mustExist(t, filepath.Join(dir, "config.yaml"), filepath.Join(dir, "weights", "w.bin"))
	}
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, ".drmas-run.123-abc.drmas-tmp"), "")
	lock, _, err := rundir.Prepare(dir, false, false)
	if err != nil {
		t.Fatalf("a folder holding only a cut-short marker write: %v", err)
	}
	lock.Release()
}

// In drmas's own folder, --force and --resume delete only what drmas wrote.
func TestForceAndResumeKeepOtherFiles(t *testing.T) {
	dir := t.TempDir()
	train(t, tinyConfig(t, dir, "run.steps=1", "warmup.steps=0"), Options{})
	mustExist(t, filepath.Join(dir, rundir.MarkerFile))
	notes := filepath.Join(dir, "notes.txt")
	writeFile(t, notes, "mine")
	train(t, tinyConfig(t, dir, "run.steps=1", "warmup.steps=0"), Options{Force: true})
	mustExist(t, notes)
	if rows := readRows(t, dir); len(rows) != 1 {
		t.Errorf("--force: %d metrics rows, want the new run's 1", len(rows))
	}
	// --resume with no checkpoint but a previous run's metrics refuses (nothing deleted); with none
	// of a previous run's files it starts over, again keeping the user's file.
	for _, s := range []string{"step-1", "metrics.jsonl"} {
		if err := os.RemoveAll(filepath.Join(dir, s)); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(dir, "metrics.jsonl"), "{\"step\": 7}\n")
	if _, err := New(context.Background(), tinyConfig(t, dir, "run.steps=1", "warmup.steps=0"), Options{Resume: true}); !errors.Is(err, rundir.ErrNothingToResume) || !strings.Contains(err.Error(), "metrics.jsonl") {
		t.Fatalf("--resume over a previous run's metrics and no checkpoint: err = %v, want rundir.ErrNothingToResume naming metrics.jsonl", err)
	}
	if b := readBytes(t, filepath.Join(dir, "metrics.jsonl")); string(b) != "{\"step\": 7}\n" {
		t.Fatalf("the refused --resume changed metrics.jsonl: %q", b)
	}
	if err := os.Remove(filepath.Join(dir, "metrics.jsonl")); err != nil {
		t.Fatal(err)
	}
	train(t, tinyConfig(t, dir, "run.steps=1", "warmup.steps=0"), Options{Resume: true})
	mustExist(t, notes)
	if rows := readRows(t, dir); len(rows) != 1 || rows[0]["step"] != 1.0 {
		t.Errorf("--resume without a checkpoint or history: rows %v, want the new run's step 1 only", rows)
	}
}

// A second writer on a locked folder fails at once, naming the holder's PID (same process: flock
// locks belong to open files, so a second open conflicts).
func TestRunLockedInProcess(t *testing.T) {
	dir := t.TempDir()
	lock, _, err := rundir.Prepare(dir, false, false)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Release()
	for _, opt := range []Options{{}, {Resume: true}, {Force: true}} {
		_, err := New(context.Background(), tinyConfig(t, dir), opt)
		if !errors.Is(err, rundir.ErrRunLocked) || !strings.Contains(err.Error(), "process "+strconv.Itoa(os.Getpid())) {
			t.Errorf("%+v: err = %v, want rundir.ErrRunLocked naming PID %d", opt, err, os.Getpid())
		}
	}
	lock.Release()
	if lock2, _, err := rundir.Prepare(dir, false, false); err != nil {
		t.Errorf("after release: %v", err)
	} else {
		lock2.Release()
	}
}

// TestHelperHoldLock is the child process of TestRunLockedByChild: it locks the folder, says so,
// and holds the lock until its stdin closes.
func TestHelperHoldLock(t *testing.T) {
	dir := os.Getenv("DRMAS_TEST_LOCK_DIR")
	if dir == "" {
		t.Skip("child process of TestRunLockedByChild")
	}
	lock, _, err := rundir.Prepare(dir, false, false)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Release()
	os.Stdout.WriteString("locked\n")
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
}

func TestRunLockedByChild(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperHoldLock$")
	cmd.Env = append(os.Environ(), "DRMAS_TEST_LOCK_DIR="+dir)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); _ = cmd.Wait() }()
	line, _ := bufio.NewReader(stdout).ReadString('\n')
	if !strings.Contains(line, "locked") {
		t.Fatalf("child said %q", line)
	}
	_, err := New(context.Background(), tinyConfig(t, dir), Options{Resume: true})
	if !errors.Is(err, rundir.ErrRunLocked) || !strings.Contains(err.Error(), "process "+strconv.Itoa(cmd.Process.Pid)) {
		t.Fatalf("err = %v, want rundir.ErrRunLocked naming the child's PID %d", err, cmd.Process.Pid)
	}
}

// Resuming with another model shape is refused (before: the old weights were kept silently while
// the new checkpoints recorded the new shape).
func TestResumeRefusesChangedShape(t *testing.T) {
	dir := t.TempDir()
	train(t, tinyConfig(t, dir, "run.steps=2", "warmup.steps=0"), Options{})
	_, err := New(context.Background(), tinyConfig(t, dir, "models.0.init.hidden_size=32", "run.steps=4"), Options{Resume: true})
	if !errors.Is(err, config.ErrResumeMismatch) || !strings.Contains(err.Error(), "init.hidden_size: checkpoint 16, config 32") {
		t.Fatalf("err = %v, want config.ErrResumeMismatch naming init.hidden_size", err)
	}
	_, err = New(context.Background(), tinyConfig(t, dir, "models.0.id=other", "agents.0.model=other", "agents.1.model=other", "run.steps=4"), Options{Resume: true})
	if !errors.Is(err, config.ErrResumeMismatch) || !strings.Contains(err.Error(), "solver→other") {
		t.Fatalf("changed team: err = %v, want config.ErrResumeMismatch naming the agents", err)
	}
}

// A damaged latest checkpoint is skipped for the newest complete one, with a warning (before:
// resume failed).
func TestResumeFallsBackPastDamagedCheckpoint(t *testing.T) {
	dir := t.TempDir()
	train(t, tinyConfig(t, dir, "run.steps=4", "warmup.steps=0"), Options{})
	weights := filepath.Join(rundir.CheckpointDir(dir, 4), "small", "model.safetensors")
	st, err := os.Stat(weights)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(weights, st.Size()/2); err != nil {
		t.Fatal(err)
	}
	tr, err := New(context.Background(), tinyConfig(t, dir, "run.steps=5", "warmup.steps=0"), Options{Resume: true})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if tr.step != 2 {
		t.Fatalf("resumed at step %d, want 2 (the newest complete checkpoint)", tr.step)
	}
	if err := tr.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if rows := readRows(t, dir); len(rows) != 5 {
		t.Errorf("%d metrics rows after resuming from step 2 to 5, want 5", len(rows))
	}
}
