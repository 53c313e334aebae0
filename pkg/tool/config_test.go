package tool

import (
	"strings"
	"testing"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"go.yaml.in/yaml/v3"
)

func TestConfigDecode(t *testing.T) {
	const doc = `
max_result_chars: 2000
timeout: 10s
concurrency: 4
retries: 2
mcp_servers:
  - name: everything
    command: npx
    args: [-y, "@modelcontextprotocol/server-everything"]
    env: {LOG_LEVEL: debug}
    tools: [echo, get-sum]
  - name: web
    url: https://tools.example.com/mcp
    key_env: TOOLS_KEY
    timeout: 1m
`
	var raw map[string]any
	if err := yaml.Unmarshal([]byte(doc), &raw); err != nil {
		t.Fatal(err)
	}
	var c Config
	dec, err := mapstructure.NewDecoder(&mapstructure.DecoderConfig{Result: &c, ErrorUnused: true,
		DecodeHook: mapstructure.StringToTimeDurationHookFunc()})
	if err != nil {
		t.Fatal(err)
	}
	if err := dec.Decode(raw); err != nil {
		t.Fatal(err)
	}
	if c.MaxResultChars != 2000 || c.Timeout != 10*time.Second || c.Concurrency != 4 || c.Retries != 2 || len(c.Servers) != 2 {
		t.Fatalf("decoded %+v", c)
	}
	e, w := c.Servers[0], c.Servers[1]
	if e.Command != "npx" || len(e.Args) != 2 || e.Env["LOG_LEVEL"] != "debug" || strings.Join(e.Tools, ",") != "echo,get-sum" ||
		w.URL != "https://tools.example.com/mcp" || w.KeyEnv != "TOOLS_KEY" || w.Timeout != time.Minute {
		t.Errorf("decoded servers %+v", c.Servers)
	}
	if err := c.Validate("tools"); err != nil {
		t.Error(err)
	}
}

func TestConfigValidate(t *testing.T) {
	ok := Server{Name: "s", Command: "srv"}
	for _, c := range []struct {
		cfg  Config
		want []string // parts of the error, one per problem; none: valid
	}{
		{Config{}, nil},
		{Config{Servers: []Server{ok, {Name: "h", URL: "http://127.0.0.1:1/mcp", KeyEnv: "K"}}}, nil},
		{Config{Settings: Settings{MaxResultChars: -1, Timeout: -time.Second, Concurrency: -1, Retries: -1}},
			[]string{"tools.max_result_chars: must be ≥ 0", "tools.timeout: must be ≥ 0", "tools.concurrency: must be ≥ 0", "tools.retries: must be ≥ 0"}},
		{Config{Servers: []Server{{Command: "x"}}}, []string{"tools.mcp_servers[0].name: required"}},
		{Config{Servers: []Server{{Name: "a b", Command: "x"}}}, []string{`tools.mcp_servers[0] (a b).name: "a b"`}},
		{Config{Servers: []Server{ok, ok}}, []string{`tools.mcp_servers[1] (s).name: "s" is also mcp_servers[0]'s name`}},
		{Config{Servers: []Server{{Name: "s"}}}, []string{"tools.mcp_servers[0] (s).command: a server needs a command"}},
		{Config{Servers: []Server{{Name: "s", Command: "x", URL: "http://h/mcp"}}}, []string{"(s).url: give a command"}},
		{Config{Servers: []Server{{Name: "s", URL: "ftp://h/mcp", Args: []string{"-v"}, Env: map[string]string{"A": "1"}}}},
			[]string{`(s).url: "ftp://h/mcp" is not an http(s) URL`, "(s).args: only a stdio server", "(s).env: only a stdio server"}},
		{Config{Servers: []Server{{Name: "s", Command: "x", KeyEnv: "K", Timeout: -1, Tools: []string{"a", "a", "b c"}}}},
			[]string{"(s).key_env: only an HTTP server", "(s).timeout: must be ≥ 0", `(s).tools: "a" named twice`, `(s).tools: tool name "b c"`}},
	} {
		err := c.cfg.Validate("tools")
		if len(c.want) == 0 {
			if err != nil {
				t.Errorf("%+v: %v", c.cfg, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%+v: valid, want %q", c.cfg, c.want)
			continue
		}
		lines := strings.Split(err.Error(), "\n")
		if len(lines) != len(c.want) {
			t.Errorf("%+v: %d problems, want %d:\n%v", c.cfg, len(lines), len(c.want), err)
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%+v: error %q lacks %q", c.cfg, err, w)
			}
		}
	}
}
