package env

import (
	"context"
	"fmt"
	"testing"

	"github.com/drmas/drmas/pkg/llm"
)

// An agent's chat_template_kwargs travel with every one of its requests, and only with its own.
func TestChatTemplateKwargsReachRequests(t *testing.T) {
	agents := agentsNamed("m", "solver", "verifier")
	agents[0].ChatTemplateKwargs = map[string]any{"enable_thinking": false, "date_string": "01 Dec 2026"}
	o := mustOrchestra(t, toyConfig("math"), agents, nil)
	seen := map[string]string{}
	s := &script{rule: func(r llm.Request) string {
		seen[r.Agent] = fmt.Sprint(r.ChatTemplateKwargs)
		return mathRule(r)
	}}
	if _, err := o.Run(context.Background(), s, tasksOf("T0", "T1"), 2, RunOptions{Seed: 1}); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"solver": "map[date_string:01 Dec 2026 enable_thinking:false]", "verifier": "map[]"}
	for agent, w := range want {
		if seen[agent] != w {
			t.Errorf("%s requests carried chat_template_kwargs %s, want %s", agent, seen[agent], w)
		}
	}
}
