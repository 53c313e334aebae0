package train

import (
	"bufio"
	"context"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sugarme/gotch/ts"

	"github.com/drmas/drmas/pkg/config"
	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/metric"
	"github.com/drmas/drmas/pkg/rundir"
	"github.com/drmas/drmas/pkg/torch"
)

// tinyConfig is configs/toy-math.yaml shrunk to run in a second or two.
func tinyConfig(t *testing.T, dir string, sets ...string) *config.Config {
	t.Helper()
	base := []string{"run.dir=" + dir, "run.steps=4", "run.save_every=2", "run.test_freq=0", "run.keep_last=0",
		"run.threads=1", "warmup.steps=2", "warmup.batch_size=8",
		"models.0.init={model_type: qwen2, hidden_size: 16, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1}",
		"algorithm.batch_size=4", "algorithm.group_size=4", "algorithm.micro_batch_size=8",
		"agents.0.sampling.max_new_tokens=4", "agents.1.sampling.max_new_tokens=4", "toy.train=64", "toy.val=8"}
	cfg, err := config.Load("../../configs/toy-math.yaml", append(base, sets...))
	if err != nil {
		t.Fatal(err)
	}
	for i := range cfg.Models {
		cfg.Models[i].Tokenizer = "../../" + cfg.Models[i].Tokenizer // the config names it from the repo root
	}
	return cfg
}

func train(t *testing.T, cfg *config.Config, opt Options) *Trainer {
	t.Helper()
	tr, err := New(context.Background(), cfg, opt)
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	tr.Close()
	return tr
}

// readRows returns the metrics rows without wall-clock figures (time/*, perf/*).
func readRows(t *testing.T, dir string) []map[string]any {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, rundir.MetricsFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rows []map[string]any
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var row map[string]any
		if err := json.Unmarshal(sc.Bytes(), &row); err != nil {
			t.Fatalf("metrics line %q: %v", sc.Text(), err)
		}
		for k := range row {
			if strings.HasPrefix(k, "time/") || strings.HasPrefix(k, "perf/") {
				delete(row, k)
			}
		}
		rows = append(rows, row)
	}
	return rows
}

func sameRows(t *testing.T, a, b []map[string]any) {
	t.Helper()
	if len(a) != len(b) {
		t.Fatalf("%d rows vs %d rows", len(a), len(b))
	}
	for i := range a {
		x, _ := json.Marshal(a[i])
		y, _ := json.Marshal(b[i])
		if string(x) != string(y) {
			t.Fatalf("row %d differs:\n%s\n%s", i+1, x, y)
		}
	}
}

func TestDeterministic(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	train(t, tinyConfig(t, a, "run.steps=3"), Options{})
	train(t, tinyConfig(t, b, "run.steps=3"), Options{})
	ra := readRows(t, a)
	if len(ra) != 3 {
		t.Fatalf("%d metrics rows, want 3", len(ra))
	}
	for _, k := range []string{"reward/mean", "grad_norm/model/small", "grad_norm/agent/solver", "loss/pg"} {
		if _, ok := ra[0][k]; !ok {
			t.Errorf("metrics lack %s", k)
		}
	}
	// inflation/agent/* and adv_energy_ratio/agent/* are written only where defined (a group with
	// σ > 0; none in these 3 iterations): TestUndefinedDiagnosticsLeftOut
	sameRows(t, ra, readRows(t, b))
}

func TestRunFolderGuard(t *testing.T) {
	dir := t.TempDir()
	train(t, tinyConfig(t, dir, "run.steps=1", "warmup.steps=0"), Options{})
	if _, err := New(context.Background(), tinyConfig(t, dir), Options{}); err == nil || !strings.Contains(err.Error(), "already holds a run") {
		t.Fatalf("second run in the same folder: err = %v, want rundir.ErrRunExists", err)
	}
	train(t, tinyConfig(t, dir, "run.steps=1", "warmup.steps=0"), Options{Force: true})
}

func TestResumeMatchesUninterrupted(t *testing.T) {
	whole, parts := t.TempDir(), t.TempDir()
	train(t, tinyConfig(t, whole), Options{})
	train(t, tinyConfig(t, parts, "run.steps=2"), Options{})
	tr := train(t, tinyConfig(t, parts), Options{Resume: true})
	if tr.step != 4 {
		t.Fatalf("resumed run ended at step %d, want 4", tr.step)
	}
	sameRows(t, readRows(t, whole), readRows(t, parts))
}

// TestHelperTrain is the child process of TestSIGKILLResume.
func TestHelperTrain(t *testing.T) {
	dir := os.Getenv("DRMAS_TEST_TRAIN_DIR")
	if dir == "" {
		t.Skip("child process of TestSIGKILLResume")
	}
	train(t, tinyConfig(t, dir, "run.steps=1000", "run.save_every=2"), Options{})
}

