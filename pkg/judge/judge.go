package judge

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/template"
)

// PromptData is what a judge prompt template sees.
type PromptData struct {
	Question   string
	Answer     string
	Reference  string   // the gold answers joined with " | "
	References []string // the gold answers
}

// Input is one answer to judge.
type Input struct {
	Question   string
	Answer     string
	References []string
}

// Verdict is the judgement of one Input.
type Verdict struct {
	Score  float64
	Cached bool  // not asked: served by an earlier request for the same input (the cache) or one in flight
	Asked  bool  // this verdict sent the request (a judge call)
	Err    error // a failed judgement (*Error, or the context's error); Score is then 0
}

// Judge asks a judge model on an OpenAI-compatible endpoint (/v1/chat/completions: vLLM, SGLang,
// drmas serve) for a score of each answer. Safe for concurrent use.
type Judge struct {
	cfg      JudgeConfig
	tmpl     *template.Template
	re       *regexp.Regexp
	verdicts map[string]float64
	c        *client

	mu    sync.Mutex
	cache map[string]*entry // by the SHA-256 of the request body: the rendered prompt with everything else sent
	order []string          // cache keys, oldest first (eviction)
}

// entry is one judgement, done when done is closed.
type entry struct {
	done chan struct{}
	v    Verdict
}

// NewJudge checks cfg and returns a judge. The key, when api_key_env is set, is read now.
func NewJudge(cfg JudgeConfig) (*Judge, error) {
	full := Config{Type: TypeJudge, Judge: cfg}.Resolve()
	if err := full.Validate(); err != nil {
		return nil, err
	}
	cfg = full.Judge
	tmpl, err := parsePrompt(cfg.Prompt)
	if err != nil {
		return nil, fmt.Errorf("reward.judge.prompt: %w", err)
	}
	c, err := newClient("judge", chatURL(cfg.URL), cfg.Endpoint, MaxJudgeReplyBytes)
	if err != nil {
		return nil, err
	}
	verdicts := map[string]float64{}
	for w, s := range cfg.Verdicts {
		verdicts[strings.ToLower(strings.TrimSpace(w))] = s
	}
	return &Judge{cfg: cfg, tmpl: tmpl, re: regexp.MustCompile(cfg.Pattern), verdicts: verdicts, c: c,
		cache: map[string]*entry{}}, nil
}

// chatURL is the chat-completions URL of a base URL (http://host:port, …/v1 or the full URL).
func chatURL(base string) string {
	u := strings.TrimRight(base, "/")
	switch {
	case strings.HasSuffix(u, "/chat/completions"):
		return u
	case strings.HasSuffix(u, "/v1"):
		return u + "/chat/completions"
	}
	return u + "/v1/chat/completions"
}

// URL is the endpoint the judge posts to.
func (j *Judge) URL() string { return j.c.url }

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type chatRequest struct {
	Model       string        `json:"model,omitempty"`
	Messages    []chatMessage `json:"messages"`
	Temperature float64       `json:"temperature"`
	MaxTokens   int           `json:"max_tokens"`
	Seed        *int64        `json:"seed,omitempty"`
}

type chatReply struct {
	Choices []struct {
		Message struct {
			Content *string `json:"content"`
		} `json:"message"`
	} `json:"choices"`
}

// request renders the chat request of an input; its JSON is the cache key and seeds the sampling.
func (j *Judge) request(in Input) ([]byte, error) {
	var b strings.Builder
	d := PromptData{Question: in.Question, Answer: in.Answer, Reference: strings.Join(in.References, " | "), References: in.References}
	if err := j.tmpl.Execute(&b, d); err != nil {
		return nil, fmt.Errorf("judge prompt: %w", err)
	}
	req := chatRequest{Model: j.cfg.Model, Temperature: j.cfg.Temperature, MaxTokens: j.cfg.MaxTokens}
	if j.cfg.System != "" {
		req.Messages = append(req.Messages, chatMessage{Role: "system", Content: j.cfg.System})
	}
	req.Messages = append(req.Messages, chatMessage{Role: "user", Content: b.String()})
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	// The seed is a function of the request, so that a rerun gets the same judgements (from a server
	// that honours seeds) and the cache never changes a score.
	sum := sha256.Sum256(body)
	seed := int64(binary.LittleEndian.Uint64(sum[:8]) >> 1)
	req.Seed = &seed
	return json.Marshal(req)
}

