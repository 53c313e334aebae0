package train

import (
	"maps"
	"math"
	"testing"

	"github.com/drmas/drmas/pkg/config"
	"github.com/drmas/drmas/pkg/normalize"
	"github.com/drmas/drmas/pkg/report"
)

// rowsOutput is what a new reporter output's file holds: it keeps every iteration's row and each
// agent's advantage count.
type rowsOutput struct {
	rows   []map[string]float64
	advs   []int
	closed bool
}

func (o *rowsOutput) Record(it report.Iteration) error {
	o.rows = append(o.rows, maps.Clone(it.Metrics))
	n := 0
	for _, a := range it.Advantages {
		n += len(a)
	}
	o.advs = append(o.advs, n)
	return nil
}

func (o *rowsOutput) Close() { o.closed = true }

// A new reporter output is its file plus one registration line (AddOutputForTest makes that line
// for the test): with nothing else changed, a run hands it every iteration — the row metrics.jsonl
// holds, throughput included, and the iteration's advantages — and closes it at the end.
func TestNewReportOutputNeedsOneRegistration(t *testing.T) {
	out := &rowsOutput{}
	t.Cleanup(report.AddOutputForTest("rows", func(report.Run) (report.Output, error) { return out, nil }))
	dir := t.TempDir()
	train(t, tinyConfig(t, dir, "run.steps=2", "warmup.steps=0"), Options{})
	rows := readRows(t, dir)
	if len(out.rows) != 2 || len(rows) != 2 || !out.closed {
		t.Fatalf("the output saw %d rows (closed: %v), metrics.jsonl holds %d", len(out.rows), out.closed, len(rows))
	}
	for i, r := range rows {
		for k, v := range r {
			if k == "nonfinite_values" { // the file's count of its nulls
				continue
			}
			want, finite := v.(float64) // null: not finite
			got, ok := out.rows[i][k]
			if !ok || (finite && got != want) || (!finite && !math.IsNaN(got) && !math.IsInf(got, 0)) {
				t.Errorf("row %d: %s = %v in the output, %v in metrics.jsonl", i+1, k, got, v)
			}
		}
		if _, ok := out.rows[i]["perf/tokens_per_s/small"]; !ok {
			t.Errorf("row %d: no throughput for model small", i+1)
		}
		if out.advs[i] < 4*4*2 { // 4 tasks × 4 samples, each a solver and a verifier call at least
			t.Errorf("row %d: %d advantages, want one per call (≥ 32)", i+1, out.advs[i])
		}
	}
}

// Each agent's clip fractions, ppo_kl, KL penalty and entropy are logged (#52: only per model, and
// the entropy only when its coefficient is not 0), as token means over its trained tokens: with one
// agent per model and one optimizer step, equal to its model's figures.
func TestPerAgentLossFigures(t *testing.T) {
	dir := t.TempDir()
	sets := []string{"run.dir=" + dir, "run.steps=2", "run.save_every=0", "run.test_freq=0", "run.threads=1", "warmup.steps=0",
		"models.0.init={model_type: qwen2, hidden_size: 16, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1}",
		"models.1.init={model_type: qwen2, hidden_size: 16, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1}",
		"algorithm.batch_size=4", "algorithm.group_size=4", "algorithm.ppo_mini_update_num=1", "algorithm.loss_agg_mode=token-mean",
		"algorithm.kl.coef=0.1", "algorithm.entropy_coef=0.01", "toy.train=64", "toy.val=8"}
	cfg, err := config.Load("../../configs/toy-math-team.yaml", sets)
	if err != nil {
		t.Fatal(err)
	}
	for i := range cfg.Models {
		cfg.Models[i].Tokenizer = "../../" + cfg.Models[i].Tokenizer
	}
	train(t, cfg, Options{})
	rows := readRows(t, dir)
	for i, r := range rows {
		for _, a := range []string{"solver", "verifier"} {
			for agent, model := range map[string]string{"pg_clipfrac/agent/" + a: "pg_clipfrac/" + a, "ppo_kl/agent/" + a: "ppo_kl/" + a,
				"kl/agent/" + a: "loss/kl/" + a, "entropy/agent/" + a: "loss/entropy/" + a} {
				got, ok1 := r[agent].(float64)
				want, ok2 := r[model].(float64)
				if !ok1 || !ok2 || math.Abs(got-want) > 1e-6*math.Max(1, math.Abs(want)) {
					t.Errorf("row %d: %s = %v, its model's %s = %v", i+1, agent, r[agent], model, r[model])
				}
			}
		}
	}
}

// The entropy is logged whatever its coefficient (#52: 0 was logged when the coefficient was 0; verl
// logs it regardless): per agent and in loss/entropy, above 0 for a sampling policy.
func TestEntropyLoggedWithoutItsTerm(t *testing.T) {
	dir := t.TempDir()
	train(t, tinyConfig(t, dir, "run.steps=1", "warmup.steps=0", "algorithm.entropy_coef=0"), Options{})
	r := readRows(t, dir)[0]
	for _, k := range []string{"entropy/agent/solver", "entropy/agent/verifier", "loss/entropy"} {
		if v, ok := r[k].(float64); !ok || !(v > 0) {
			t.Errorf("%s = %v with entropy_coef 0, want the entropy (> 0)", k, r[k])
		}
	}
}

// The inflation factor and the energy ratio are left out of an iteration where they are 0/0 (no
// group of the agent with σ > 0) instead of written null (#52: the demo's 13 iterations of
// "non-finite values" were these, counted in nonfinite_values as if training had gone wrong).
func TestUndefinedDiagnosticsLeftOut(t *testing.T) {
	m := Metrics{}
	m.addAdvantages(normalize.Stats{Agents: []normalize.AgentStats{{Agent: "a", Inflation: math.NaN()}, {Agent: "b", Inflation: 1.5}}},
		map[string]float64{"a": math.NaN(), "b": 2})
	for k, want := range map[string]bool{"inflation/agent/a": false, "adv_energy_ratio/agent/a": false, "inflation/agent/b": true, "adv_energy_ratio/agent/b": true} {
		if _, ok := m[k]; ok != want {
			t.Errorf("%s written: %v, want %v", k, ok, want)
		}
	}
}
