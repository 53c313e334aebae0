package policy

import (
	"errors"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sugarme/gotch"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/config"
	"github.com/drmas/drmas/pkg/plan"
	"github.com/drmas/drmas/pkg/torch"
)

// toyFamily is what a new family's file in pkg/arch holds (compare qwen3.go): a model_type, its
// transformers class, its config.json defaults and checks, and its options on the shared block;
// here q/k norms and biases on o_proj and the MLP but not on q/k/v, a combination no registered
// family has.
var toyFamily = arch.Family{
	ModelType:    "toyfam",
	Architecture: "ToyFamForCausalLM",
	Defaults: func(c *arch.Config) {
		if c.MaxPositionEmbeddings == 0 {
			c.MaxPositionEmbeddings = 777
		}
	},
	Check: func(c arch.Config) error {
		if c.HiddenAct != arch.ActSiLU {
			return errors.New("hidden_act: only silu for toyfam")
		}
		return nil
	},
	Options: func(c arch.Config, o *arch.Options) {
		o.QKNorm, o.QKVBias, o.OBias, o.MLPBias = true, false, true, true
	},
}

// A new model family is its file in pkg/arch plus one registration line (AddFamilyForTest makes that
// line for the test): with nothing else changed, a run config may name it (pkg/config), the memory
// plan counts it (pkg/plan), and this package builds it, runs its forward pass, trains it a step and
// saves and loads it. Nothing in this package or those lists the families.
func TestNewFamilyNeedsOneRegistration(t *testing.T) {
	sets := []string{"models.0.tokenizer=../../configs/toy/tokenizer.json", "models.0.init.model_type=toyfam", "run.dir=" + t.TempDir()}
	if _, err := config.Load("../../configs/toy-math.yaml", sets); err == nil || !strings.Contains(err.Error(), `"toyfam"`) {
		t.Fatalf("before registering: %v, want the unknown model_type named", err)
	}
	if _, err := arch.ParseConfig([]byte(`{"model_type":"toyfam","hidden_size":8,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":2,"vocab_size":9}`)); err == nil {
		t.Fatal("before registering: ParseConfig took model_type toyfam")
	}

	t.Cleanup(arch.AddFamilyForTest(&toyFamily))

	cfg, err := config.Load("../../configs/toy-math.yaml", sets)
	if err != nil {
		t.Fatalf("config with the new family: %v", err)
	}
	pl, err := plan.Build(cfg, plan.Options{Device: "cpu"})
	if err != nil {
		t.Fatalf("plan: %v", err)
	}

	c := tinyConfig("toyfam", 64)
	if c.MaxPositionEmbeddings != 256 || c.HeadDim != 8 {
		t.Fatalf("config: %+v", c)
	}
	c.MaxPositionEmbeddings = 0
	c.FillDefaults()
	if c.MaxPositionEmbeddings != 777 {
		t.Fatalf("the family's default max_position_embeddings: %d", c.MaxPositionEmbeddings)
	}
	shapes, err := arch.Shapes(c)
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, len(shapes))
	for i, w := range shapes {
		names[i] = w.Name
	}
	for _, want := range []string{"model.layers.1.self_attn.q_norm.weight", "model.layers.1.self_attn.o_proj.bias", "model.layers.1.mlp.down_proj.bias"} {
		if !slices.Contains(names, want) {
			t.Errorf("shapes lack %s", want)
		}
	}
	if slices.Contains(names, "model.layers.0.self_attn.q_proj.bias") {
		t.Error("shapes hold a q_proj bias the family does not have")
	}

	m := randomModel(t, "toyfam", 64, gotch.Float, 0.2, 3)
	ps := m.Parameters()
	if len(ps) != len(shapes) {
		t.Fatalf("%d tensors, arch.Shapes lists %d", len(ps), len(shapes))
	}
	for i, p := range ps {
		if p.Name != shapes[i].Name || !slices.Equal(p.T.MustSize(), shapes[i].Shape) {
			t.Errorf("tensor %s %v, arch.Shapes %s %v", p.Name, p.T.MustSize(), shapes[i].Name, shapes[i].Shape)
		}
	}
	if pl.Models[0].Params <= 0 || m.NumParams() != c.NumParams() {
		t.Errorf("parameters: plan %d, model %d, arch %d", pl.Models[0].Params, m.NumParams(), c.NumParams())
	}

	dir := t.TempDir()
	ids := [][]int{{1, 5, 9, 2, 7, 3}}
	err = torch.Do(func() error {
		s := torch.NewScope()
		defer s.Close()
		before := values(m.Forward(idsTensor(ids...), nil, nil, nil))
		for _, v := range before {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				t.Fatalf("forward: logit %v", v)
			}
		}
		if err := m.Save(dir); err != nil {
			return err
		}
		back, err := Load(dir, gotch.CPU, gotch.Float)
		if err != nil {
			return err
		}
		if got := values(back.Forward(idsTensor(ids...), nil, nil, nil)); !slices.Equal(got, before) {
			t.Error("the loaded model's logits differ from the saved model's")
		}
		back.Free()
		return trainStep(m, []Sequence{{PromptIDs: []int{1, 5, 9}, ResponseIDs: []int{2, 7, 3}}}, 0.1)
	})
	if err != nil {
		t.Fatal(err)
	}
	saved, err := arch.ReadConfig(filepath.Join(dir, "config.json"))
	var archs []string
	if _, rerr := saved.Raw("architectures", &archs); err != nil || rerr != nil || saved.ModelType != "toyfam" || !slices.Equal(archs, []string{"ToyFamForCausalLM"}) {
		t.Fatalf("saved config.json: %v %v, model_type %s, architectures %v", err, rerr, saved.ModelType, archs)
	}
}
