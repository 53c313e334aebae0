package report

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/rs/zerolog/log"

	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/jsonl"
	"github.com/drmas/drmas/pkg/metric"
	"github.com/drmas/drmas/pkg/rundir"
	"github.com/drmas/drmas/pkg/tbevent"
)

// TensorBoardDir is the folder of a run's TensorBoard event files (run.tensorboard).
var TensorBoardDir = rundir.Own("tensorboard")

// Board figures: how many trajectories a transcript text shows, how long it may get, the buckets of an
// advantage histogram.
const (
	boardTrajectories = 3
	boardTextMax      = 16 << 10
	boardBuckets      = 30
)

// board writes a run's TensorBoard event files, a side output of rank 0 (run.tensorboard): every
// metrics.jsonl key as a scalar at its step, each agent's advantages as a histogram every iteration,
// and a few trajectories' transcripts as text every run.dump_every iterations (read back from
// rollouts/step-N.jsonl). Each run segment (a fresh run, each resume) writes a file of its own, and
// starts by pruning the steps after the one it starts from out of the files before it: every step is
// then in one file, once. A failure to write is logged and ends the board, never the training.
type board struct {
	run       string        // the run folder
	dumpEvery int           // run.dump_every
	file      *tbevent.File // nil until the first record
	dead      bool          // a write failed: no more for this run
}

// openBoard is the TensorBoard output of a run segment (newBoard); nil when off.
func openBoard(r Run) (Output, error) {
	if b := newBoard(r.Dir, r.Config.TensorBoard, r.Config.DumpEvery, r.Step); b != nil {
		return b, nil
	}
	return nil, nil
}

// newBoard starts the board of a run segment starting after step: the files before it lose any later
// step, whether this segment writes or not (run.tensorboard off: nil). nil too when the pruning fails.
func newBoard(run string, on bool, dumpEvery, step int) *board {
	dir := filepath.Join(run, TensorBoardDir)
	changed, err := tbevent.Prune(dir, int64(step))
	for _, f := range changed {
		log.Info().Str("file", f).Int("step", step).Msg("tensorboard: event file cut back to the resumed step")
	}
	if err != nil {
		log.Warn().Err(err).Str("dir", dir).Msg("tensorboard: event files not pruned to the resumed step: no event files written this time")
		return nil
	}
	if !on {
		return nil
	}
	return &board{run: run, dumpEvery: dumpEvery}
}

// dir is the board's folder.
func (b *board) dir() string { return filepath.Join(b.run, TensorBoardDir) }

// Record writes an iteration: its metrics row as scalars, each agent's advantages as a histogram, the
// transcripts when dumped. A failure is logged and ends the board (never the training).
func (b *board) Record(it Iteration) error {
	if b.dead {
		return nil
	}
	if err := b.write(it.Metrics, it.Advantages); err != nil {
		log.Warn().Err(err).Str("dir", b.dir()).Msg("tensorboard: event file not written: no more for this run")
		b.Close()
		b.dead = true
	}
	return nil
}

func (b *board) write(m metric.Row, advs map[string][]float64) error {
	now := time.Now()
	if b.file == nil {
		f, err := tbevent.Create(b.dir(), now)
		if err != nil {
			return err
		}
		b.file = f
	}
	it := int(m["step"])
	vals, err := scalars(m)
	if err != nil {
		return err
	}
	agents := make([]string, 0, len(advs))
	for a := range advs {
		agents = append(agents, a)
	}
	sort.Strings(agents)
	for _, a := range agents {
		if h, ok := tbevent.NewHistogram(advs[a], boardBuckets); ok {
			vals = append(vals, tbevent.Histo("adv/agent/"+a, h))
		}
	}
	if b.dumpEvery > 0 && it%b.dumpEvery == 0 {
		path := filepath.Join(b.run, RolloutsDir, fmt.Sprintf("step-%d.jsonl", it))
		text, err := transcriptText(path, boardTrajectories)
		if err != nil {
			log.Warn().Err(err).Msg("tensorboard: no transcript text this iteration")
		} else if text != "" {
			vals = append(vals, tbevent.Text("transcripts", text))
		}
	}
	return b.file.Write(int64(it), now, vals...)
}

