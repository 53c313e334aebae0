package serve

import (
	"bytes"
	"slices"
	"unicode/utf8"

	"github.com/drmas/drmas/pkg/llm"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/policy/tokenizer"
)

// textOptions say how a choice's tokens become its text.
type textOptions struct {
	stops       []string // stop strings: the text ends before the first one (after it with keepStop)
	keepStop    bool     // SGLang's no_stop_trim, vLLM's include_stop_str_in_output: keep the stop string / token
	keepSpecial bool     // skip_special_tokens false: special tokens (end of turn) stay in the text
}

// choiceText follows one choice as its tokens arrive: the tokens, and the text a client may be sent.
// The text leaves out special tokens (vLLM's and SGLang's skip_special_tokens) and the final stop
// token, and ends where a stop string first appears in the decoded text, whichever tokens it spans.
// Streamed text is held back while it could still be the start of a stop string or ends inside a
// UTF-8 character, so that what was sent is always a prefix of the final text.
type choiceText struct {
	tok     *tokenizer.Tokenizer
	stopIDs []int
	opt     textOptions

	toks    []policy.Token
	raw     []byte // bytes of the visible tokens
	cut     int    // where the text ends (a stop string matched), -1 while none did
	matched string // the stop string matched
	sent    int    // bytes of raw already handed out
}

func newChoiceText(tok *tokenizer.Tokenizer, stopIDs []int, opt textOptions) *choiceText {
	return &choiceText{tok: tok, stopIDs: stopIDs, opt: opt, cut: -1}
}

// add takes the next token.
func (c *choiceText) add(t policy.Token) {
	c.toks = append(c.toks, t)
	if c.cut >= 0 {
		return // generation stops at the token that completed the stop string
	}
	if (!c.opt.keepSpecial && c.tok.IsSpecial(t.ID)) || (!c.opt.keepStop && slices.Contains(c.stopIDs, t.ID)) {
		return
	}
	before := len(c.raw)
	c.raw = append(c.raw, c.tok.DecodeBytes([]int{t.ID})...)
	best := -1
	for _, s := range c.opt.stops {
		if s == "" {
			continue
		}
		from := max(0, before-len(s)+1)
		if i := bytes.Index(c.raw[from:], []byte(s)); i >= 0 && (best < 0 || from+i < best) {
			best, c.matched = from+i, s
		}
	}
	if best >= 0 {
		c.cut = best
		if c.opt.keepStop {
			c.cut += len(c.matched)
		}
	}
}

// end is where the text ends now: at the stop string, or after every visible token.
func (c *choiceText) end() int {
	if c.cut >= 0 {
		return c.cut
	}
	return len(c.raw)
}

// safe is how much of raw may leave before the choice ends: not a tail that could begin a stop
// string, nor a UTF-8 character cut in two, nor (when the tokenizer cleans up spaces before
// punctuation) a trailing space.
func (c *choiceText) safe() int {
	end := c.end()
	if c.cut < 0 {
		hold := 0
		for _, s := range c.opt.stops {
			for k := min(len(s)-1, end); k > hold; k-- {
				if bytes.HasSuffix(c.raw[:end], []byte(s[:k])) {
					hold = k
					break
				}
			}
		}
		end -= hold
	}
	i := end - 1
	for i > c.sent && i > end-utf8.UTFMax && !utf8.RuneStart(c.raw[i]) {
		i--
	}
	if i >= c.sent && i < end && !utf8.FullRune(c.raw[i:end]) {
		end = i
	}
	if c.tok.CleansUpSpaces() {
		for end > c.sent && c.raw[end-1] == ' ' {
			end--
		}
	}
	return max(end, c.sent)
}

// delta returns the text not handed out yet: all of it when final, else what is safe to send.
func (c *choiceText) delta(final bool) string {
	end := c.end()
	if !final {
		end = c.safe()
	}
	if end <= c.sent {
		return ""
	}
	out := c.tok.Text(c.raw[c.sent:end])
	c.sent = end
	return out
}

// text is the whole text of the choice.
func (c *choiceText) text() string { return c.tok.Text(c.raw[:c.end()]) }

// finish is OpenAI's finish_reason of a finished choice.
func finishReason(f llm.Finish) string {
	if f == llm.FinishLength {
		return "length"
	}
	return "stop"
}

func (c *choiceText) ids() []int {
	out := make([]int, len(c.toks))
	for i, t := range c.toks {
		out[i] = t.ID
	}
	return out
}
