package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// referenceEncode is the encoder as it was before Encode became linear, kept as the
// reference the fast one must agree with token for token: find the earliest added token by
// searching the rest of the text for each of them (longest first, so the longest wins a
// tie), split the text before it with SplitPattern, and run GPT-2's BPE on each word (merge
// every occurrence of the lowest-ranked pair, left to right, until none is left).
func referenceEncode(t *Tokenizer, text string) []int {
	rank := map[[2]string]int{}
	for i, m := range t.Merges {
		if _, ok := rank[m]; !ok {
			rank[m] = i
		}
	}
	bpe := func(w string) []int {
		var sym []string
		for _, r := range w {
			sym = append(sym, string(r))
		}
		for len(sym) > 1 {
			best, bi := -1, -1
			for j := 0; j+1 < len(sym); j++ {
				if r, ok := rank[[2]string{sym[j], sym[j+1]}]; ok && (best < 0 || r < best) {
					best, bi = r, j
				}
			}
			if bi < 0 {
				break
			}
			m := t.Merges[best]
			sym = applyMerge(sym, m, m[0]+m[1])
		}
		ids := make([]int, 0, len(sym))
		for _, s := range sym {
			ids = append(ids, t.Vocab[s])
		}
		return ids
	}
	var ids []int
	for len(text) > 0 {
		at, which := -1, -1
		for i, sp := range t.Specials {
			if sp.Content == "" {
				continue // the old encoder looped forever on these
			}
			if k := strings.Index(text, sp.Content); k >= 0 && (at < 0 || k < at) {
				at, which = k, i
			}
		}
		chunk := text
		if at >= 0 {
			chunk = text[:at]
		}
		for _, w := range splitRE.FindAllString(chunk, -1) {
			ids = append(ids, bpe(ByteLevel(w))...)
		}
		if at < 0 {
			break
		}
		ids = append(ids, t.Specials[which].ID)
		text = text[at+len(t.Specials[which].Content):]
	}
	return ids
}

const trainText = `Hello world! Hello, world. The quick brown fox jumps over the lazy dog. aaaa aaaaaa
naïve café — 東京 🙂 12345 67890 tabs	and
new lines, <tags> and [INST] brackets [/INST] <|im_start|>user
hi<|im_end|> mississippi banana bandana`

// chatSpecials overlap in every way: prefixes of one another, suffixes, one inside another.
var chatSpecials = []string{"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|im", "<|", "|>", "<<", "<", "im_end", "[INST]", "[/INST]", "<think>", "</think>", "ab", "aba"}

func trained(t testing.TB) *Tokenizer {
	t.Helper()
	return Train(trainText, 400, chatSpecials)
}

// fromJSON loads a tokenizer.json written from its parts (added tokens in file order).
func fromJSON(t testing.TB, vocab map[string]int, merges []string, added []Special) *Tokenizer {
	t.Helper()
	var at []map[string]any
	for _, a := range added {
		at = append(at, map[string]any{"id": a.ID, "content": a.Content, "special": true})
	}
	b, err := json.Marshal(map[string]any{
		"added_tokens":  at,
		"pre_tokenizer": map[string]any{"type": "ByteLevel"},
		"model":         map[string]any{"type": "BPE", "vocab": vocab, "merges": merges},
	})
	require.NoError(t, err)
	p := filepath.Join(t.TempDir(), "tokenizer.json")
	require.NoError(t, os.WriteFile(p, b, 0o644))
	tok, err := LoadHF(p)
	require.NoError(t, err)
	return tok
}

// unordered has a merge that needs another's product ranked before it, an added token with
// no content and two added tokens with the same content: cases a trained tokenizer never
// has, where the round structure of GPT-2's BPE and the choice between duplicates show.
func unordered(t testing.TB) *Tokenizer {
	vocab := map[string]int{}
	for b := 0; b < 256; b++ {
		vocab[string(byteToRune[b])] = b
	}
	vocab["aa"], vocab["aaa"], vocab["ab"], vocab["aab"] = 256, 257, 258, 259
	return fromJSON(t, vocab, []string{"aa a", "a b", "aa b", "a a"},
		[]Special{{ID: 300, Content: "<x>"}, {ID: 301, Content: ""}, {ID: 302, Content: "<x>"}, {ID: 303, Content: "<xy>"}})
}

var samples = []string{
	"",
	"Hello world!",
	"<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
	"<|im<|im_<|im_end<|<|>|><<<<<<|im_end|>>>",
	"abababa aba ab a b abab",
	"aaaa aaaaa aaaaaaaaaaaaaaaaaaa <x><xy><x<xy",
	"naïve café — 東京 🙂\xff\xfe invalid \x80 bytes",
	"[INST] q [/INST] a</s>[INST]<think>\nhmm\n</think>",
	"  spaces\tand\nnew lines  ",
	strings.Repeat("mississippi", 50),
}

func TestEncodeMatchesReference(t *testing.T) {
	for _, tok := range []*Tokenizer{trained(t), unordered(t)} {
		for _, s := range samples {
			require.Equal(t, referenceEncode(tok, s), tok.Encode(s), "%q", s)
		}
	}
}

// TestUnorderedMerges: a round of BPE merges every occurrence present when it began, even
// when a merge it makes would form a pair ranked lower ("aa a" is ranked before "a a").
func TestUnorderedMerges(t *testing.T) {
	tok := unordered(t)
	require.Equal(t, []int{256, 256}, tok.Encode("aaaa"))
	require.Equal(t, []int{257}, tok.Encode("aaa"), "a a, then aa a")
	require.Equal(t, []int{300, 303, 300}, tok.Encode("<x><xy><x>"), "the longest added token at a position; the first of duplicates")
}