func TestSIGKILLResume(t *testing.T) {
	whole, killed := t.TempDir(), t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperTrain$")
	cmd.Env = append(os.Environ(), "DRMAS_TEST_TRAIN_DIR="+killed)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		steps, _ := rundir.Steps(killed)
		if len(steps) > 0 && steps[len(steps)-1] >= 4 {
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatal("the child run made no checkpoint at step 4 within 60 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	tr := train(t, tinyConfig(t, killed, "run.steps=6"), Options{Resume: true})
	if tr.step != 6 {
		t.Fatalf("resumed run ended at %d", tr.step)
	}
	train(t, tinyConfig(t, whole, "run.steps=6"), Options{})
	sameRows(t, readRows(t, whole), readRows(t, killed))
}

func snapshot(ts []*ts.Tensor) [][]float64 {
	out := make([][]float64, len(ts))
	for i, t := range ts {
		if t != nil {
			out[i] = t.Float64Values()
		}
	}
	return out
}

func TestNonfiniteStepSkipped(t *testing.T) {
	dir := t.TempDir()
	cfg := tinyConfig(t, dir, "run.steps=1", "warmup.steps=0", "algorithm.ppo_mini_update_num=1")
	tr, err := New(context.Background(), cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if err := tr.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	ms := modelOf(tr, "small")
	var w, m, v [][]float64
	var step int
	torch.Do(func() error {
		w, m, v, step = snapshot(ms.params), snapshot(ms.opt.M), snapshot(ms.opt.V), ms.opt.Step
		return nil
	})
	ms.par = poisoned{ms.par} // iteration 2
	tr.Config.Run.Steps = 2
	if err := tr.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	torch.Do(func() error {
		for name, pair := range map[string][2][][]float64{"weights": {w, snapshot(ms.params)}, "exp_avg": {m, snapshot(ms.opt.M)}, "exp_avg_sq": {v, snapshot(ms.opt.V)}} {
			a, b := pair[0], pair[1]
			for i := range a {
				for j := range a[i] {
					if a[i][j] != b[i][j] {
						t.Fatalf("%s changed by a skipped step (tensor %d, element %d)", name, i, j)
					}
				}
			}
		}
		if ms.opt.Step != step {
			t.Errorf("AdamW step count %d → %d across a skipped step", step, ms.opt.Step)
		}
		return nil
	})
	rows := readRows(t, dir)
	last := rows[len(rows)-1]
	if last["nonfinite/model/small"] != 1.0 || last["grad_norm/model/small"] != nil {
		t.Errorf("step 2 metrics: nonfinite %v, grad_norm %v; want 1 and null", last["nonfinite/model/small"], last["grad_norm/model/small"])
	}
	if last["nonfinite_values"] == nil {
		t.Error("the null values were not counted")
	}
}

func TestNonfiniteAbort(t *testing.T) {
	cfg := tinyConfig(t, t.TempDir(), "run.steps=5", "warmup.steps=0", "algorithm.max_nonfinite_steps=2")
	tr, err := New(context.Background(), cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	modelOf(tr, "small").par = poisoned{modelOf(tr, "small").par}
	err = tr.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "max_nonfinite_steps") {
		t.Fatalf("err = %v, want an abort after 2 non-finite steps", err)
	}
}

// items makes synthetic training sequences for agents.
func synthItems(agents ...string) []*item {
	var out []*item
	for i, a := range agents {
		for j := 0; j < 3; j++ {
			out = append(out, &item{agent: a, prompt: []int{257, 80 + j, 43, 50 + i, 258}, response: []int{60 + i + j, 61, 258},
				adv: float64(j) - 1 + 0.3*float64(i)})
		}
	}
	return out
}

// The agents' shares of the loss add up to the model's loss, and each agent's measured norm is the
// norm of the gradient of its share alone.
func TestAgentSharesAddUp(t *testing.T) {
	cfg := tinyConfig(t, t.TempDir(), "warmup.steps=0")
	tr, err := New(context.Background(), cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	ms := modelOf(tr, "small")
	mb := newMiniBatch(synthItems("solver", "verifier"), 4, true)
	torch.Do(func() error {
		ZeroGrad(ms.params)
		st, err := ms.backward(mb, ms.params)
		if err != nil {
			t.Fatal(err)
		}
		whole := GradNorm(ms.params)
		if len(st.agents) != 2 || st.agents[0].agent != "solver" || st.agents[1].agent != "verifier" {
			t.Fatalf("agent shares %+v, want solver then verifier", st.agents)
		}
		var sumLoss float64
		norms := map[string]float64{}
		for _, share := range st.agents {
			norms[share.agent] = share.gradNorm
			var own []*item
			for _, x := range mb.items {
				if x.agent == share.agent {
					own = append(own, x)
				}
			}
			ZeroGrad(ms.params)
			alone, err := ms.backward(miniBatch{items: own, denom: mb.denom, onPolicy: true}, ms.params) // the whole mini-batch's denominators
			if err != nil {
				t.Fatal(err)
			}
			aloneNorm := GradNorm(ms.params)
			sumLoss += alone.loss.PG
			if math.Abs(aloneNorm-share.gradNorm) > 1e-5*math.Max(1, aloneNorm) || aloneNorm == 0 {
				t.Errorf("%s: norm in the shared pass %g, alone %g", share.agent, share.gradNorm, aloneNorm)
			}
			if math.Abs(alone.loss.PG-share.loss.PG) > 1e-6 {
				t.Errorf("%s: loss share in the shared pass %g, alone %g", share.agent, share.loss.PG, alone.loss.PG)
			}
		}
		if math.Abs(sumLoss-st.loss.PG) > 1e-6 {
			t.Errorf("agents' loss shares add up to %g, the model's loss is %g", sumLoss, st.loss.PG)
		}
		if whole > norms["solver"]+norms["verifier"]+1e-6 || whole == 0 {
			t.Errorf("model norm %g vs agents %v", whole, norms)
		}
		return nil
	})
}

// Shared agents train one model with one optimizer; non-shared agents train their own models only.
func TestSharedAndNonSharedOptimizers(t *testing.T) {
	cfg := tinyConfig(t, t.TempDir(), "warmup.steps=0",
		`models=[{id: a, tokenizer: configs/toy/tokenizer.json, init: {hidden_size: 16, num_hidden_layers: 1, num_attention_heads: 2}},
		         {id: b, tokenizer: configs/toy/tokenizer.json, init: {hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2}}]`,
		"agents.0.model=a", "agents.1.model=b")
	for i := range cfg.Models {
		cfg.Models[i].Optim.LR = 1e-3
	}
	tr, err := New(context.Background(), cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	a, b := modelOf(tr, "a"), modelOf(tr, "b")
	if a.opt == b.opt || len(a.agents) != 1 || len(b.agents) != 1 {
		t.Fatal("non-shared models must have their own optimizers and agents")
	}
	torch.Do(func() error {
		before := snapshot(b.params)
		if _, err := a.optimizerStep(newMiniBatch(synthItems("solver"), a.horizon, true), 1); err != nil {
			t.Fatal(err)
		}
		if a.opt.Step != 1 || b.opt.Step != 0 {
			t.Errorf("optimizer steps: a %d, b %d; want 1, 0", a.opt.Step, b.opt.Step)
		}
		after := snapshot(b.params)
		for i := range before {
			for j := range before[i] {
				if before[i][j] != after[i][j] {
					t.Fatal("the solver's step changed the verifier's model")
				}
			}
		}
		return nil
	})

	shared := tinyConfig(t, t.TempDir(), "warmup.steps=0")
	tr2, err := New(context.Background(), shared, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr2.Close()
	ms := modelOf(tr2, "small")
	torch.Do(func() error {
		st, err := ms.optimizerStep(newMiniBatch(synthItems("solver", "verifier"), ms.horizon, true), 1)
		if err != nil {
			t.Fatal(err)
		}
		if ms.opt.Step != 1 || len(st.agents) != 2 || !isFinite(st.gradNorm) || st.skipped {
			t.Errorf("shared model: %d optimizer steps, agent shares %+v; want one step measuring both agents", ms.opt.Step, st.agents)
		}
		return nil
	})
}

func TestMetricsNullAndTruncate(t *testing.T) {
	dir := t.TempDir()
	for s := 1; s <= 4; s++ {
		if err := rundir.AppendMetrics(dir, metric.Row{"step": float64(s), "x": math.NaN(), "y": 1}); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := os.ReadFile(filepath.Join(dir, rundir.MetricsFile))
	if !strings.HasPrefix(string(b), `{"step":1,"x":null,"y":1,"nonfinite_values":1}`) {
		t.Errorf("first row = %q", strings.SplitN(string(b), "\n", 2)[0])
	}
	if err := rundir.TruncateMetrics(dir, 2); err != nil {
		t.Fatal(err)
	}
	if rows := readRows(t, dir); len(rows) != 2 || rows[1]["step"] != 2.0 {
		t.Errorf("after truncating at step 2: %v", rows)
	}
}

// Gradient checkpointing recomputes each layer in backward: the run's metrics (rewards, losses,
// gradient norms, after every update) equal those without it within rounding, and they are not
// trivially equal (the runs learn: the gradient norms are non-zero).
func TestGradientCheckpointingMatches(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	// float64: AdamW divides by √v, which turns float32 rounding in near-zero gradient components
	// into whole-step differences; in float64 the two runs agree to many digits.
	// The entropy bonus gives every step a gradient (the toy's groups mostly score alike: zero
	// advantages, and the KL term's gradient is zero while the weights are the reference's).
	sets := []string{"run.steps=3", "models.0.init.num_hidden_layers=3", "models.0.dtype=float64", "algorithm.entropy_coef=0.01"}
	train(t, tinyConfig(t, a, sets...), Options{})
	train(t, tinyConfig(t, b, append(sets, "models.0.gradient_checkpointing=true")...), Options{})
	ra, rb := readRows(t, a), readRows(t, b)
	if len(ra) != 3 || len(rb) != 3 {
		t.Fatalf("%d and %d metrics rows, want 3", len(ra), len(rb))
	}
	for i := range ra {
		if g, _ := ra[i]["grad_norm/model/small"].(float64); g == 0 {
			t.Fatalf("row %d: zero gradient norm", i+1)
		}
		for k, va := range ra[i] {
			x, okx := va.(float64)
			y, oky := rb[i][k].(float64)
			if okx != oky || (okx && math.Abs(x-y) > 1e-9*(1+math.Abs(x))) {
				t.Errorf("row %d %s: %v without checkpointing, %v with", i+1, k, va, rb[i][k])
			}
		}
	}
}

// poisoned is a parallel strategy whose reduced gradients come out non-finite (a NaN in the first
// parameter's gradient): the non-finite path of the step, entered without a hook in the step.
type poisoned struct{ parallel }

func (p poisoned) reduce(model string, params []*ts.Tensor) error {
	err := p.parallel.reduce(model, params)
	if err == nil {
		s := torch.NewScope()
		defer s.Close()
		_ = torch.NoGrad(func() error {
			params[0].MustGrad(false).MustFill_(ts.FloatScalar(math.NaN()))
			return nil
		})
	}
	return err
}

// modelOf is the trainer's model group of an id.
func modelOf(tr *Trainer, id string) *modelState {
	for _, ms := range tr.models {
		if ms.id == id {
			return ms
		}
	}
	return nil
}

// A rollout dump shows what each model read and wrote: the prompt as its tokens decode (the chat
// template's rendering around the agent's prompt; the toy template writes the prompt alone), the
// prompt's and the response's token counts and why generation ended.
func TestRolloutDumpShowsWhatTheModelSaw(t *testing.T) {
	dir := t.TempDir()
	train(t, tinyConfig(t, dir, "run.steps=1", "warmup.steps=0", "run.dump_every=1"), Options{})
	b, err := os.ReadFile(filepath.Join(dir, "rollouts", "step-1.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	for _, l := range lines {
		var x env.TranscriptLine
		if err := json.Unmarshal([]byte(l), &x); err != nil {
			t.Fatal(err)
		}
		if x.PromptTokens == 0 || x.ResponseTokens == 0 || x.Finish == "" || !strings.Contains(x.RenderedPrompt, x.Prompt) {
			t.Fatalf("transcript line %+v: want token counts, a finish reason and the rendered prompt around the agent's prompt", x)
		}
	}
	if len(lines) < 16 {
		t.Errorf("%d transcript lines, want one per call (≥ 16)", len(lines))
	}
}

// The update's time is split as verl's timing_s is (old and reference log-probs, forward/backward,
// optimizer steps), and the parts fit within it.
func TestUpdateTimeSplit(t *testing.T) {
	dir := t.TempDir()
	train(t, tinyConfig(t, dir, "run.steps=1", "warmup.steps=0", "algorithm.kl.coef=0.05"), Options{})
	b, err := os.ReadFile(filepath.Join(dir, rundir.MetricsFile))
	if err != nil {
		t.Fatal(err)
	}
	var row map[string]float64
	if err := json.Unmarshal(b, &row); err != nil {
		t.Fatal(err)
	}
	parts := 0.0
	for _, k := range []string{metric.TimeOldLogProb, metric.TimeRefLogProb, metric.TimeBackward, metric.TimeOptimizerStep} {
		v, ok := row[k]
		if !ok || v < 0 {
			t.Fatalf("%s = %v (present %v)", k, v, ok)
		}
		parts += v
	}
	if row[metric.TimeBackward] <= 0 || row[metric.TimeRefLogProb] <= 0 || parts > row[metric.TimeUpdate]*1.001 {
		t.Errorf("split %v of time/update %v: want the forward/backward and the reference log-probs measured, the parts within the whole", parts, row[metric.TimeUpdate])
	}
}
