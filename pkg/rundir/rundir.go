package rundir

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/drmas/drmas/pkg/atomicfile"
	"github.com/rs/zerolog/log"
)

// A run folder belongs to drmas only where drmas made it. drmas marks a folder it makes (or finds
// empty) with MarkerFile, and holds an exclusive lock on LockFile for the whole run, so that two
// writers never share a folder. --force and --resume delete only what drmas writes (the names
// ownedName matches); a folder with anything else in it and no marker is refused.
const (
	MarkerFile = ".drmas-run"  // JSON: who made the folder, and when
	LockFile   = ".drmas-lock" // flock'ed for the run's whole life; holds the writer's PID
)

// ErrRunExists is returned when run.dir holds a run and neither --resume nor --force was given.
var ErrRunExists = errors.New("run folder already holds a run")

// ErrForeignDir is returned for a run.dir that drmas did not make and that holds other files.
var ErrForeignDir = errors.New("run folder holds files drmas did not write")

// ErrRunLocked is returned when another process is writing to run.dir.
var ErrRunLocked = errors.New("run folder is in use")

// tempRE is the name of pkg/atomicfile's temporary files (.NAME.PID-RAND.drmas-tmp).
var tempRE = regexp.MustCompile(`^\..+\.drmas-tmp$`)

// stepRE is a checkpoint folder's name.
var stepRE = regexp.MustCompile(`^step-\d+$`)

// ownedRE matches the names this package writes at the top of a run folder; the other packages
// that write there register theirs (Own).
var ownedRE = regexp.MustCompile(`^(step-\d+|step-\d+\.tmp|step-\d+\.damaged(\.\d+)?|metrics\.jsonl(\.tmp)?|metrics\.dropped\.jsonl|config\.yaml(\.tmp)?|\.drmas-run|\.drmas-lock)$`)

// Lock is the held lock of a run folder; Release lets go of it (the kernel does too when the
// process ends, however it ends).
type Lock struct{ f *os.File }

// Release drops the lock.
func (l *Lock) Release() {
	if l != nil && l.f != nil {
		_ = syscall.Flock(int(l.f.Fd()), syscall.LOCK_UN)
		_ = l.f.Close()
		l.f = nil
	}
}

// lockDir takes the exclusive lock of a run folder without waiting; when another process holds it,
// the error names that process's PID.
func lockDir(dir string) (*Lock, error) {
	path := filepath.Join(dir, LockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		b, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			holder := strings.TrimSpace(string(b))
			if holder == "" {
				holder = "unknown"
			}
			return nil, fmt.Errorf("%w: %s is being written by drmas process %s (lock %s); wait for it or stop it first",
				ErrRunLocked, dir, holder, path)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &Lock{f: f}, nil
}

// marker is what MarkerFile records.
type marker struct {
	CreatedBy string    `json:"created_by"`
	Created   time.Time `json:"created"`
}

func writeMarker(dir string) error {
	b, _ := json.MarshalIndent(marker{CreatedBy: "drmas", Created: time.Now().UTC()}, "", "  ")
	return atomicfile.WriteBytes(filepath.Join(dir, MarkerFile), append(b, '\n'))
}

// claim makes sure the folder is drmas's and locks it: a missing or empty folder is made and
// marked; a marked one is taken as it is; an unmarked one is adopted only when everything in it is
// a name drmas writes and a run's metrics or checkpoints are there (a run from before markers), and
// refused otherwise.
func claim(dir string) (*Lock, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	marked, evidence := false, false
	var foreign, owned []string
	for _, e := range entries {
		switch n := e.Name(); {
		case n == MarkerFile:
			marked = true
		case n == LockFile: // a run that has taken the folder and not marked it yet (lockDir decides)
		case tempRE.MatchString(n): // an atomic write cut short (the marker's own, say)
		case !ownedName(n):
			foreign = append(foreign, n)
		default:
			owned = append(owned, n)
			evidence = evidence || n == MetricsFile || stepRE.MatchString(n)
		}
	}
	// An unmarked folder is a run from before markers only with a run's evidence in it (metrics.jsonl
	// or a step-N folder): a user's own config.yaml or weights/ alone is no run of drmas's.
	if !marked && len(foreign) == 0 && len(owned) > 0 && !evidence {
		foreign = owned
	}
	if !marked && len(foreign) > 0 {
		sort.Strings(foreign)
		if len(foreign) > 5 {
			foreign = append(foreign[:5], "…")
		}
		return nil, fmt.Errorf("%w: %s has no %s marker and holds %s; drmas never deletes or mixes with other files: choose a new run.dir, or empty this one yourself",
			ErrForeignDir, dir, MarkerFile, strings.Join(foreign, ", "))
	}
	lock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	if !marked {
		if err := writeMarker(dir); err != nil {
			lock.Release()
			return nil, err
		}
	}
	return lock, nil
}

// runFiles lists what drmas wrote in the folder, apart from the marker and the lock.
func runFiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if n := e.Name(); ownedName(n) && n != MarkerFile && n != LockFile {
			out = append(out, n)
		}
	}
	return out, nil
}

// clearRun deletes what drmas wrote in the folder (never the marker, the lock or anything else).
func clearRun(dir string) error {
	names, err := runFiles(dir)
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := os.RemoveAll(filepath.Join(dir, n)); err != nil {
			return err
		}
	}
	if len(names) > 0 {
		log.Warn().Str("dir", dir).Strs("deleted", names).Msg("deleted the previous run's files")
	}
	return nil
}