func TestEncodeLimit(t *testing.T) {
	tok := trained(t)
	text := strings.Repeat("<|im_start|>user\nHello world, the quick brown fox.<|im_end|>\n", 200)
	all := tok.Encode(text)
	ids, ok := tok.EncodeLimit(text, len(all))
	require.True(t, ok)
	require.Equal(t, all, ids)
	ids, ok = tok.EncodeLimit(text, -1)
	require.True(t, ok)
	require.Equal(t, all, ids)
	for _, limit := range []int{0, 1, 7, 100, len(all) - 1} {
		ids, ok := tok.EncodeLimit(text, limit)
		require.False(t, ok, "limit %d", limit)
		require.Equal(t, all[:len(ids)], ids, "the tokens returned are the text's first ones")
		require.Less(t, len(ids), limit+20, "encoding stopped at the limit, not at the end of the text")
	}
}

// TestEncodeLimitStopsEarly: over its limit, encoding stops: on a 4 MiB text and a limit of
// 100 tokens it does the work of about 100 tokens, counted in steps.
func TestEncodeLimitStopsEarly(t *testing.T) {
	tok := trained(t)
	text := strings.Repeat("the quick brown fox <|im_end|>", 4<<20/30)
	var n steps
	ids, ok := tok.encode(text, 100, &n)
	require.False(t, ok)
	require.LessOrEqual(t, len(ids), 110)
	require.Less(t, n.n, 2000, "steps for a 100-token limit")
	// One word longer than the limit can hold is refused without running BPE on it: the
	// steps are the search for an added token, one per byte.
	n = steps{}
	word := strings.Repeat("z", 4<<20)
	_, ok = tok.encode(word, 100, &n)
	require.False(t, ok)
	require.Equal(t, len(word), n.n)
}

// TestEncodeIsLinear counts the steps of encoding texts of 1, 2 and 4 units: dense chat
// markers (every byte could start an added token), one long word, and plain text. The
// steps double when the text doubles (the old encoder searched the whole rest of the text
// for every added token at each one it found, and rescanned a word for every merge).
func TestEncodeIsLinear(t *testing.T) {
	tok := trained(t)
	for name, unit := range map[string]string{
		"markers":   strings.Repeat("<|im_start|><|im_end|><|<|im<<", 1000),
		"long word": strings.Repeat("aabanana", 2000),
		"text":      strings.Repeat("Hello world, the quick brown fox. ", 500),
	} {
		var per []float64
		for k := 1; k <= 4; k *= 2 {
			var n steps
			_, ok := tok.encode(strings.Repeat(unit, k), -1, &n)
			require.True(t, ok)
			per = append(per, float64(n.n)/float64(k*len(unit)))
		}
		require.InDelta(t, per[0], per[1], per[0]*0.05, "%s: steps per byte at 1× and 2× %v", name, per)
		require.InDelta(t, per[0], per[2], per[0]*0.05, "%s: steps per byte at 1× and 4× %v", name, per)
		require.Less(t, per[2], 40.0, "%s: steps per byte", name)
	}
}

// TestMaxTokenBytes: no token stands for more than MaxTokenBytes bytes of text.
func TestMaxTokenBytes(t *testing.T) {
	for _, tok := range []*Tokenizer{trained(t), unordered(t)} {
		for _, s := range samples {
			require.LessOrEqual(t, len(s), len(tok.Encode(s))*tok.MaxTokenBytes(), "%q", s)
		}
	}
	require.Equal(t, len("<|endoftext|>"), trained(t).MaxTokenBytes())
}

// FuzzEncode checks the encoder against the reference on any text, EncodeLimit against
// Encode, and the MaxTokenBytes bound.
func FuzzEncode(f *testing.F) {
	for _, s := range samples {
		f.Add(s, 5)
	}
	toks := []*Tokenizer{trained(f), unordered(f)}
	f.Fuzz(func(t *testing.T, s string, limit int) {
		if len(s) > 4096 {
			return // the reference is quadratic
		}
		for _, tok := range toks {
			want := referenceEncode(tok, s)
			got := tok.Encode(s)
			if len(want) != len(got) {
				t.Fatalf("%q: %v, reference %v", s, got, want)
			}
			for i := range want {
				if want[i] != got[i] {
					t.Fatalf("%q: %v, reference %v", s, got, want)
				}
			}
			if len(s) > len(got)*tok.MaxTokenBytes() {
				t.Fatalf("%q: %d bytes in %d tokens of at most %d bytes", s, len(s), len(got), tok.MaxTokenBytes())
			}
			limit := limit % (len(got) + 2)
			ids, ok := tok.EncodeLimit(s, limit)
			if ok != (limit < 0 || len(got) <= limit) {
				t.Fatalf("%q limit %d: complete %v with %d tokens", s, limit, ok, len(got))
			}
			if len(ids) > len(got) || (ok && len(ids) != len(got)) {
				t.Fatalf("%q limit %d: %d tokens of %d", s, limit, len(ids), len(got))
			}
			for i := range ids {
				if ids[i] != got[i] {
					t.Fatalf("%q limit %d: not a prefix", s, limit)
				}
			}
		}
	})
}
