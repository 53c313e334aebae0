package plan

import (
	"testing"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/config"
)

// A LoRA team's plan: the frozen base holds its weights and the shared rollout only; each adapter
// its A and B with gradients and AdamW moments, and the activations of the base's forward, and no
// rollout of its own. Against the same team of full models, the static memory shrinks to one base
// plus the adapters.
func TestPlanLoRA(t *testing.T) {
	cfg, err := config.Load("../../configs/toy-math-lora.yaml", []string{"models.0.tokenizer=../../configs/toy/tokenizer.json"})
	if err != nil {
		t.Fatal(err)
	}
	pl, err := Build(cfg, Options{Device: "cpu"})
	if err != nil {
		t.Fatal(err)
	}
	if len(pl.Models) != 3 {
		t.Fatalf("%d model lines, want the base and two adapters", len(pl.Models))
	}
	base, solver := pl.Models[0], pl.Models[1]
	if base.Gradients != 0 || base.Optimizer != 0 || base.Master != 0 || base.Activations != 0 || base.Weights != base.Params*4 ||
		base.RolloutKV == 0 || base.DecodeCopy != base.Weights || base.Role == "" {
		t.Errorf("frozen base: %+v", base.Parts)
	}
	pc, err := modelConfig(cfg.WeightsOf(cfg.Models[1]))
	if err != nil {
		t.Fatal(err)
	}
	want, err := arch.LoRAParams(pc, 16, []string{"all-linear"})
	if err != nil {
		t.Fatal(err)
	}
	want += 2 * 16 * int64(pc.VocabSize+pc.HiddenSize) // embed_tokens' and lm_head's A and B (the config targets them)
	if solver.Params != want || solver.Weights != want*4 || solver.Gradients != want*4 || solver.Optimizer != want*8 ||
		solver.RolloutKV != 0 || solver.DecodeCopy != 0 || solver.Activations == 0 || solver.Base != "toy" {
		t.Errorf("adapter: %d params (want %d), %+v", solver.Params, want, solver.Parts)
	}
	full, err := config.Load("../../configs/toy-math-team.yaml", []string{"models.0.tokenizer=../../configs/toy/tokenizer.json",
		"models.1.tokenizer=../../configs/toy/tokenizer.json"})
	if err != nil {
		t.Fatal(err)
	}
	fp, err := Build(full, Options{Device: "cpu"})
	if err != nil {
		t.Fatal(err)
	}
	if l, f := pl.Devices[0].Static, fp.Devices[0].Static; l*2 > f {
		t.Errorf("static memory: LoRA team %d, full team %d: want under half", l, f)
	}
}
