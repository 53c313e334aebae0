package answer

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"unicode"
)

// boxCommands are the LaTeX commands whose braced argument is taken as the final answer.
var boxCommands = []string{`\boxed`, `\fbox`}

// Boxed returns the content of the last `\boxed{...}` (or `\fbox{...}`) in s, with nested braces
// handled. It also accepts the brace-less form `\boxed 5` that some MATH solutions use. It reports
// false when s holds no box or the last box is not closed.
func Boxed(s string) (string, bool) {
	start, cmd := -1, ""
	for _, c := range boxCommands {
		if i := lastCommand(s, c); i > start {
			start, cmd = i, c
		}
	}
	if start < 0 {
		return "", false
	}
	after := s[start+len(cmd):]
	rest := strings.TrimLeft(after, " ")
	if !strings.HasPrefix(rest, "{") {
		if rest == after {
			return "", false
		}
		// `\boxed 5`: the argument runs to the next `$` or the end of the string.
		if i := strings.IndexByte(rest, '$'); i >= 0 {
			rest = rest[:i]
		}
		arg := strings.TrimSpace(rest)
		return arg, arg != ""
	}
	depth := 0
	for i, r := range rest {
		switch r {
		case '{':
			depth++
		case '}':
			depth--
			if depth == 0 {
				return rest[1:i], true
			}
		}
	}
	return "", false
}

// lastCommand returns the index of the last occurrence of the LaTeX command cmd in s that is not
// a prefix of a longer command name (`\boxed` must not match `\boxedx`), or -1.
func lastCommand(s, cmd string) int {
	for end := len(s); end > 0; {
		i := strings.LastIndex(s[:end], cmd)
		if i < 0 {
			return -1
		}
		next := i + len(cmd)
		if next >= len(s) || !isASCIILetter(s[next]) {
			return i
		}
		end = i
	}
	return -1
}

