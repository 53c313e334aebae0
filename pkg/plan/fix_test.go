package plan

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/drmas/drmas/pkg/config"
)

// fitsWith rebuilds the plan of cfg (loaded with sets) with the --set arguments of a fix added and
// reports its peak on a device of the given capacity.
func fitsWith(t *testing.T, cfg *config.Config, sets, fix []string, opt Options, capacity int64) (bool, int64) {
	t.Helper()
	c, err := config.Load(cfg.Source, append(slices.Clone(sets), fix...))
	if err != nil {
		t.Fatalf("the fix %q does not load: %v", fix, err)
	}
	pl, err := Build(c, opt)
	if err != nil {
		t.Fatal(err)
	}
	pl.Capacities(Options{Memory: map[string]int64{"": capacity}})
	return *pl.Devices[0].Fits, pl.Devices[0].PeakBytes
}

// The refusal names a change that fits, and the change, applied as the --set arguments it names,
// does fit; so do the alternatives it names. Capacities from just below the plan down to its
// static memory: each is met by some change or by none (then the refusal says so).
func TestFixFitsWhenApplied(t *testing.T) {
	for _, c := range []struct {
		name string
		sets []string
	}{
		{"as written", nil},
		{"context-bound prompts", []string{"data.max_prompt_length=0"}},
		{"checkpointing and micro-batch 1 already", []string{"data.max_prompt_length=0", "models.0.gradient_checkpointing=true", "algorithm.micro_batch_size=1"}},
		{"token budget", []string{"algorithm.max_tokens_per_micro_batch=512"}},
		{"a rollout of 4,096 rows", []string{"algorithm.batch_size=256", "algorithm.group_size=16", "data.max_prompt_length=1024"}},
	} {
		cfg := smallRun(t, c.sets...)
		opt := Options{Device: "cpu"}
		pl, err := Build(cfg, opt)
		if err != nil {
			t.Fatal(err)
		}
		d := pl.Devices[0]
		found := 0
		for _, frac := range []float64{0.95, 0.8, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1} {
			capacity := d.Static + d.Overhead + int64(frac*float64(d.PeakBytes-d.Static-d.Overhead))
			pl.Capacities(Options{Memory: map[string]int64{"": capacity}})
			got := pl.Devices[0]
			if *got.Fits {
				t.Fatalf("%s: peak %d fits %d", c.name, got.PeakBytes, capacity)
			}
			_, err := pl.Check()
			if got.Fix == "" {
				if !strings.Contains(err.Error(), "no change") {
					t.Errorf("%s at %.2f: no fix and the refusal %q does not say so", c.name, frac, err)
				}
				continue
			}
			found++
			if !strings.Contains(err.Error(), "it fits with "+got.Fix) {
				t.Errorf("%s: refusal %q does not name the fix %q", c.name, err, got.Fix)
			}
			fixes := [][]string{got.FixSets}
			for _, a := range got.Alternatives {
				var sets []string
				for _, f := range strings.Fields(a) {
					if strings.Contains(f, "=") {
						sets = append(sets, f)
					}
				}
				fixes = append(fixes, sets)
			}
			if ok, peak := fitsWith(t, cfg, c.sets, got.FixSets, opt, capacity); peak != got.FixPeak || !ok {
				t.Errorf("%s at %.2f: the fix %q promised a peak of %d; applied, the plan's is %d (fits %v)", c.name, frac, got.FixSets, got.FixPeak, peak, ok)
			}
			for _, fix := range fixes {
				if ok, peak := fitsWith(t, cfg, c.sets, fix, opt, capacity); !ok {
					t.Errorf("%s at %.2f: the named change %q gives a peak of %d, more than %d", c.name, frac, fix, peak, capacity)
				}
			}
		}
		if found == 0 {
			t.Errorf("%s: no capacity got a fix", c.name)
		}
	}
}