// Prepare claims and locks the run folder: a fresh run needs it free of a previous run (or
// --force, which deletes that run's files); --resume continues from the newest complete
// checkpoint. It returns the lock and the checkpoint to resume from ("" for a fresh start).
func Prepare(dir string, resume, force bool) (*Lock, string, error) {
	lock, err := claim(dir)
	if err != nil {
		return nil, "", err
	}
	ck, err := prepareClaimed(dir, resume, force)
	if err != nil {
		lock.Release()
		return nil, "", err
	}
	return lock, ck, nil
}

func prepareClaimed(dir string, resume, force bool) (string, error) {
	names, err := runFiles(dir)
	if err != nil {
		return "", err
	}
	switch {
	case resume:
		ck, err := resumable(dir)
		if err != nil {
			return "", err
		}
		if ck != "" {
			// A metrics file a resume would have to cut rows from silently is refused now, before
			// any weights load (TruncateMetrics does the cut in restore).
			_, _, _, err := splitMetrics(dir, StepOf(ck))
			return ck, err
		}
		if kept := runHistory(dir, names); len(kept) > 0 {
			return "", fmt.Errorf("%w: %s has no checkpoint to resume from, but holds what a previous run wrote (%s): --resume never deletes it; start over with --force (which does), or move it away",
				ErrNothingToResume, dir, strings.Join(kept, ", "))
		}
		log.Warn().Str("dir", dir).Msg("--resume: no checkpoint in the run folder yet; starting from the beginning")
		return "", clearRun(dir)
	case len(names) > 0 && !force:
		return "", fmt.Errorf("%w: %s (use --resume to continue it or --force to start over)", ErrRunExists, dir)
	case force:
		return "", clearRun(dir)
	}
	return "", nil
}

// ErrNothingToResume is returned by --resume for a run folder with no checkpoint that still holds
// a previous run's metrics rows or checkpoints kept aside: starting over would delete them.
var ErrNothingToResume = errors.New("nothing to resume")

// runHistory lists what a previous run left in dir that a fresh start would delete and could not
// make again: metrics rows, dropped rows, checkpoints kept aside (the KL reference and the warm-up's
// report of a run without a checkpoint are the start's, which a fresh start makes the same). names
// are dir's entries (runFiles).
func runHistory(dir string, names []string) []string {
	var out []string
	for _, n := range names {
		switch {
		case n == MetricsFile || n == DroppedMetricsFile:
			if info, err := os.Stat(filepath.Join(dir, n)); err == nil && info.Size() > 0 {
				out = append(out, n)
			}
		case strings.Contains(n, ".damaged"):
			out = append(out, n)
		}
	}
	return out
}

// ErrNoCompleteCheckpoint is returned by --resume for a run folder with checkpoints, none complete:
// drmas never restarts over them.
var ErrNoCompleteCheckpoint = errors.New("no complete checkpoint")

// resumable returns the newest complete checkpoint (Verify); each newer one is
// reported, naming the file and what is wrong with it, skipped, and kept under another name
// (KeepAside in checkpoint.go). "" when the folder has no step-N folder at all; an error when it has some but none
// is complete.
func resumable(dir string) (string, error) {
	steps, err := Steps(dir)
	if err != nil {
		return "", err
	}
	var faults []string
	for _, s := range slices.Backward(steps) {
		ck := CheckpointDir(dir, s)
		legacy, err := Verify(ck, s)
		if err != nil {
			log.Warn().Str("checkpoint", ck).Err(err).Msg("--resume: checkpoint is incomplete or damaged; skipping it for an older one (it is kept)")
			faults = append(faults, fmt.Sprintf("%s%d: %v", StepPrefix, s, err))
			continue
		}
		if legacy {
			log.Warn().Str("checkpoint", ck).Msg("--resume: checkpoint has no " + ManifestFile + " (written by an older drmas): taken as complete because trainer.json, config.yaml and every model's files are there and whole; no checksum vouches for its bytes")
		}
		if len(faults) > 0 {
			log.Warn().Str("checkpoint", ck).Int("skipped", len(faults)).Msg("--resume: resuming from an older checkpoint than the newest")
			// The skipped ones are not this trajectory's: renamed aside now (step-N.damaged), so
			// that pruning, which counts step-N folders, neither counts nor deletes them.
			for _, sk := range steps[slices.Index(steps, s)+1:] {
				if err := KeepAside(CheckpointDir(dir, sk)); err != nil {
					return "", err
				}
			}
		}
		return ck, nil
	}
	if len(faults) > 0 {
		return "", fmt.Errorf("%w in %s: %d checkpoint folder(s), none complete, and drmas never restarts over them: %s. Repair or move them, or start over with --force (which deletes them)",
			ErrNoCompleteCheckpoint, dir, len(faults), strings.Join(faults, "; "))
	}
	return "", nil
}

// StepOf is the step of a checkpoint folder's name (-1 when it is not step-N).
func StepOf(ck string) int {
	n, ok := strings.CutPrefix(filepath.Base(ck), StepPrefix)
	s, err := strconv.Atoi(n)
	if !ok || err != nil || s < 0 || strconv.Itoa(s) != n {
		return -1
	}
	return s
}
