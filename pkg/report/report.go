// Package report is what a run tells about itself, on rank 0: a row of metrics.jsonl per
// iteration, TensorBoard event files, the rollouts' transcripts, the console's progress bar and log
// line, throughput and MFU per model, and the summary and curves when training ends. The training
// loop hands it each iteration's figures (Record) and rollout (Rollout); nothing else of the loop
// knows the outputs exist. An output is one file implementing Output plus one line in outputs.
package report

import (
	"fmt"
	"io"
	"time"

	"github.com/rs/zerolog/log"

	"github.com/drmas/drmas/pkg/choice"
	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/llm"
	"github.com/drmas/drmas/pkg/metric"
)

// Config is the reporting keys of the `run:` section.
type Config struct {
	// DumpEvery writes the rollout's transcripts every N iterations (rollouts/step-N.jsonl); 0 = never.
	DumpEvery int `mapstructure:"dump_every"`
	// TensorBoard writes TensorBoard event files under <dir>/tensorboard (docs/watching.md).
	TensorBoard bool `mapstructure:"tensorboard"`
	// PeakTFLOPS is the peak of each device a model trains on, in TFLOP/s, for perf/mfu/<model>;
	// 0 = pkg/flops' table for a known GPU, none on a CPU.
	PeakTFLOPS float64 `mapstructure:"peak_tflops"`
}

// Validate checks the keys, each problem naming its key under key ("run").
func (c Config) Validate(key string) error {
	var p choice.Problems
	p.AtLeast(key+".dump_every", c.DumpEvery, 0)
	p.NonNeg(key+".peak_tflops", c.PeakTFLOPS)
	return p.Err()
}

// Run is what a reporter reports on: the run folder, its config, the iterations it trains (to Steps,
// from Step), the validation's k, where the progress bar is drawn (nil: logs only), whether this
// process reports (rank 0) and, for the transcripts, the name they are written under and how a
// call's prompt ids are read back.
type Run struct {
	Dir         string
	Config      Config
	Steps, Step int
	ValK        int
	Console     io.Writer
	Primary     bool
	Transcripts string
	Render      func(model string, ids []int) string
	// GPUName names a CUDA device's GPU (nvidia-smi's name, e.g. "NVIDIA H200"), for its peak
	// FLOP/s; nil: MFU only with run.peak_tflops.
	GPUName func(device string) (string, error)
}

// Iteration is what the loop hands the reporter once an iteration is done: its metrics row, each
// agent's advantages, and each model's work (for throughput and MFU).
type Iteration struct {
	Metrics    metric.Row
	Advantages map[string][]float64
	Work       []Work
}

// Output is one place an iteration is recorded. A failure of an output the run depends on
// (metrics.jsonl) is returned and ends the run; a side output logs its own failures and goes quiet.
type Output interface {
	Record(it Iteration) error
	Close()
}

// outputs are the reporter's outputs, in the order they record an iteration; each opens when the run
// asks for it (a nil Output: off).
var outputs = []struct {
	name string
	open func(Run) (Output, error)
}{
	{"metrics", openMetrics},
	{"tensorboard", openBoard},
}

// Reporter reports one process's part of a run: its outputs, and the console (a log line per
// iteration; on a terminal a progress bar that also moves within an iteration).
type Reporter struct {
	run   Run
	outs  []Output
	bar   *progress
	began time.Time
	watch watch // what went wrong, for the terminal and the end summary
}

// New opens the run's outputs (rank 0's; the other ranks report nothing but their end).
func New(r Run) (*Reporter, error) {
	rep := &Reporter{run: r, bar: newProgress(r.Console, r.Steps, r.Step, r.ValK), began: time.Now()}
	if r.GPUName != nil {
		gpuName = r.GPUName
	}
	if !r.Primary {
		return rep, nil
	}
	for _, o := range outputs {
		out, err := o.open(r)
		if err != nil {
			rep.Close()
			return nil, fmt.Errorf("report %s: %w", o.name, err)
		}
		if out != nil {
			rep.outs = append(rep.outs, out)
		}
	}
	return rep, nil
}

// Record writes an iteration to every output: throughput and MFU added to its row first.
func (r *Reporter) Record(it Iteration) error {
	addPerf(it.Metrics, it.Work, r.run.Config.PeakTFLOPS)
	for _, o := range r.outs {
		if err := o.Record(it); err != nil {
			return err
		}
	}
	if r.run.Primary {
		r.bar.report(it.Metrics)
		r.watch.see(it.Metrics)
	}
	return nil
}

// Rollout writes iteration it's transcripts to <run>/rollouts/step-N.jsonl every run.dump_every
// iterations (rank 0): before the update, so that an iteration that fails leaves its rollout behind.
func (r *Reporter) Rollout(it int, roll *env.Rollout) error {
	if every := r.run.Config.DumpEvery; !r.run.Primary || every <= 0 || it%every != 0 {
		return nil
	}
	return writeTranscripts(r.run, it, roll)
}

// Finish ends a run that trained to step (from the step this process started at): the bar
// completed and, on rank 0, the summary and curves (summary.go).
func (r *Reporter) Finish(step int) {
	r.bar.finish()
	if !r.run.Primary {
		log.Info().Int("step", step).Str("took", time.Since(r.began).Round(time.Second).String()).Msg("training done")
		return
	}
	summarize(r.run.Dir, step, r.run.Step, r.run.ValK, r.run.Config.TensorBoard, r.began, &r.watch)
}

// Close closes the outputs.
func (r *Reporter) Close() {
	for _, o := range r.outs {
		o.Close()
	}
	r.outs = nil
}

// Generator counts iteration it's rollout on the bar as gen's batches return.
func (r *Reporter) Generator(gen llm.Generator, it int) llm.Generator {
	return r.bar.generator(gen, it)
}

// Trajectories is the rollout's progress call-back: trajectories finished of the total (nil: no bar).
func (r *Reporter) Trajectories() func(done, total int) { return r.bar.trajectories() }

// MiniBatch returns the update's progress call-back for model id (the i-th of n): mini-batch k of m.
func (r *Reporter) MiniBatch(it int, id string, i, n int) func(k, m int) {
	return r.bar.miniBatch(it, id, i, n)
}

// Show puts a phase of iteration it on the bar, at frac (0–1) of the iteration.
func (r *Reporter) Show(it int, frac float64, phase string) { r.bar.show(it, frac, phase) }

// AddOutputForTest registers an output as one more line of outputs would, and returns what undoes
// it: a test shows that a new output is its file and that one line.
func AddOutputForTest(name string, open func(Run) (Output, error)) (remove func()) {
	outputs = append(outputs, struct {
		name string
		open func(Run) (Output, error)
	}{name, open})
	n := len(outputs)
	return func() { outputs = outputs[:n-1] }
}