// A plan whose prompts are bounded by the context alone, with checkpointing on and micro-batches
// of 1, fits only with shorter prompts: the refusal names data.max_prompt_length (the old search
// tried checkpointing and micro-batch size only and named nothing), the largest power of two that
// fits.
func TestFixNamesPromptLength(t *testing.T) {
	sets := []string{"data.max_prompt_length=0", "models.0.gradient_checkpointing=true", "algorithm.micro_batch_size=1"}
	cfg := smallRun(t, sets...)
	opt := Options{Device: "cpu"}
	pl, err := Build(cfg, opt)
	if err != nil {
		t.Fatal(err)
	}
	if pl.Models[0].PromptBound != boundContext {
		t.Fatalf("prompt bound %q", pl.Models[0].PromptBound)
	}
	_, at128 := fitsWith(t, cfg, sets, []string{"data.max_prompt_length=128"}, opt, 1)
	_, at256 := fitsWith(t, cfg, sets, []string{"data.max_prompt_length=256"}, opt, 1)
	capacity := (at128 + at256) / 2 // 128 fits, 256 does not
	pl.Capacities(Options{Memory: map[string]int64{"": capacity}})
	d := pl.Devices[0]
	if !slices.Equal(d.FixSets, []string{"data.max_prompt_length=128"}) {
		t.Fatalf("fix %q (sets %q), want data.max_prompt_length=128", d.Fix, d.FixSets)
	}
	if !strings.HasPrefix(d.Fix, "--set data.max_prompt_length=128 (peak ") || !strings.Contains(d.Fix, "a prompt over 128 tokens is cut") {
		t.Errorf("fix text %q: want the peak and what the bound cuts", d.Fix)
	}
}

// With prompts measured on the data, the fix never names a data.max_prompt_length below the data's
// longest first-turn prompt (it would refuse those records), unless data.filter_overlong_prompts
// skips them.
func TestFixKeepsTheDataFirstTurns(t *testing.T) {
	for _, filter := range []bool{false, true} {
		sets := []string{"data.max_prompt_length=0", "models.0.gradient_checkpointing=true", "algorithm.micro_batch_size=1",
			fmt.Sprintf("data.filter_overlong_prompts=%v", filter)}
		cfg := smallRun(t, sets...)
		opt := Options{Device: "cpu", Prompts: []MeasuredPrompt{{Agent: "solver", Index: 0, Model: "m", FirstTurn: 300, Bound: 4000},
			{Agent: "verifier", Index: 1, Model: "m", FirstTurn: 300, Bound: 4000}}}
		pl, err := Build(cfg, opt)
		if err != nil {
			t.Fatal(err)
		}
		_, at128 := fitsWith(t, cfg, sets, []string{"data.max_prompt_length=128"}, opt, 1)
		_, at256 := fitsWith(t, cfg, sets, []string{"data.max_prompt_length=256"}, opt, 1)
		pl.Capacities(Options{Memory: map[string]int64{"": (at128 + at256) / 2}}) // 128 fits, 256 does not
		d := pl.Devices[0]
		if named := slices.Contains(d.FixSets, "data.max_prompt_length=128"); named != filter {
			t.Errorf("filter_overlong_prompts %v: fix %q (sets %q); naming max_prompt_length=128 under the data's 300-token first turns: %v", filter, d.Fix, d.FixSets, named)
		}
		// #52: the fix says which turns the bound cuts and what that does.
		if want := "solver's first turns (up to 300 tokens) over it: their records refused at load (skipped with data.filter_overlong_prompts), later turns (up to 4000) over it become overlong calls"; filter && !strings.Contains(d.Fix, want) {
			t.Errorf("fix %q does not say %q", d.Fix, want)
		}
	}
}

// A plan whose peak is the rollout's KV cache (4,096 rows of 1,056 tokens) fits by bounding the
// rows of generation in flight (models[i].rollout.max_batch: continuous batching), which costs time
// only, before shorter prompts or responses; alone, or with a smaller micro-batch when the update
// does not fit either (#52: a walkthrough's team was refused with no change named).
func TestFixBoundsRowsInFlight(t *testing.T) {
	sets := []string{"algorithm.batch_size=256", "algorithm.group_size=16", "data.max_prompt_length=1024", "models.0.gradient_checkpointing=true"}
	cfg := smallRun(t, sets...)
	opt := Options{Device: "cpu"}
	pl, err := Build(cfg, opt)
	if err != nil {
		t.Fatal(err)
	}
	d := pl.Devices[0]
	if d.RolloutKV < d.Update {
		t.Fatalf("rollout KV %d under the update %d: the test's construction failed", d.RolloutKV, d.Update)
	}
	pl.Capacities(Options{Memory: map[string]int64{"": d.Static + d.Overhead + d.Update + d.Update/2}})
	got := pl.Devices[0]
	if len(got.FixSets) != 1 || !strings.HasPrefix(got.FixSets[0], "models.0.rollout.max_batch=") {
		t.Fatalf("fix %q (sets %q), want models.0.rollout.max_batch alone", got.Fix, got.FixSets)
	}
	if ok, _ := fitsWith(t, cfg, sets, got.FixSets, opt, got.CapacityBytes); !ok {
		t.Fatalf("the fix %q applied does not fit", got.FixSets)
	}
}
