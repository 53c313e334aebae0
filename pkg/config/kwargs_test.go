package config

import (
	"fmt"
	"strings"
	"testing"
)

// Template arguments are data, not config keys: their keys reach the template exactly as written,
// at every depth (viper lower-cases map keys and splits them on dots; a tool's JSON schema has
// mixed-case property names), from the file, from --set and from the environment.
func TestChatTemplateKwargsKeepTheirKeys(t *testing.T) {
	body := strings.Replace(minimal, "  - {name: verifier, model: m}", `  - name: verifier
    model: m
    chat_template_kwargs:
      dateString: 01 Dec 2026
      enable_thinking: false
      v1.2: dotted
      tools:
        - type: function
          function: {name: getWeather, parameters: {properties: {cityName: {type: string}}, required: [cityName]}}`, 1)
	path := write(t, body)
	t.Setenv("DRMAS_AGENTS_0_CHAT_TEMPLATE_KWARGS", "{fromEnv: X}")
	for _, sets := range [][]string{nil, {"agents.1.chat_template_kwargs.setKey=Y"}} {
		cfg, err := Load(path, sets)
		if err != nil {
			t.Fatal(err)
		}
		got := fmt.Sprint(cfg.Agents[1].ChatTemplateKwargs)
		want := "map[dateString:01 Dec 2026 enable_thinking:false tools:[map[function:map[name:getWeather " +
			"parameters:map[properties:map[cityName:map[type:string]] required:[cityName]]] type:function]] v1.2:dotted]"
		if sets != nil {
			want = strings.Replace(want, "enable_thinking:false", "enable_thinking:false setKey:Y", 1)
		}
		if got != want {
			t.Errorf("--set %v: chat_template_kwargs\n got  %s\n want %s", sets, got, want)
		}
		if got := fmt.Sprint(cfg.Agents[0].ChatTemplateKwargs); got != "map[fromEnv:X]" {
			t.Errorf("from the environment: got %s, want map[fromEnv:X]", got)
		}
		// A checkpoint's config.yaml reads back the same (resume).
		back := readBack(t, cfg)
		if got := fmt.Sprint(back.Agents[1].ChatTemplateKwargs); got != want {
			t.Errorf("--set %v: resolved config read back:\n got  %s\n want %s", sets, got, want)
		}
	}
}

// The names of an MCP server's environment variables and a judge's verdict words are data too:
// they reach the server and the judge's answers as written (#52: TNAME became tname), and read back
// the same from a checkpoint's config.yaml.
func TestDataMapsKeepTheirKeys(t *testing.T) {
	body := minimal + `tools:
  mcp_servers:
    - {name: everything, command: npx, env: {TNAME: x, Mixed_Case: y}}
reward:
  type: judge
  judge: {url: "http://127.0.0.1:1/v1", prompt: "{{.Question}} {{.Answer}} {{.References}}", pattern: "(Correct|WRONG)", verdicts: {Correct: 1, WRONG: 0}}
`
	cfg, err := Load(write(t, body), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []*Config{cfg, readBack(t, cfg)} {
		if got := fmt.Sprint(c.Tools.Servers[0].Env); got != "map[Mixed_Case:y TNAME:x]" {
			t.Errorf("tools.mcp_servers[0].env = %s, want the names as written", got)
		}
		if got := fmt.Sprint(c.Reward.Judge.Verdicts); got != "map[Correct:1 WRONG:0]" {
			t.Errorf("reward.judge.verdicts = %s, want the words as written", got)
		}
	}
}
