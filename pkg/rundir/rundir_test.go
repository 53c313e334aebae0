package rundir

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Two fresh runs racing for one folder: the winner has locked it and not yet marked it. The loser is
// told another run took the folder (ErrRunLocked, naming the winner's process), not that the folder
// holds files drmas did not write (issue #42: it said ErrForeignDir, naming .drmas-lock).
func TestRaceLoserToldAnotherRunTookIt(t *testing.T) {
	dir := t.TempDir()
	winner, err := lockDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer winner.Release()
	_, _, err = Prepare(dir, false, false)
	if !errors.Is(err, ErrRunLocked) || !strings.Contains(err.Error(), "drmas process") {
		t.Fatalf("the loser got %v, want %v naming the winner", err, ErrRunLocked)
	}
	// Once the winner is gone (a crash before it marked the folder), its lock file alone is no
	// foreign file: a new run takes the folder.
	winner.Release()
	lock, _, err := Prepare(dir, false, false)
	if err != nil {
		t.Fatalf("after the winner left: %v", err)
	}
	lock.Release()
	if _, err := os.Stat(filepath.Join(dir, MarkerFile)); err != nil {
		t.Errorf("the folder was not marked: %v", err)
	}
}

// A folder holding a file drmas did not write, beside a lock file, is still refused.
func TestForeignFileBesideLockRefused(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{LockFile, "notes.txt"} {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := Prepare(dir, false, false); !errors.Is(err, ErrForeignDir) || !strings.Contains(err.Error(), "notes.txt") {
		t.Fatalf("err %v, want %v naming notes.txt", err, ErrForeignDir)
	}
}