func isASCIILetter(b byte) bool { return (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') }

var (
	plainNumber = regexp.MustCompile(`^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$`)
	thousands   = regexp.MustCompile(`^[+-]?\d{1,3}(,\d{3})+(\.\d*)?$`)
	// `\frac{a}{b}` (after `\dfrac`/`\tfrac` were folded into `\frac`) and the shorthand `\frac12`.
	bracedFrac = regexp.MustCompile(`^([+-]?)\\frac\{([^{}]+)\}\{([^{}]+)\}$`)
	shortFrac  = regexp.MustCompile(`^([+-]?)\\frac(\d)(\d)$`)
)

// NormalizeNumber parses s as a number the way graders read final answers: it accepts thousands
// separators (`1,000`, `1{,}000`), a leading `$` or `\$`, a trailing `%` / `\%`, a trailing period,
// a Unicode minus, LaTeX thin spaces (`\!`, `\,`), plain fractions `a/b`, `\frac{a}{b}` / `\dfrac` /
// `\tfrac` (also `\frac12`) and signs in front of or inside fractions. A percentage is read as the
// number before the sign (`50%` is 50, as GSM8K golds are written). It reports false for anything
// else, including NaN and infinities.
func NormalizeNumber(s string) (float64, bool) {
	s = strings.TrimSpace(s)
	for _, r := range []struct{ old, new string }{
		{`{,}`, ","}, {`\!`, ""}, {`\,`, ""}, {`\;`, ""}, {`\ `, ""}, {" ", ""},
		{`\$`, ""}, {"$", ""}, {`\%`, ""}, {"%", ""},
		{`\dfrac`, `\frac`}, {`\tfrac`, `\frac`},
		{`\left`, ""}, {`\right`, ""}, {"\u2212", "-"},
	} {
		s = strings.ReplaceAll(s, r.old, r.new)
	}
	s = strings.TrimSuffix(s, ".")
	s = stripOuter(s, '{', '}')
	s = stripOuter(s, '(', ')')
	if s == "" {
		return 0, false
	}
	if v, ok := parseDecimal(s); ok {
		return v, true
	}
	if m := bracedFrac.FindStringSubmatch(s); m != nil {
		return fraction(m[1], m[2], m[3])
	}
	if m := shortFrac.FindStringSubmatch(s); m != nil {
		return fraction(m[1], m[2], m[3])
	}
	if num, den, ok := strings.Cut(s, "/"); ok && !strings.Contains(den, "/") {
		sign := ""
		if strings.HasPrefix(num, "-") || strings.HasPrefix(num, "+") {
			sign, num = num[:1], num[1:]
		}
		return fraction(sign, num, den)
	}
	return 0, false
}

// stripOuter removes one pair of enclosing brackets when they wrap the whole string.
func stripOuter(s string, open, close byte) string {
	if len(s) >= 2 && s[0] == open && s[len(s)-1] == close {
		inner := s[1 : len(s)-1]
		if !strings.ContainsAny(inner, string([]byte{open, close})) {
			return inner
		}
	}
	return s
}

// parseDecimal parses a plain decimal number, with or without thousands separators.
func parseDecimal(s string) (float64, bool) {
	if thousands.MatchString(s) {
		s = strings.ReplaceAll(s, ",", "")
	}
	if !plainNumber.MatchString(s) {
		return 0, false
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsInf(v, 0) || math.IsNaN(v) {
		return 0, false
	}
	return v, true
}

// fraction evaluates sign·num/den where num and den are plain decimals; a zero denominator fails.
func fraction(sign, num, den string) (float64, bool) {
	n, ok := parseDecimal(strings.TrimSpace(num))
	if !ok {
		return 0, false
	}
	d, ok := parseDecimal(strings.TrimSpace(den))
	if !ok || d == 0 {
		return 0, false
	}
	v := n / d
	if sign == "-" {
		v = -v
	}
	return v, true
}

// relTol is the relative tolerance of numeric answer comparison.
const relTol = 1e-6

// MathEqual reports whether pred and gold are the same answer: numerically equal within a relative
// tolerance of 1e-6 when both parse with NormalizeNumber, else equal as strings after a light LaTeX
// normalization (see normalizeLatex).
func MathEqual(pred, gold string) bool {
	p, pok := NormalizeNumber(pred)
	g, gok := NormalizeNumber(gold)
	if pok && gok {
		return p == g || math.Abs(p-g) <= relTol*math.Max(math.Abs(p), math.Abs(g))
	}
	np, ng := normalizeLatex(pred), normalizeLatex(gold)
	return np != "" && np == ng
}

// textWrappers are LaTeX commands whose braced argument is kept and the command dropped.
var textWrappers = []string{`\text`, `\textbf`, `\textrm`, `\mathrm`, `\mathbf`, `\mbox`}

// normalizeLatex removes presentation-only LaTeX: whitespace, `\left` / `\right`, `$`, thin
// spaces, `\text{}`-like wrappers (keeping their content), `\dfrac` / `\tfrac` (as `\frac`) and a
// trailing period.
func normalizeLatex(s string) string {
	for _, w := range textWrappers {
		s = unwrap(s, w)
	}
	s = strings.Map(func(r rune) rune {
		if unicode.IsSpace(r) {
			return -1
		}
		return r
	}, s)
	for _, r := range []struct{ old, new string }{
		{`\left`, ""}, {`\right`, ""}, {`\$`, ""}, {"$", ""},
		{`\!`, ""}, {`\,`, ""}, {`\;`, ""}, {`\dfrac`, `\frac`}, {`\tfrac`, `\frac`},
	} {
		s = strings.ReplaceAll(s, r.old, r.new)
	}
	return strings.TrimSuffix(s, ".")
}

// unwrap replaces every `cmd{x}` in s by x, with nested braces in x handled. An unclosed wrapper is
// left as it is.
func unwrap(s, cmd string) string {
	var b strings.Builder
	for {
		i := strings.Index(s, cmd+"{")
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		open := i + len(cmd)
		end := matchBrace(s, open)
		if end < 0 {
			b.WriteString(s)
			return b.String()
		}
		b.WriteString(s[:i])
		b.WriteString(s[open+1 : end])
		s = s[end+1:]
	}
}

// matchBrace returns the index of the `}` closing the `{` at s[open], or -1.
func matchBrace(s string, open int) int {
	depth := 0
	for i := open; i < len(s); i++ {
		switch s[i] {
		case '{':
			depth++
		case '}':
			depth--
			if depth == 0 {
				return i
			}
		}
	}
	return -1
}

// GSM8KGold returns the final answer of a GSM8K solution: the text after `####`, trimmed, with
// thousands separators removed.
func GSM8KGold(answer string) (string, error) {
	i := strings.LastIndex(answer, "####")
	if i < 0 {
		return "", fmt.Errorf("gsm8k answer has no \"####\" marker: %q", abbreviate(answer, 60))
	}
	gold := strings.ReplaceAll(strings.TrimSpace(answer[i+4:]), ",", "")
	if gold == "" {
		return "", fmt.Errorf("gsm8k answer has nothing after \"####\": %q", abbreviate(answer, 60))
	}
	return gold, nil
}

func abbreviate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// asciiPunct is Python's string.punctuation, which the Search-R1 normalization removes.
const asciiPunct = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"

// NormalizeQA normalizes a QA answer exactly as Search-R1's (and SQuAD's) normalize_answer does:
// lowercase, remove ASCII punctuation, remove the articles "a", "an" and "the" as whole words, and
// collapse whitespace.
func NormalizeQA(s string) string {
	s = strings.ToLower(s)
	s = strings.Map(func(r rune) rune {
		if r < 128 && strings.ContainsRune(asciiPunct, r) {
			return -1
		}
		return r
	}, s)
	return strings.Join(strings.Fields(removeArticles(s)), " ")
}

// removeArticles replaces each whole word "a", "an" or "the" by a space; a word is a maximal run of
// letters, digits and underscores (Python's Unicode `\w`), as `re.sub(r"\b(a|an|the)\b", " ", s)`.
func removeArticles(s string) string {
	var b strings.Builder
	rs := []rune(s)
	for i := 0; i < len(rs); {
		if !isWord(rs[i]) {
			b.WriteRune(rs[i])
			i++
			continue
		}
		j := i
		for j < len(rs) && isWord(rs[j]) {
			j++
		}
		switch w := string(rs[i:j]); w {
		case "a", "an", "the":
			b.WriteByte(' ')
		default:
			b.WriteString(w)
		}
		i = j
	}
	return b.String()
}

func isWord(r rune) bool { return r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r) }

// ExactMatch reports whether pred equals any of golds after NormalizeQA.
func ExactMatch(pred string, golds []string) bool {
	p := NormalizeQA(pred)
	for _, g := range golds {
		if NormalizeQA(g) == p {
			return true
		}
	}
	return false
}

// MathDecide is MathEqual over several gold answers, with whether the rule could tell: a match is
// decided, and so is a mismatch when the prediction and every gold parse as numbers
// (NormalizeNumber). A mismatch between texts that are not both numbers (LaTeX, words, an
// expression) is undecided: the strings differ, but the answers may still be equal (a judge decides;
// reward.judge.mode fallback).
func MathDecide(pred string, golds []string) (equal, decided bool) {
	for _, g := range golds {
		if MathEqual(pred, g) {
			return true, true
		}
	}
	if _, ok := NormalizeNumber(pred); !ok || len(golds) == 0 {
		return false, false
	}
	for _, g := range golds {
		if _, ok := NormalizeNumber(g); !ok {
			return false, false
		}
	}
	return false, true
}

// QADecide is ExactMatch with whether the rule could tell: a match is decided, a mismatch is not
// (a paraphrase, an alias or a longer phrasing of the gold answer fails exact match but may be right).
func QADecide(pred string, golds []string) (equal, decided bool) {
	if ExactMatch(pred, golds) {
		return true, true
	}
	return false, false
}
