package dataset

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/rs/zerolog"
	"github.com/rs/zerolog/log"
)

// Records with invalid UTF-8 are kept (their bad bytes read as U+FFFD, as JSON decoding does), and a
// warning says how many there are and where the first is (before: the replacement was silent).
func TestInvalidUTF8Warned(t *testing.T) {
	var buf bytes.Buffer
	old := log.Logger
	log.Logger = zerolog.New(&buf)
	defer func() { log.Logger = old }()

	path := writeFile(t, "d.jsonl", "{\"question\": \"ok\", \"answer\": \"1\"}\n"+
		"{\"question\": \"caf\xe9?\", \"answer\": \"2\"}\n\n"+
		"{\"question\": \"\xff\xfe\", \"answer\": \"3\"}\n"+
		"{\"question\": \"fine\", \"answer\": \"4\"}\n")
	tasks := mustLoad(t, path, Options{})
	if len(tasks) != 4 || tasks[1].Question != "caf\uFFFD?" {
		t.Fatalf("tasks %+v; want the four records, bad bytes as U+FFFD", tasks)
	}
	var warned map[string]any
	for _, line := range strings.Split(buf.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["level"] == "warn" && strings.Contains(m["message"].(string), "UTF-8") {
			warned = m
		}
	}
	if warned == nil || warned["records"] != float64(2) || warned["first"] != path+":2" || warned["path"] != path {
		t.Errorf("warning %v; want one naming the file, 2 records and the first at line 2\nlog: %s", warned, buf.String())
	}

	buf.Reset()
	mustLoad(t, writeFile(t, "clean.jsonl", "{\"question\": \"ok\", \"answer\": \"1\"}\n"), Options{})
	if strings.Contains(buf.String(), "UTF-8") {
		t.Errorf("a clean file warned: %s", buf.String())
	}
}
