package report

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/drmas/drmas/pkg/tbevent"
)

// A segment with run.tensorboard off still cuts the earlier files back to the step it starts from,
// and writes none of its own.
func TestBoardOffStillPrunes(t *testing.T) {
	run := t.TempDir()
	w, err := tbevent.Create(filepath.Join(run, TensorBoardDir), time.Unix(1, 0))
	if err != nil {
		t.Fatal(err)
	}
	for s := int64(1); s <= 5; s++ {
		if err := w.Write(s, time.Unix(1, 0), tbevent.Scalar("reward/mean", 0)); err != nil {
			t.Fatal(err)
		}
	}
	w.Close()
	if b := newBoard(run, false, 0, 3); b != nil {
		t.Fatal("run.tensorboard off, yet a board")
	}
	files, evs := boardEvents(t, run)
	if files != 1 || len(evs) != 3 || evs[2].Step != 3 {
		t.Fatalf("%d files, %d events after pruning at 3", files, len(evs))
	}
}

// boardEvents reads every event file of a run's tensorboard folder, in name order, and returns the
// step Events (the files' first Events aside).
func boardEvents(t *testing.T, run string) (files int, evs []tbevent.Event) {
	t.Helper()
	paths, err := tbevent.Files(filepath.Join(run, TensorBoardDir))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range paths {
		es, err := tbevent.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, es[1:]...)
	}
	return len(paths), evs
}
