package rundir

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/drmas/drmas/pkg/atomicfile"
	"github.com/drmas/drmas/pkg/jsonl"
	"github.com/rs/zerolog/log"
)

// MetricsFile is the name of the metrics log in a run folder.
const MetricsFile = "metrics.jsonl"

// AppendMetrics appends one row to the run's metrics file.
func AppendMetrics(dir string, m json.Marshaler) error {
	f, created, err := openAppend(filepath.Join(dir, MetricsFile))
	if err != nil {
		return err
	}
	b, err := m.MarshalJSON()
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil { // a row is kept once written, power loss or not
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if created { // the file's name too
		return SyncDir(dir)
	}
	return nil
}

// openAppend opens path for appending, creating it if need be, and says whether it did.
func openAppend(path string) (f *os.File, created bool, err error) {
	if f, err = os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0o644); err == nil || !errors.Is(err, fs.ErrNotExist) {
		return f, false, err
	}
	f, err = os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	return f, err == nil, err
}

// DroppedMetricsFile receives, on --resume, the metrics rows a run wrote after the checkpoint it
// resumes from (and a last line a crash cut short), appended as they were: the resumed run writes
// those iterations again, and drmas never deletes a row it did not just write.
const DroppedMetricsFile = "metrics.dropped.jsonl"

// splitMetrics splits the run's metrics file at a checkpoint's step: the rows up to step stay, those
// after it go. Every line must be a row (a JSON object with a numeric step), but for the last line,
// which a crash may have cut short: a malformed line anywhere else is refused, naming it, for a resume
// must not lose rows. nil, nil when there is no metrics file.
func splitMetrics(dir string, step int) (keep, drop []byte, torn int, err error) {
	path := filepath.Join(dir, MetricsFile)
	type line struct {
		n    int
		text []byte
		row  bool
		step float64
		err  error
	}
	var lines []line
	_, err = jsonl.ReadFile(path, func(l jsonl.Line) error {
		var row struct {
			Step *float64 `json:"step"`
		}
		x := line{n: l.N, text: l.Text}
		if x.err = json.Unmarshal(l.Text, &row); x.err == nil && row.Step == nil {
			x.err = errors.New("no step")
		}
		if x.err == nil {
			x.row, x.step = true, *row.Step
		}
		lines = append(lines, x)
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, 0, nil
	}
	if err != nil {
		return nil, nil, 0, err
	}
	var k, d bytes.Buffer
	for i, l := range lines {
		switch {
		case !l.row && i < len(lines)-1:
			return nil, nil, 0, fmt.Errorf("%s:%d: not a metrics row (%v): --resume keeps every row before its checkpoint and drops none silently; repair or remove that line, then resume again",
				path, l.n, l.err)
		case !l.row: // the last line
			torn = l.n
			d.Write(l.text)
			d.WriteByte('\n')
		case l.step <= float64(step):
			k.Write(l.text)
			k.WriteByte('\n')
		default:
			d.Write(l.text)
			d.WriteByte('\n')
		}
	}
	return k.Bytes(), d.Bytes(), torn, nil
}

// TruncateMetrics cuts the run's metrics file back to the rows up to step, so that a resumed run
// continues it where its checkpoint was taken; the rows cut are appended to DroppedMetricsFile first.
// A file with nothing to cut is not rewritten.
func TruncateMetrics(dir string, step int) error {
	keep, drop, torn, err := splitMetrics(dir, step)
	if err != nil || len(drop) == 0 {
		return err
	}
	if torn > 0 {
		log.Warn().Str("file", filepath.Join(dir, MetricsFile)).Int("line", torn).Str("moved_to", DroppedMetricsFile).
			Msg("--resume: the last metrics line is not a whole row (a crash cut it short?)")
	}
	f, created, err := openAppend(filepath.Join(dir, DroppedMetricsFile))
	if err != nil {
		return err
	}
	_, err = f.Write(drop)
	if err == nil {
		err = f.Sync()
	}
	if err == nil && created {
		err = SyncDir(dir)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("%s: %w", filepath.Join(dir, DroppedMetricsFile), err)
	}
	log.Info().Int("rows", bytes.Count(drop, []byte{'\n'})).Int("after_step", step).Str("moved_to", filepath.Join(dir, DroppedMetricsFile)).
		Msg("--resume: metrics rows written after the checkpoint moved aside (the resumed run writes those iterations again)")
	return atomicfile.WriteBytes(filepath.Join(dir, MetricsFile), keep)
}
