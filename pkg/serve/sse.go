package serve

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// sse writes server-sent events.
type sse struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

// startSSE sends the status line and the headers of an event stream.
func startSSE(w http.ResponseWriter) *sse {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	return &sse{w: w, rc: http.NewResponseController(w)}
}

// send writes v as one event and flushes it.
func (e *sse) send(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	// A client that stops reading is dropped (its row ends) instead of holding the handler.
	_ = e.rc.SetWriteDeadline(time.Now().Add(writeTimeout))
	if _, err := fmt.Fprintf(e.w, "data: %s\n\n", b); err != nil {
		return err
	}
	return e.rc.Flush()
}

// done ends the stream as OpenAI's and SGLang's do, with data: [DONE].
func (e *sse) done() {
	fmt.Fprint(e.w, "data: [DONE]\n\n")
	_ = e.rc.Flush()
}

// fail ends a stream whose status line has gone: the error as one more event, in the error shape.
func (e *sse) fail(err error) {
	var ae *apiError
	if !errors.As(err, &ae) {
		ae = &apiError{status: http.StatusInternalServerError, msg: err.Error()}
	}
	_ = e.send(ae.body())
	e.done()
}
