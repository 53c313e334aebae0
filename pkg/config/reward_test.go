package config

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/drmas/drmas/pkg/judge"
)

// The reward section decodes over pkg/judge's defaults and its problems name their keys.
func TestRewardSection(t *testing.T) {
	cfg, err := Load("../../configs/toy-math-judge.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	j := cfg.Reward.Judge
	if cfg.Reward.Type != judge.TypeJudge || j.URL != "http://127.0.0.1:30000" || j.OnError != judge.OnErrorScore ||
		j.Timeout != 30*time.Second || j.MaxTokens != 8 || len(j.Verdicts) != 4 || j.Verdicts["no"] != 0 || j.Verdicts["approve"] != 1 {
		t.Errorf("toy-math-judge reward: %+v", cfg.Reward)
	}
	if cfg.Reward.Remote.BatchSize != 32 || cfg.Reward.SuccessThreshold != 1 {
		t.Errorf("defaults not applied: %+v", cfg.Reward)
	}
	ref, err := Load("../../configs/reference.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ref.Reward.Resolve(), judge.Defaults().Resolve(); !reflect.DeepEqual(got, want) {
		t.Errorf("configs/reference.yaml's reward section is not the defaults:\n%+v\n%+v", got, want)
	}
	def, err := Load(write(t, minimal), nil)
	if err != nil {
		t.Fatal(err)
	}
	if def.Reward.Type != judge.TypeRule {
		t.Errorf("default reward type %q", def.Reward.Type)
	}
	for set, want := range map[string]string{
		"reward.type=remote":                 "reward.remote.url: required",
		"reward.judge.timeout=0":             "reward.judge.timeout: must be in (0s, 1h]",
		"reward.judge.pattern=verdict":       "reward.judge.pattern: \"verdict\" has no capture group",
		"reward.judge.api_key_env=sk-live-1": "reward.judge.api_key_env: \"sk-live-1\" is not an environment variable name",
		"reward.judge.verdicts={fine: 3}":    "reward.judge.verdicts.fine: must be a score in [0, 1]",
		"reward.judge.on_error=ignore":       "reward.judge.on_error: must be fail or score",
		"reward.judge.on_error=0":            "reward.judge.on_error: want 'string'",
		"reward.judge.temperatur=1":          "reward.judge",
	} {
		_, err := Load("../../configs/toy-math-judge.yaml", []string{set})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("--set %s: %v, want %q", set, err, want)
		}
	}
}