// Judge judges the inputs concurrently (at most max_concurrency requests in flight over every caller)
// and returns one verdict per input, aligned. An input already judged, or being judged, is not asked
// again. A failure is the verdict's Err: Judge itself never fails.
func (j *Judge) Judge(ctx context.Context, ins []Input) []Verdict {
	out := make([]Verdict, len(ins))
	var wg sync.WaitGroup
	for i, in := range ins {
		body, err := j.request(in)
		if err != nil {
			out[i].Err = err
			continue
		}
		sum := sha256.Sum256(body)
		key := string(sum[:])
		e, owner := j.lookup(key)
		if !owner {
			wg.Add(1)
			go func() {
				defer wg.Done()
				select {
				case <-e.done:
					// An in-flight request for the same input that failed fails this one too.
					out[i] = e.v
					out[i].Asked, out[i].Cached = false, true
				case <-ctx.Done():
					out[i].Err = ctx.Err()
				}
			}()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			v := j.ask(ctx, body)
			v.Asked = true
			e.v = v
			j.settle(key, e)
			out[i] = v
		}()
	}
	wg.Wait()
	return out
}

// lookup returns the cache entry of a request, and whether the caller owns it (must ask the judge).
func (j *Judge) lookup(key string) (*entry, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if e, ok := j.cache[key]; ok {
		return e, false
	}
	e := &entry{done: make(chan struct{})}
	j.cache[key] = e
	return e, true
}

// settle publishes a finished judgement: a reply, parsed or not, stays cached (the oldest evicted
// beyond cache_entries; the same request gets the same reply from a judge that honours seeds); a
// request that got no reply is dropped so that the next rollout asks again.
func (j *Judge) settle(key string, e *entry) {
	j.mu.Lock()
	defer j.mu.Unlock()
	close(e.done)
	var je *Error
	replied := e.v.Err == nil || (errors.As(e.v.Err, &je) && je.Kind == KindUnparseable)
	if !replied || j.cfg.CacheEntries == 0 {
		delete(j.cache, key)
		return
	}
	j.order = append(j.order, key)
	for len(j.order) > j.cfg.CacheEntries {
		delete(j.cache, j.order[0])
		j.order = j.order[1:]
	}
}

// ask sends one request and parses its reply.
func (j *Judge) ask(ctx context.Context, body []byte) Verdict {
	b, err := j.c.post(ctx, body)
	if err != nil {
		return Verdict{Err: err}
	}
	var r chatReply
	if err := json.Unmarshal(b, &r); err != nil || len(r.Choices) == 0 || r.Choices[0].Message.Content == nil {
		why := fmt.Errorf("not a chat completion with a message")
		if err != nil {
			why = fmt.Errorf("not a chat completion: %w", err)
		}
		return Verdict{Err: &Error{Who: "judge", Endpoint: j.c.url, Kind: KindMalformed, Err: why, Snippet: snippet(string(b))}}
	}
	text := *r.Choices[0].Message.Content
	score, err := j.Parse(text)
	if err != nil {
		return Verdict{Err: &Error{Who: "judge", Endpoint: j.c.url, Kind: KindUnparseable, Err: err, Snippet: snippet(text)}}
	}
	return Verdict{Score: score}
}

// Parse reads a score from a judge's reply: the last match of the pattern after any </think>, its
// first group a verdict word (when verdicts are configured) or a number in [0, 1].
func (j *Judge) Parse(reply string) (float64, error) {
	if i := strings.LastIndex(reply, "</think>"); i >= 0 {
		reply = reply[i+len("</think>"):]
	}
	ms := j.re.FindAllStringSubmatch(reply, -1)
	if len(ms) == 0 {
		return 0, fmt.Errorf("no match of the pattern %s", j.cfg.Pattern)
	}
	got := strings.TrimSpace(ms[len(ms)-1][1])
	if len(j.verdicts) > 0 {
		if s, ok := j.verdicts[strings.ToLower(got)]; ok {
			return s, nil
		}
		return 0, fmt.Errorf("verdict %q is not one of %s", got, j.verdictWords())
	}
	v, err := strconv.ParseFloat(got, 64)
	if err != nil || math.IsNaN(v) || v < 0 || v > 1 {
		return 0, fmt.Errorf("score %q is not a number in [0, 1]", got)
	}
	return v, nil
}

func (j *Judge) verdictWords() string {
	var ws []string
	for w := range j.verdicts {
		ws = append(ws, strconv.Quote(w))
	}
	slices.Sort(ws)
	return strings.Join(ws, ", ")
}