// scalars returns every key of m's metrics.jsonl row (step aside) as a scalar, sorted, a null
// (non-finite) value as NaN.
func scalars(m metric.Row) ([]tbevent.Value, error) {
	row, err := m.MarshalJSON()
	if err != nil {
		return nil, err
	}
	var vals map[string]*float64
	if err := json.Unmarshal(row, &vals); err != nil {
		return nil, err
	}
	keys := make([]string, 0, len(vals))
	for k := range vals {
		if k != "step" {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	out := make([]tbevent.Value, 0, len(keys))
	for _, k := range keys {
		v := math.NaN()
		if p := vals[k]; p != nil {
			v = *p
		}
		out = append(out, tbevent.Scalar(k, v))
	}
	return out, nil
}

// Close ends the board's file.
func (b *board) Close() {
	if b.file == nil {
		return
	}
	if err := b.file.Close(); err != nil {
		log.Warn().Err(err).Str("file", b.file.Path()).Msg("tensorboard: event file not closed cleanly")
	}
	b.file = nil
}

// transcriptText renders the first n trajectories of a rollout dump (docs/contracts.md) as Markdown:
// per trajectory its question, reward and answer, then each call's agent, turn and response ("" when
// the file holds no call). The text is cut at boardTextMax.
func transcriptText(path string, n int) (string, error) {
	var order []string
	calls := map[string][]env.TranscriptLine{}
	_, err := jsonl.ReadFile(path, func(l jsonl.Line) error {
		var t env.TranscriptLine
		if err := json.Unmarshal(l.Text, &t); err != nil {
			return fmt.Errorf("%s:%d: %w", path, l.N, err)
		}
		if _, seen := calls[t.TrajUID]; !seen {
			if len(order) == n {
				return nil
			}
			order = append(order, t.TrajUID)
		}
		calls[t.TrajUID] = append(calls[t.TrajUID], t)
		return nil
	})
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for i, id := range order {
		cs := calls[id]
		first := cs[0]
		if i > 0 {
			b.WriteString("\n---\n\n")
		}
		mark := "✗"
		if first.Success {
			mark = "✓"
		}
		fmt.Fprintf(&b, "**trajectory %s** (question %s, sample %d): reward %.3g %s, answer `%s`, gold `%s`\n\n",
			id, first.QuestionID, first.Sample, first.Reward, mark, oneLine(first.Answer), strings.Join(first.GroundTruth, " | "))
		b.WriteString("prompt of the first call:\n\n")
		writeIndented(&b, clip(first.Prompt, 1500))
		for _, c := range cs {
			valid := ""
			if !c.Valid {
				valid = ", invalid"
			}
			fmt.Fprintf(&b, "\nturn %d · **%s** (score %.3g%s):\n\n", c.Turn, c.Agent, c.Score, valid)
			writeIndented(&b, clip(c.Response, 1500))
		}
	}
	s := b.String()
	if len(s) > boardTextMax {
		s = strings.ToValidUTF8(s[:boardTextMax], "") + "\n\n…"
	}
	return s, nil
}

// writeIndented writes s as a Markdown code block (indented four spaces), its invalid UTF-8 and
// control characters (what an untrained model samples) shown as U+FFFD.
func writeIndented(b *strings.Builder, s string) {
	s = strings.Map(func(r rune) rune {
		if r != '\n' && r != '\t' && unicode.IsControl(r) {
			return utf8.RuneError
		}
		return r
	}, strings.ToValidUTF8(s, string(utf8.RuneError)))
	for _, line := range strings.Split(s, "\n") {
		b.WriteString("    ")
		b.WriteString(line)
		b.WriteByte('\n')
	}
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + " …"
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// boardDirExists reports whether the run folder holds a tensorboard folder.
func boardDirExists(run string) bool {
	st, err := os.Stat(filepath.Join(run, TensorBoardDir))
	return err == nil && st.IsDir()
}
