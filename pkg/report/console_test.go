package report

import (
	"bytes"
	"testing"
)

// A log line on the bar's terminal clears the bar's line, is written, and the bar is drawn again.
func TestTerminalLogsDoNotCutTheBar(t *testing.T) {
	var out bytes.Buffer
	term := NewTerminal(&out)
	_, _ = term.Write([]byte("\r[==>  ] 40% iteration 2/5"))
	_, _ = term.Log(&out).Write([]byte("INF checkpoint saved\n"))
	want := "\r[==>  ] 40% iteration 2/5" + "\r\033[K" + "INF checkpoint saved\n" + "\r[==>  ] 40% iteration 2/5"
	if out.String() != want {
		t.Errorf("terminal output %q, want %q", out.String(), want)
	}
}
